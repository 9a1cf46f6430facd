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

When the shared transaction fails because another writer appended to one of the jobs
first, nothing of it was written and every job still holds its pending events
(`Ledger.save_jobs`), so each is saved again alone: the conflicting one fails as it would
have alone (its worker makes no call), the others are saved.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ledger.application import Ledger
    from ledger.job import SendJob


log = logging.getLogger("sendledger.engine")

#: Told, after a `save_soon`, whether the save failed (the exception) or not (None).
Then = Callable[[BaseException | None], None]


@dataclass(eq=False)
class _Save:
    job: SendJob | None  # None: a flush, nothing of its own to write
    done: bool = False
    error: BaseException | None = None
    then: Then | None = None  # set for a save nobody waits for (`save_soon`)


class GroupCommit:
    def __init__(self, ledger: Ledger, *, defer: bool = True) -> None:
        self._ledger = ledger
        self._cond = threading.Condition()
        self._waiting: list[_Save] = []
        self._committing = False
        self.commits = 0  # transactions made, for tests and the bench
        #: False: `save_soon` saves at once (bench/pipeline.py --variant outcome-waited).
        self.defer = defer

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
        with self._cond:
            self._waiting.append(mine)
            while self._committing and not mine.done:
                self._cond.wait()
            if not mine.done:
                batch, self._waiting = self._waiting, []
                self._committing = True
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
