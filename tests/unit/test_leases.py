"""A claim is a lease on one call (daemon/engine/leases.py, docs/architecture.md "Leases"):
its deadline counts from the call, is renewed while the call runs, and recovery never takes
a claim a live worker holds; another daemon takes it only when the lease lapsed."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from tests.unit.engine_rig import DAEMON, GRACE, TIMEOUT, EngineRig, policy, receipt
from tests.unit.meanwhile import Meanwhile
from tests.unit.test_circuit_hangs import wait_until

from daemon.bootstrap import bootstrap
from daemon.doubles.fake_drafts import FakeDraftsProvider
from daemon.doubles.fake_history import FakeHistoryProvider
from daemon.doubles.fake_provider import FakeProvider, Scripted
from daemon.doubles.fake_time import FakeClock
from daemon.engine import Engine, PolicyHolder
from daemon.engine.circuit import CircuitSettings
from daemon.engine.dispatch import Dispatch
from daemon.engine.leases import RENEW_SHARE, renew_interval
from daemon.providers.base import Provider, SendKind, SendOutcome
from ledger.application import Ledger
from ledger.job import SendJob
from ledger.vocabulary import JobState
from policies.loader import PolicySet

REVIEW = policy("legal", on_unknown="review", pending_draft="review")
RETRY = policy("receipts", on_unknown="retry")
LEASE = TIMEOUT + GRACE


@pytest.fixture
def rig() -> Iterator[EngineRig]:
    rig = EngineRig(REVIEW, RETRY, concurrency=2)
    yield rig
    rig.close()


def slow_send(rig: EngineRig, key: str, channel: str = "legal") -> threading.Event:
    """`key` submitted and handed to a worker whose call answers only when released."""
    release = threading.Event()
    rig.submit(channel, key)
    rig.provider.script(Scripted.slow(release))
    rig.engine.hand_out()
    assert rig.engine.settle(busy=lambda: rig.provider.hanging, timeout=10)
    assert rig.provider.hanging == 1
    return release


def finish(rig: EngineRig, release: threading.Event) -> None:
    release.set()
    assert rig.engine.settle(timeout=10)


def test_a_slow_call_that_answers_is_never_recovered_and_renews_its_lease(rig: EngineRig) -> None:
    release = slow_send(rig, "k1")
    claimed = rig.job("k1")
    assert claimed.due_at == rig.clock() + timedelta(seconds=LEASE)
    for _ in range(6):  # three leases' worth of ticks while the call runs
        rig.clock.advance(LEASE / 2)
        rig.engine.hand_out()
        assert rig.engine.settle(busy=lambda: rig.provider.hanging, timeout=10)
        job = rig.job("k1")
        assert job.state is JobState.ATTEMPTED, rig.events("k1")
        assert job.due_at is not None and job.due_at > rig.clock()  # never lapsed
    finish(rig, release)
    events = rig.events("k1")
    assert events[0:2] == ["Requested", "Attempted"] and events[-1] == "Confirmed"
    assert "Unknown" not in events and events.count("LeaseRenewed") == 6
    assert rig.copies("k1") == 1


def test_a_fast_call_writes_no_renewal(rig: EngineRig) -> None:
    rig.submit("legal", "k1")
    rig.tick()
    assert rig.events("k1") == ["Requested", "Attempted", "Confirmed"]
    assert rig.engine.leases.renewed == 0


def test_own_recovery_never_takes_a_held_claim_even_past_its_stored_deadline(
    rig: EngineRig,
) -> None:
    release = slow_send(rig, "k1")
    rig.engine.leases.renew_due = lambda: 0  # type: ignore[method-assign]  # store unreachable
    rig.clock.advance(LEASE * 3)
    rig.engine.hand_out()
    assert rig.engine.settle(busy=lambda: rig.provider.hanging, timeout=10)
    assert rig.job("k1").state is JobState.ATTEMPTED  # past its deadline, yet held
    finish(rig, release)
    assert rig.job("k1").state is JobState.CONFIRMED and "Unknown" not in rig.events("k1")


def test_another_daemon_waits_while_the_lease_is_renewed_and_takes_it_once_lapsed(
    rig: EngineRig,
) -> None:
    release = slow_send(rig, "k1")
    other = rig.new_engine()
    try:
        for _ in range(4):
            rig.clock.advance(LEASE / 2)
            rig.engine.renew_leases()  # the first daemon is alive
            assert other.tick().recovered == 0
        rig.engine.leases.renew_due = lambda: 0  # type: ignore[method-assign]  # it hangs
        rig.clock.advance(LEASE + 1)
        assert other.tick().recovered == 1  # lapsed: another daemon takes it
        assert rig.job("k1").state is JobState.REVIEW  # legal: an Unknown goes to a human
        finish(rig, release)  # the first daemon's answer comes too late to be written
        assert rig.events("k1").count("Confirmed") == 0
        assert rig.copies("k1") == 1  # the human's check will find it
    finally:
        other.close()


def test_a_lapsed_slow_call_on_a_retry_channel_is_found_by_the_search_not_resent(
    rig: EngineRig,
) -> None:
    """The call outlives its lease (its daemon's renewals stopped: a store it lost) and
    then succeeds. Another daemon recovers the claim (Unknown) and, on a channel that
    retries, searches after `search_after` while the call still hangs: the copy the call
    filed is found, the job confirmed by the search, nothing sent again; the first
    daemon's late answer conflicts and writes nothing."""
    release = slow_send(rig, "k1", channel="receipts")
    other = rig.new_engine()
    try:
        rig.engine.leases.renew_due = lambda: 0  # type: ignore[method-assign]  # it hangs
        rig.clock.advance(LEASE + 1)
        assert other.tick().recovered == 1
        assert rig.job("k1").state is JobState.UNKNOWN
        for _ in range(3):
            rig.clock.advance(61)  # past `search_after`, the call still out
            other.tick()
        assert rig.provider.hanging == 1
        assert rig.job("k1").state is JobState.CONFIRMED
        finish(rig, release)
        assert rig.provider.sends == 1 and rig.copies("k1") == 1
        assert rig.events("k1").count("Confirmed") == 1
    finally:
        other.close()


def test_a_renewal_that_finds_the_claim_taken_stops_renewing(rig: EngineRig) -> None:
    release = slow_send(rig, "k1")
    other = rig.new_engine()
    try:
        rig.clock.advance(LEASE + 1)  # the first daemon missed its renewals
        assert other.tick().recovered == 1
        assert rig.engine.renew_leases() == 0  # conflict: lost, not renewed
        lease = rig.engine.leases.lease("k1")
        assert lease is not None and not lease.renewing
    finally:
        finish(rig, release)
        other.close()


def test_a_crashed_call_releases_its_claim_for_recovery_at_the_deadline(rig: EngineRig) -> None:
    rig.submit("legal", "k1")
    rig.provider.script(Scripted.crash_during_call(stored=True))
    rig.tick(errors=1)
    assert not rig.engine.leases.holds("k1")
    rig.clock.advance(LEASE + 1)
    assert rig.tick().recovered == 1


def test_the_renewer_interval_fits_the_shortest_lease() -> None:
    assert renew_interval(4.0) == pytest.approx(4.0 * RENEW_SHARE / 4)
    assert renew_interval(0.01) == 0.02 and renew_interval(3600) == 5.0


def drafts_rig() -> EngineRig:
    rig = EngineRig(REVIEW, RETRY)
    rig.engine.close()
    rig.provider = FakeDraftsProvider("fake", clock=rig.clock)
    rig.engine = rig.new_engine()
    return rig


def test_the_lease_counts_from_the_call_not_from_before_the_draft_step() -> None:
    rig = drafts_rig()
    provider = rig.provider
    assert isinstance(provider, FakeDraftsProvider)
    slow = 7.0  # the draft step takes most of the lease
    provider.during_create = lambda: rig.clock.advance(slow)
    try:
        rig.submit("legal", "k1")
        started = rig.clock()
        rig.tick()
        [attempted] = [e for e in rig.ledger.history("k1") if isinstance(e, SendJob.Attempted)]
        assert attempted.timestamp == started + timedelta(seconds=slow)
        assert attempted.deadline == attempted.timestamp + timedelta(seconds=LEASE)
    finally:
        rig.close()


def test_a_slow_draft_send_is_never_recorded_unsent() -> None:
    """The issue's case: `pending_draft = "review"`, a provider slower than the lease that
    answers: the live daemon's recovery once wrote "draft still unsent" for a job that was
    being sent."""
    rig = drafts_rig()
    try:
        release = slow_send(rig, "k1")
        for _ in range(5):
            rig.clock.advance(LEASE / 2)
            rig.engine.hand_out()
            assert rig.engine.settle(busy=lambda: rig.provider.hanging, timeout=10)
        finish(rig, release)
        events = rig.events("k1")
        assert "DraftPending" not in events and "Unknown" not in events, events
        assert rig.job("k1").state is JobState.CONFIRMED and rig.copies("k1") == 1
    finally:
        rig.close()


def test_an_outcome_told_after_the_next_claim_of_its_job_leaves_that_claim_held(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A draft send answered 500 and its draft found unsent: DraftPending, due at once. Its
    outcome is told to its worker after the commit that saved it, and meanwhile another
    worker claimed the job again and is in a slow call. That telling released the job's
    lease by its key, the new claim's: not renewed, and recovered as Unknown by this very
    daemon while its call ran, its draft fenced under it. It releases only its own now."""
    rig = drafts_rig()
    provider = rig.provider
    assert isinstance(provider, FakeDraftsProvider)
    release = threading.Event()
    answered_500 = Scripted(SendOutcome(SendKind.UNKNOWN, "HTTP 500", status=500), stored=False)
    provider.script(answered_500, Scripted.slow(release))
    told = Dispatch.outcome_saved

    def claimed_again() -> None:  # on the committing thread, between the commit and `then`
        rig.engine.hand_out()
        wait_until(lambda: provider.hanging == 1)

    meanwhile = Meanwhile(claimed_again)

    def told_after_a_new_claim(self: Dispatch, *args: Any) -> None:
        meanwhile()
        told(self, *args)

    monkeypatch.setattr(Dispatch, "outcome_saved", told_after_a_new_claim)
    try:
        rig.submit("receipts", "k1")
        rig.engine.hand_out()
        assert rig.engine.settle(busy=lambda: provider.hanging, timeout=10)
        assert meanwhile.hook is None and provider.hanging == 1
        assert rig.events("k1")[-2:] == ["DraftPending", "Attempted"]
        assert rig.engine.leases.holds("k1")
        rig.clock.advance(LEASE + 1)  # past the stored deadline: renewed, not recovered
        assert rig.engine.hand_out().recovered == 0
        assert rig.engine.settle(busy=lambda: provider.hanging, timeout=10)
        finish(rig, release)
        events = rig.events("k1")
        assert events.count("Unknown") == 1 and "DraftsDeleted" not in events, events
        assert rig.job("k1").state is JobState.CONFIRMED and rig.copies("k1") == 1
    finally:
        release.set()
        rig.close()


def test_the_claimed_daemon_is_the_one_that_renews(rig: EngineRig) -> None:
    release = slow_send(rig, "k1")
    rig.clock.advance(LEASE / 2)
    assert rig.engine.renew_leases() == 1
    renewal = rig.ledger.history("k1")[-1]
    assert isinstance(renewal, SendJob.LeaseRenewed)
    assert (renewal.daemon, renewal.attempt) == (DAEMON, 1)
    finish(rig, release)


class AckedLate:
    """The store as an engine's group commit sees it: the next claim it saves is written,
    and the commit's answer comes back only after `meanwhile()` (a PostgreSQL commit
    stalled, a pause of the process right after it)."""

    def __init__(self, ledger: Any, meanwhile: Callable[[], None]) -> None:
        self._ledger = ledger
        self._meanwhile: Callable[[], None] | None = meanwhile

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ledger, name)

    def save_jobs(self, jobs: list[SendJob]) -> None:
        for job in jobs:
            self.save_job(job)

    def save_job(self, job: SendJob, **kwargs: Any) -> None:
        claim = any(isinstance(e, SendJob.Attempted) for e in job.pending_events)
        self._ledger.save_job(job, **kwargs)
        meanwhile, self._meanwhile = self._meanwhile, None
        if claim and meanwhile is not None:
            meanwhile()


def test_a_claim_whose_save_outlasted_its_lease_makes_no_call(rig: EngineRig) -> None:
    """The claim is durable, but its save answers only after its lease: meanwhile another
    daemon found the lease over, recorded the outcome unknown, searched (no copy: no call
    was made), and sent the job again under `on_unknown = "retry"`. The first daemon,
    once its save answers, must not call: its claim was not its own any more, and the job
    would have two copies."""
    other = rig.new_engine("other")
    try:

        def meanwhile() -> None:
            for _ in range(60):
                rig.clock.advance(5)
                other.tick()
                if rig.job("k1").state is JobState.CONFIRMED:
                    return
            raise AssertionError(rig.events("k1"))

        rig.engine.commits._ledger = AckedLate(rig.ledger, meanwhile)  # type: ignore[assignment]
        rig.submit("receipts", "k1")
        rig.tick()
        assert rig.job("k1").state is JobState.CONFIRMED, rig.events("k1")
        assert rig.copies("k1") == 1, rig.events("k1")
        assert rig.provider.sends == 1  # the other daemon's resend alone
    finally:
        other.close()


class SlowPing(FakeProvider):
    """A provider whose circuit probe (`ping`) answers slowly but within its timeout:
    `during_ping` runs at the start of each ping."""

    def __init__(self, name: str, clock: FakeClock) -> None:
        super().__init__(name, clock=clock)
        self.during_ping: Callable[[], None] | None = None

    def ping(self) -> None:
        hook, self.during_ping = self.during_ping, None
        if hook is not None:
            hook()
        super().ping()


def test_an_outcome_left_to_the_next_commit_is_saved_before_a_slow_ping() -> None:
    """One send worker: it sends k1 (confirmed; its outcome left to the next commit, its
    lease no longer renewed), then takes the probe of another provider's circuit, opened
    by a hang: a ping, answered within that provider's (longer) timeout but after k1's
    lease. Another daemon must not find k1's claim lapsed meanwhile and record it as
    Unknown (a false crash, and the confirmation lost): the outcome is durable first."""
    start = datetime(2026, 11, 1, 9, 0, tzinfo=UTC)
    clock = FakeClock(start)
    ledger = Ledger("memory://", clock=clock)
    fast = FakeProvider("fast", clock=clock)
    slow = SlowPing("slow", clock)
    providers: dict[str, Provider] = {"fast": fast, "slow": slow}
    timeouts = {"fast": 10.0, "slow": 60.0}
    policies = PolicySet({"f": policy("f", provider="fast"), "s": policy("s", provider="slow")})

    def engine(name: str) -> Engine:
        return Engine(ledger, PolicyHolder(lambda: policies), providers,
                      provider_timeouts=timeouts, clock=clock, elapsed=clock.elapsed,
                      deadline_grace=GRACE,
                      concurrency=1, rng=random.Random(1), daemon_name=name)  # fmt: skip

    a, b = engine("a"), engine("b")
    try:
        # `slow` hung: its calls timed out until its circuit opened on a hang.
        for _ in range(CircuitSettings().failures):
            with a.circuits.calling("slow"):
                a.circuits.called("slow", clock(), unavailable=True, timed_out=True)
        assert a.circuits.open() != []
        clock.advance(CircuitSettings().probe_after)
        ledger.submit(receipt("f", "k1"), policies["f"].sender_for(None))
        clock.advance(0.001)
        ledger.submit(receipt("s", "k2"), policies["s"].sender_for(None))

        def pinging() -> None:  # on `a`'s send worker, right after k1's send
            clock.advance(timeouts["slow"] * 0.9)  # the ping answers within its timeout
            b.tick()  # the other daemon's tick: recovers what lapsed

        slow.during_ping = pinging
        a.hand_out()
        assert a.settle(timeout=10)
        assert slow.pings == 1 and slow.during_ping is None
        assert rig_events(ledger, "k1") == ["Requested", "Attempted", "Confirmed"]
        assert fast.copies_of(ledger.get_job("k1").message_id) == 1
    finally:
        for e in (a, b):
            e.close()
        ledger.close()


def rig_events(ledger: Ledger, key: str) -> list[str]:
    return [type(event).__name__ for event in ledger.history(key)]


class SlowMark(FakeHistoryProvider):
    """A provider whose claims' history mark needs a call now and then (as Gmail's when
    its shared mark is old): `during_mark` runs in the next mark, as that call."""

    def __init__(self, name: str, clock: FakeClock) -> None:
        super().__init__(name, clock=clock)
        self.during_mark: Callable[[], None] | None = None

    def history_mark(self, before_call: Callable[[], None] | None = None) -> str | None:
        hook, self.during_mark = self.during_mark, None
        if hook is not None:
            if before_call is not None:
                before_call()
            hook()
        return super().history_mark(before_call)


def test_an_outcome_left_to_the_next_commit_is_saved_before_a_slow_history_mark() -> None:
    """One send worker: k1's call answers (confirmed) a little before its first renewal;
    its outcome is left to the next commit, its lease no longer renewed. k2's claim then
    fetches the mailbox's history mark, answered within the provider's timeout but after
    k1's lease (a short grace). Another daemon must not find k1's claim lapsed meanwhile
    and record it as Unknown: the outcome is durable before the mark's call."""
    start = datetime(2026, 11, 1, 9, 0, tzinfo=UTC)
    clock = FakeClock(start)
    ledger = Ledger("memory://", clock=clock)
    gmail = SlowMark("gmail", clock)
    timeout, grace = 10.0, 2.0
    policies = PolicySet({"f": policy("f", provider="gmail")})

    def engine(name: str) -> Engine:
        return Engine(ledger, PolicyHolder(lambda: policies), {"gmail": gmail},
                      provider_timeouts={"gmail": timeout}, clock=clock, elapsed=clock.elapsed,
                      deadline_grace=grace,
                      concurrency=1, rng=random.Random(1), daemon_name=name)  # fmt: skip

    a, b = engine("a"), engine("b")
    try:
        ledger.submit(receipt("f", "k1"), policies["f"].sender_for(None))
        clock.advance(0.001)
        ledger.submit(receipt("f", "k2"), policies["f"].sender_for(None))

        def marking() -> None:  # k2's claim: the mark's call answers within its timeout
            clock.advance(timeout * 0.95)
            b.tick()  # the other daemon's tick: recovers what lapsed

        def sending() -> None:  # k1's call: answered just before a third of its lease
            gmail.during_send = None
            clock.advance((timeout + grace) * RENEW_SHARE * 0.9)
            gmail.during_mark = marking  # the next claim's mark (k2's) makes a call

        gmail.during_send = sending
        a.hand_out()
        assert a.settle(timeout=10)
        assert gmail.during_mark is None  # k2's mark made its call
        assert rig_events(ledger, "k1") == ["Requested", "Attempted", "Confirmed"]
        assert gmail.copies_of(ledger.get_job("k1").message_id) == 1
    finally:
        for e in (a, b):
            e.close()
        ledger.close()


