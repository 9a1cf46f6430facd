"""The composition root: the one place that wires settings, store, policies, providers and
engine together. ``run``, ``demo``, ``review check`` and the tests all build through it;
tests pass a memory store, a fake provider and an injected clock instead of the real ones.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime

from daemon.engine import Engine, PolicyHolder
from daemon.engine.circuit import CircuitSettings
from daemon.engine.observer import EngineObserver
from daemon.providers.base import Provider
from daemon.settings import ConfigError, Settings, SmtpImapProviderSettings
from ledger.application import Ledger
from policies.loader import PolicySet


def build_provider(settings: Settings, name: str) -> Provider:
    """The provider `[providers.NAME]` configures, by its kind (each client library is
    imported only here)."""
    config = settings.providers[name]
    if isinstance(config, SmtpImapProviderSettings):
        from daemon.providers.smtp_imap import SmtpImapProvider, read_password_file

        path = settings.resolve(config.password_file)
        try:
            password = read_password_file(path)
        except ValueError as exc:
            raise ConfigError(f"providers.{name}.password_file: {exc}") from None
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
        )
    from daemon.providers.gmail import DelegationRequired, GmailProvider

    try:
        return GmailProvider(
            name,
            credentials_file=settings.credentials_file(name),
            user=config.user,
            api_endpoint=config.api_endpoint,
            token_uri=config.token_uri,
            timeout=config.timeout,
            quota_units_per_second=config.quota_units_per_second,
            readback_first=config.readback_first,
            readback_rate=config.readback_rate,
        )
    except DelegationRequired as exc:
        raise ConfigError(f"providers.{name}.user: {exc}") from None


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
    rng: random.Random | None = None,
    observer: EngineObserver | None = None,
) -> Service:
    """Wire a daemon. ``policies``, when the caller has just loaded them, saves loading
    them again; ``providers`` replaces the configured ones (a fake in tests)."""
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
        concurrency=settings.daemon.concurrency,
        search_concurrency=settings.daemon.search_concurrency,
        batch_size=settings.daemon.batch_size,
        deadline_grace=settings.daemon.deadline_grace,
        rng=rng,
        observer=observer,
        daemon_name=settings.daemon.name,
        circuit=CircuitSettings(
            failures=settings.daemon.circuit_failures,
            probe_after=settings.daemon.circuit_probe_after,
            probe_max=max(settings.daemon.circuit_probe_max, settings.daemon.circuit_probe_after),
        ),
    )
    return Service(settings, ledger, holder, providers, engine, observer)
