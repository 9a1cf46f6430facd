"""A write whose commit is ambiguous (docs/architecture.md "Ambiguous commits"): the
connection lost at COMMIT, the events stored all the same. The process's own events, met
by its next write of the job, are adopted as stored, never taken for another writer's."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from eventsourcing.persistence import OperationalError
from tests.unit.engine_rig import DAEMON, GRACE, TIMEOUT, EngineRig, policy
from tests.unit.test_leases import finish, slow_send

from daemon.webhooks.events import WEBHOOK_TYPES, type_of
from ledger.application import ConcurrentUpdate
from ledger.job import CLAIM_READ_BACK, SendJob
from ledger.stores.index import Withdrawn
from ledger.vocabulary import JobState

REVIEW = policy("legal", on_unknown="review", pending_draft="review")
LEASE = TIMEOUT + GRACE


@pytest.fixture
def rig() -> Iterator[EngineRig]:
    rig = EngineRig(REVIEW, concurrency=2)
    yield rig
    rig.close()


def the_release(rig: EngineRig, key: str) -> SendJob.Rejected:
    [released] = [e for e in rig.ledger.history(key) if isinstance(e, SendJob.Rejected)]
    return released


def lose_next_commit_answer(rig: EngineRig) -> list[int]:
    """The store's next write is stored, then fails as a connection lost at COMMIT does
    (the answer never came back). Returns the count of writes so failed."""
    recorder: Any = rig.ledger.recorder
    insert = recorder.insert_events
    lost: list[int] = []

    def stored_then_lost(*args: Any, **kwargs: Any) -> Any:
        insert(*args, **kwargs)
        recorder.insert_events = insert
        lost.append(1)
        raise OperationalError("server closed the connection unexpectedly")

    recorder.insert_events = stored_then_lost
    return lost


def test_a_renewal_stored_though_its_commit_failed_is_adopted_not_taken_for_a_loss(
    rig: EngineRig,
) -> None:
    release = slow_send(rig, "k1")
    try:
        rig.clock.advance(LEASE / 2)
        lost = lose_next_commit_answer(rig)
        assert rig.engine.renew_leases() == 0  # the daemon believes it failed
        assert lost and rig.events("k1")[-1] == "LeaseRenewed"  # yet it is stored
        rig.clock.advance(LEASE / 2)
        assert rig.engine.renew_leases() == 1  # its own renewal adopted, the next written
        lease = rig.engine.leases.lease("k1")
        assert lease is not None and lease.renewing
        deadline = rig.job("k1").due_at
        # The lease goes on: its deadline is the new renewal's.
        assert deadline is not None and deadline > rig.clock() + timedelta(seconds=GRACE)
    finally:
        finish(rig, release)
    events = rig.events("k1")
    assert events[-1] == "Confirmed" and events.count("LeaseRenewed") == 2, events
    assert "Unknown" not in events and rig.copies("k1") == 1


def test_an_outcome_after_a_renewal_stored_though_its_commit_failed_is_saved(
    rig: EngineRig,
) -> None:
    release = slow_send(rig, "k1")
    try:
        rig.clock.advance(LEASE / 2)
        lose_next_commit_answer(rig)
        assert rig.engine.renew_leases() == 0
    finally:
        finish(rig, release)  # the outcome goes out with the renewal pending in memory
    events = rig.events("k1")
    assert rig.job("k1").state is JobState.CONFIRMED, events
    assert events[1:] == ["Attempted", "LeaseRenewed", "Confirmed"], events


def test_an_outcome_stored_though_its_commit_failed_is_adopted_by_its_next_save(
    rig: EngineRig,
) -> None:
    rig.submit("legal", "k1")
    job = rig.job("k1")
    job.cancel(by="ops", note="not needed", at=rig.clock())
    lose_next_commit_answer(rig)
    with pytest.raises(OperationalError):
        rig.ledger.save_job(job)
    assert rig.events("k1")[-1] == "Cancelled"  # stored, the caller told it failed
    rig.ledger.save_job(job)  # tried again: its own write, adopted
    assert not job.pending_events and job.version == rig.job("k1").version


def test_the_same_events_written_by_another_writer_still_conflict(rig: EngineRig) -> None:
    # Equal events this process never tried to write (two engines of one name on one
    # injected clock write exactly the same claim): a conflict, as before.
    rig.submit("legal", "k1")
    mine, theirs = rig.job("k1"), rig.job("k1")
    for job in (mine, theirs):
        job.cancel(by="ops", note="not needed", at=rig.clock())
    rig.ledger.save_job(theirs)
    with pytest.raises(ConcurrentUpdate):
        rig.ledger.save_job(mine)


def test_a_claim_whose_commit_failed_is_read_back_released_and_sent_once(
    rig: EngineRig,
) -> None:
    """Stored, and believed failed: before, no call and the claim left to its deadline,
    recovered as an unknown outcome (here a review) for a send never made. The store is
    read back: its own Attempted there, the claim is released unsent, due again."""
    rig.submit("legal", "k1")
    lose_next_commit_answer(rig)
    rig.tick()
    assert rig.provider.sends == 0  # invariant 1: not known to be durable, not called
    assert rig.events("k1") == ["Requested", "Attempted", "Rejected"]
    claim = rig.ledger.history("k1")[1]
    assert isinstance(claim, SendJob.Attempted) and claim.daemon == DAEMON
    assert rig.job("k1").state is JobState.REQUESTED
    rig.advance_and_tick(LEASE + 1)
    assert rig.provider.sends == 1 and rig.job("k1").state is JobState.CONFIRMED


def test_a_claim_read_back_and_released_is_no_refusal_by_the_provider(rig: EngineRig) -> None:
    # No call was made: the tick's line ("N refused by the provider") and its counts do
    # not take the store's lost answer for the provider's refusal, as for a stop's claim.
    rig.submit("legal", "k1")
    lose_next_commit_answer(rig)
    report = rig.tick()
    assert rig.events("k1") == ["Requested", "Attempted", "Rejected"]
    assert (report.sent, report.rejected, report.unavailable) == (0, 0, 0), report


def test_a_claim_read_back_and_released_says_nothing_of_the_provider(rig: EngineRig) -> None:
    """The store's lost answer, not the provider's: before, the release set the job's
    `unavailable_since` (its `give_up_after` counted from it) and a `rejected` webhook
    said `unavailable`, telling receivers the provider was down."""
    rig.submit("legal", "k1")
    lose_next_commit_answer(rig)
    rig.tick()
    [released] = [e for e in rig.ledger.history("k1") if isinstance(e, SendJob.Rejected)]
    assert rig.job("k1").unavailable_since is None
    assert type_of(released, WEBHOOK_TYPES) is None
    assert rig.job("k1").round_attempts == 0  # still no attempt spent


def test_a_claim_known_not_stored_is_not_read_back(
    rig: EngineRig, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A stopping daemon's claim whose wait for a pooled connection was given up
    # (`Withdrawn`) began nothing: a read-back would ask the same pool again, twice, past
    # the stop's window.
    rig.submit("legal", "k1")
    read_back: list[str] = []
    monkeypatch.setattr(rig.ledger, "save_job", _withdrawn)
    monkeypatch.setattr(rig.ledger, "stored_after_unsure", lambda job: read_back.append(job.key))
    rig.tick(errors=1)
    monkeypatch.undo()
    assert read_back == [] and rig.provider.sends == 0
    assert rig.events("k1") == ["Requested"]


def test_a_stopping_daemon_s_claim_whose_commit_failed_is_not_read_back(
    rig: EngineRig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stop asked while a claim's save failed unsure: the read-back at once waited for
    the store again (a store down: its connect_timeout and a ping once more), the stop
    held past its window. The claim is left to the next start, as a kept one is."""
    rig.submit("legal", "k1")
    read_back: list[str] = []
    lost = lose_next_commit_answer(rig)
    save_job = rig.ledger.save_job

    def stop_asked_meanwhile(job: SendJob, **kwargs: Any) -> None:
        try:
            save_job(job, **kwargs)
        finally:
            if lost:
                rig.engine.stop()

    monkeypatch.setattr(rig.ledger, "save_job", stop_asked_meanwhile)
    monkeypatch.setattr(rig.ledger, "stored_after_unsure", lambda job: read_back.append(job.key))
    rig.tick(errors=1)
    monkeypatch.undo()
    assert lost and read_back == [] and rig.provider.sends == 0
    assert rig.events("k1") == ["Requested", "Attempted"]


