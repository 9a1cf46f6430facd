"""The saves of a stopping daemon (daemon/engine/commit.py, docs/operations.md "Stopping"):
rows held by another session cost the stop one window of the store's lock wait, not one
per job.

`HeldRows` stands in for the ledger: every try of a save whose rows another session holds
waits one lock wait on an injected clock and fails, as PostgreSQL's `lock_timeout` does;
it counts the waits, so nothing here sleeps.
"""

from __future__ import annotations

import functools
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import cast

import pytest
from tests.unit.engine_rig import EngineRig, claimed_by, policy

from daemon.engine.commit import GroupCommit, LeftToRecovery
from daemon.engine.report import Counter
from daemon.engine.work import Work
from ledger.application import ConcurrentUpdate, Ledger
from ledger.job import SendJob
from ledger.stores.unchanged import Unchanged

LOCK_WAIT = 5.0
#: What the commit passes for its waits (`Ledger.save_job`'s keep_trying, connect_while).
Wait = Callable[[], bool] | None


class LockWaitedInVain(Exception):
    """What a try that waited its whole lock wait for a held row raises."""


class HeldRows:
    """A ledger whose rows of `held` keys another session holds; `conflicts`: keys another
    writer appended to (a batch holding one fails at once, as `Ledger.save_jobs` does);
    `free_after`: the session lets its rows go after that many lock waits."""

    def __init__(
        self,
        held: set[str],
        conflicts: frozenset[str] = frozenset(),
        free_after: int | None = None,
    ) -> None:
        self.held = held
        self.free_after = free_after
        self.conflicts = conflicts
        self.now = 0.0
        self.waits = 0
        self.saved: list[str] = []

    def clock(self) -> float:
        return self.now

    def save_job(
        self, job: SendJob, *, keep_trying: Wait = None, connect_while: Wait = None
    ) -> None:
        self._save([job], keep_trying)

    def save_jobs(
        self, jobs: Sequence[SendJob], *, keep_trying: Wait = None, connect_while: Wait = None
    ) -> None:
        self._save(list(jobs), keep_trying)

    def _save(self, jobs: list[SendJob], keep_trying: Callable[[], bool] | None) -> None:
        keys = {job.key for job in jobs}
        if keys & self.conflicts:
            raise ConcurrentUpdate("one of the jobs was changed by another writer")
        while keys & self.held:
            self.now += LOCK_WAIT
            self.waits += 1
            if self.waits == self.free_after:
                self.held.clear()
                break
            if keep_trying is None or not keep_trying():
                raise LockWaitedInVain(f"{sorted(keys & self.held)} held")
        self.saved.extend(sorted(keys))


@pytest.fixture
def jobs() -> Iterator[list[SendJob]]:
    rig = EngineRig(policy("receipts", on_unknown="retry"))
    for n in range(6):
        rig.submit("receipts", f"k{n}")
    yield [claimed_by(rig.ledger, f"k{n}", "me") for n in range(6)]
    rig.close()


def stopped_commits(store: HeldRows) -> GroupCommit:
    stopping = threading.Event()
    stopping.set()
    return GroupCommit(
        cast(Ledger, store),
        window=0,
        clock=store.clock,
        stopping=stopping,
        stop_wait=LOCK_WAIT,
    )


def outcomes_of(commits: GroupCommit, jobs: list[SendJob]) -> dict[str, BaseException | None]:
    told: dict[str, BaseException | None] = {}
    for job in jobs:
        commits.save_soon(job, functools.partial(told.__setitem__, job.key))
    commits.flush()
    return told


def test_a_failed_batch_at_a_stop_costs_one_lock_wait_not_one_per_held_row(
    jobs: list[SendJob],
) -> None:
    # Every row held: the batch waits once in vain; the jobs alone are not tried again
    # one lock wait each (before: 1 + 6 waits, 35 s of a 35 s stop_timeout).
    store = HeldRows({job.key for job in jobs})
    told = outcomes_of(stopped_commits(store), jobs)
    assert store.waits == 1 and store.now == LOCK_WAIT
    assert all(isinstance(error, LeftToRecovery) for error in told.values()), told


def test_the_jobs_alone_share_the_window_the_batch_began(jobs: list[SendJob]) -> None:
    # The batch fails at once (another writer took k0); each job is then saved alone, in
    # order, within the one window: k1's held row uses it up, the rest are left.
    store = HeldRows({"k1", "k2", "k3"}, conflicts=frozenset({"k0"}))
    told = outcomes_of(stopped_commits(store), jobs)
    assert store.waits == 1 and store.now == LOCK_WAIT
    assert isinstance(told["k0"], ConcurrentUpdate)
    assert isinstance(told["k1"], LockWaitedInVain)
    assert all(isinstance(told[f"k{n}"], LeftToRecovery) for n in (2, 3, 4, 5)), told


def test_a_save_that_waited_behind_another_commit_past_its_window_is_not_tried(
    jobs: list[SendJob],
) -> None:
    store = HeldRows({"k0"})
    commits = stopped_commits(store)
    told: list[BaseException | None] = []
    commits.save_soon(jobs[0], told.append)
    store.now += LOCK_WAIT  # the commit before it took the whole window
    commits.flush()
    assert store.waits == 0 and store.saved == []
    assert len(told) == 1 and isinstance(told[0], LeftToRecovery)


def test_a_running_daemon_keeps_trying_as_long_as_the_store_waits(
    jobs: list[SendJob],
) -> None:
    store = HeldRows({"k0"}, free_after=3)
    running = GroupCommit(
        cast(Ledger, store),
        window=0,
        clock=store.clock,
        stopping=threading.Event(),
        stop_wait=LOCK_WAIT,
    )
    assert outcomes_of(running, jobs[:2]) == {"k0": None, "k1": None}
    assert store.waits == 3 and sorted(store.saved) == ["k0", "k1"]


class HeldGuardedRows(HeldRows):
    """`HeldRows` for a save that holds to a record as read (`unchanged`), tried again
    without `keep_trying` as the ledger does: as long as the store waits (`STORE_WAIT`)."""

    STORE_WAIT = 12 * LOCK_WAIT

    def __init__(self, held: set[str]) -> None:
        super().__init__(held)
        self.unchanged: list[Unchanged | None] = []

    def save_job(
        self,
        job: SendJob,
        *,
        keep_trying: Wait = None,
        connect_while: Wait = None,
        unchanged: Unchanged | None = None,
    ) -> None:
        self.unchanged.append(unchanged)
        self._save([job], keep_trying or (lambda: self.now < self.STORE_WAIT))


def test_a_guarded_save_at_a_stop_keeps_the_stop_s_window(jobs: list[SendJob]) -> None:
    # A requeued job's claim, or the sweep's decision after a miss, holds to the handle
    # as read and is saved alone; at a stop it too waits one window, not the store's
    # whole wait (before: 12 lock waits, 60 s of a 35 s stop_timeout).
    store = HeldGuardedRows({"k0"})
    handle = Unchanged(uuid.uuid4(), 2)
    work = Work(jobs[0], None, None, jobs[0].modified_on, cast(Ledger, store), Counter(),
                commits=stopped_commits(store), unchanged=handle)  # fmt: skip
    with pytest.raises(LockWaitedInVain):
        work.save()
    assert store.waits == 1 and store.now == LOCK_WAIT
    assert store.unchanged == [handle] and store.saved == []
