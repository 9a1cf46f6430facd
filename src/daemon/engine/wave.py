"""Dispatch with group commit: the claims of several jobs and the outcomes of the calls
that returned, in one transaction; every worker refilled as soon as its call returns.

A save is a commit, and a durable commit (SQLite's fsync, a PostgreSQL round trip and WAL
flush) costs far more than the events it writes; one save per claim and one per outcome
made the commit, not the provider call, the daemon's limit. At most as many jobs are
claimed as there are free workers, so every claimed job gets a worker at once, and a slow
call delays nobody else's: its worker alone stays busy.

Invariant 1 (``docs/architecture.md``) holds per job: no call starts before the save that
holds its claim. When that save fails because another writer appended to one of the jobs
first (another daemon claimed it, an operator acted), nothing of it was written and every
job still holds its pending events (`Ledger.save_jobs`), so each is saved again alone: a
claim the other writer took fails as it would have alone and is not sent; the others are
claimed and sent. An outcome that fails alone leaves its job attempted, recovered at its
deadline (invariant 6).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from functools import partial
from typing import Any

from daemon.engine.dispatch import Claimed, Dispatch
from daemon.engine.report import Counter
from daemon.engine.runner import StepRunner
from ledger.application import ConcurrentUpdate, Ledger
from ledger.stores.index import IndexRow

log = logging.getLogger("sendledger.engine")


class DispatchWave:
    def __init__(
        self,
        ledger: Ledger,
        runner: StepRunner,
        dispatch: Dispatch,
        pool: ThreadPoolExecutor,
        size: int,
    ) -> None:
        self._ledger = ledger
        self._runner = runner
        self._dispatch = dispatch
        self._pool = pool
        self._size = max(size, 1)

    def run(self, rows: Sequence[IndexRow], counter: Counter) -> None:
        """The rows' jobs, every worker kept busy. Each round claims (in memory) as many
        jobs as there are free workers and takes the outcomes of the calls that returned
        meanwhile, saves both in one transaction (group commit), and only then sends the
        new claims; with nothing to save it waits for the next call to return. A slow
        call holds its own worker only: the others are refilled as theirs return."""
        keys = [row.key for row in rows]
        taken = 0
        in_flight: dict[Future[None], Claimed] = {}
        try:
            while taken < len(keys) or in_flight:
                # A returned call's worker is free: its outcome and the claim that refills
                # it go in the same commit.
                returned = [future for future in in_flight if future.done()]
                free = self._size - len(in_flight) + len(returned)
                batch = keys[taken : taken + free]
                taken += len(batch)
                claims = self._claim(batch, counter) if batch else []
                if not claims and not returned:
                    if batch:
                        continue  # none of these could be claimed: try the next ones
                    wait(in_flight, return_when=FIRST_COMPLETED)
                    continue
                outcomes = self._outcomes([(in_flight.pop(f), f) for f in returned], counter)
                saved = self._save(outcomes + claims, counter)
                for claim in claims:
                    if claim in saved:
                        in_flight[self._pool.submit(self._send, claim, counter)] = claim
                    else:
                        claim.gate.close()  # not claimed: no call
                self._recorded(outcomes, saved, counter)
        finally:
            outcomes = self._outcomes([(c, f) for f, c in in_flight.items()], counter)
            self._recorded(outcomes, self._save(outcomes, counter), counter)

    def _recorded(self, outcomes: list[Claimed], saved: list[Claimed], counter: Counter) -> None:
        for claim in outcomes:
            if claim in saved:
                self._do(self._dispatch.recorded, claim, counter)

    def _claim(self, keys: list[str], counter: Counter) -> list[Claimed]:
        """Load (one query), decide, render and claim in memory, in this thread: the
        workers may still be busy with earlier calls."""
        runner, dispatch = self._runner, self._dispatch
        jobs = runner.guard(dispatch, keys[0], counter, lambda: self._ledger.get_jobs(keys))
        if jobs is None:
            return []
        claims = []
        for key in keys:
            job = jobs.get(key)
            if job is None:
                counter.bump("skipped")  # an index row without events: nothing to send
                continue
            work = runner.load(dispatch, key, counter, job)
            if work is not None:
                claim = runner.guard(dispatch, key, counter, partial(dispatch.claim, work))
                if claim is not None:
                    claims.append(claim)
        return claims

    def _outcomes(
        self, in_flight: list[tuple[Claimed, Future[None]]], counter: Counter
    ) -> list[Claimed]:
        """Wait for the calls; their outcomes recorded on the jobs in memory."""
        for _claim, future in in_flight:
            future.result()
        return [
            claim
            for claim, _future in in_flight
            if claim.outcome is not None and self._do(self._dispatch.record, claim, counter)
        ]

    def _send(self, claim: Claimed, counter: Counter) -> None:
        with claim.gate:
            self._do(self._dispatch.send, claim, counter)

    def _do(self, phase: Callable[[Claimed], None], claim: Claimed, counter: Counter) -> bool:
        """One phase for one job; False when it failed (counted as the runner counts)."""

        def run() -> bool:
            phase(claim)
            return True

        return self._runner.guard(self._dispatch, claim.work.job.key, counter, run) is True

    def _save(self, claims: list[Claimed], counter: Counter) -> list[Claimed]:
        """The jobs' pending events in one transaction; when another writer appended to
        one of them first (nothing written), each alone. The ones saved."""
        if not claims:
            return []
        works = [c.work for c in claims]
        events: list[list[Any]] = [list(w.job.pending_events) for w in works]
        try:
            self._ledger.save_jobs([w.job for w in works])
        except ConcurrentUpdate:
            return [c for c in claims if self._do(lambda c: c.work.save(), c, counter)]
        except Exception:
            log.exception("a dispatch wave of %d jobs could not be saved", len(works))
            counter.bump("errors", len(works))
            return []
        for work, pending in zip(works, events, strict=True):
            work.saved(pending)
        return claims