def test_a_clock_set_back_during_a_slow_call_neither_puts_off_nor_loses_its_renewals(
    rig: EngineRig,
) -> None:
    # This daemon's clock is stepped back a whole lease (an NTP step) while its call runs;
    # another daemon's stays right. The renewals go on as time passes, never moving the
    # stored deadline back, so the other daemon never takes the live call for a crash.
    release = slow_send(rig, "k1")
    right = FakeClock(rig.clock())
    other = bootstrap(
        rig.settings.model_copy(
            update={"daemon": rig.settings.daemon.model_copy(update={"name": "other"})}
        ),
        ledger=rig.ledger,
        policy_loader=lambda: rig.policies,
        policies=rig.policies,
        providers={"fake": rig.provider},
        clock=right,
        elapsed=right.elapsed,
        rng=random.Random(0),
        share_scopes=False,
    ).engine
    try:
        rig.clock.advance(-LEASE)
        for _ in range(8):
            rig.clock.advance(LEASE / 4)
            right.advance(LEASE / 4)
            rig.engine.renew_leases()
            assert other.tick().recovered == 0, rig.events("k1")
            job = rig.job("k1")
            assert job.state is JobState.ATTEMPTED and job.due_at is not None
            assert job.due_at > right()  # never lapsed, by the clock that stayed right
            lease = rig.engine.leases.lease("k1")
            assert lease is not None and lease.renewing
        finish(rig, release)
        events = rig.events("k1")
        assert events[-1] == "Confirmed" and "Unknown" not in events
        assert rig.copies("k1") == 1
    finally:
        release.set()
        other.close()


