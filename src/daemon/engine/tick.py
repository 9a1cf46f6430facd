"""The engine: a tick hands the due jobs of five steps to two worker budgets and returns.

dispatch (requested) -> recover (attempted past its deadline, no worker of ours holding
it) -> sweep (unknown, search due) -> verify (confirmed after a resend, count due) -> tidy
(settled, its unsent drafts to delete). Each tick first renews the leases of the calls in
flight (`leases.py`). Each step reads the job index for
its due jobs only, so a tick's work grows with what is due, not with the history. Sends
run on the send workers (`sends.py`, `concurrency` of them), which own what a send takes
(`SendSteps`, built here) and read more due sends themselves; everything else runs on the
check workers (`search_concurrency`): a backlog of sends never delays a due search, and
the other way round. The daemon's tick (`hand_out`) waits for neither, so a hung call holds
one worker and nothing else; `tick` waits for what it handed out (one-shot runs, tests).
Every save goes through one group commit (`commit.py`).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from datetime import timedelta
from functools import partial

from daemon.engine.bounces import BounceWatch, EndWatch, MailboxRead
from daemon.engine.circuit import Circuits, CircuitSettings, OpenCircuit
from daemon.engine.clock import Clock
from daemon.engine.commit import GroupCommit
from daemon.engine.dispatch import Dispatch
from daemon.engine.leases import Leases, lock_wait, renew_interval
from daemon.engine.observer import EngineObserver, NullObserver, ObservedProvider, notify
from daemon.engine.owners import OurScopes, ScopeOwners, horizon
from daemon.engine.policy_holder import PolicyHolder
from daemon.engine.readback import ProviderHealth
from daemon.engine.recover import Recover, RecoverOwnClaims
from daemon.engine.report import Counter, TickReport
from daemon.engine.runner import StepRunner
from daemon.engine.search import FirstDue, SearchBackoff, Sweep, Tidy, Verify
from daemon.engine.sends import SendSteps, SendWorkers
from daemon.engine.unsent import UnsentClaims
from daemon.engine.work import Step, Work
from daemon.providers.base import Provider
from ledger.application import Ledger
from ledger.stores.identity import NameSession
from ledger.vocabulary import FINAL_STATES, JobState

log = logging.getLogger("sendledger.engine")


class CheckWorkers:
    """Recover, sweep and verify on their own workers; a job is handed out once at a time."""

    def __init__(self, runner: StepRunner, counter: Counter, workers: int, name: str = "") -> None:
        self._runner = runner
        self._counter = counter
        self._size = max(workers, 1)
        # Named after the daemon, as the send workers are: two engines in one process.
        prefix = f"check@{name}" if name else "check"
        self._pool = ThreadPoolExecutor(max_workers=self._size, thread_name_prefix=prefix)
        # Reentrant: a future already done runs its callback (`_done`) in `submit`.
        self._lock = threading.RLock()
        self._running: dict[str, Future[None]] = {}

    def free(self) -> int:
        with self._lock:
            return self._size - len(self._running)

    def running(self) -> int:
        with self._lock:
            return len(self._running)

    def submit(self, step: Step, keys: list[str]) -> None:
        with self._lock:
            for key in keys:
                if len(self._running) >= self._size:
                    break  # the rest are found again by a later tick
                if key not in self._running:
                    future = self._pool.submit(self._runner.run, step, key, self._counter)
                    self._running[key] = future
                    future.add_done_callback(partial(self._done, key))

    def submit_task(self, name: str, task: Callable[[], None]) -> None:
        """A task that is not one job's step (a mailbox's bounce read), on the same
        workers and budget, once at a time under its `name`."""
        with self._lock:
            if len(self._running) >= self._size or name in self._running:
                return
            future = self._pool.submit(task)
            self._running[name] = future
            future.add_done_callback(partial(self._done, name))

    def _done(self, key: str, future: Future[None]) -> None:
        # Only its own entry: `drain` may have forgotten this future already and the key
        # been handed out again, and that run must stay counted (once at a time).
        with self._lock:
            if self._running.get(key) is future:
                del self._running[key]

    def drain(self) -> None:
        """Wait for the tasks running now, and forget them before returning: a future's
        done callback runs after `wait` has woken (on the worker's thread, late under
        load), and until then its key would still count as running, so the next offer
        (this tick's next step, the next tick) would skip it."""
        with self._lock:
            running = list(self._running.items())
        wait([future for _key, future in running])
        for key, future in running:
            self._done(key, future)
        for _key, future in running:
            future.result()  # a simulated crash (tests) is raised in the caller

    def close(self) -> None:
        self._pool.shutdown(wait=True)


class Engine:
    def __init__(
        self,
        ledger: Ledger,
        policies: PolicyHolder,
        providers: Mapping[str, Provider],
        *,
        provider_timeouts: Mapping[str, float],
        clock: Clock | None = None,
        elapsed: Callable[[], float] = time.monotonic,
        concurrency: int = 4,
        search_concurrency: int | None = None,
        batch_size: int = 200,
        deadline_grace: float = 30.0,
        rng: random.Random | None = None,
        observer: EngineObserver | None = None,
        daemon_name: str = "",
        circuit: CircuitSettings | None = None,
        bounce_interval: float = 60.0,
        scope_lease: float | None = None,
    ) -> None:
        """`scope_lease`: share the quota scopes with other daemons on the store, each
        owned by one daemon through a lease this long (`owners.py`); None: this engine
        works for every scope (tests of one engine). `elapsed`: monotonic seconds, what
        the calls' bounds count (`Lease.ends_at`)."""
        self.ledger = ledger
        self.daemon_name = daemon_name
        self.policies = policies
        self.providers = providers
        self.clock: Clock = clock or ledger.clock
        self.batch_size = batch_size
        self.circuits = Circuits(circuit)
        self.health = ProviderHealth(ledger, self.clock, self.circuits)
        self._stopping = threading.Event()
        self.commits = GroupCommit(
            ledger, savers=concurrency, stopping=self._stopping, stop_wait=lock_wait(ledger.store)
        )
        self.leases = Leases(ledger, self.clock, daemon_name, elapsed)
        self._lease_seconds = min(provider_timeouts.values(), default=30.0) + deadline_grace
        self._grace = deadline_grace
        #: The deadline of the longest call: what an earlier process of the name may still
        #: need in a scope this one takes from under it (`ScopeOwners.wait_for_predecessor`).
        self._longest_call = max(provider_timeouts.values(), default=30.0) + deadline_grace
        self.owners = (
            None
            if scope_lease is None
            else ScopeOwners(
                ledger.scope_leases(),
                policies,
                providers,
                daemon=daemon_name,
                lease=scope_lease,
                grace=deadline_grace,
                horizon=horizon(scope_lease, provider_timeouts.values()),
                clock=self.clock,
            )
        )
        self.scopes = OurScopes(self.owners, providers, ledger.mailbox_of)
        self._counter = Counter()
        self.observer: EngineObserver = observer or NullObserver()
        # Only the steps' calls are timed: `providers` stays what the caller gave.
        called: Mapping[str, Provider] = (
            providers
            if observer is None
            else {name: ObservedProvider(p, observer) for name, p in providers.items()}
        )
        self._runner = StepRunner(
            ledger,
            policies,
            called,
            self.clock,
            self._stopping,
            self.observer,
            commits=self.commits,
            may_run=None if self.owners is None else self._may_run,
        )
        backoff = self._backoff = SearchBackoff(
            self.circuits, self.clock, may_call=None if self.owners is None else self._may_call
        )
        # Claims whose save and read-back both failed, read back again (`unsent.py`).
        self.unsent = UnsentClaims(
            ledger, self.clock, self.circuits.settings.probe_after, self.commits.save
        )
        self._dispatch = Dispatch(
            self.health,
            self.clock,
            self.circuits,
            self.leases,
            provider_timeouts=provider_timeouts,
            deadline_grace=deadline_grace,
            rng=rng or random.Random(),
            stopping=self._stopping,
            daemon=daemon_name,
            may_call=None if self.owners is None else self.scopes.may_call,
            policies=policies,
            unsent=self.unsent,
        )
        self._checks_steps: tuple[Step, ...] = (
            Recover(self.health, self.leases),
            Sweep(self.health, backoff, self.clock),
            # One step for the confirmed jobs: they share one due time (`FirstDue`).
            FirstDue(
                Verify(backoff, self.clock),
                Tidy(JobState.CONFIRMED, backoff, self.clock),
                # A watch ends once its mailbox was read past its end (`bounces.py`).
                EndWatch(
                    self.clock,
                    lambda job: self.bounces.read_through(job),
                    lambda job, now: self.bounces.unread(job, now),
                ),
            ),
            *(
                Tidy(state, backoff, self.clock)
                for state in sorted(FINAL_STATES - {JobState.CONFIRMED})
            ),
        )
        self._send_steps = SendSteps(
            ledger,
            self._runner,
            self._dispatch,
            circuits=self.circuits,
            commits=self.commits,
            counter=self._counter,
            clock=self.clock,
            scopes=self.scopes,
        )
        self._sends = SendWorkers(
            self._send_steps,
            workers=concurrency,
            batch=batch_size,
            circuits=self.circuits,
            clock=self.clock,
            max_queued=max(batch_size * 10, concurrency * 4),
            name=daemon_name,
        )
        self._checks = CheckWorkers(
            self._runner, self._counter, search_concurrency or concurrency, daemon_name
        )
        self.bounces = BounceWatch(
            ledger,
            policies,
            called,
            self.clock,
            self.circuits,
            self.commits,
            self.observer,
            interval=bounce_interval,
            sends_waiting=self._sends.waiting,
            may_read=None if self.owners is None else self.scopes.may_call,
            skew=deadline_grace,
        )

    def stop(self) -> None:
        """Start no new provider call; the ones in flight finish and are recorded."""
        self._stopping.set()

    def name_lost(self) -> None:
        """This daemon's name was taken by another process: no new call, and the scope
        leases under the name are left to that process (`ScopeOwners.disown`)."""
        self.stop()
        if self.owners is not None:
            self.owners.disown()

    def close(self) -> None:
        self._sends.close()
        self._checks.close()
        self.leases.close()
        if self.owners is not None:
            self.owners.close()  # the calls are done: the scopes go to the others

    def start_lease_renewer(self) -> None:
        """A running daemon's leases are renewed on a thread of their own, so a tick
        held up by the store does not let a slow call's lease lapse (`leases.py`), and so
        are its scopes' (`owners.py`)."""
        self.leases.start(renew_interval(self._lease_seconds, self._grace))
        if self.owners is not None:
            self.owners.start()

    def renew_leases(self) -> int:
        return self.leases.renew_due()

    def in_flight(self) -> tuple[int, int]:
        """(sends, checks) running now: what a stopping daemon waits for (`runtime.py`)."""
        return self._sends.running(), self._checks.running()

    def take_report(self) -> TickReport:
        """What the workers did since the last tick (a stopped daemon's last count)."""
        return self._counter.take()

    def unreliable_providers(self) -> list[str]:
        return self.health.unreliable()

    def open_circuits(self) -> list[OpenCircuit]:
        return self.circuits.open()

    def scope_failure(self) -> str | None:
        """Why this daemon's scope leases are not being renewed, when they have not been
        for a while (`ScopeOwners.renewal_failure`); None when it shares no scopes."""
        return None if self.owners is None else self.owners.renewal_failure()

    def clock_failure(self) -> tuple[float, str] | None:
        """How far off the store's this daemon's clock is, and why it acts on nothing,
        while it stands aside for it (`ScopeOwners.clock_failure`); else None."""
        return None if self.owners is None else self.owners.clock_failure()

    def wait_for_predecessor(self, tick: float) -> None:
        """The name's lock can end under a live holder (`IdentityLock.ends_only_with_holder`
        false): the scopes an earlier process of the name held are called for only once
        its calls there are past their deadline (`ScopeOwners.wait_for_predecessor`).
        `tick`: `daemon.tick`; that process starts calls until its next tick's name
        check, up to a tick after the take, which the grace alone covers only while the
        tick is shorter."""
        if self.owners is not None:
            self.owners.wait_for_predecessor(self._longest_call + tick)

    def predecessor_gone(self) -> bool:
        """At start-up, where the name's lock can end under a live holder: whether the
        name's heartbeat names a process provably gone on this host
        (`ScopeOwners.predecessor_gone`); False when this engine shares no scopes (no
        heartbeat is read), when the row cannot be read now (the store away, a row held
        past `lock_timeout`) or names no process (its table's new column refused behind a
        lock: `SqlScopeLeases._add_process_column`): the waits are kept, the start goes
        on."""
        if self.owners is None:
            return False
        try:
            return self.owners.predecessor_gone()
        except Exception as exc:
            log.warning(
                "daemon.name %r: the name's heartbeat not read (%s: %s): its earlier "
                "process is waited for", self.daemon_name, type(exc).__name__, exc,
            )  # fmt: skip
            return False

    def check_name_by(
        self, check: Callable[[], None], session: Callable[[], NameSession | None] | None = None
    ) -> None:
        """`check` (raising IdentityTaken once the name is another process's) is asked
        before each renewal of the scope leases, whose write is made only while
        `session` holds the name (`ScopeOwners.check_name_by`)."""
        if self.owners is not None:
            self.owners.check_name_by(check, session)

    def recover_own_claims(self, *, wait_for_deadlines: bool = False) -> TickReport:
        """At start-up, with this daemon's name held (`Ledger.hold_identity`): its own
        claims left by an earlier process, Unknown now. `wait_for_deadlines`: the name's
        lock can end under a live holder (`IdentityLock.ends_only_with_holder` false), so
        that process may still be finishing a call: only claims past their deadline are
        taken now, the others by `Recover` at their deadline (recover.py)."""
        counter = Counter()
        self.health.refresh(self.providers)
        step = RecoverOwnClaims(
            self.health, self.leases, self.daemon_name, wait_for_deadlines=wait_for_deadlines
        )
        for row in self.ledger.jobs(state=step.state):
            self._runner.run(step, row.key, counter)
        return counter.report

    def hand_out(self) -> TickReport:
        """The daemon's tick: the due jobs handed to the workers, waiting for none of them.
        What the workers did since the previous tick."""
        started = time.perf_counter()
        self.leases.renew_due()
        self._balance_scopes()
        self.health.refresh(self.providers)
        self._forget_idle()
        self._sends.refill()
        self._offer_unsent()
        for step in self._checks_steps:
            self._offer_checks(step)
        self._offer_bounce_reads()
        return self._done(started)

    def tick(self) -> TickReport:
        """One tick to completion: each step's due jobs handed out and waited for, in
        order (a one-shot run, tests)."""
        started = time.perf_counter()
        self.leases.renew_due()
        self._balance_scopes()
        self.health.refresh(self.providers)
        self._forget_idle()
        self._sends.refill()
        self._sends.drain()
        self._offer_unsent()
        self._checks.drain()
        for step in self._checks_steps:
            self._offer_checks(step)
            self._checks.drain()
        self._offer_bounce_reads()
        self._checks.drain()
        return self._done(started)

    def settle(self, busy: Callable[[], int] = lambda: 0, timeout: float | None = None) -> bool:
        """Wait until the workers have nothing they could do now, with at most `busy()`
        send calls still running (tests that hang calls on purpose)."""
        settled = self._sends.drain(busy, timeout)
        self._checks.drain()
        return settled

    def _done(self, started: float) -> TickReport:
        report = self._counter.take()
        elapsed = time.perf_counter() - started
        notify(self.observer.tick_done, elapsed, report)
        return report

    def _forget_idle(self) -> None:
        """Each provider drops the mailboxes idle long enough that a fresh one would equal
        them (Gmail and Graph with `user = "{from}"`): what a tick spends here is what it
        drops, not the mailboxes that have nothing to do."""
        for name, provider in self.providers.items():
            try:
                provider.forget_idle()
            except Exception:
                log.exception("provider %s: forgetting idle mailboxes failed", name)

    def _balance_scopes(self) -> None:
        """This daemon's share of the quota scopes, and the filter of their due rows
        (`owners.py`). A store that cannot be read keeps the last filter: the scopes'
        leases end as written, and their calls stop in time (`may_call`)."""
        if self.owners is None:
            return
        now = self.clock()
        try:
            due = self.ledger.scopes_due(now + timedelta(seconds=self.owners.horizon))
            # A watched mailbox's reads are its scope's work (its channel's provider's).
            due += [(channel, mailbox, None) for channel, mailbox in self.bounces.wanted()]
            self.scopes.filter = self.owners.balance(due, now)
        except Exception as exc:
            log.warning("scope leases: round failed (%s: %s)", type(exc).__name__, exc)

    def _may_run(self, step: Step, work: Work) -> bool:
        if self.owners is not None and self.owners.aside is not None:
            return False  # its clock is off the store's: it would judge deadlines wrong
        # A recovery calls no provider: it is not held back by who owns the scope.
        return isinstance(step, Recover) or self.scopes.may_call(
            work.policy, work.job.from_addr, work.now, work.provider_name or None
        )

    def _may_call(self, work: Work) -> bool:
        """Whether a check's next provider call may start now (`SearchBackoff`)."""
        if self.owners is not None and self.owners.aside is not None:
            return False
        return self.scopes.may_call(
            work.policy, work.job.from_addr, self.clock(), work.provider_name or None
        )

    def _offer_unsent(self) -> None:
        """Each claim whose save and read-back failed, read back again on a check worker
        under its job's key (so never beside the job's recovery), before its deadline's
        recovery would search for a send never made (`unsent.py`)."""
        if self._stopping.is_set():
            return
        for key in self.unsent.due():
            self._checks.submit_task(key, partial(self._settle_unsent, key))

    def _settle_unsent(self, key: str) -> None:
        try:
            self.unsent.settle(key)
        except Exception as exc:
            # The store still down: tried again at the next tick. Not said at each tick
            # of an outage for every claim kept (up to `unsent.REMEMBERED` lines a tick):
            # the claim's first failed read-back was (`Dispatch.save_claim_or_read_back`).
            log.debug("job %s: its unsent claim not read back yet (%s)", key, exc)

    def _offer_checks(self, step: Step) -> None:
        free = self._checks.free()
        if free <= 0 or self.scopes.none_yet():
            return
        limit = min(free * 2, self.batch_size)
        if not isinstance(step, Sweep | FirstDue | Tidy):
            rows = self.ledger.due(step.state, self.clock(), limit, self.scopes.filter)
            self._checks.submit(step, [row.key for row in rows])
            return
        now = self.clock()
        ends = isinstance(step, FirstDue) and any(isinstance(s, EndWatch) for s in step.steps)
        # Watches past their end that wait for a read of their mailbox, as their rows
        # tell them: left out of the page, however many (`bounces.py`).
        held = self.bounces.holds(now) if ends else []
        rows = self.ledger.due(step.state, now, limit, self.scopes.filter, held)
        if not rows:
            return  # nothing due: no held search or ended watch to read past
        # Searches held by a backoff or an open circuit stay due in the index: read past
        # them (a bounded number) so another scope's due searches are not starved.
        waiting = self._backoff.waiting(now)
        if ends:
            # ... and watches whose rows cannot tell (an earlier release's), loaded once.
            waiting += self.bounces.ends_waiting(now)
        extra = min(waiting, self.batch_size * 10)
        if extra and len(rows) >= limit:  # a page that is not full holds every due row
            rows = self.ledger.due(step.state, now, limit + extra, self.scopes.filter, held)
        keys = [
            row.key
            for row in rows
            if not self._backoff.held(row.key, now)
            and not (ends and self.bounces.waits_for_read(row))
        ]
        self._checks.submit(step, keys[:limit])

    def _offer_bounce_reads(self) -> None:
        """Each watched mailbox whose read is due, on a check worker (`bounces.py`)."""
        for read in self.bounces.due():
            self._checks.submit_task(f"bounces:{read.scope}", partial(self._read_bounces, read))

    def _read_bounces(self, read: MailboxRead) -> None:
        if self._stopping.is_set():
            return
        try:
            self.bounces.read(read, self._counter)
        except Exception:
            logging.getLogger("sendledger.engine").exception("%s: bounce read failed", read.scope)
            self._counter.bump("errors")
