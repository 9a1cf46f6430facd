"""The daemon's ticks after the wall clock is stepped back (NTP correcting a clock that
ran ahead, a VM restored from a snapshot): APScheduler keeps its next run as a wall-clock
time, which is then that far ahead, and without a correction no tick runs for as long
(docs/operations.md "Running under systemd": the watchdog is fed while ticks complete)."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

from tests.unit.daemon_thread import serving

from daemon.runtime import Daemon
from ledger.application import Ledger


def _ticks_within(daemon: Daemon, seconds: float, more_than: int) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if daemon.health.ticks > more_than:
            return True
        threading.Event().wait(0.02)
    return False


def test_a_clock_stepped_back_an_hour_does_not_stop_the_ticks() -> None:
    with Ledger("memory://") as ledger, serving(ledger) as (daemon, _):
        assert _ticks_within(daemon, 10, 0)
        # What a step back of an hour leaves: the next run an hour ahead of the clock.
        ahead = datetime.now(UTC) + timedelta(hours=1)
        daemon.scheduler.modify_job("tick", next_run_time=ahead)
        threading.Event().wait(0.2)  # a tick that was running has ended
        before = daemon.health.ticks
        assert _ticks_within(daemon, 5, before), "no tick since the clock stepped back"
