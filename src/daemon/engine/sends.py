"""The send workers: due jobs, taken by scope in turn, each by one worker from its claim to
its saved outcome (`Dispatch.dispatch`).

A tick only offers the keys of due jobs (`offer`) and returns. The workers load them (in
batches, one query), queue them per scope (a provider, or one mailbox of it where the quota
is per mailbox: `Provider.scope`) and take them in turn, one scope after the other, so no
scope's backlog starves another's. A job is taken only when its scope may send now: its
circuit is closed (or this job is its one probe, `circuit.py`) and the quota of its send
was reserved (`Provider.reserve_send`). So a mailbox out of quota, or a provider that is
down, holds no worker: the workers serve the other scopes, and a worker whose call hangs
holds only itself, until the provider's timeout. A worker that runs out of offered keys
asks for more itself (`refill`) instead of waiting for the next tick. While a scope is
held, every job of its queue that has waited longer than its channel's `give_up_after`
goes to review, wherever it stands in the queue; and a circuit that a hang opened is
probed with a ping (`Admit.PING`), the job staying queued.

docs/performance.md "Performance and scaling" and "Outages and quotas"; ``docs/architecture.md``
"Dispatch".
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime

from daemon.engine.circuit import Admit, Circuits
from daemon.engine.clock import Clock
from daemon.engine.runner import Work
from daemon.providers.base import Provider
from policies import decisions

log = logging.getLogger("sendledger.engine")

#: Keys one worker loads in one query.
LOAD_BATCH = 32
#: Keys one worker loads at least (when that many are offered): with many workers a
#: query per key or two cost more CPU than the rows it read (bench/pipeline.py (b)).
LOAD_MIN = 8
#: The longest a worker with nothing to do sleeps before it looks again.
IDLE_WAIT = 0.5
#: What a worker does before it sleeps when an outcome of its may wait for a commit.
_FLUSH = object()


@dataclass(eq=False)
class _Task:
    work: Work
    scope: str
    admit: Admit | None  # None: give up (waited longer than give_up_after)


class _Queue(deque[Work]):
    """One scope's due jobs, oldest first, and the soonest moment one of them will have
    waited longer than its channel's `give_up_after` (None: none will)."""

    give_up_at: datetime | None = None

    def add(self, work: Work) -> None:
        self.append(work)
        at = _give_up_time(work)
        if at is not None and (self.give_up_at is None or at < self.give_up_at):
            self.give_up_at = at

    def take_given_up(self, now: datetime) -> Work | None:
        """The first job that waited too long by `now`, out of the queue; None."""
        if self.give_up_at is None or now < self.give_up_at:
            return None
        found = next((w for w in self if _waited_too_long(w, now)), None)
        if found is not None:
            self.remove(found)
        times = [at for w in self if (at := _give_up_time(w)) is not None]
        self.give_up_at = min(times, default=None)
        return found