class RowHeld:
    """The store with one job's row held by another session (a long transaction, an open
    psql): a save of that job waits until `free` is set, as a lock wait retried for up to
    `store_wait` does; the other jobs are saved at once."""

    def __init__(self, ledger: Any, key: str, free: threading.Event) -> None:
        self._ledger = ledger
        self._key = key
        self._free = free
        self.waiting = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ledger, name)

    def save_job(self, job: SendJob, **kwargs: Any) -> None:
        if job.key == self._key:
            self.waiting.set()
            self._free.wait(10)
        self._ledger.save_job(job, **kwargs)


def test_a_renewal_stuck_on_one_job_does_not_hold_up_the_others(rig: EngineRig) -> None:
    # Two slow calls; k1's row is held by another session when their renewals fall due.
    # k2's renewal must be written while k1's waits: waiting its turn behind k1's (up to
    # the store's 60 s), k2's lease would lapse and another daemon take its healthy call
    # for a crash (Unknown, a search). k1's renewal lands once its row is free.
    releases = [threading.Event(), threading.Event()]
    for key, release in zip(("k1", "k2"), releases, strict=True):
        rig.submit("legal", key)
        rig.provider.script(Scripted.slow(release))
    rig.engine.hand_out()
    assert rig.engine.settle(busy=lambda: rig.provider.hanging, timeout=10)
    assert rig.provider.hanging == 2
    free = threading.Event()
    held = RowHeld(rig.ledger, "k1", free)
    rig.engine.leases._ledger = held  # type: ignore[assignment]
    try:
        rig.clock.advance(LEASE / 2)
        assert rig.engine.renew_leases() == 1  # k2's; k1's still waits for its row
        assert held.waiting.is_set()
        assert "LeaseRenewed" in rig.events("k2")
        assert "LeaseRenewed" not in rig.events("k1")
        rig.clock.advance(LEASE / 2)  # k2 due again; k1's renewal still in flight
        assert rig.engine.renew_leases() == 1
        assert rig.events("k2").count("LeaseRenewed") == 2
        free.set()
        for _ in range(100):  # k1's renewal lands once the row is free
            if "LeaseRenewed" in rig.events("k1"):
                break
            threading.Event().wait(0.05)
        assert rig.events("k1").count("LeaseRenewed") == 1
        assert rig.engine.renew_leases() == 1  # k1's next one: the look takes it again
        for key in ("k1", "k2"):
            job = rig.job(key)
            assert job.state is JobState.ATTEMPTED and job.due_at is not None
            assert job.due_at > rig.clock()
    finally:
        free.set()
        for release in releases:
            release.set()
    assert rig.engine.settle(timeout=10)
    for key in ("k1", "k2"):
        events = rig.events(key)
        assert events[-1] == "Confirmed" and "Unknown" not in events
        assert rig.copies(key) == 1


