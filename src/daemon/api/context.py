"""What the API's routes share: the services, tokens, sessions, metrics, health."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, Request

from daemon.api.auth import Sessions, TokenBook
from daemon.api.health import HealthSources
from daemon.api.metrics import Metrics
from daemon.api.signin_limit import SignInLimit
from daemon.engine.observer import ObservedProvider
from daemon.providers.base import Provider
from daemon.service_layer.services import ChannelPolicies, ProviderSource, Services
from ledger.application import Ledger
from ledger.mime import MessageLimits
from policies.loader import PolicySet


@dataclass
class ApiContext:
    ledger: Ledger
    policies: Callable[[], PolicySet]
    tokens: TokenBook
    max_body: int
    health: HealthSources
    metrics: Metrics
    # Each provider's per-message limits, held against every job at intake.
    limits: Mapping[str, MessageLimits] = field(default_factory=dict)
    # The providers a job's thread_id may go to (the gmail ones).
    thread_providers: frozenset[str] = frozenset()
    # The providers that may leave unsent drafts (a settling decision tidies them).
    draft_providers: frozenset[str] = frozenset()
    sessions: Sessions = field(default_factory=Sessions)
    # Intake's view of the policies (broken channels refuse), and the providers a check
    # may search with; without them, the policies in force and no search.
    intake_policies: Callable[[], ChannelPolicies] | None = None
    providers: ProviderSource | None = None
    # `[api] trusted_hosts` and `public_url` (docs/http-api.md "HTTP API"); sign-in attempts.
    trusted_hosts: list[str] = field(default_factory=list)
    public_url: str = ""
    signin_limit: SignInLimit = field(default_factory=SignInLimit)
    services: Services = field(init=False)

    def __post_init__(self) -> None:
        policies = self.intake_policies or (lambda: ChannelPolicies(self.policies()))
        self.services = Services(
            self.ledger,
            policies,
            providers=None if self.providers is None else _timed(self.providers, self.metrics),
            limits=self.limits,
            thread_providers=self.thread_providers,
            draft_providers=self.draft_providers,
            on_search=self.metrics.door_search,
        )


def _timed(source: ProviderSource, metrics: Metrics) -> ProviderSource:
    """Each provider a door searches with, its calls timed in the metrics as the engine's
    are (`sendledger_provider_call_duration_seconds`). The daemon lends its providers
    unwrapped (the engine times its own copies), so no call is timed twice."""

    @contextmanager
    def timed(name: str) -> Iterator[Provider]:
        with source(name) as provider:
            yield ObservedProvider(provider, metrics)

    return timed


def context_of(request: Request) -> ApiContext:
    ctx: ApiContext = request.app.state.ctx
    return ctx


#: A route's context, as a FastAPI dependency (`ctx: Ctx`).
Ctx = Annotated[ApiContext, Depends(context_of)]