class SendWorkers:
    def __init__(
        self,
        *,
        workers: int,
        load: Callable[[list[str]], list[Work]],
        dispatch: Callable[[Work, bool], object],
        give_up: Callable[[Work], None],
        ping: Callable[[Provider, str], None],
        refill: Callable[[], None],
        flush: Callable[[], None],
        circuits: Circuits,
        clock: Clock,
        max_queued: int,
        name: str = "",
        may_send: Callable[[Work, datetime], bool] | None = None,
    ) -> None:
        """`may_send(work, now)`: whether this daemon may call for the job's scope now
        (it owns it, `owners.py`); the scope's queued jobs are dropped when it may not."""
        self._load = load
        self._may_send = may_send
        self._dispatch = dispatch
        self._give_up = give_up
        self._ping = ping
        self._refill = refill
        self._flush = flush
        self._circuits = circuits
        self._clock = clock
        self._max_queued = max_queued
        # Workers wait on `_cond`, `drain` on `_drained`; one lock. A worker that goes
        # idle wakes only a drain: waking the other idle workers made them wake each
        # other in turn for as long as they were idle (a core's worth of CPU, and the
        # interpreter lock taken from the busy workers).
        lock = threading.RLock()
        self._cond = threading.Condition(lock)
        self._drained = threading.Condition(lock)
        self._intake: deque[str] = deque()
        self._known: set[str] = set()  # offered, queued or running
        self._queues: dict[str, _Queue] = {}
        self._turns: deque[str] = deque()  # scopes in the order they are served
        self._loading = 0
        self._running = 0
        self._idle: dict[int, int] = {}  # worker -> the generation it found nothing in
        self._generation = 0
        self._more = False  # the last offer was cut short: more may be due
        self._refilling = False
        self._closing = False
        self._crashed: BaseException | None = None
        self._threads = [
            # Named after the daemon too: two engines in one process (tests) are told apart.
            threading.Thread(
                target=self._serve,
                args=(n,),
                name=f"send-{n}@{name}" if name else f"send-{n}",
                daemon=True,
            )
            for n in range(max(workers, 1))
        ]
        for thread in self._threads:
            thread.start()

    # -- what the tick does -------------------------------------------------------------

    def known(self) -> int:
        with self._cond:
            return len(self._known)

    def running(self) -> int:
        """Jobs a worker is sending now (what a stopping daemon waits for)."""
        with self._cond:
            return self._running

    def waiting(self, scope: str) -> int:
        """Due jobs of `scope` queued for their send: a bounce read of that mailbox waits
        until there are none (docs/how-it-works.md "Bounces")."""
        with self._cond:
            queue = self._queues.get(scope)
            return 0 if queue is None else len(queue)

    def offer(self, keys: Iterable[str], *, more: bool = False) -> int:
        """Keys of due jobs (soonest first); those already known are skipped. `more`:
        the store has more due than were read. How many were new."""
        added = 0
        with self._cond:
            for key in keys:
                if len(self._known) >= self._max_queued:
                    more = False  # enough in memory: the rest wait for a later offer
                    break
                if key not in self._known:
                    self._known.add(key)
                    self._intake.append(key)
                    added += 1
            self._more = more and added > 0
            self._changed()
        return added

    def drain(self, busy: Callable[[], int] = lambda: 0, timeout: float | None = None) -> bool:
        """Wait until no worker has anything it could do now, with at most `busy()` calls
        still running (those hanging on purpose in tests). False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            self._changed()  # time may have moved on: every worker looks again
            while not (settled := self._settled(busy())):
                if deadline is not None and time.monotonic() >= deadline:
                    break
                self._drained.wait(0.05)  # `busy()` can change without a notification
            crashed, self._crashed = self._crashed, None
        if crashed is not None:
            raise crashed
        return settled

    def close(self) -> None:
        """Let the running jobs finish (their calls and saves), take no more, stop."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        for thread in self._threads:
            thread.join()

    # -- the workers --------------------------------------------------------------------

    def _settled(self, busy: int) -> bool:
        # A worker that found nothing to do since the last change would have taken any
        # offered key; keys are left only when every worker is busy (hung, in tests).
        return (
            not self._loading
            and not self._refilling
            and self._running <= busy
            and len(self._idle) + self._running >= len(self._threads)
            and all(seen == self._generation for seen in self._idle.values())
        )

    def _changed(self) -> None:
        # Caller holds the lock.
        self._generation += 1
        self._cond.notify_all()
        self._drained.notify_all()

    def _serve(self, me: int) -> None:
        owes = False  # a job's outcome may still wait for a commit (`commit.py`)
        while True:
            with self._cond:
                step = self._next(me, owes)
            if step is None or step is _FLUSH:
                self._flush_now()
                owes = False
                if step is None:
                    return
            elif isinstance(step, list):
                self._queue(step)
            elif isinstance(step, _Task):
                self._run(step)
                owes = True
            else:
                self._refill_now()

    def _next(self, me: int, owes: bool) -> list[str] | _Task | bool | object | None:
        """What this worker does next (lock held): keys to load, a job, True to refill,
        `_FLUSH` before it would sleep with an outcome unsaved (`owes`), None to stop.
        Sleeps while there is nothing."""
        while not self._closing:
            if self._intake:
                self._idle.pop(me, None)
                count = min(LOAD_BATCH, max(LOAD_MIN, len(self._intake) // len(self._threads)))
                self._loading += 1
                return [self._intake.popleft() for _ in range(min(count, len(self._intake)))]
            task, wait = self._pick()
            if task is not None:
                self._idle.pop(me, None)
                self._running += 1
                return task
            if self._more and not self._refilling:
                self._idle.pop(me, None)
                self._refilling = True
                self._more = False
                return True
            if owes:
                self._idle.pop(me, None)
                return _FLUSH
            self._idle[me] = self._generation
            self._drained.notify_all()  # a drain may be waiting for this
            self._cond.wait(min(wait, IDLE_WAIT))
        return None

    def _pick(self) -> tuple[_Task | None, float]:
        """The next job of the first scope in turn that may send now (lock held), and
        otherwise how long until one might."""
        now = self._clock()
        wait = IDLE_WAIT
        for _ in range(len(self._turns)):
            scope = self._turns[0]
            self._turns.rotate(-1)
            queue = self._queues.get(scope)
            if not queue:
                self._turns.remove(scope)
                self._queues.pop(scope, None)
                continue
            work = queue[0]
            provider = work.provider
            if provider is None:  # no provider: dispatch says why (review, or an error)
                queue.popleft()
                return _Task(work, scope, Admit.GO), 0.0
            if self._may_send is not None and not self._may_send(work, now):
                # Another daemon's scope now (or soon): its jobs are not ours to send.
                self._known.difference_update(w.job.key for w in queue)
                self._queues.pop(scope, None)
                self._turns.remove(scope)
                continue
            admit = self._circuits.admit(scope, now)
            if admit is Admit.HOLD:
                given_up = queue.take_given_up(now)
                if given_up is not None:
                    return _Task(given_up, scope, None), 0.0
                probe_at = self._circuits.next_probe(scope)
                if probe_at is not None:
                    wait = min(wait, max((probe_at - now).total_seconds(), 0.001))
                elif queue.give_up_at is not None:
                    wait = min(wait, max((queue.give_up_at - now).total_seconds(), 0.001))
                continue
            if admit is Admit.PING:
                return _Task(work, scope, admit), 0.0  # the job stays queued
            reserved = provider.reserve_send()
            if reserved > 0.0:
                if admit is Admit.PROBE:
                    self._circuits.probe_returned(scope)
                wait = min(wait, reserved)
                continue
            queue.popleft()
            return _Task(work, scope, admit), 0.0
        return None, wait

    def _queue(self, keys: list[str]) -> None:
        try:
            works = self._load(keys)
        except Exception:
            log.exception("could not load %d due jobs", len(keys))
            works = []
        scoped = [(w, "" if w.provider is None else w.provider.scope()) for w in works]
        with self._cond:
            self._loading -= 1
            loaded = {w.job.key for w, _ in scoped}
            self._known.difference_update(k for k in keys if k not in loaded)
            for work, scope in scoped:
                queue = self._queues.get(scope)
                if queue is None:
                    queue = self._queues[scope] = _Queue()
                    self._turns.append(scope)
                queue.add(work)
            self._changed()

    def _run(self, task: _Task) -> None:
        if task.admit is Admit.PING:
            self._run_ping(task)
            return
        try:
            if task.admit is None:
                self._give_up(task.work)
            else:
                self._dispatch(task.work, task.admit is Admit.PROBE)
        except Exception:  # the dispatch guards its own; this keeps the worker alive
            log.exception("job %s: send worker failed", task.work.job.key)
        except BaseException as exc:
            # A simulated crash (tests) or an interpreter exit: the job's claim is left to
            # recovery, as after a real one, and `drain` raises it in the caller.
            with self._cond:
                self._crashed = exc
        finally:
            with self._cond:
                self._running -= 1
                self._known.discard(task.work.job.key)
                self._changed()

    def _run_ping(self, task: _Task) -> None:
        provider = task.work.provider
        try:
            if provider is not None:
                self._ping(provider, task.scope)
        except Exception:
            log.exception("scope %s: ping failed", task.scope)
        finally:
            with self._cond:
                self._running -= 1
                self._changed()

    def _flush_now(self) -> None:
        try:
            self._flush()
        except Exception:
            log.exception("could not save the outcomes left to the next commit")

    def _refill_now(self) -> None:
        try:
            self._refill()
        except Exception:
            log.exception("could not read the due jobs")
        finally:
            with self._cond:
                self._refilling = False
                self._changed()


def _waiting_since(work: Work) -> datetime | None:
    return work.job.unavailable_since or work.job.due_at


def _give_up_time(work: Work) -> datetime | None:
    since = _waiting_since(work)
    if work.policy is None or since is None:
        return None
    return decisions.give_up_time(work.policy, waiting_since=since)


def _waited_too_long(work: Work, now: datetime) -> bool:
    since = _waiting_since(work)
    if work.policy is None or since is None:
        return False
    return decisions.waited_too_long(work.policy, waiting_since=since, now=now) is not None
