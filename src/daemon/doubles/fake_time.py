"""Injected time for tests and benches: a wall clock the test moves instead of sleeping
(the engine's `Clock`, daemon/engine/clock.py), and monotonic seconds with a sleep that
moves them at once (what paces itself, such as the quota buckets)."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta


class FakeClock:
    """Injected time: tests move it instead of sleeping."""

    def __init__(self, start: datetime | None = None) -> None:
        self.now = start or datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
        self._elapsed = 0.0

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> datetime:
        """Time passes: the wall clock and `elapsed` move together."""
        self.now += timedelta(seconds=seconds)
        self._elapsed += seconds
        return self.now

    def jump(self, seconds: float) -> datetime:
        """The wall clock is set (an NTP step, a VM restored): no time passed, so
        `elapsed` stays where it was."""
        self.now += timedelta(seconds=seconds)
        return self.now

    def elapsed(self) -> float:
        """Monotonic seconds (the engine's `time.monotonic`): moved by `advance` only."""
        return self._elapsed


class FakeTime:
    """Injected monotonic seconds and sleep, for what paces itself (quota buckets): a
    sleep moves the time at once and is recorded. Thread-safe, as workers share a bucket."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start
        self.sleeps: list[float] = []
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self.now

    def sleep(self, seconds: float) -> None:
        with self._lock:
            self.sleeps.append(seconds)
            self.now += seconds
