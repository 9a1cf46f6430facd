"""Building the API for a process: the daemon (beside its engine) or `sendledger api`."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from daemon.api.app import create_app
from daemon.api.context import ApiContext
from daemon.api.health import HealthSources
from daemon.api.metrics import Metrics, Sources
from daemon.api.server import ApiServer, ListenRefused
from daemon.config.settings import ConfigError, Settings
from daemon.config.tick_bound import tick_limit
from daemon.engine.circuit import OpenCircuit
from daemon.engine.policy_holder import PolicyHolder
from daemon.from_settings import draft_providers, message_limits, thread_providers
from daemon.providers.base import Provider
from daemon.secret_reads import load_tokens
from daemon.service_layer.doors import PolicyWatch, built_providers, lent_providers
from ledger.application import Ledger


def api_context(
    settings: Settings,
    ledger: Ledger,
    policies: PolicyHolder,
    providers: Mapping[str, Provider | None],
    *,
    metrics: Metrics | None = None,
    unreliable: Callable[[], list[str]] | None = None,
    tick_age: Callable[[], float] | None = None,
    circuits: Callable[[], list[OpenCircuit]] | None = None,
    scope_failure: Callable[[], str | None] | None = None,
    clock_failure: Callable[[], tuple[float, str] | None] | None = None,
    by_folder: bool = False,
) -> ApiContext:
    """The API's view of this process. Without `unreliable` (no engine here) the handles'
    reliability is read from the store. `by_folder` (`sendledger api`, which sends
    nothing): intake and checks read the policy folder as the commands do, not the
    process's loaded set (`PolicyWatch`)."""
    tokens = load_tokens(settings)
    if unreliable is None:
        names = sorted(providers)

        def unreliable() -> list[str]:
            return [name for name in names if not ledger.handle_reliable(name)]

    if metrics is None:
        metrics = Metrics(Sources(ledger, providers))
    metrics.sources.unreliable = unreliable
    metrics.sources.tick_age = tick_age
    metrics.sources.circuits = circuits
    metrics.sources.webhooks = sorted(settings.webhooks)
    health = HealthSources(
        ledger=ledger,
        policies=lambda: policies.current,
        policy_error=lambda: policies.last_error,
        providers=sorted(providers),
        unreliable=unreliable,
        tick_age=tick_age,
        # The watchdog's limit: a tick still waiting for a slow store is not stuck.
        tick_limit=tick_limit(settings.daemon.tick, settings.store),
        circuits=circuits,
        scope_failure=scope_failure,
        clock_failure=clock_failure,
    )
    return ApiContext(
        ledger=ledger,
        policies=lambda: policies.current,
        tokens=tokens,
        max_body=settings.api.max_body,
        health=health,
        metrics=metrics,
        limits=message_limits(settings),
        thread_providers=thread_providers(settings),
        draft_providers=draft_providers(settings),
        intake_policies=PolicyWatch(settings, None if by_folder else lambda: policies.current),
        providers=lent_providers(providers, built_providers(settings)),
        trusted_hosts=settings.api.trusted_hosts,
        public_url=settings.api.public_url,
    )


def server_for(settings: Settings, ctx: ApiContext) -> ApiServer:
    host, port = settings.api.host_port
    return ApiServer(create_app(ctx), host, port)


#: The variable that sets `api.listen` (docs/configuration.md "Configuration").
LISTEN_VARIABLE = "SENDLEDGER_API__LISTEN"


def bound_server(settings: Settings, ctx: ApiContext, *, option: str = "") -> ApiServer:
    """The API's server with its port taken; a port that cannot be had is a ConfigError
    (exit 2) naming `api.listen`, its variable and `option` when the command has one."""
    server = server_for(settings, ctx)
    try:
        server.bind()
    except ListenRefused as exc:
        also = f", or {option} HOST:PORT" if option else ""
        raise ConfigError(
            f"{settings.config_path}: api.listen: {exc}; choose another address in "
            f"api.listen (or {LISTEN_VARIABLE}=127.0.0.1:PORT{also})"
        ) from None
    return server


__all__ = [
    "LISTEN_VARIABLE",
    "api_context",
    "bound_server",
    "load_tokens",
    "server_for",
]
