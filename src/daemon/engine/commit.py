"""Group commit: the saves that several workers ask for at once, in one transaction.

A save is a commit, and a durable commit (SQLite's fsync, a PostgreSQL round trip and WAL
flush) costs far more than the events it writes. Each worker saves its own job as if alone
(`GroupCommit.save`, the same contract as `Ledger.save_job`); the first to arrive commits
every save that is waiting, and saves that arrive meanwhile wait for the next commit, which
the first of them makes. So one commit serves as many jobs as there are workers between
two commits, and no thread exists only to commit.

When the shared transaction fails because another writer appended to one of the jobs
first, nothing of it was written and every job still holds its pending events
(`Ledger.save_jobs`), so each is saved again alone: the conflicting one fails as it would
have alone (its worker makes no call), the others are saved.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from ledger.application import Ledger
from ledger.job import SendJob


@dataclass(eq=False)
class _Save:
    job: SendJob
    done: bool = False
    error: BaseException | None = None


class GroupCommit:
    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger
        self._cond = threading.Condition()
        self._waiting: list[_Save] = []
        self._committing = False
        self.commits = 0  # transactions made, for tests and the bench

    def save(self, job: SendJob) -> None:
        """Append the job's pending events, with whatever else is waiting to be saved.
        Raises what `Ledger.save_job` would have (ConcurrentUpdate: another writer won)."""
        mine = _Save(job)
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
        if mine.error is not None:
            raise mine.error

    def _commit(self, batch: list[_Save]) -> None:
        try:
            if len(batch) == 1:
                self._ledger.save_job(batch[0].job)
            else:
                self._ledger.save_jobs([save.job for save in batch])
        except BaseException as exc:
            if len(batch) == 1:
                batch[0].error = exc
            else:
                # Nothing was written: each alone, so one job's conflict fails only it.
                for save in batch:
                    try:
                        self._ledger.save_job(save.job)
                    except BaseException as alone:
                        save.error = alone
        finally:
            self.commits += 1
            for save in batch:
                save.done = True
