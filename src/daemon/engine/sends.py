"""The send workers: due jobs, taken by scope in turn, each by one worker from its claim to
its saved outcome (`Dispatch.dispatch`).

A tick only offers the keys of due jobs (`refill`) and returns. Each worker runs one loop
(`SendWorkers._serve`), which reads top to bottom:

1. keys offered: load them (a batch, one query) and queue them per scope;
2. else a job whose scope may send now: send it, its outcome left to the next commit;
3. else the last offer was cut short: read more due keys itself (`refill`), instead of
   waiting for the next tick;
4. else an outcome of its sends still waits for a commit: save it (`commit.py`), so none
   waits in memory while the worker sleeps;
5. else sleep until something changes.

Each "take" is decided under the workers' lock, the work itself done outside it by
`SendSteps`, which the engine builds: load, send, give up, ping, read due keys, flush. The
workers call nothing of the tick; what they read of the engine's state, the scopes this
daemon works for, is a holder the tick updates each round (`owners.OurScopes`).

A scope is a provider, or one mailbox of it where the quota is per mailbox
(`Provider.scope`); the workers take the scopes in turn, one after the other, so no
scope's backlog starves another's. A job is taken only when its scope may send now: its
circuit is closed (or this job is its one probe, `circuit.py`) and the quota of its send
was reserved (`Provider.reserve_send`). So a mailbox out of quota, or a provider that is
down, holds no worker: the workers serve the other scopes, and a worker whose call hangs
holds only itself, until the provider's timeout. While a scope is held, every job of its
queue that has waited longer than its channel's `give_up_after` goes to review, wherever
it stands in the queue; and a circuit that a hang opened is probed with a ping
(`Admit.PING`), the job staying queued.

docs/performance.md "Performance and scaling" and "Outages and quotas";
docs/architecture.md "The life of one job, file by file" (steps 3 and 4).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import TYPE_CHECKING

from daemon.engine.circuit import PING, Admit, Circuits
from daemon.engine.clock import Clock
from daemon.engine.commit import GroupCommit
from daemon.engine.owners import OurScopes
from daemon.engine.report import Counter
from daemon.engine.work import Work
from daemon.providers.base import Provider, ProviderError
from ledger.application import Ledger
from ledger.vocabulary import JobState
from policies import decisions

if TYPE_CHECKING:
    from daemon.engine.dispatch import Dispatch
    from daemon.engine.runner import StepRunner

log = logging.getLogger("sendledger.engine")

#: Keys one worker loads in one query.
LOAD_BATCH = 32
#: Keys one worker loads at least (when that many are offered): with many workers a
#: query per key or two cost more CPU than the rows it read (bench/pipeline.py (b)).
LOAD_MIN = 8
#: The longest a worker with nothing to do sleeps before it looks again.
IDLE_WAIT = 0.5


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
        steps: SendSteps,
        *,
        workers: int,
        batch: int,
        circuits: Circuits,
        clock: Clock,
        max_queued: int,
        name: str = "",
    ) -> None:
        """`steps`: what a worker does to the jobs it takes; `batch`: how many due keys
        past the known ones a read (`refill`) asks for."""
        self._steps = steps
        self._batch = batch
        self._circuits = circuits
        self._clock = clock
        self._max_queued = max_queued
        # Workers wait on `_cond`, `drain` on `_drained`; one lock. A worker that goes
        # idle wakes only a drain: waking the other idle workers made them wake each
        # other in turn for as long as they were idle (a core's worth of CPU, and the
        # interpreter lock taken from the busy workers).
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._drained = threading.Condition(self._lock)
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
        # Set by `_pick` when it finds no job: how long until a held scope may send.
        self._look_again = IDLE_WAIT
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

    def refill(self) -> None:
        """Offer the next due jobs, read past the ones already known: the tick's offer,
        and a worker's that ran out of offered keys while more were due."""
        limit = self._batch + self.known()
        keys = self._steps.due(limit)
        if keys is not None:
            self.offer(keys, more=len(keys) >= limit)

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
        # Caller holds the lock. Only the workers are woken: a drain can be satisfied
        # only once every worker has looked since this change and found nothing, and
        # each such look ends in `_sleep`, which wakes the drain. Waking the drain here
        # too cost it a wake-up and a look per job sent.
        self._generation += 1
        self._cond.notify_all()

    def _serve(self, me: int) -> None:
        """One worker: load offered keys, else send a job whose scope may send, else read
        more due keys, else save what its sends left to the next commit, else sleep. It
        looks and sleeps in one hold of the lock, so nothing offered after a look that
        found nothing goes unseen; it lets the lock go for the work itself."""
        owes = False  # an outcome of its sends may still wait for a commit (`commit.py`)
        with self._cond:
            while not self._closing:
                if keys := self._take_keys(me):
                    with self._unlocked():
                        self._load(keys)
                elif task := self._take_job(me):
                    with self._unlocked():
                        self._run(task)
                    owes = True
                elif self._take_refill(me):
                    with self._unlocked():
                        self._read_more()
                elif owes:  # before it sleeps: no outcome waits in memory meanwhile
                    with self._unlocked():
                        self._flush()
                    owes = False
                else:
                    self._sleep(me)
        self._flush()

    @contextmanager
    def _unlocked(self) -> Iterator[None]:
        # `_serve` holds the lock once: let go of it while the work runs.
        self._lock.release()
        try:
            yield
        finally:
            self._lock.acquire()

    def _take_keys(self, me: int) -> list[str]:
        """Offered keys for this worker to load, a share of them (lock held); none when
        none are offered."""
        if not self._intake:
            return []
        self._idle.pop(me, None)
        count = min(LOAD_BATCH, max(LOAD_MIN, len(self._intake) // len(self._threads)))
        self._loading += 1
        return [self._intake.popleft() for _ in range(min(count, len(self._intake)))]

    def _take_job(self, me: int) -> _Task | None:
        """The next job whose scope may send now (lock held), counted as running."""
        task = self._pick()
        if task is not None:
            self._idle.pop(me, None)
            self._running += 1
        return task

    def _take_refill(self, me: int) -> bool:
        """Whether this worker reads more due keys (lock held): the last offer was cut
        short, and no other worker is reading them."""
        if not self._more or self._refilling:
            return False
        self._idle.pop(me, None)
        self._refilling = True
        self._more = False
        return True

    def _sleep(self, me: int) -> None:
        """Nothing to do (lock held): idle until something changes, a held scope may send
        (`_pick`), or the idle wait has passed."""
        self._idle[me] = self._generation
        self._drained.notify_all()  # a drain may be waiting for this
        self._cond.wait(min(self._look_again, IDLE_WAIT))

    def _pick(self) -> _Task | None:
        """The next job of the first scope in turn that may send now (lock held); None,
        with `_look_again` set to how long until one might."""
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
                return _Task(work, scope, Admit.GO)
            if not self._steps.may_send(work, now):
                # Another daemon's scope now (or soon): its jobs are not ours to send.
                self._known.difference_update(w.job.key for w in queue)
                self._queues.pop(scope, None)
                self._turns.remove(scope)
                continue
            admit = self._circuits.admit(scope, now)
            if admit is Admit.HOLD:
                given_up = queue.take_given_up(now)
                if given_up is not None:
                    return _Task(given_up, scope, None)
                probe_at = self._circuits.next_probe(scope)
                if probe_at is not None:
                    wait = min(wait, max((probe_at - now).total_seconds(), 0.001))
                elif queue.give_up_at is not None:
                    wait = min(wait, max((queue.give_up_at - now).total_seconds(), 0.001))
                continue
            if admit is Admit.PING:
                return _Task(work, scope, admit)  # the job stays queued
            reserved = provider.reserve_send()
            if reserved > 0.0:
                if admit is Admit.PROBE:
                    self._circuits.probe_returned(scope)
                wait = min(wait, reserved)
                continue
            queue.popleft()
            return _Task(work, scope, admit)
        self._look_again = wait
        return None

    def _load(self, keys: list[str]) -> None:
        """The keys' jobs loaded and queued, each under its scope."""
        try:
            works = self._steps.load(keys)
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
                self._steps.give_up(task.work)
            else:
                self._steps.send(task.work, task.admit is Admit.PROBE)
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
                # A ping probes a hang and may take its provider's whole timeout: the
                # outcomes this worker left to the next commit are saved first, or their
                # claims, no longer renewed, could lapse meanwhile (another daemon would
                # record them Unknown, and a confirmation would be lost).
                self._flush()
                if self._steps.may_send(task.work, self._clock()):
                    self._steps.ping(provider, task.scope)
                else:
                    # The save may have taken a while, and the scope gone to another
                    # daemon meanwhile: no call for it; the probe is handed back.
                    self._circuits.probe_returned(task.scope)
        except Exception:
            log.exception("scope %s: ping failed", task.scope)
        finally:
            with self._cond:
                self._running -= 1
                self._changed()

    def _flush(self) -> None:
        try:
            self._steps.flush()
        except Exception:
            log.exception("could not save the outcomes left to the next commit")

    def _read_more(self) -> None:
        try:
            self.refill()
        except Exception:
            log.exception("could not read the due jobs")
        finally:
            with self._cond:
                self._refilling = False
                self._changed()


class SendSteps:
    """What a send worker does to the jobs it takes, one method a step. The engine builds
    it from its own parts (the step runner, the dispatch, the circuits, the group commit)
    and the scopes it works for; the workers decide when each step runs."""

    def __init__(
        self,
        ledger: Ledger,
        runner: StepRunner,
        dispatch: Dispatch,
        *,
        circuits: Circuits,
        commits: GroupCommit,
        counter: Counter,
        clock: Clock,
        scopes: OurScopes,
    ) -> None:
        self._ledger = ledger
        self._runner = runner
        self._dispatch = dispatch
        self._circuits = circuits
        self._commits = commits
        self._counter = counter
        self._clock = clock
        self._scopes = scopes

    def due(self, limit: int) -> list[str] | None:
        """The keys of up to `limit` due sends of the scopes this daemon works for, soonest
        first; None while it shares the scopes and no round has told which are its own."""
        if self._scopes.none_yet():
            return None
        rows = self._ledger.due(JobState.REQUESTED, self._clock(), limit, self._scopes.filter)
        return [row.key for row in rows]

    def load(self, keys: list[str]) -> list[Work]:
        """Due jobs read in one query, each with its policy and provider."""
        jobs = self._ledger.get_jobs(keys)
        works = []
        for key in keys:
            job = jobs.get(key)
            if job is None:
                self._counter.bump("skipped")  # an index row without events
                continue
            work = self._runner.load(self._dispatch, key, self._counter, job)
            if work is not None:
                works.append(work)
        return works

    def may_send(self, work: Work, now: datetime) -> bool:
        """Whether this daemon may call for the job's scope now (`owners.py`)."""
        return self._scopes.may_call(work.policy, work.job.from_addr, now)

    def send(self, work: Work, probe: bool) -> None:
        """The job from its claim to its outcome, left to the next commit (`Dispatch`); a
        commit that starts while the claim is on its way may wait for it (`commit.py`)."""
        run = partial(self._dispatch.dispatch, work, probe=probe)
        with self._commits.coming():
            self._runner.guard(self._dispatch, work.job.key, self._counter, run)

    def give_up(self, work: Work) -> None:
        """A job that waited longer than its channel's `give_up_after`, to review."""
        run = partial(self._dispatch.give_up, work)
        self._runner.guard(self._dispatch, work.job.key, self._counter, run)

    def ping(self, provider: Provider, scope: str) -> None:
        """The probe of a circuit a hang opened: a call that sends nothing."""
        try:
            with self._circuits.call(scope, self._clock, PING):
                provider.ping()
        except ProviderError:
            pass  # fed to the circuit by `call`: the probe's backoff doubles
        except BaseException:
            self._circuits.probe_returned(scope)
            raise

    def flush(self) -> None:
        """Return once the outcomes left to the next commit are durable (`commit.py`)."""
        self._commits.flush()


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
