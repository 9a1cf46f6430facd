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

A commit that a waited-for save starts first gathers (`GroupCommit.window`, 2 ms), in one
of two ways, by what is scarce:

- With cores to spare (the load average at most the CPUs this process may use), it waits
  only for the claims on their way - those of the workers that took a job and are deciding
  and rendering it (`GroupCommit.coming`), a fraction of a millisecond from their save -
  and commits as soon as none is left on its way. Workers in a provider call are not
  waited for: on a quiet machine waiting for them held every worker in step with the
  slowest, and cost jobs/s and CPU per job against no gathering at all.
- On a machine busier than its cores, CPU is what is scarce and a commit fewer is CPU
  saved (docs/performance.md "Commits per job"): while the saves arrive less than two
  windows apart on average, it waits until every send worker (`savers`) has its claim in.

Only the moment of the commit moves: every claim is still durable before its own call
(invariant 1), and a claim whose commit failed is never called. bench/pipeline.py
`--variant no-commit-window`, `gather-all`, `gather-on-the-way`.

When the shared transaction fails because another writer appended to one of the jobs
first, nothing of it was written and every job still holds its pending events
(`Ledger.save_jobs`), so each is saved again alone: the conflicting one fails as it would
have alone (its worker makes no call), the others are saved.

A stopping daemon (`stopping` set) gives each save one window, `stop_wait` (one `[store]
lock_timeout`), from when it was asked or from the stop if it was asked before: a try of
it begins only within that window. A job's row held by another session (a long
transaction, an open psql) would otherwise hold the save for the store's minute, past
`daemon.stop_timeout`, and the stop would then end at once with every other worker's
outcome unsaved. The window is shared: a batch whose commit failed is saved job by job
only within its jobs' windows, not one lock wait each (n held rows cost one window, not
n), and a save that waited behind another commit until its window passed is not tried
(`LeftToRecovery`). So the saves of a stop end within two lock waits of the last one
asked, whatever their number: the window, and the lock wait of a try begun at its end
(docs/operations.md "Stopping"). A wait for a pooled connection begun once the daemon
stops ends with the window too (`Withdrawn`). An outcome not saved by then is as after a
crash: the claim's deadline stands and recovery takes it (docs/architecture.md "Leases").
"""

from __future__ import annotations

import enum
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypedDict

from ledger.exceptions import SendledgerError, known

if TYPE_CHECKING:
    from ledger.application import Ledger
    from ledger.job import SendJob
    from ledger.stores.unchanged import Unchanged


log = logging.getLogger("sendledger.engine")

#: The longest a commit waits for the claims on their way to share it, in seconds
#: (`GroupCommit`): a claim on its way is a fraction of a millisecond of CPU from its save,
#: more only when its worker is kept off the CPU.
WINDOW = 0.002
#: A commit waits for every saver only while the saves arrive, on average, less than this
#: many windows apart: more are then likely within the window.
GAP_LIMIT = 2
#: The weight of the newest gap in the moving average of the gaps between saves.
GAP_WEIGHT = 0.2
#: How long the machine's load, once read, is taken as it was (seconds).
LOAD_FOR = 1.0

#: Told, after a `save_soon`, whether the save failed (the exception) or not (None).
Then = Callable[[BaseException | None], None]


class LeftToRecovery(SendledgerError):
    """A save of a stopping daemon not tried: its window passed (the module's last
    paragraph). Its job is as after a crash: recovered at its claim's deadline."""


class _Awaits(enum.Enum):
    """What a gathering commit waits for (`GroupCommit._gather`)."""

    EVERY = "every saver's claim"
    COMING = "the claims on their way"


@dataclass(eq=False)
class _Save:
    job: SendJob | None  # None: a flush, nothing of its own to write
    done: bool = False
    error: BaseException | None = None
    then: Then | None = None  # set for a save nobody waits for (`save_soon`)
    asked: float = -math.inf  # the clock when it was asked (`GroupCommit._clock`)


