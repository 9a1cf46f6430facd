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


@contextmanager
def serving(
    ledger: Ledger, *, notifier: Notifier | None = None, **daemon: Any
) -> Iterator[tuple[Daemon, threading.Thread]]:
    """The daemon and the thread it serves on; stopped, and its thread ended, after.
    `daemon`: settings of its `[daemon]` section beside the 50 ms tick."""
    settings = settings_from_dict(
        {"store": {"url": "memory://"}, "daemon": {"tick": "50ms", "name": "n1", **daemon}}
    )
    service = bootstrap(
        settings,
        ledger=ledger,
        policy_loader=PolicySet,
        providers={"fake": FakeProvider("fake", clock=ledger.clock)},
    )
    served = Daemon(service, settings.daemon.tick, notifier=notifier)
    runner = threading.Thread(target=served.serve, daemon=True)
    runner.start()
    try:
        yield served, runner
    finally:
        served.request_stop()
        runner.join(timeout=20)
    assert not runner.is_alive()