def _withdrawn(job: SendJob, **kwargs: Any) -> None:
    raise Withdrawn("not saved: the daemon stopped while its save waited for a connection")


def unreadable_past_a_version(rig: EngineRig, monkeypatch: pytest.MonkeyPatch) -> None:
    """The store's reads past a job's version fail (the read-back: the store down)."""
    get = rig.ledger.events.get

    def unreadable(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("gt") is not None:
            raise OperationalError("the store's connection dropped")
        return get(*args, **kwargs)

    monkeypatch.setattr(rig.ledger.events, "get", unreadable)


def test_a_claim_whose_commit_failed_and_cannot_be_read_back_is_read_back_once_it_answers(
    rig: EngineRig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its read-back failing too, the claim was left to its deadline: recovered as an
    unknown outcome (here a person's look) for a send never made. It is read back at
    each tick until the store answers, and released then, before the deadline."""
    rig.submit("legal", "k1")
    lose_next_commit_answer(rig)
    unreadable_past_a_version(rig, monkeypatch)
    rig.tick(errors=1)
    assert rig.events("k1") == ["Requested", "Attempted"]
    rig.tick()  # the store still down: kept, no release, no recovery
    assert rig.events("k1") == ["Requested", "Attempted"]
    monkeypatch.undo()
    rig.tick()
    assert rig.events("k1") == ["Requested", "Attempted", "Rejected"]
    assert the_release(rig, "k1").reason == CLAIM_READ_BACK
    assert rig.job("k1").unavailable_since is None and rig.job("k1").round_attempts == 0
    rig.advance_and_tick(LEASE + 1)
    assert (rig.provider.sends, rig.provider.searches) == (1, 0)
    assert rig.job("k1").state is JobState.CONFIRMED, rig.events("k1")


def test_a_store_down_costs_one_read_back_a_tick_not_one_per_claim_kept(
    rig: EngineRig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each read-back while the store is down waits for it (`[store] connect_timeout`):
    before, a tick read back every claim kept, each holding a check worker for that
    wait, for the same answer. Now only the oldest while the store does not answer,
    the rest once it does."""
    reads: list[int] = []
    get = rig.ledger.events.get

    def unreadable(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("gt") is not None:
            reads.append(1)
            raise OperationalError("the store's connection dropped")
        return get(*args, **kwargs)

    monkeypatch.setattr(rig.ledger.events, "get", unreadable)
    for key in ("k1", "k2", "k3"):
        rig.submit("legal", key)
        lose_next_commit_answer(rig)
        rig.tick(errors=1)
    assert rig.engine.unsent.kept() == ["k1", "k2", "k3"]
    reads.clear()
    rig.tick()
    rig.tick()
    assert len(reads) == 2  # one a tick: the oldest's
    monkeypatch.undo()
    rig.tick()  # the oldest's answer: the store is back
    rig.tick()
    assert rig.engine.unsent.kept() == []
    for key in ("k1", "k2", "k3"):
        assert the_release(rig, key).reason == CLAIM_READ_BACK


def test_an_unsent_claim_another_daemon_recovered_meanwhile_is_left_to_it(
    rig: EngineRig, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Written on the version read: the other daemon's Unknown stands, nothing is
    # released on top of it, and its search settles the job.
    rig.submit("legal", "k1")
    lose_next_commit_answer(rig)
    unreadable_past_a_version(rig, monkeypatch)
    rig.tick(errors=1)
    monkeypatch.undo()
    rig.clock.advance(LEASE + 1)
    other = rig.new_engine("other")
    assert other.tick().recovered == 1
    rig.tick()
    assert rig.events("k1") == ["Requested", "Attempted", "Unknown", "Escalated"]
    assert rig.engine.unsent.kept() == [] and rig.provider.sends == 0


def test_another_writers_conflict_is_told_without_reading_the_store(
    rig: EngineRig, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No save of this job failed unsure: the conflict is another writer's, said at once.
    # A read back would cost every lost race one more query and, failing (a store's
    # blip), would turn the conflict into a store error (a lost claim's draft then kept).
    rig.submit("legal", "k1")
    mine, theirs = rig.job("k1"), rig.job("k1")
    theirs.cancel(by="ops", note="not needed", at=rig.clock())
    rig.ledger.save_job(theirs)
    mine.cancel(by="ops", note="mine", at=rig.clock())

    def unreadable(*args: Any, **kwargs: Any) -> Any:
        raise OperationalError("the store's connection dropped")

    monkeypatch.setattr(rig.ledger.events, "get", unreadable)
    with pytest.raises(ConcurrentUpdate):
        rig.ledger.save_job(mine)
    assert mine.pending_events


def test_a_claim_whose_read_back_fails_for_itself_holds_back_no_other(
    rig: EngineRig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the oldest claim is read back while the store does not answer; an error of
    that claim's own (not the store's: here a RuntimeError) says nothing of the store.
    Before, it kept the store counted down, and the claims kept after it were never read
    back while it failed: each left to its deadline's recovery, a search for a send never
    made."""
    unreadable_past_a_version(rig, monkeypatch)
    for key in ("k1", "k2", "k3"):
        rig.submit("legal", key)
        lose_next_commit_answer(rig)
        rig.tick(errors=1)
    monkeypatch.undo()
    assert rig.engine.unsent.kept() == ["k1", "k2", "k3"]
    read_back = rig.ledger.stored_after_unsure

    def not_for_k1(job: SendJob) -> bool:
        if job.key == "k1":
            raise RuntimeError("k1's own")
        return read_back(job)

    monkeypatch.setattr(rig.ledger, "stored_after_unsure", not_for_k1)
    for _ in range(10):  # the check workers' read-backs may end after their tick
        rig.tick()
        if rig.engine.unsent.kept() == ["k1"]:
            break
        time.sleep(0.05)
    assert rig.engine.unsent.kept() == ["k1"]
    for key in ("k2", "k3"):
        assert the_release(rig, key).reason == CLAIM_READ_BACK
