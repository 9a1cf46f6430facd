"""SendJob with the history handle (docs/architecture.md "The history handle"): the
historyId recorded with the claim, the history read at once after an unknown outcome,
Confirmed via history with exactly one copy, a miss that proves nothing or (believed) makes
the search due, an expired start that leaves the search to decide; every refusal; and the
claims and unknown outcomes of stores written before it load with no historyId ("Stored
events keep loading")."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from eventsourcing.persistence import StoredEvent
from eventsourcing.utils import get_topic, resolve_topic
from tests.unit.jobs import DEADLINE, MAPPER, POLICY, PROVIDER, assert_reloads, requested_job

from daemon.doubles.fake_time import FakeClock
from ledger.decision_types import (
    Confirm,
    Duplicate,
    HistoryMiss,
    ResendAt,
    Review,
    SearchAgainAt,
    SearchAt,
)
from ledger.job import SendJob, TransitionError
from ledger.vocabulary import ConfirmedVia, EscalationReason, JobState

MARK = "123456"
QUERY = f"history.list startHistoryId={MARK} labelId=SENT historyTypes=messageAdded"
SEARCH_AFTER = timedelta(minutes=5)


def unknown(clock: FakeClock, *, mark: str | None = MARK, history: bool = True) -> SendJob:
    """A job claimed with `mark` whose outcome became unknown now: the history due at
    once (`history`), the search SEARCH_AFTER later."""
    job = requested_job(clock)
    job.claim(provider=PROVIDER, deadline=clock.now + DEADLINE, at=clock.now, history_id=mark)
    decision = SearchAt(POLICY, clock.now + SEARCH_AFTER, clock.now if history else None)
    job.record_unknown(reason="reply lost", decision=decision, at=clock.now)
    return job


@pytest.mark.parametrize("cls", [SendJob.HistoryMissed, SendJob.HistoryUnusable])
def test_history_events_have_explicit_topics(cls: type[SendJob.Event]) -> None:
    assert f"sendledger:SendJob.{cls.__name__}" == cls.TOPIC
    assert resolve_topic(get_topic(cls)) is cls


def test_the_claim_records_the_mark_and_the_unknown_makes_the_history_due_first(
    clock: FakeClock,
) -> None:
    job = unknown(clock)
    assert job.history_id == MARK
    assert (job.history_due_at, job.search_due_at) == (clock.now, clock.now + SEARCH_AFTER)
    assert job.due_at == clock.now  # the sooner of the two: the index row finds it now
    assert_reloads(job)


def test_one_copy_in_the_history_confirms_via_history(clock: FakeClock) -> None:
    job = unknown(clock)
    job.record_history(query=QUERY, copies=["m1"], decision=Confirm(POLICY), at=clock.now)
    assert job.state is JobState.CONFIRMED and job.provider_message_ids == ["m1"]
    confirmed = job.pending_events[-1]
    assert isinstance(confirmed, SendJob.Confirmed) and confirmed.via == ConfirmedVia.HISTORY
    assert_reloads(job)


def test_two_copies_in_the_history_are_a_duplicate_for_review(clock: FakeClock) -> None:
    job = unknown(clock)
    job.record_history(query=QUERY, copies=["m1", "m2"], decision=Duplicate(POLICY), at=clock.now)
    assert job.state is JobState.REVIEW and job.duplicate
    escalated = job.pending_events[-1]
    assert isinstance(escalated, SendJob.Escalated) and "in the history" in escalated.detail
    assert_reloads(job)


def test_a_miss_proves_nothing_the_search_stays_due_when_it_was(clock: FakeClock) -> None:
    job = unknown(clock)
    job.record_history(query=QUERY, copies=[], decision=HistoryMiss(POLICY), at=clock.now)
    missed = job.pending_events[-1]
    assert isinstance(missed, SendJob.HistoryMissed) and not missed.believed
    assert missed.query == QUERY
    assert {"policy": missed.policy, "fingerprint": missed.fingerprint} == POLICY.event_fields()
    assert (job.state, job.misses, job.history_due_at) == (JobState.UNKNOWN, 0, None)
    assert job.due_at == job.search_due_at == clock.now + SEARCH_AFTER
    # ... and a search before then is refused, as without a history.
    with pytest.raises(TransitionError, match="search not due"):
        job.record_search(
            query="q", copies=[], decision=SearchAgainAt(POLICY, clock.now), at=clock.now
        )
    assert_reloads(job)


def test_a_miss_read_again_later_then_believed_makes_the_search_due_at_once(
    clock: FakeClock,
) -> None:
    job = unknown(clock)
    again = clock.now + timedelta(seconds=10)
    job.record_history(
        query=QUERY, copies=[], decision=HistoryMiss(POLICY, next_at=again), at=clock.now
    )
    assert (job.history_due_at, job.due_at) == (again, again)
    with pytest.raises(TransitionError, match="history read not due"):
        job.record_history(query=QUERY, copies=[], decision=HistoryMiss(POLICY), at=clock.now)
    clock.advance(10)
    job.record_history(
        query=QUERY, copies=[], decision=HistoryMiss(POLICY, search_at=clock.now), at=clock.now
    )
    believed = job.pending_events[-1]
    assert isinstance(believed, SendJob.HistoryMissed) and believed.believed
    assert job.search_due_at == job.due_at == clock.now
    # The search that follows counts its misses as always.
    job.record_search(
        query="q", copies=[], decision=ResendAt(POLICY, clock.now, misses_required=1), at=clock.now
    )
    assert job.state is JobState.REQUESTED
    assert_reloads(job)


def test_an_expired_start_leaves_the_search_to_decide(clock: FakeClock) -> None:
    job = unknown(clock)
    job.record_history_unusable(reason="historyId 123456 expired (HTTP 404)", at=clock.now)
    unusable = job.pending_events[-1]
    assert isinstance(unusable, SendJob.HistoryUnusable) and unusable.history_id == MARK
    assert (job.history_id, job.history_due_at) == (None, None)
    assert job.due_at == clock.now + SEARCH_AFTER
    with pytest.raises(TransitionError, match="no history read is due"):
        job.record_history(query=QUERY, copies=["m1"], decision=Confirm(POLICY), at=clock.now)
    assert_reloads(job)


def test_a_search_miss_ends_the_history_reads(clock: FakeClock) -> None:
    job = unknown(clock)
    clock.advance(SEARCH_AFTER.total_seconds())
    job.record_search(query="q", copies=[], decision=SearchAgainAt(POLICY, clock.now), at=clock.now)
    assert job.history_due_at is None
    with pytest.raises(TransitionError, match="no history read is due"):
        job.record_history(query=QUERY, copies=["m1"], decision=Confirm(POLICY), at=clock.now)


def test_refusals_leave_the_job_untouched(clock: FakeClock) -> None:
    job = unknown(clock)
    before = len(job.pending_events)
    with pytest.raises(TransitionError, match="0 copies found, exactly one expected"):
        job.record_history(query=QUERY, copies=[], decision=Confirm(POLICY), at=clock.now)
    with pytest.raises(TransitionError, match="2 copies found, exactly one expected"):
        job.record_history(query=QUERY, copies=["a", "b"], decision=Confirm(POLICY), at=clock.now)
    with pytest.raises(TransitionError, match="1 copies found, two or more expected"):
        job.record_history(query=QUERY, copies=["a"], decision=Duplicate(POLICY), at=clock.now)
    with pytest.raises(TransitionError, match="1 copies found, none expected"):
        job.record_history(query=QUERY, copies=["a"], decision=HistoryMiss(POLICY), at=clock.now)
    with pytest.raises(TransitionError, match="does not decide this"):
        not_a_history_decision: Any = SearchAgainAt(POLICY, clock.now)  # wrong on purpose
        job.record_history(query=QUERY, copies=[], decision=not_a_history_decision, at=clock.now)
    earlier = clock.now - timedelta(seconds=1)
    with pytest.raises(TransitionError, match="nothing can be due before"):
        job.record_history(
            query=QUERY, copies=[], decision=HistoryMiss(POLICY, next_at=earlier), at=clock.now
        )
    assert len(job.pending_events) == before
    # No historyId with the claim: no history read may be planned, nor made.
    bare = requested_job(clock)
    bare.claim(provider=PROVIDER, deadline=clock.now + DEADLINE, at=clock.now)
    with pytest.raises(TransitionError, match="no historyId was recorded"):
        bare.record_unknown(
            reason="lost", decision=SearchAt(POLICY, clock.now, clock.now), at=clock.now
        )
    marked = requested_job(clock)
    marked.claim(provider=PROVIDER, deadline=clock.now + DEADLINE, at=clock.now, history_id=MARK)
    with pytest.raises(TransitionError, match="a history read cannot be due before"):
        marked.record_unknown(
            reason="lost", decision=SearchAt(POLICY, clock.now, earlier), at=clock.now
        )
    planned_none = unknown(clock, history=False)
    with pytest.raises(TransitionError, match="no history read is due"):
        planned_none.record_history(
            query=QUERY, copies=["m1"], decision=Confirm(POLICY), at=clock.now
        )
    with pytest.raises(TransitionError, match="no historyId is recorded"):
        unknown(clock, mark=None, history=False).record_history_unusable(reason="x", at=clock.now)
    # Not while a call is in flight, nor once settled.
    claimed = requested_job(clock)
    claimed.claim(provider=PROVIDER, deadline=clock.now + DEADLINE, at=clock.now, history_id=MARK)
    with pytest.raises(TransitionError):
        claimed.record_history(query=QUERY, copies=["m1"], decision=Confirm(POLICY), at=clock.now)
    with pytest.raises(TransitionError):
        claimed.record_history_unusable(reason="x", at=clock.now)


def test_a_review_after_the_unknown_plans_no_history_read(clock: FakeClock) -> None:
    job = requested_job(clock)
    job.claim(provider=PROVIDER, deadline=clock.now + DEADLINE, at=clock.now, history_id=MARK)
    job.record_unknown(
        reason="lost", decision=Review(POLICY, EscalationReason.HANDLE_UNRELIABLE), at=clock.now
    )
    assert job.state is JobState.REVIEW and job.due_at is None


def _stored_as_before(event: object, *, drop: str, version: int) -> StoredEvent:
    """The event as a store written before the history handle holds it: without `drop`,
    at class version `version`."""
    stored = MAPPER.to_stored_event(event)  # type: ignore[arg-type]
    state = json.loads(stored.state)
    del state[drop]
    state["class_version"] = version
    return StoredEvent(
        originator_id=stored.originator_id,
        originator_version=stored.originator_version,
        topic=stored.topic,
        state=json.dumps(state).encode(),
    )


def test_claims_and_unknowns_stored_before_the_history_load_with_none(clock: FakeClock) -> None:
    job = unknown(clock, mark=None, history=False)
    requested, attempted, unknown_event = job.pending_events
    old = [
        MAPPER.to_stored_event(requested),
        _stored_as_before(attempted, drop="history_id", version=2),
        _stored_as_before(unknown_event, drop="history_due_at", version=1),
    ]
    loaded = None
    for item in old:
        loaded = MAPPER.to_domain_event(item).mutate(loaded)  # type: ignore[attr-defined]
    assert isinstance(loaded, SendJob)
    assert (loaded.history_id, loaded.history_due_at) == (None, None)
    assert loaded.due_at == loaded.search_due_at == clock.now + SEARCH_AFTER
    assert loaded.state is JobState.UNKNOWN
