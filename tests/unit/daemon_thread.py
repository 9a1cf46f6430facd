"""The daemon (`daemon.runtime.Daemon`) serving on a thread of the test, on a memory
store and the fake provider, ticking every 50 ms: for what only the running daemon does
(its scheduler, its stop, the watchdog's measure)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from daemon.bootstrap import bootstrap
from daemon.config.settings import settings_from_dict
from daemon.doubles.fake_provider import FakeProvider
from daemon.runtime import Daemon
from daemon.systemd import Notifier
from ledger.application import Ledger
from policies.loader import PolicySet


def daemon_on(
    ledger: Ledger,
    *,
    notifier: Notifier | None = None,
    provider: FakeProvider | None = None,
    policies: PolicySet | None = None,
    api: dict[str, Any] | None = None,
    **daemon: Any,
) -> Daemon:
    """The daemon on `ledger`, not yet serving: `provider` (default a FakeProvider) as
    provider "fake", `policies` (default none), `api` its `[api]` section (default none);
    `daemon`: settings of its `[daemon]` section beside the 50 ms tick and the name n1."""
    settings = settings_from_dict(
        {
            "store": {"url": "memory://"},
            "daemon": {"tick": "50ms", "name": "n1", **daemon},
            "api": api or {},
            "providers": {"fake": {"credentials_file": "x.json", "user": "s@example.com"}},
        }
    )
    service = bootstrap(
        settings,
        ledger=ledger,
        policy_loader=PolicySet if policies is None else lambda: policies,
        policies=policies,
        providers={"fake": provider or FakeProvider("fake", clock=ledger.clock)},
    )
    return Daemon(service, settings.daemon.tick, notifier=notifier)


def serve_on_a_thread(daemon: Daemon) -> tuple[threading.Thread, list[BaseException]]:
    """`daemon.serve()` on a thread of its own, started, and what it raised (a stop it
    decided itself), there once the thread has ended."""
    raised: list[BaseException] = []

    def serve() -> None:
        try:
            daemon.serve()
        except BaseException as exc:
            raised.append(exc)

    runner = threading.Thread(target=serve)
    runner.start()
    return runner, raised


@contextmanager
def serving(
    ledger: Ledger, *, notifier: Notifier | None = None, **daemon: Any
) -> Iterator[tuple[Daemon, threading.Thread]]:
    """The daemon and the thread it serves on; stopped, and its thread ended, after.
    `daemon`: settings of its `[daemon]` section beside the 50 ms tick."""
    served = daemon_on(ledger, notifier=notifier, **daemon)
    runner = threading.Thread(target=served.serve, daemon=True)
    runner.start()
    try:
        yield served, runner
    finally:
        served.request_stop()
        runner.join(timeout=20)
    assert not runner.is_alive()