def test_a_renewal_still_waiting_when_the_daemon_stops_never_lands(rig: EngineRig) -> None:
    # k1's renewal waits for its row (held by another session) when the daemon stops:
    # close waits `close_wait`, then withdraws it. When the row is freed the renewal must
    # not be written: the daemon said it stopped, and a deadline pushed out after that
    # would have another daemon wait a lease longer to recover a call nobody runs.
    release = slow_send(rig, "k1")
    deadline = rig.job("k1").due_at
    free = threading.Event()
    held = RowHeld(rig.ledger, "k1", free)
    leases = rig.engine.leases
    leases._ledger = held  # type: ignore[assignment]
    try:
        rig.clock.advance(LEASE / 2)
        assert rig.engine.renew_leases() == 0
        assert held.waiting.is_set()
        leases.close_wait = 0.2
        started = time.monotonic()
        leases.close()
        assert time.monotonic() - started < 2.0  # bounded, though the renewal still waits
        free.set()
        for _ in range(100):  # the withdrawn renewal's save goes on and is rolled back
            lease = leases.lease("k1")
            if lease is None or not lease.in_flight:
                break
            threading.Event().wait(0.05)
        threading.Event().wait(0.1)
        assert "LeaseRenewed" not in rig.events("k1")
        assert rig.job("k1").due_at == deadline
        assert leases.renew_due() == 0  # closed: no renewal after the stop
    finally:
        free.set()
        release.set()
    assert rig.engine.settle(timeout=10)
    assert rig.events("k1")[-1] == "Confirmed"
