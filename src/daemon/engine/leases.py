"""Leases: a claim is a lease on one provider call (docs/architecture.md "Leases").

The claim's deadline (`Attempted.deadline`) is its lease. It is set when the call starts
(after any draft step) for the provider's timeout plus the daemon's grace, and while the
call and what follows it in the same worker (the read-back, the draft check) run, the
lease is renewed every third of it (`LeaseRenewed`), so a provider that answers slowly but
answers is never taken for a crash. A fast call costs nothing here: it ends before its
first renewal is due.

Recovery in this daemon never takes a claim one of its workers holds (`Leases.holds`),
whatever its deadline. Another daemon takes it only when its lease lapsed: this daemon
died, hung, or lost the store and could not renew. A daemon that lost its lease finds
out when it renews (the append conflicts) or when it saves the outcome (likewise): what
it learnt is not written, and the recovering daemon's Unknown is searched as usual.

Renewals are made by `renew_due`, which every tick calls and, in a running daemon, a
thread of its own (`start`), so a tick held up by the store does not let a lease lapse.
Each renewal is written on a thread of its own, and a look waits for them only a renewer
interval: a job's row held by another session (a long transaction: each save waits for
it up to the store's minute) holds up that job's renewal, never the other leases', whose
renewals would otherwise queue behind it past their deadlines (their healthy calls taken
for crashes by another daemon). The stuck one is left out of the looks until it ends.
At most `renewal_threads` renewals are written at once (half the store's pool): each holds
a connection while it waits, and many rows held at once must not take every connection
from the claims and the records; the due leases queue for the threads, so a stuck one
holds up only the thread it is on.
A lease's job is shared between its worker and the renewer: every change to it happens
under the lease's lock, and the worker stops the renewals before it records the outcome.

A stopping daemon (`close`) waits for the renewals being written a bounded time
(`close_wait`), then withdraws the ones still waiting for their rows: each renewal's
save asks, once it holds its row and right before its commit, whether it may land
(`Ledger.save_job`'s guard), and after `close` none may. One that landed later would push
out a claim's deadline after the daemon said it stopped: another daemon would then wait a
lease longer to recover a call nobody runs, or, the daemon's scopes released meanwhile,
hold a claim against the scope's new owner. A renewal still waiting for a pooled
connection (the pool taken by other store work) has begun nothing: it gives up at once
when `close` begins, or when its call ends (`Ledger.save_job`'s `connect_while`), instead
of holding the stop or its worker for `[store] connect_timeout` or longer; a queued one is
not begun.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from daemon.engine.clock import Clock
from ledger.application import ConcurrentUpdate, Ledger
from ledger.job import SendJob, TransitionError
from ledger.stores.index import Withdrawn
from ledger.stores.url import DEFAULT_LOCK_TIMEOUT, PostgresStore, StoreSpec

log = logging.getLogger("sendledger.engine")

#: A lease is renewed once this share of the call's bound (the lease less the grace: one
#: `timeout`) has passed since the claim or the last renewal: two more chances before the
#: call is cut (`Lease.renew_every`).
RENEW_SHARE = 1 / 3
#: Renewals written at once on a store with no pool to share (SQLite, memory).
RENEWAL_THREADS = 4
#: Seconds a stopping daemon waits for the renewals being written before it withdraws
#: them (`Leases.close`).
CLOSE_WAIT = 5.0


@dataclass(eq=False)
class Lease:
    job: SendJob
    seconds: float  # the lease's length: the provider's timeout plus the grace
    renew_at: datetime
    #: The latest time this clock showed while the lease was held: a later look that shows
    #: an earlier one saw the clock set back (`Leases.renew_due`).
    seen: datetime
    lock: threading.Lock = field(default_factory=threading.Lock)
    renewing: bool = True  # False once the worker records the outcome, or the lease is lost
    #: How far this clock was set back while the lease was held (seconds): the stored
    #: deadline was written by the clock as it was, and is renewed by it (`_renew`).
    behind: float = 0.0
    #: A renewal of this lease is queued for a renewal thread or being written (its
    #: thread holds `lock` meanwhile): the looks leave the lease alone until it ends.
    #: Changed under `Leases._lock`.
    in_flight: bool = False
    #: The worker recorded the call's outcome (`stop_renewing`): a renewal still waiting
    #: for its job's row may not land, nor try again; changed under `Leases._lock`.
    withdrawn: bool = False
    #: The deadline last written to the store (the claim's, then each renewal's once
    #: committed), on the clock as it was before any step back: the one another daemon
    #: recovers the claim by (the call's bound counts it as `ends_at`).
    written: datetime | None = None
    #: The grace the call's bound leaves off the lease (`seconds_left`): another
    #: daemon's clock may be that far ahead.
    grace: float = 0.0
    #: When the deadline last written falls, in this process's monotonic seconds (the
    #: `elapsed` a `Leases` is made with): the call's bound counts time passed, not the
    #: wall clock, which a step forward would move past a bound no time reached
    #: (`seconds_left`).
    ends_at: float = 0.0

    @property
    def renew_every(self) -> float:
        """Seconds from one written deadline to the next renewal: a third of the call's
        bound (the lease less the grace: one `timeout`), so a renewal has two thirds of a
        `timeout` to land before the bound runs out (docs/architecture.md "Leases")."""
        return renew_every(self.seconds, self.grace)

    def seconds_left(self, elapsed: float) -> float:
        """What is left, at `elapsed` (monotonic seconds), of the lease as last written,
        less the grace (the clocks' skew another daemon's recovery allows for): past it
        that recovery may take the claim."""
        return self.ends_at - elapsed - self.grace


class Leases:
    """The claims this daemon's workers hold now, by job key. Thread-safe."""

    def __init__(
        self,
        ledger: Ledger,
        clock: Clock,
        daemon: str,
        elapsed: Callable[[], float] = time.monotonic,
    ) -> None:
        self._ledger = ledger
        self._clock = clock
        #: Monotonic seconds: what the calls' bounds are counted in (`Lease.ends_at`).
        self._elapsed = elapsed
        self._daemon = daemon
        self._lock = threading.Lock()
        self._held: dict[str, Lease] = {}
        self._renewing = threading.Lock()  # one renewal pass at a time
        #: The due leases waiting for a renewal thread, each with its look's time (on
        #: the clock, and in monotonic seconds) and that look's count of renewals
        #: written; changed under `_lock`.
        self._queue: deque[tuple[Lease, datetime, float, list[bool]]] = deque()
        self._threads = renewal_threads(ledger.store)
        self._running = 0  # renewal threads alive, under `_lock`
        self._renewal_ended = threading.Condition(self._lock)
        #: The leases whose renewal may commit now (their guard said yes), under `_lock`.
        self._landing: set[Lease] = set()
        self._closed = False  # no renewal lands any more (`close`)
        self._closing = False  # `close` began: no renewal waits for a connection any more
        self.close_wait = CLOSE_WAIT
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.renewed = 0  # renewals written, for tests and /metrics

    def hold(self, job: SendJob, seconds: float, now: datetime, grace: float = 0.0) -> Lease:
        """The claim just saved on `job` (its lease `seconds` long, `grace` of it the
        call's bound leaves off: `Lease.seconds_left`) is held by a worker."""
        lease = Lease(job, seconds, now, now, grace=grace)
        lease.renew_at = now + timedelta(seconds=lease.renew_every)
        lease.written = now + timedelta(seconds=seconds)
        # `now` was read before the claim's save: its deadline is placed in monotonic
        # seconds by one look at both clocks, after it; never further than the lease from
        # that look (a clock set back during the save would put it the step further).
        wall, elapsed = self._clock(), self._elapsed()
        lease.ends_at = elapsed + min((lease.written - wall).total_seconds(), seconds)
        with self._lock:
            self._held[job.key] = lease
        return lease

    @contextmanager
    def holding(
        self, job: SendJob, seconds: float, now: datetime, grace: float = 0.0
    ) -> Iterator[Lease]:
        """`hold` the claim just saved on `job` for the call made inside; released here
        only when that call raised (no outcome will be recorded: the claim's stored
        deadline stands, and recovery takes it then, as after a crash). Otherwise the
        worker releases it once the outcome is durable (`release`)."""
        lease = self.hold(job, seconds, now, grace)
        try:
            yield lease
        except BaseException:
            self.release(lease)
            raise

    def time_left(self, lease: Lease) -> float:
        """What the call under `lease` has left now (`Lease.seconds_left`)."""
        return lease.seconds_left(self._elapsed())

    def holds(self, key: str) -> bool:
        with self._lock:
            return key in self._held

    def lease(self, key: str) -> Lease | None:
        with self._lock:
            return self._held.get(key)

    def stop_renewing(self, lease: Lease) -> None:
        """The worker is about to record the call's outcome on the job: no renewal may
        touch it from now on. One being written is withdrawn first, then waited for: it
        holds the job, and its save may wait for a row another session holds, up to the
        store's minute, while the outcome needing the same row waited behind it (and a
        stop behind the worker, past `daemon.stop_timeout`). Withdrawn, it rolls back once
        it holds the row, or ends at its lock wait's end (`[store] lock_timeout`) without
        another try; its LeaseRenewed stays pending and goes out with the outcome."""
        with self._lock:
            lease.withdrawn = True
        with lease.lock:
            lease.renewing = False

    def release(self, lease: Lease) -> None:
        """The outcome is durable, or failed to be (then the claim's deadline stands and
        recovery takes it): the worker no longer holds the claim. Only that claim: its
        outcome is told after its commit, and by then the job may be due again (a draft
        found unsent: at once) and claimed by another worker, whose call is in flight,
        its lease held under the same key."""
        with self._lock:
            if self._held.get(lease.job.key) is lease:
                del self._held[lease.job.key]

    def renew_due(self) -> int:
        """Renew every held lease whose renewal is due; how many were renewed."""
        with self._renewing:
            now, elapsed = self._clock(), self._elapsed()
            with self._lock:
                if self._closed:
                    return 0
                # One still being written holds its lock (`_follow_clock` would wait on
                # it): it is looked at again once it ends.
                held = [lease for lease in self._held.values() if not lease.in_flight]
            for lease in held:
                _follow_clock(lease, now)
            due = [lease for lease in held if lease.renew_at <= now]
            if not due:
                return 0
            done: list[bool] = []
            with self._lock:
                for lease in due:
                    lease.in_flight = True
                    self._queue.append((lease, now, elapsed, done))
                more = min(self._threads - self._running, len(self._queue))
                self._running += more
            for _ in range(more):
                threading.Thread(
                    target=self._renew_queued, name="lease-renewal", daemon=True
                ).start()
            # Waited for as long as the renewer's interval for the shortest lease held (one
            # not due yet may fall due meanwhile): a renewal stuck longer goes on alone, and
            # the next look comes on time.
            until = time.monotonic() + min(
                renew_interval(lease.seconds, lease.grace) for lease in held
            )
            with self._lock:
                while any(lease.in_flight for lease in due):
                    left = until - time.monotonic()
                    if left <= 0:
                        break
                    self._renewal_ended.wait(left)
                return sum(done)

    def _renew_queued(self) -> None:
        """A renewal thread: `_renew` for the queued leases until none is left, each
        counted in its look's `done` (while it waits) and in `renewed` when written."""
        while True:
            with self._lock:
                if not self._queue or self._closing:  # `close` drops what is queued
                    self._running -= 1
                    self._renewal_ended.notify_all()
                    return
                lease, now, elapsed, done = self._queue.popleft()
            renewed = False
            try:
                renewed = self._renew(lease, now, elapsed)
            except Exception:
                log.exception("job %s: renewing its lease failed", lease.job.key)
            finally:
                with self._lock:
                    lease.in_flight = False
                    self._landing.discard(lease)
                    if renewed:
                        done.append(True)
                        self.renewed += 1
                    self._renewal_ended.notify_all()

    def _renew(self, lease: Lease, now: datetime, elapsed: float) -> bool:
        with lease.lock:
            if not lease.renewing:
                return False
            job = lease.job
            # Counted on the clock as it was before any step back (`behind`): `now + lease`
            # would be earlier than the deadline written before the step (refused, "must be
            # later"), and other daemons' clocks did not go back with this one.
            deadline = now + timedelta(seconds=lease.behind + lease.seconds)
            try:
                job.renew_lease(deadline=deadline, at=now, daemon=self._daemon)
                self._ledger.save_job(
                    job,
                    guard=lambda: self._may_land(lease),
                    keep_trying=lambda: self._may_try(lease),
                    connect_while=lambda: self._may_connect(lease),
                )
            except Withdrawn:
                # The daemon stopped, or the call ended, while it waited: not written.
                lease.renewing = False
                log.info("job %s: lease renewal withdrawn: %s", job.key, self._why_withdrawn(lease))
                return False
            except (ConcurrentUpdate, TransitionError) as exc:
                # Recovered by another daemon (our renewals did not reach the store in
                # time): the outcome will not be written either.
                lease.renewing = False
                log.warning("job %s: claim lost while its call runs (%s)", job.key, exc)
                return False
            except Exception as exc:
                # The store is unreachable: the renewal stays pending on the job and goes
                # out with the next one or with the outcome; until then the stored
                # deadline is the last one written.
                if not self._may_try(lease):  # withdrawn while it waited for a lock
                    lease.renewing = False
                    why = self._why_withdrawn(lease)
                    log.info("job %s: lease renewal withdrawn: %s (%s)", job.key, why, exc)
                    return False
                log.warning("job %s: lease not renewed (%s: %s)", job.key, type(exc).__name__, exc)
                lease.renew_at = now + timedelta(seconds=min(1.0, lease.renew_every))
                return False
            lease.renew_at = now + timedelta(seconds=lease.renew_every)
            lease.written = deadline
            # `lease.seconds` from the look, as the deadline is: the clock's steps since
            # (`behind`) moved no time.
            lease.ends_at = elapsed + lease.seconds
            return True

    def _may_land(self, lease: Lease) -> bool:
        """The guard of a renewal's save, asked once its row is held: no once `close` or
        the worker (`stop_renewing`) withdrew it; yes otherwise, and `close` then waits
        for its commit."""
        with self._lock:
            if self._closed or lease.withdrawn:
                return False
            self._landing.add(lease)
            return True

    def _may_try(self, lease: Lease) -> bool:
        """Whether a renewal's save whose lock wait ended in vain tries again: not once
        withdrawn (by `close` or the worker), so neither waits longer than one lock wait."""
        with self._lock:
            return not (self._closed or lease.withdrawn)

    def _may_connect(self, lease: Lease) -> bool:
        """Whether a renewal's save still waits for a pooled connection: not once `close`
        began or the worker withdrew it (it has begun nothing yet)."""
        with self._lock:
            return not (self._closing or lease.withdrawn)

    def _why_withdrawn(self, lease: Lease) -> str:
        with self._lock:
            return "its call ended" if lease.withdrawn else "the daemon stopped"

    # -- the renewer thread of a running daemon ---------------------------------------

    def start(self, interval: float) -> None:
        """Renew every `interval` seconds (real time) on a thread of its own."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._run, args=(interval,), name="lease-renewer", daemon=True
        )
        self._thread.start()

    def _run(self, interval: float) -> None:
        while not self._stop.wait(interval):
            try:
                self.renew_due()
            except Exception:
                log.exception("renewing leases failed")

    def close(self) -> None:
        """No more renewals: the renewer stops, the ones being written are waited for
        `close_wait` seconds, and the ones still waiting then are withdrawn (see the
        module); those waiting for a connection give up at once. Returns once none can
        land any more."""
        with self._lock:
            self._closing = True
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        until = time.monotonic() + self.close_wait
        with self._lock:
            while self._running and (left := until - time.monotonic()) > 0:
                self._renewal_ended.wait(left)
            self._closed = True
            for lease, _now, _elapsed, _done in self._queue:
                lease.in_flight = False
            self._queue.clear()
            # Past its guard, a save commits at once: waited for, not withdrawn.
            while self._landing and (left := until + self.close_wait - time.monotonic()) > 0:
                self._renewal_ended.wait(left)
            if self._landing:
                log.error(
                    "lease renewals of %s still committing as the daemon stops",
                    ", ".join(sorted(lease.job.key for lease in self._landing)),
                )


def _follow_clock(lease: Lease, now: datetime) -> None:
    """A look at the clock while `lease` is held. One set back (an NTP step, a VM
    restored) since the last look would put the lease's renewal off by the step, past its
    stored deadline if the step is long enough, and another daemon would take the live
    call for a crash: the renewal stays due when it was, and `behind` carries the step.
    A step forward needs nothing: the renewal comes sooner and reaches further."""
    with lease.lock:
        if now < lease.seen:
            step = lease.seen - now
            lease.behind += step.total_seconds()
            lease.renew_at -= step
        lease.seen = now


def renew_every(lease_seconds: float, grace: float = 0.0) -> float:
    """`Lease.renew_every` of a lease `lease_seconds` long, `grace` of it left off."""
    bound = lease_seconds - grace if grace < lease_seconds else lease_seconds
    return RENEW_SHARE * bound


def renew_interval(lease_seconds: float, grace: float = 0.0) -> float:
    """How often the renewer thread looks: often enough for the shortest lease."""
    return min(max(renew_every(lease_seconds, grace) / 4, 0.02), 5.0)


def lock_wait(store: StoreSpec) -> float:
    """Seconds one try of a write waits for a lock: PostgreSQL's `[store] lock_timeout`;
    elsewhere the same default (SQLite's busy wait)."""
    if isinstance(store, PostgresStore):
        return float(store.lock_timeout)
    return float(DEFAULT_LOCK_TIMEOUT)


def renewal_threads(store: StoreSpec) -> int:
    """How many renewals are written at once: half the PostgreSQL pool (each waiting one
    holds a connection; the claims and the records keep the rest), else `RENEWAL_THREADS`."""
    if isinstance(store, PostgresStore):
        return max(1, store.pool_size // 2)
    return RENEWAL_THREADS
