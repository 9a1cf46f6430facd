"""What people recorded on jobs, counted from the event log at scrape time (docs/http-api.md
"Metrics"): the searches of a check, a triage or a resend (`Checked`) and the decisions
(`Resolved`), whichever door made them: the command line, the API, the page, in any
process on the store.

A command searches and decides in a process of its own that ends before any scrape, so
only the store sees every door once: each process serving `/metrics` reads the events
recorded since it started, as far as the log is final (`PositionStore.horizon`, the
webhooks' bound: on PostgreSQL an id still being written is not read past), and counts
them. Every process counts every event: across processes, `max`, not `sum`.

"Since it started" is since it committed: a save in flight at the start, whose id is
below the newest visible one on PostgreSQL, is counted once it commits, and the events
committed before the start are not (`PositionStore.reader_start`).
"""

from __future__ import annotations

import threading
from collections import Counter as Tally
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from ledger.job import SendJob
from ledger.stores.positions import LogStart, final_end
from ledger.vocabulary import Resolution

if TYPE_CHECKING:
    from ledger.application import Ledger

PURPOSES = ("check", "resend", "triage")
RESULTS = ("hit", "miss", "duplicate")
#: Notifications read a query; a scrape reads every page up to the final end of the log.
PAGE = 500
_TOPICS = (SendJob.Checked.TOPIC, SendJob.Resolved.TOPIC)


def copies_result(count: int) -> str:
    """A search's result by the copies it found, as `sendledger_searches_total` counts."""
    return "miss" if count == 0 else "hit" if count == 1 else "duplicate"


class RecordedByPeople(Collector):
    """Counters of the `Checked` and `Resolved` events recorded since this process
    started, read on from where the last scrape stopped."""

    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger
        # One, kept: on PostgreSQL it remembers how far the log was found final, so a
        # gap settled once is not waited out again.
        self._positions = ledger.positions()
        self._lock = threading.Lock()  # scrapes run in worker threads
        # Before it started: the process counts what it saw recorded, as a counter does.
        self._position: int | None = None
        self._counted_before: frozenset[int] = frozenset()  # ids after it, not counted
        self._start()
        self._checks: Tally[tuple[str, str]] = Tally()
        self._resolutions: Tally[str] = Tally()

    def collect(self) -> Iterator[CounterMetricFamily]:
        with self._lock:
            self._read_on()
            checks = CounterMetricFamily(
                "sendledger_checks_recorded",
                "Searches people made, recorded on their job (any door, any process)",
                labels=["purpose", "result"],
            )
            # Every pair, 0 included: a series that appears only at its first event
            # reads as no data to rate().
            for pair in sorted({(p, r) for p in PURPOSES for r in RESULTS} | set(self._checks)):
                checks.add_metric(list(pair), self._checks[pair])
            resolutions = CounterMetricFamily(
                "sendledger_resolutions_recorded",
                "Decisions people made on jobs in review (any door, any process)",
                labels=["decision"],
            )
            for decision in sorted({str(r) for r in Resolution} | set(self._resolutions)):
                resolutions.add_metric([decision], self._resolutions[decision])
        yield checks
        yield resolutions

    def _start(self) -> None:
        try:
            start: LogStart = self._positions.reader_start()
        except Exception:
            # The store unreachable while the server starts: it must start all the same
            # (/healthz says why); counted from the first scrape that reads the log.
            return
        self._position, self._counted_before = start.position, start.committed

    def _read_on(self) -> None:
        if self._position is None:
            self._start()
            return
        position = self._read_to(self._position, final_end(self._positions, self._position))
        if self._counted_before and position >= max(self._counted_before):
            self._counted_before = frozenset()  # all read

    def _read_to(self, position: int, end: int) -> int:
        """Count the events in (position, end]; `end`. The position is kept page by
        page: a read that fails half-way counts none of them again."""
        while position < end:
            notes = self._ledger.log_after(position, end, PAGE, _TOPICS)
            for note in notes:
                if int(note.id) not in self._counted_before:
                    self._count(note)
            position = int(notes[-1].id) if notes else end
            self._position = position
        return position

    def _count(self, note: Any) -> None:
        try:
            event: Any = self._ledger.mapper.to_domain_event(note)
        except Exception:
            # One that cannot be read (a key that left the key file) is not counted:
            # failing every scrape for it would hide every other count.
            return
        if isinstance(event, SendJob.Checked):
            count = len(event.provider_message_ids) if event.count is None else event.count
            self._checks[(event.purpose, copies_result(count))] += 1
        elif isinstance(event, SendJob.Resolved):
            self._resolutions[event.decision] += 1


__all__ = ["RecordedByPeople", "copies_result"]