class GroupCommit:
    def __init__(
        self,
        ledger: Ledger,
        *,
        defer: bool = True,
        savers: int = 1,
        window: float = WINDOW,
        clock: Callable[[], float] = time.monotonic,
        busy: Callable[[], bool] | None = None,
        stopping: threading.Event | None = None,
        stop_wait: float = 0.0,
    ) -> None:
        """`savers`: how many threads may wait for a save at once (the send workers).
        `window`: the longest a commit gathers (0: never). `clock`: real seconds, for the
        gathering and the stop's windows. `busy`: whether the machine is busier than its
        cores (default: `machine_busy`, read at most once a `LOAD_FOR`). `stopping`: set
        once the daemon stops; a save is then tried only within `stop_wait` seconds of
        when it was asked, or of the stop (the module's last paragraph)."""
        self._ledger = ledger
        self._stopping = stopping
        self.stop_wait = stop_wait
        #: When this commit first saw `stopping` set (`_clock`): the window of a save asked
        #: before the stop starts then. Under `_lock`.
        self._stopped_at: float | None = None
        # One lock: the savers wait on `_cond` for their commit, a gathering commit on
        # `_arrivals` for the claims on their way (an arrival wakes only it).
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._arrivals = threading.Condition(self._lock)
        self._waiting: list[_Save] = []
        self._committing = False
        self.commits = 0  # transactions made, for tests and the bench
        #: False: `save_soon` saves at once (bench/pipeline.py --variant outcome-waited).
        self.defer = defer
        #: 0: every commit starts at once (bench/pipeline.py --variant no-commit-window).
        self.window = window
        self._clock = clock
        self.savers = savers
        #: Whether CPU is scarce: a commit then gathers every saver's claim, not only those
        #: on their way (bench/pipeline.py --variant gather-all, gather-on-the-way).
        self.busy = busy if busy is not None else _LoadWatch(clock)
        #: What a gathering commit waits on `_arrivals` for (under `_lock`): every saver's
        #: claim, the claims on their way, or nothing (no commit gathering).
        self._gathering: _Awaits | None = None
        self._last_save: float | None = None  # when the last waited-for save arrived
        self._gap = math.inf  # the moving average of the gaps between them
        self._coming = 0  # claims on their way (`coming`), not yet saved
        self._local = threading.local()  # `.coming`: this thread's claim is on its way
        self.gathered = 0  # commits that waited for claims on their way, for tests and the bench

    @contextmanager
    def coming(self) -> Iterator[None]:
        """Around a worker's work on one job, from taking it to its claim's save: while
        its claim is on its way, a commit may wait for it (up to the window). The first
        waited-for save in the block is the claim; a job left without one (not sent now,
        or a draft step that raised) is no longer waited for when the block ends, nor one
        whose worker flushes before a provider call (`flush`)."""
        with self._lock:
            self._coming += 1
        self._local.coming = True
        try:
            yield
        finally:
            if self._local.coming:
                self._local.coming = False
                with self._lock:
                    self._gone()

    def save(self, job: SendJob) -> None:
        """Append the job's pending events, with whatever else is waiting to be saved.
        Raises what `Ledger.save_job` would have (ConcurrentUpdate: another writer won)."""
        with self._lock:
            mine = _Save(job, asked=self._asked())
        self._join(mine)
        if mine.error is not None:
            raise mine.error

    def save_alone(self, job: SendJob, unchanged: Unchanged) -> None:
        """`save` for a save that holds to a record as read (`Ledger.save_job`'s
        `unchanged`): in a transaction of its own, so that no other job's save is
        withdrawn with it, once what waits for a commit is durable; within the limits a
        commit's save keeps (`_may_begin`, `_waits`): once the daemon stops, begun and
        tried again only within its window, as any other save."""
        with self._lock:
            mine = _Save(job, asked=self._asked())
        self.flush()
        if not self._may_begin(mine):
            raise known(mine.error, "a save left out is failed by _may_begin")
        self._ledger.save_job(job, unchanged=unchanged, **self._waits([mine]))

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
        with self._lock:
            self._waiting.append(_Save(job, then=then, asked=self._asked()))

    def flush(self) -> None:
        """Return once every save asked for before the call is durable or failed. A worker
        flushes before a provider call that may take its whole timeout (a draft step, a
        history mark's fetch): its claim is then no longer on its way."""
        with self._lock:
            if getattr(self._local, "coming", False):
                self._local.coming = False
                self._gone()
            if not self._waiting and not self._committing:
                return
        self._join(_Save(None))

    def _join(self, mine: _Save) -> None:
        waited = mine.job is not None  # a save its caller waits for (not a flush)
        with self._lock:
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
                with self._lock:
                    self._committing = False
                    self._cond.notify_all()
            for save in batch:
                if save.then is not None:
                    _tell(save.then, save.error)

    def _arrived(self) -> None:
        """A waited-for save arrived (lock held): the gaps' average; if it is its thread's
        claim on its way, that claim is no longer awaited; a commit gathering every
        saver's claim told once it has them all."""
        now = self._clock()
        if self._last_save is not None:
            gap = now - self._last_save
            self._gap = gap if math.isinf(self._gap) else self._gap + GAP_WEIGHT * (gap - self._gap)
        self._last_save = now
        if getattr(self._local, "coming", False):
            self._local.coming = False
            self._gone()
        # Woken only when it may commit: each wake-up is a thread switch (and a hand-off
        # of the interpreter lock) that finds nothing to do otherwise.
        if self._gathering is _Awaits.EVERY and self._gathered(_Awaits.EVERY):
            self._arrivals.notify()

    def _gone(self) -> None:
        """A claim is no longer on its way (lock held): saved, or none made."""
        self._coming -= 1
        if self._coming == 0 and self._gathering is _Awaits.COMING:
            self._arrivals.notify()

    def _gather(self) -> None:
        """Before a commit (lock held, `_committing` set, so that saves arriving now wait
        for it): wait, up to the window, until every saver has its claim in (a busy
        machine, saves close together) or else until no claim is on its way."""
        if self.window <= 0:
            return
        every = self.savers > 1 and self._gap < GAP_LIMIT * self.window and self.busy()
        if not every and self._coming <= 0:
            return
        awaits = _Awaits.EVERY if every else _Awaits.COMING
        end = self._clock() + self.window
        self._gathering = awaits
        try:
            while not self._gathered(awaits):
                left = end - self._clock()
                if left <= 0:
                    break
                self._arrivals.wait(left)
        finally:
            self._gathering = None
        self.gathered += 1

    def _gathered(self, awaits: _Awaits) -> bool:
        if awaits is _Awaits.EVERY:
            claims = sum(1 for s in self._waiting if s.job is not None and s.then is None)
            return claims >= self.savers
        return self._coming <= 0

    def _commit(self, batch: list[_Save]) -> None:
        saves = [save for save in batch if save.job is not None and self._may_begin(save)]
        tried = bool(saves)
        try:
            if len(saves) == 1:
                self._ledger.save_job(_job(saves[0]), **self._waits(saves))
            elif saves:
                self._ledger.save_jobs([_job(save) for save in saves], **self._waits(saves))
        except BaseException as exc:
            if len(saves) == 1:
                saves[0].error = exc
            else:
                # Nothing was written: each alone, so one job's conflict fails only it;
                # at a stop, within the window the batch's try already used.
                for save in saves:
                    if not self._may_begin(save):
                        continue
                    try:
                        self._ledger.save_job(_job(save), **self._waits([save]))
                    except BaseException as alone:
                        save.error = alone
        finally:
            if tried:
                self.commits += 1
            for save in batch:
                save.done = True

    def _may_begin(self, save: _Save) -> bool:
        """Whether a try of `save` may begin now: always while the daemon runs; once it
        stops, within the save's window. A save left out is failed here (`LeftToRecovery`)."""
        if self._within_window(save):
            return True
        if save.error is None:
            save.error = LeftToRecovery(
                f"not saved: the daemon is stopping and its {self.stop_wait:g}s for the "
                "store passed; recovered at its claim's deadline"
            )
        return False

    def _within_window(self, save: _Save) -> bool:
        stopping = self._stopping
        if stopping is None or not stopping.is_set():
            return True
        with self._lock:
            now = self._asked()
            assert self._stopped_at is not None, "noted by _asked"
            opened = max(save.asked, self._stopped_at)
        return now - opened < self.stop_wait

    def _asked(self) -> float:
        """The clock now (lock held), the stop's time noted if it is the first seen."""
        now = self._clock()
        if self._stopped_at is None and self._stopping is not None and self._stopping.is_set():
            self._stopped_at = now
        return now

    def _waits(self, saves: list[_Save]) -> _Waits:
        """How long a save of `saves` waits, as `Ledger.save_job`'s arguments: whether it
        tries again after a lock wait in vain (`keep_trying`: while the daemon runs, as
        long as the store waits; once it stops, while the window of one of them is open)
        and, once the daemon stops, whether it still waits for a pooled connection
        (`connect_while`: within the same windows; while it runs, as long as the pool
        waits, in its place in the pool's queue)."""
        stopping = self._stopping
        if stopping is None:
            return {"keep_trying": None, "connect_while": None}

        def within() -> bool:
            return any(self._within_window(save) for save in saves)

        return {"keep_trying": within, "connect_while": within if stopping.is_set() else None}


class _Waits(TypedDict):
    """`Ledger.save_job`'s and `save_jobs`' arguments of how long a save waits."""

    keep_trying: Callable[[], bool] | None
    connect_while: Callable[[], bool] | None


def _job(save: _Save) -> SendJob:
    return known(save.job, "flushes are filtered out before a commit")


def _tell(then: Then, error: BaseException | None) -> None:
    try:
        then(error)
    except Exception:  # a report must never break the commit that others wait for
        log.exception("reporting a saved outcome failed")


class _LoadWatch:
    """`machine_busy`, read at most once a `LOAD_FOR` of `clock` (a commit asks each time)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._until = -math.inf
        self._busy = False

    def __call__(self) -> bool:
        now = self._clock()
        if now >= self._until:
            self._busy = machine_busy()
            self._until = now + LOAD_FOR
        return self._busy


def machine_busy() -> bool:
    """Whether the machine's load average over the last minute exceeds the CPUs this
    process may run on: its threads then wait for a core, and CPU is what is scarce."""
    try:
        load = os.getloadavg()[0]
    except OSError:  # not known here: as on a machine with cores to spare
        return False
    return load > _cpus()


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1
