"""Group commit: the saves that several workers ask for at once, in one transaction.

A save is a commit, and a durable commit (SQLite's fsync, a PostgreSQL round trip and WAL
flush) costs far more than the events it writes. Each worker saves its own job as if alone
(`GroupCommit.save`, the same contract as `Ledger.save_job`); the first to arrive commits
every save that is waiting, and saves that arrive meanwhile wait for the next commit, which
the first of them makes. So one commit serves as many jobs as there are workers between
two commits, and no thread exists only to commit.

An outcome nobody has to wait for (a send's recorded answer: invariant 1 needs only the
claim durable before the call) is left with `save_soon` and rides on the next commit
anyone makes - in a busy send worker, its own next claim - so a job costs about one
transaction instead of two. A worker that has nothing more to do first calls `flush`, so
no outcome waits in memory while its worker sleeps (`sends.py`). Until then the job's
stored state is its claim, as after a crash between the call and the save: recovered at
the claim's deadline, never sent twice.

A commit that a waited-for save starts first gathers (`GroupCommit.window`): while the
saves waited for arrive less than two windows apart (a moving average of their gaps),
it waits up to the window for the other savers' (`savers`, the send workers), and commits
as soon as each of them has one in. So when the workers' calls are short and the daemon is
busy, four claims share a commit instead of about two, and each commit (an fsync) costs
its share of the CPU once per four jobs; a daemon whose calls take longer than the window
(a real provider's hundreds of milliseconds) does not wait at all. Only the moment of the
commit moves: every claim is still durable before its own call (invariant 1), and a claim
whose commit failed is never called. bench/pipeline.py `--variant no-commit-window`.

When the shared transaction fails because another writer appended to one of the jobs
first, nothing of it was written and every job still holds its pending events
(`Ledger.save_jobs`), so each is saved again alone: the conflicting one fails as it would
have alone (its worker makes no call), the others are saved.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ledger.application import Ledger
    from ledger.job import SendJob


log = logging.getLogger("sendledger.engine")

#: The longest a commit waits for more saves to share it, in seconds (`GroupCommit`).
WINDOW = 0.002
#: A commit gathers only while the saves arrive, on average, less than this many windows
#: apart: more saves are then likely within the window.
GAP_LIMIT = 2
#: The weight of the newest gap in the moving average of the gaps between saves.
GAP_WEIGHT = 0.2

#: Told, after a `save_soon`, whether the save failed (the exception) or not (None).
Then = Callable[[BaseException | None], None]


@dataclass(eq=False)
class _Save:
    job: SendJob | None  # None: a flush, nothing of its own to write
    done: bool = False
    error: BaseException | None = None
    then: Then | None = None  # set for a save nobody waits for (`save_soon`)


class GroupCommit:
    def __init__(
        self,
        ledger: Ledger,
        *,
        defer: bool = True,
        savers: int = 1,
        window: float = WINDOW,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`savers`: how many threads may wait for a save at once (the send workers); a
        commit gathers only for more than one. `window`: the longest it gathers (0: never).
        `clock`: real seconds, for the gathering only."""
        self._ledger = ledger
        self._cond = threading.Condition()
        self._waiting: list[_Save] = []
        self._committing = False
        self.commits = 0  # transactions made, for tests and the bench
        #: False: `save_soon` saves at once (bench/pipeline.py --variant outcome-waited).
        self.defer = defer
        self.savers = savers
        #: 0: every commit starts at once (bench/pipeline.py --variant no-commit-window).
        self.window = window
        self._clock = clock
        self._gathering = False
        self._last_save: float | None = None  # when the last waited-for save arrived
        self._gap = math.inf  # the moving average of the gaps between them
        self.gathered = 0  # commits that waited for more saves, for tests and the bench

    def save(self, job: SendJob) -> None:
        """Append the job's pending events, with whatever else is waiting to be saved.
        Raises what `Ledger.save_job` would have (ConcurrentUpdate: another writer won)."""
        mine = _Save(job)
        self._join(mine)
        if mine.error is not None:
            raise mine.error

    def save_soon(self, job: SendJob, then: Then) -> None:
        """Append the job's pending events with the next commit, without waiting for it;
        `then(error)` runs once they are durable or failed (on the committing thread)."""
        if not self.defer:
            try:
                self.save(job)
            except Exception as exc:
                _tell(then, exc)
            else:
                _tell(then, None)
            return
        with self._cond:
            self._waiting.append(_Save(job, then=then))

    def flush(self) -> None:
        """Return once every save asked for before the call is durable or failed."""
        with self._cond:
            if not self._waiting and not self._committing:
                return
        self._join(_Save(None))

    def _join(self, mine: _Save) -> None:
        waited = mine.job is not None  # a save its caller waits for (not a flush)
        with self._cond:
            self._waiting.append(mine)
            if waited:
                self._arrived()
            while self._committing and not mine.done:
                self._cond.wait()
            if not mine.done:
                self._committing = True
                try:
                    if waited:
                        self._gather()
                except BaseException:  # an interrupt while gathering: nobody stays blocked
                    self._committing = False
                    self._cond.notify_all()
                    raise
                batch, self._waiting = self._waiting, []
        if not mine.done:
            try:
                self._commit(batch)
            finally:
                with self._cond:
                    self._committing = False
                    self._cond.notify_all()
            for save in batch:
                if save.then is not None:
                    _tell(save.then, save.error)

    def _arrived(self) -> None:
        """A waited-for save arrived (lock held): the gaps' average, and a gathering
        commit told."""
        now = self._clock()
        if self._last_save is not None:
            gap = now - self._last_save
            self._gap = gap if math.isinf(self._gap) else self._gap + GAP_WEIGHT * (gap - self._gap)
        self._last_save = now
        if self._gathering:
            self._cond.notify_all()

    def _gather(self) -> None:
        """Before a commit (lock held, `_committing` set, so that saves arriving now wait
        for it): while saves arrive less than `GAP_LIMIT` windows apart, wait up to the
        window until every saver has one in."""
        if self.savers <= 1 or self.window <= 0 or self._gap >= GAP_LIMIT * self.window:
            return
        end = self._clock() + self.window
        self._gathering = True
        try:
            while self._saves_in() < self.savers:
                left = end - self._clock()
                if left <= 0:
                    break
                self._cond.wait(left)
        finally:
            self._gathering = False
        self.gathered += 1

    def _saves_in(self) -> int:
        return sum(1 for save in self._waiting if save.job is not None and save.then is None)

    def _commit(self, batch: list[_Save]) -> None:
        saves = [save for save in batch if save.job is not None]
        try:
            if len(saves) == 1:
                self._ledger.save_job(_job(saves[0]))
            elif saves:
                self._ledger.save_jobs([_job(save) for save in saves])
        except BaseException as exc:
            if len(saves) == 1:
                saves[0].error = exc
            else:
                # Nothing was written: each alone, so one job's conflict fails only it.
                for save in saves:
                    try:
                        self._ledger.save_job(_job(save))
                    except BaseException as alone:
                        save.error = alone
        finally:
            if saves:
                self.commits += 1
            for save in batch:
                save.done = True


def _job(save: _Save) -> SendJob:
    assert save.job is not None, "flushes are filtered out before a commit"
    return save.job


def _tell(then: Then, error: BaseException | None) -> None:
    try:
        then(error)
    except Exception:  # a report must never break the commit that others wait for
        log.exception("reporting a saved outcome failed")
