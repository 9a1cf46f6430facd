"""The composition root: the one place that wires settings, store, policies, providers and
engine together. ``run`` and ``demo`` build the daemon through :func:`bootstrap`, as do the
engine's test rig (``tests/unit/engine_rig.py``) and the tests that need the whole service
(``tests/integration/test_api.py``, ``tests/unit/test_daemon_name_lost.py``), passing a
memory store, a fake provider or an injected clock instead of the real ones. Commands that
need only a provider (``review check``, ``probe``) take it from :func:`build_provider`.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime

from daemon.config.settings import (
    GraphProviderSettings,
    Settings,
    SmtpImapProviderSettings,
)
from daemon.engine.circuit import CircuitSettings
from daemon.engine.observer import EngineObserver
from daemon.engine.policy_holder import PolicyHolder
from daemon.engine.tick import Engine
from daemon.providers.base import Provider
from daemon.secret_reads import gmail_refusals, graph_credential, smtp_password
from ledger.application import Ledger
from policies.loader import PolicySet


def build_provider(settings: Settings, name: str) -> Provider:
    """The provider `[providers.NAME]` configures, by its kind (each client library is
    imported only here)."""
    config = settings.providers[name]
    if isinstance(config, GraphProviderSettings):
        return _graph_provider(settings, name, config)
    if isinstance(config, SmtpImapProviderSettings):
        from daemon.providers.kept import ReuseLimits
        from daemon.providers.smtp_imap import SmtpImapProvider

        password = smtp_password(settings, name, config)
        return SmtpImapProvider(
            name,
            smtp_host=config.smtp_host,
            smtp_port=config.smtp_port,
            smtp_security=config.smtp_security,
            imap_host=config.imap_host,
            imap_port=config.imap_port,
            imap_security=config.imap_security,
            username=config.username,
            password=password,
            sent_folder=config.sent_folder,
            sent_copy=config.sent_copy,
            timeout=config.timeout,
            reuse=ReuseLimits(
                max_uses=config.connection_max_messages,
                max_age=config.connection_max_age,
                idle_check_after=config.connection_idle_check,
            ),
            pipelining=config.pipelining,
        )
    from daemon.providers.gmail import GmailProvider

    with gmail_refusals(settings, name):
        return GmailProvider(
            name,
            credentials_file=settings.credentials_file(name),
            user=config.user,
            api_endpoint=config.api_endpoint,
            token_uri=config.token_uri,
            allow_http=config.allow_http,
            timeout=config.timeout,
            quota_units_per_second=config.quota_units_per_second,
            readback_first=config.readback_first,
            readback_rate=config.readback_rate,
            send_via=config.send_via,
            read_history=config.read_history,
        )


def _graph_provider(settings: Settings, name: str, config: GraphProviderSettings) -> Provider:
    from daemon.providers.graph import GraphProvider, GraphTokens, trusted_ca_bundle

    credential = graph_credential(settings, name, config)
    tokens = GraphTokens(
        authority=config.authority,
        tenant_id=config.tenant_id,
        client_id=config.client_id,
        credential=credential,
        timeout=config.timeout,
        ca_bundle=trusted_ca_bundle(),
    )
    return GraphProvider(
        name,
        tokens=tokens,
        user=config.user,
        api_endpoint=config.api_endpoint,
        timeout=config.timeout,
        max_concurrent=config.max_concurrent,
        confirm_wait=config.confirm_wait,
        ca_certs=trusted_ca_bundle(),
    )


@dataclass
class Service:
    """Everything a running daemon holds. Closing it closes the engine and the providers;
    the ledger belongs to whoever opened it."""

    settings: Settings
    ledger: Ledger
    policies: PolicyHolder
    providers: Mapping[str, Provider]
    engine: Engine
    # Set when the daemon serves the HTTP API: its metrics watch the engine.
    observer: EngineObserver | None = None

    def close(self) -> None:
        self.engine.close()
        for provider in self.providers.values():
            provider.close()


def bootstrap(
    settings: Settings,
    *,
    ledger: Ledger,
    policy_loader: Callable[[], PolicySet],
    policies: PolicySet | None = None,
    providers: Mapping[str, Provider] | None = None,
    clock: Callable[[], datetime] | None = None,
    elapsed: Callable[[], float] = time.monotonic,
    rng: random.Random | None = None,
    observer: EngineObserver | None = None,
    share_scopes: bool = True,
) -> Service:
    """Wire a daemon. ``policies``, when the caller has just loaded them, saves loading
    them again; ``providers`` replaces the configured ones (a fake in tests);
    ``share_scopes=False`` makes an engine that works for every quota scope without a
    lease (tests of one engine, or of engines that race for one job on purpose)."""
    if providers is None:
        providers = {name: build_provider(settings, name) for name in settings.providers}
    holder = PolicyHolder(policy_loader, policies)
    if observer is None and settings.api.listen:
        # The daemon serves the API: its metrics count what the engine does.
        from daemon.api.metrics import Metrics, Sources

        observer = Metrics(Sources(ledger, providers))
    engine = Engine(
        ledger,
        holder,
        providers,
        provider_timeouts={name: p.timeout for name, p in settings.providers.items()},
        clock=clock,
        elapsed=elapsed,
        concurrency=settings.daemon.concurrency,
        search_concurrency=settings.daemon.search_concurrency,
        batch_size=settings.daemon.batch_size,
        deadline_grace=settings.daemon.deadline_grace,
        rng=rng,
        observer=observer,
        daemon_name=settings.daemon.name,
        bounce_interval=settings.daemon.bounce_interval,
        circuit=CircuitSettings(
            failures=settings.daemon.circuit_failures,
            probe_after=settings.daemon.circuit_probe_after,
            probe_max=max(settings.daemon.circuit_probe_max, settings.daemon.circuit_probe_after),
        ),
        scope_lease=settings.daemon.scope_lease_seconds if share_scopes else None,
    )
    return Service(settings, ledger, holder, providers, engine, observer)
