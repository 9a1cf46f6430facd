"""A store that hangs (a network partition to PostgreSQL: a query on an open connection
that never answers) must not hold the daemon's main thread, which handles SIGTERM and
SIGINT (docs/operations.md "Stopping": the wait is bounded by `daemon.stop_timeout`)."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

from tests.unit.daemon_thread import serving

from daemon.systemd import Notifier
from ledger.application import Ledger


def test_a_stop_is_not_held_by_a_status_line_whose_store_query_hangs(tmp_path: Path) -> None:
    systemd = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)  # $NOTIFY_SOCKET
    systemd.bind(str(tmp_path / "notify"))
    hung = threading.Event()
    release = threading.Event()
    with Ledger("memory://") as ledger:
        counts = ledger.open_counts
        calls = 0

        def open_counts() -> dict[str, int]:
            nonlocal calls
            calls += 1
            if calls > 2:  # READY and the start-up line are read; then the store hangs
                hung.set()
                release.wait(60)
            return counts()

        ledger.open_counts = open_counts  # type: ignore[method-assign]
        notifier = Notifier(str(tmp_path / "notify"))
        with serving(ledger, notifier=notifier, stop_timeout="2s") as (daemon, runner):
            try:
                assert hung.wait(10)
                asked = time.monotonic()
                daemon.request_stop()
                runner.join(timeout=10)
                assert not runner.is_alive(), "the stop waits for the hung store query"
                assert time.monotonic() - asked < 2 + 2  # stop_timeout and a margin
            finally:
                release.set()
                systemd.close()


class _StoreDown:
    """The daemon's name in a store that is down (a PostgreSQL restart, a failover): held
    at start-up, then every check fails as a connection that is refused does."""

    ends_only_with_holder = False

    def check(self) -> None:
        raise OSError("connection refused")

    def session(self) -> None:
        return None

    def release(self) -> None:
        pass


def test_ticks_that_fail_while_the_store_is_down_still_feed_the_watchdog() -> None:
    """docs/performance.md: while the database is down the tick is tried again at the
    next one and the daemon does not exit. Ticks that end (with an error) are not a hung
    daemon: the watchdog's measure, the last tick's age, stays under two ticks, or
    systemd would kill the daemon (SIGABRT, its calls in flight cut) a minute into the
    outage."""
    with Ledger("memory://") as ledger:
        ledger.hold_identity = lambda name: _StoreDown()  # type: ignore[method-assign]
        with serving(ledger) as (daemon, _):
            threading.Event().wait(1.0)
            assert daemon.health.ticks == 0  # no tick got past the store
            assert daemon.health.last_error == "OSError: connection refused"
            assert daemon.tick_age() < 2 * 0.05 + 0.3, daemon.tick_age()
            assert daemon._healthy()
