"""SendJob in drafts mode (docs/providers.md "Gmail setup"): the draft recorded before the claim,
Confirmed via draft, a pending draft sent again or reviewed; every refusal; the history
reloads through the store's mapper, and a job stored before drafts existed loads with
none recorded ("Stored events keep loading" in docs/architecture.md)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from eventsourcing.utils import get_topic, resolve_topic
from tests.unit.jobs import DEADLINE, MAPPER, POLICY, PROVIDER, assert_reloads, requested_job

from daemon.doubles.fake_time import FakeClock
from ledger.decision_types import Confirm, RetryAt, Review, SearchAt
from ledger.job import SendJob, TransitionError
from ledger.vocabulary import ConfirmedVia, EscalationReason, JobState

DRAFT = "r123"
DRAFT_MESSAGE = "18c0ffee"


def drafted(clock: FakeClock) -> SendJob:
    job = requested_job(clock)
    job.record_draft(draft_id=DRAFT, provider_message_id=DRAFT_MESSAGE, at=clock.now)
    return job


def claimed(clock: FakeClock) -> SendJob:
    job = drafted(clock)
    job.claim(provider=PROVIDER, deadline=clock.now + DEADLINE, at=clock.now)
    return job


@pytest.mark.parametrize("cls", [SendJob.DraftCreated, SendJob.DraftPending, SendJob.DraftGone])
def test_draft_events_have_explicit_topics(cls: type[SendJob.Event]) -> None:
    assert f"sendledger:SendJob.{cls.__name__}" == cls.TOPIC
    assert resolve_topic(get_topic(cls)) is cls


def test_the_draft_is_recorded_before_the_claim_and_the_claim_keeps_it(clock: FakeClock) -> None:
    job = claimed(clock)
    assert (job.draft_id, job.draft_message_id) == (DRAFT, DRAFT_MESSAGE)
    assert [type(e) for e in job.pending_events[1:]] == [SendJob.DraftCreated, SendJob.Attempted]
    assert_reloads(job)


def test_a_job_without_drafts_has_none_recorded(clock: FakeClock) -> None:
    job = requested_job(clock)
    assert (job.draft_id, job.draft_message_id) == (None, None)


@pytest.mark.parametrize("state", ["attempted", "unknown"])
def test_the_consumed_draft_confirms_via_draft(clock: FakeClock, state: str) -> None:
    job = claimed(clock)
    if state == "unknown":
        job.record_unknown(reason="reply lost", decision=SearchAt(POLICY, clock.now), at=clock.now)
    job.record_draft_sent(provider_message_id=DRAFT_MESSAGE, decision=Confirm(POLICY), at=clock.now)
    assert job.state is JobState.CONFIRMED
    assert job.provider_message_ids == [DRAFT_MESSAGE]
    confirmed = job.pending_events[-1]
    assert isinstance(confirmed, SendJob.Confirmed) and confirmed.via == ConfirmedVia.DRAFT
    assert_reloads(job)


def test_a_pending_draft_is_sent_again_when_the_policy_says_so(clock: FakeClock) -> None:
    job = claimed(clock)
    job.record_unknown(reason="reply lost", decision=SearchAt(POLICY, clock.now), at=clock.now)
    job.record_draft_pending(decision=RetryAt(POLICY, clock.now), at=clock.now)
    assert job.state is JobState.REQUESTED and job.due_at == clock.now
    assert job.draft_id == DRAFT  # the same draft is sent again
    job.claim(provider=PROVIDER, deadline=clock.now + DEADLINE, at=clock.now)
    assert job.attempts == 2
    assert_reloads(job)


def test_a_pending_draft_goes_to_review_when_the_policy_says_so(clock: FakeClock) -> None:
    job = claimed(clock)
    job.record_draft_pending(
        decision=Review(POLICY, EscalationReason.UNKNOWN_OUTCOME), at=clock.now
    )
    assert job.state is JobState.REVIEW
    assert job.reason == EscalationReason.UNKNOWN_OUTCOME
    escalated = job.pending_events[-1]
    assert isinstance(escalated, SendJob.Escalated) and "still unsent" in escalated.detail
    assert_reloads(job)


def test_refusals_leave_the_job_untouched(clock: FakeClock) -> None:
    job = claimed(clock)
    before = len(job.pending_events)
    with pytest.raises(TransitionError, match="not the draft's message"):
        job.record_draft_sent(provider_message_id="other", decision=Confirm(POLICY), at=clock.now)
    with pytest.raises(TransitionError):  # a claimed job gets no new draft
        job.record_draft(draft_id="r2", provider_message_id="m2", at=clock.now)
    with pytest.raises(TransitionError, match="before the check"):
        job.record_draft_pending(
            decision=RetryAt(POLICY, clock.now - timedelta(seconds=1)), at=clock.now
        )
    assert len(job.pending_events) == before
    plain = requested_job(clock)
    plain.claim(provider=PROVIDER, deadline=clock.now + DEADLINE, at=clock.now)
    with pytest.raises(TransitionError, match="no draft"):
        plain.record_draft_sent(provider_message_id="m", decision=Confirm(POLICY), at=clock.now)
    with pytest.raises(TransitionError, match="no draft"):
        plain.record_draft_pending(decision=RetryAt(POLICY, clock.now), at=clock.now)
    with pytest.raises(TransitionError, match="needs its id"):
        requested_job(clock).record_draft(draft_id="", provider_message_id="m", at=clock.now)


def test_a_stored_job_from_before_drafts_loads_without_a_draft(clock: FakeClock) -> None:
    job = requested_job(clock)
    job.claim(provider=PROVIDER, deadline=clock.now + DEADLINE, at=clock.now)
    stored = [MAPPER.to_stored_event(e) for e in job.pending_events]
    loaded = None
    for item in stored:
        loaded = MAPPER.to_domain_event(item).mutate(loaded)  # type: ignore[attr-defined]
    assert isinstance(loaded, SendJob)
    assert (loaded.draft_id, loaded.draft_message_id) == (None, None)


def test_a_gone_draft_is_forgotten_and_the_search_decides(clock: FakeClock) -> None:
    job = claimed(clock)
    unknown_at = clock.now
    job.record_unknown(reason="reply lost", decision=SearchAt(POLICY, clock.now), at=clock.now)
    later = unknown_at + timedelta(minutes=5)
    job.record_draft_gone(decision=SearchAt(POLICY, later), at=clock.now)
    assert (job.state, job.due_at, job.draft_id) == (JobState.UNKNOWN, later, None)
    assert_reloads(job)


def test_a_gone_draft_on_a_review_channel_goes_to_review(clock: FakeClock) -> None:
    job = claimed(clock)
    job.record_unknown(reason="reply lost", decision=SearchAt(POLICY, clock.now), at=clock.now)
    job.record_draft_gone(decision=Review(POLICY, EscalationReason.UNKNOWN_OUTCOME), at=clock.now)
    assert job.state is JobState.REVIEW
    escalated = job.pending_events[-1]
    assert isinstance(escalated, SendJob.Escalated) and DRAFT in escalated.detail
    with pytest.raises(TransitionError):
        claimed(clock).record_draft_gone(decision=SearchAt(POLICY, clock.now), at=clock.now)
