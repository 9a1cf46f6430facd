"""Every SendJob command: the transition it makes and every refusal it must make.

Refusals must raise (TransitionError for a state that does not allow the command,
ValueError for an unknown reason/decision/source) and leave the aggregate untouched.
"""

from __future__ import annotations

import copy
import functools
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest
from eventsourcing.domain import DomainEventProtocol
from eventsourcing.persistence import (
    DatetimeAsISO,
    DecimalAsStr,
    JSONTranscoder,
    Mapper,
    UUIDAsHex,
)
from eventsourcing.utils import get_topic, resolve_topic
from tests.conftest import FakeClock

from ledger.job import (
    JOB_NAMESPACE,
    JobState,
    SendJob,
    TransitionError,
    job_id_for,
)

KEY = "order-42"
POLICY = "receipts"
FINGERPRINT = "sha256:0123456789abcdef"
PROVIDER = "support"
SEARCH_AFTER = timedelta(minutes=5)
DEADLINE = timedelta(seconds=30)

EVENT_CLASSES: list[type[Any]] = [
    SendJob.Requested,
    SendJob.Attempted,
    SendJob.Unknown,
    SendJob.SearchedMiss,
    SendJob.Requeued,
    SendJob.Rejected,
    SendJob.Confirmed,
    SendJob.Duplicate,
    SendJob.Escalated,
    SendJob.Resolved,
]


# -- helpers ----------------------------------------------------------------------------


def new_job(clock: FakeClock, key: str = KEY) -> SendJob:
    job = SendJob.request(
        key=key,
        channel="receipts",
        to=["Bob <bob@example.com>"],
        cc=["carol@example.com"],
        reply_to="help@example.com",
        from_addr="Support <support@example.com>",
        subject="Your receipt",
        body="Thanks!",
        html="<p>Thanks!</p>",
        message_id="<job-abc@mail.example.com>",
        content_hash="sha256:feed",
        policy=POLICY,
        fingerprint=FINGERPRINT,
        at=clock.now,
    )
    job.collect_events()  # tests below look only at the events their command appends
    return job


def appended(job: SendJob) -> list[Any]:
    """The events the last command(s) appended (drains the pending list)."""
    return list(job.collect_events())


def only_event(job: SendJob, cls: type[Any]) -> Any:
    events = appended(job)
    assert [type(e) for e in events] == [cls]
    return events[0]


def state(job: SendJob) -> JobState:
    """The state, read afresh (keeps mypy from narrowing across commands)."""
    return job.state


def state_of(job: SendJob) -> dict[str, Any]:
    return copy.deepcopy({k: v for k, v in vars(job).items() if k != "_pending_events"})


def refused(
    job: SendJob,
    command: Callable[[], object],
    match: str,
    exc: type[Exception] = TransitionError,
) -> Exception:
    """Run a command that must be refused; the job must be left exactly as it was."""
    before = state_of(job)
    pending = list(job.collect_events())
    assert pending == [], "helper expects a drained job"
    with pytest.raises(exc, match=match) as info:
        command()
    assert state_of(job) == before
    assert list(job.collect_events()) == []
    return info.value


def attempt(job: SendJob, clock: FakeClock) -> int:
    return job.attempt(provider=PROVIDER, deadline=clock.now + DEADLINE, at=clock.now)


def unknown(job: SendJob, clock: FakeClock, *, search: bool = True) -> None:
    job.record_unknown(
        reason="timeout",
        search_due_at=clock.now + SEARCH_AFTER if search else None,
        policy=POLICY,
        fingerprint=FINGERPRINT,
        at=clock.now,
    )


def miss(job: SendJob, clock: FakeClock, *, again: bool = True) -> None:
    job.record_miss(
        query="rfc822msgid:<job-abc@mail.example.com>",
        next_search_at=clock.now + SEARCH_AFTER if again else None,
        policy=POLICY,
        fingerprint=FINGERPRINT,
        at=clock.now,
    )


def requeue(job: SendJob, clock: FakeClock, *, misses_required: int = 2) -> None:
    job.requeue(
        reason="not found after 2 searches",
        due_at=clock.now,
        misses_required=misses_required,
        policy=POLICY,
        fingerprint=FINGERPRINT,
        at=clock.now,
    )


def reject(job: SendJob, clock: FakeClock, *, transient: bool, retry_at: datetime | None) -> None:
    job.reject(
        transient=transient,
        reason="429 rateLimitExceeded" if transient else "400 invalidArgument",
        status=429 if transient else 400,
        retry_at=retry_at,
        policy=POLICY,
        fingerprint=FINGERPRINT,
        at=clock.now,
    )


def confirm(job: SendJob, clock: FakeClock, via: str, ids: list[str]) -> None:
    job.confirm(
        via=via, provider_message_ids=ids, policy=POLICY, fingerprint=FINGERPRINT, at=clock.now
    )


def duplicate(job: SendJob, clock: FakeClock, ids: list[str]) -> None:
    job.record_duplicate(
        provider_message_ids=ids, policy=POLICY, fingerprint=FINGERPRINT, at=clock.now
    )


def escalate(job: SendJob, clock: FakeClock, reason: str = "unknown-outcome") -> None:
    job.escalate(
        reason=reason, detail="needs a human", policy=POLICY, fingerprint=FINGERPRINT, at=clock.now
    )


def resolve(job: SendJob, clock: FakeClock, decision: str) -> None:
    job.resolve(decision=decision, note="checked the mailbox", by="alice", at=clock.now)


# Jobs in each interesting situation -----------------------------------------------------


def attempted_job(clock: FakeClock) -> SendJob:
    job = new_job(clock)
    attempt(job, clock)
    appended(job)
    return job


def unknown_job(clock: FakeClock) -> SendJob:
    job = attempted_job(clock)
    clock.advance(30)
    unknown(job, clock)
    appended(job)
    return job


def searched_job(clock: FakeClock, misses: int, *, believed: bool = True) -> SendJob:
    job = unknown_job(clock)
    for number in range(1, misses + 1):
        clock.advance(SEARCH_AFTER.total_seconds())
        miss(job, clock, again=not (believed and number == misses))
    appended(job)
    return job


def review_job(clock: FakeClock) -> SendJob:
    job = attempted_job(clock)
    unknown(job, clock, search=False)
    escalate(job, clock, "unknown-outcome")
    appended(job)
    return job


def duplicate_job(clock: FakeClock, *, escalated: bool) -> SendJob:
    job = unknown_job(clock)
    clock.advance(SEARCH_AFTER.total_seconds())
    duplicate(job, clock, ["m1", "m2"])
    if escalated:
        escalate(job, clock, "duplicate")
    appended(job)
    return job


def confirmed_job(clock: FakeClock) -> SendJob:
    job = attempted_job(clock)
    confirm(job, clock, "response", ["m1"])
    appended(job)
    return job


def abandoned_job(clock: FakeClock) -> SendJob:
    job = review_job(clock)
    resolve(job, clock, "abandon")
    appended(job)
    return job


def permanently_rejected_job(clock: FakeClock) -> SendJob:
    job = attempted_job(clock)
    reject(job, clock, transient=False, retry_at=None)
    appended(job)
    return job


# -- identity and topics ----------------------------------------------------------------


def test_aggregate_id_is_uuid5_of_the_key(clock: FakeClock) -> None:
    job = new_job(clock)
    assert job.id == job_id_for(KEY) == uuid.uuid5(JOB_NAMESPACE, KEY)
    assert job_id_for("other") != job.id
    assert job_id_for("ключ-🎉") == uuid.uuid5(JOB_NAMESPACE, "ключ-🎉")


@pytest.mark.parametrize("cls", [*EVENT_CLASSES, SendJob.Verified], ids=lambda c: c.__name__)
def test_event_classes_have_explicit_topics_that_resolve_to_them(cls: type[Any]) -> None:
    topic = cls.TOPIC
    assert topic == f"sendledger:SendJob.{cls.__name__}"
    assert get_topic(cls) == topic
    assert resolve_topic(topic) is cls


def test_aggregate_topic_is_explicit() -> None:
    assert SendJob.TOPIC == "sendledger:SendJob"
    assert resolve_topic("sendledger:SendJob") is SendJob


def test_no_two_event_classes_share_a_topic() -> None:
    nested = {
        name: value
        for name, value in vars(SendJob).items()
        if isinstance(value, type) and issubclass(value, SendJob.Event)
    }
    for cls in nested.values():
        assert resolve_topic(get_topic(cls)) is cls


def _mapper() -> Mapper[uuid.UUID]:
    transcoder = JSONTranscoder()
    for transcoding in (UUIDAsHex(), DatetimeAsISO(), DecimalAsStr()):
        transcoder.register(transcoding)
    return Mapper(transcoder=transcoder)


def _full_history(clock: FakeClock) -> list[DomainEventProtocol[uuid.UUID]]:
    job = SendJob.request(
        key=KEY,
        channel="c",
        to=["a@example.com"],
        cc=[],
        reply_to=None,
        from_addr="s@example.com",
        subject="s",
        body="b",
        html=None,
        message_id="<job-x@example.com>",
        content_hash="h",
        policy=POLICY,
        fingerprint=FINGERPRINT,
        at=clock.now,
    )
    attempt(job, clock)
    reject(job, clock, transient=True, retry_at=clock.now)
    attempt(job, clock)
    unknown(job, clock)
    clock.advance(SEARCH_AFTER.total_seconds())
    miss(job, clock)
    clock.advance(SEARCH_AFTER.total_seconds())
    miss(job, clock, again=False)
    requeue(job, clock)
    attempt(job, clock)
    unknown(job, clock)
    clock.advance(SEARCH_AFTER.total_seconds())
    duplicate(job, clock, ["m1", "m2"])
    escalate(job, clock, "duplicate")
    resolve(job, clock, "sent")
    return list(job.collect_events())


def test_stored_topics_resolve_back_to_the_event_classes(clock: FakeClock) -> None:
    mapper = _mapper()
    events = _full_history(clock)
    assert {type(e) for e in events} == set(EVENT_CLASSES)  # Verified: test_verification.py
    replayed: Any = None
    for event in events:
        stored = mapper.to_stored_event(event)
        assert stored.topic.startswith("sendledger:SendJob.")
        assert resolve_topic(stored.topic) is type(event)
        restored = mapper.to_domain_event(stored)
        assert restored == event
        replayed = restored.mutate(replayed)  # type: ignore[attr-defined]
    assert replayed.state is JobState.CONFIRMED


# -- request ----------------------------------------------------------------------------


def test_request_creates_a_requested_job_due_now(clock: FakeClock) -> None:
    job = SendJob.request(
        key=KEY,
        channel="receipts",
        to=["bob@example.com"],
        cc=[],
        reply_to=None,
        from_addr="support@example.com",
        subject="Hi",
        body="Body",
        html=None,
        message_id="<job-abc@mail.example.com>",
        content_hash="sha256:feed",
        policy=POLICY,
        fingerprint=FINGERPRINT,
        at=clock.now,
    )
    assert job.state is JobState.REQUESTED
    assert job.due_at == clock.now
    assert job.created_on == clock.now
    assert job.version == 1
    assert (job.attempts, job.round_attempts, job.searches, job.misses) == (0, 0, 0, 0)
    assert job.awaiting is None and job.reason is None and not job.duplicate
    assert not job.settled
    event = only_event(job, SendJob.Requested)
    assert (event.policy, event.fingerprint) == (POLICY, FINGERPRINT)
    assert event.key == KEY and event.message_id == "<job-abc@mail.example.com>"
    assert event.content_hash == "sha256:feed"
    assert event.to == ["bob@example.com"]


def test_request_copies_the_recipient_lists(clock: FakeClock) -> None:
    to = ["bob@example.com"]
    job = SendJob.request(
        key=KEY,
        channel="c",
        to=to,
        cc=[],
        reply_to=None,
        from_addr="s@example.com",
        subject="s",
        body="b",
        html=None,
        message_id="<m@example.com>",
        content_hash="h",
        policy=POLICY,
        fingerprint=FINGERPRINT,
        at=clock.now,
    )
    to.append("mallory@example.com")
    assert job.to == ["bob@example.com"]


# -- attempt ----------------------------------------------------------------------------


def test_attempt_claims_the_job(clock: FakeClock) -> None:
    job = new_job(clock)
    number = attempt(job, clock)
    assert number == 1
    assert job.state is JobState.ATTEMPTED
    assert (job.attempts, job.round_attempts) == (1, 1)
    assert job.due_at == clock.now + DEADLINE
    assert job.last_provider == PROVIDER
    event = only_event(job, SendJob.Attempted)
    assert (event.attempt, event.provider, event.deadline) == (1, PROVIDER, clock.now + DEADLINE)
    assert event.timestamp == clock.now


def test_no_second_attempt_before_an_outcome(clock: FakeClock) -> None:
    job = attempted_job(clock)
    clock.advance(3600)  # even long after the deadline: an Unknown must come first
    error = refused(job, lambda: attempt(job, clock), r"is attempted: cannot Attempted")
    assert isinstance(error, TransitionError)
    assert (error.key, error.state, error.action) == (KEY, "attempted", "Attempted")


def test_attempt_refused_before_due(clock: FakeClock) -> None:
    job = attempted_job(clock)
    reject(job, clock, transient=True, retry_at=clock.now + timedelta(seconds=60))
    appended(job)
    clock.advance(59)
    refused(job, lambda: attempt(job, clock), "not due before")
    clock.advance(1)
    assert attempt(job, clock) == 2


def test_attempt_refused_with_a_deadline_not_after_the_attempt(clock: FakeClock) -> None:
    job = new_job(clock)
    refused(
        job,
        lambda: job.attempt(provider=PROVIDER, deadline=clock.now, at=clock.now),
        "deadline must be after the attempt",
    )


@pytest.mark.parametrize(
    "make",
    [unknown_job, review_job, confirmed_job, abandoned_job],
    ids=["unknown", "review", "confirmed", "abandoned"],
)
def test_attempt_refused_outside_requested(make: Callable[[FakeClock], SendJob]) -> None:
    clock = FakeClock()
    job = make(clock)
    clock.advance(86400)
    refused(job, lambda: attempt(job, clock), "cannot Attempted")


# -- record_unknown ---------------------------------------------------------------------


def test_unknown_schedules_the_first_search(clock: FakeClock) -> None:
    job = attempted_job(clock)
    clock.advance(31)
    unknown(job, clock)
    assert job.state is JobState.UNKNOWN
    assert job.due_at == clock.now + SEARCH_AFTER
    assert (job.searches, job.misses) == (0, 0)
    assert job.reason == "timeout"
    assert job.awaiting is None
    event = only_event(job, SendJob.Unknown)
    assert event.attempt == 1
    assert event.search_due_at == clock.now + SEARCH_AFTER
    assert (event.policy, event.fingerprint) == (POLICY, FINGERPRINT)


def test_unknown_without_search_awaits_escalation(clock: FakeClock) -> None:
    job = attempted_job(clock)
    unknown(job, clock, search=False)
    appended(job)
    assert job.state is JobState.UNKNOWN
    assert job.due_at is None
    assert job.awaiting == "Escalated"
    clock.advance(86400)
    refused(job, lambda: miss(job, clock), "Escalated must come first")
    refused(job, lambda: confirm(job, clock, "search", ["m1"]), "Escalated must come first")
    refused(job, lambda: requeue(job, clock, misses_required=1), "Escalated must come first")
    refused(job, lambda: duplicate(job, clock, ["m1", "m2"]), "Escalated must come first")
    escalate(job, clock, "unknown-outcome")
    assert state(job) is JobState.REVIEW


def test_unknown_refuses_a_search_due_before_the_outcome(clock: FakeClock) -> None:
    job = attempted_job(clock)
    refused(
        job,
        lambda: job.record_unknown(
            reason="timeout",
            search_due_at=clock.now - timedelta(seconds=1),
            policy=POLICY,
            fingerprint=FINGERPRINT,
            at=clock.now,
        ),
        "a search cannot be due before the outcome",
    )


@pytest.mark.parametrize(
    "make", [new_job, unknown_job, review_job, confirmed_job], ids=lambda f: f.__name__
)
def test_unknown_refused_without_an_attempt(make: Callable[[FakeClock], SendJob]) -> None:
    clock = FakeClock()
    job = make(clock)
    refused(job, lambda: unknown(job, clock), "cannot Unknown")


# -- record_miss ------------------------------------------------------------------------


def test_miss_after_the_search_is_due(clock: FakeClock) -> None:
    job = unknown_job(clock)
    clock.advance(SEARCH_AFTER.total_seconds())
    miss(job, clock)
    assert job.state is JobState.UNKNOWN
    assert (job.searches, job.misses) == (1, 1)
    assert job.due_at == clock.now + SEARCH_AFTER
    assert job.awaiting is None
    event = only_event(job, SendJob.SearchedMiss)
    assert event.search == 1
    assert event.query == "rfc822msgid:<job-abc@mail.example.com>"
    assert event.next_search_at == clock.now + SEARCH_AFTER
    assert (event.policy, event.fingerprint) == (POLICY, FINGERPRINT)


def test_miss_refused_before_the_search_is_due(clock: FakeClock) -> None:
    # A search inside the lag window reads a lagging index: it proves nothing.
    job = unknown_job(clock)
    clock.advance(SEARCH_AFTER.total_seconds() - 1)
    refused(job, lambda: miss(job, clock), "search not due before")


def test_second_miss_refused_before_the_next_search(clock: FakeClock) -> None:
    job = searched_job(clock, 1, believed=False)
    clock.advance(SEARCH_AFTER.total_seconds() - 1)
    refused(job, lambda: miss(job, clock), "search not due before")
    clock.advance(1)
    miss(job, clock)
    assert (job.searches, job.misses) == (2, 2)


def test_believed_miss_awaits_a_decision(clock: FakeClock) -> None:
    job = searched_job(clock, 2, believed=True)
    assert job.due_at is None
    assert job.awaiting == "Requeued|Escalated"
    clock.advance(3600)
    refused(job, lambda: miss(job, clock), "Requeued|Escalated must come first")
    refused(job, lambda: confirm(job, clock, "search", ["m1"]), "must come first")
    escalate(job, clock, "unknown-outcome")
    assert job.state is JobState.REVIEW


def test_miss_refuses_a_next_search_before_the_miss(clock: FakeClock) -> None:
    job = unknown_job(clock)
    clock.advance(SEARCH_AFTER.total_seconds())
    refused(
        job,
        lambda: job.record_miss(
            query="q",
            next_search_at=clock.now - timedelta(seconds=1),
            policy=POLICY,
            fingerprint=FINGERPRINT,
            at=clock.now,
        ),
        "cannot SearchedMiss",
    )


@pytest.mark.parametrize("make", [new_job, attempted_job, review_job], ids=lambda f: f.__name__)
def test_miss_refused_outside_unknown(make: Callable[[FakeClock], SendJob]) -> None:
    clock = FakeClock()
    job = make(clock)
    clock.advance(3600)
    refused(job, lambda: miss(job, clock), "cannot SearchedMiss")


# -- requeue ----------------------------------------------------------------------------


def test_requeue_after_enough_misses(clock: FakeClock) -> None:
    job = searched_job(clock, 2)
    requeue(job, clock, misses_required=2)
    assert job.state is JobState.REQUESTED
    assert job.due_at == clock.now
    assert (job.searches, job.misses) == (0, 0)
    assert job.awaiting is None
    assert job.reason == "not found after 2 searches"
    event = only_event(job, SendJob.Requeued)
    assert event.misses_required == 2
    assert (event.policy, event.fingerprint) == (POLICY, FINGERPRINT)
    assert attempt(job, clock) == 2
    assert (job.attempts, job.round_attempts) == (2, 2)


def test_requeue_never_due_in_the_past(clock: FakeClock) -> None:
    job = searched_job(clock, 1)
    job.requeue(
        reason="r",
        due_at=clock.now - timedelta(hours=1),
        misses_required=1,
        policy=POLICY,
        fingerprint=FINGERPRINT,
        at=clock.now,
    )
    assert job.due_at == clock.now


def test_requeue_refused_before_confirm_misses(clock: FakeClock) -> None:
    job = searched_job(clock, 1, believed=False)
    refused(job, lambda: requeue(job, clock, misses_required=2), "1 empty searches, 2 required")


def test_requeue_refused_without_any_miss(clock: FakeClock) -> None:
    job = unknown_job(clock)
    clock.advance(SEARCH_AFTER.total_seconds())
    refused(job, lambda: requeue(job, clock, misses_required=1), "0 empty searches, 1 required")
    # misses_required below one never turns "no search at all" into a resend
    refused(job, lambda: requeue(job, clock, misses_required=0), "0 empty searches, 1 required")


@pytest.mark.parametrize(
    "make", [new_job, attempted_job, review_job, confirmed_job], ids=lambda f: f.__name__
)
def test_requeue_refused_outside_unknown(make: Callable[[FakeClock], SendJob]) -> None:
    clock = FakeClock()
    job = make(clock)
    refused(job, lambda: requeue(job, clock, misses_required=1), "cannot Requeued")


@pytest.mark.parametrize("escalated", [False, True], ids=["duplicate", "duplicate+escalated"])
def test_requeue_refused_after_duplicate(escalated: bool) -> None:
    clock = FakeClock()
    job = duplicate_job(clock, escalated=escalated)
    refused(job, lambda: requeue(job, clock, misses_required=1), "cannot Requeued")


# -- reject -----------------------------------------------------------------------------


def test_transient_rejection_with_retry_time(clock: FakeClock) -> None:
    job = attempted_job(clock)
    retry_at = clock.now + timedelta(seconds=30)
    reject(job, clock, transient=True, retry_at=retry_at)
    assert job.state is JobState.REQUESTED
    assert job.due_at == retry_at
    assert job.awaiting is None
    assert job.reason == "429 rateLimitExceeded"
    event = only_event(job, SendJob.Rejected)
    assert (event.attempt, event.transient, event.status, event.retry_at) == (
        1,
        True,
        429,
        retry_at,
    )
    assert (event.policy, event.fingerprint) == (POLICY, FINGERPRINT)


def test_transient_rejection_without_retry_awaits_escalation(clock: FakeClock) -> None:
    job = attempted_job(clock)
    reject(job, clock, transient=True, retry_at=None)
    event = only_event(job, SendJob.Rejected)
    assert event.transient and event.retry_at is None
    assert job.state is JobState.ATTEMPTED
    assert job.due_at is None
    assert job.awaiting == "Escalated"
    clock.advance(3600)
    refused(job, lambda: attempt(job, clock), "Escalated must come first")
    escalate(job, clock, "max-attempts")
    assert state(job) is JobState.REVIEW
    assert job.reason == "max-attempts"


def test_permanent_rejection_allows_only_escalation(clock: FakeClock) -> None:
    job = attempted_job(clock)
    reject(job, clock, transient=False, retry_at=None)
    event = only_event(job, SendJob.Rejected)
    assert not event.transient and event.status == 400
    assert job.awaiting == "Escalated"
    clock.advance(3600)
    awaiting = "Escalated must come first"
    refused(job, lambda: attempt(job, clock), awaiting)
    refused(job, lambda: unknown(job, clock), awaiting)
    refused(job, lambda: reject(job, clock, transient=True, retry_at=clock.now), awaiting)
    refused(job, lambda: confirm(job, clock, "response", ["m1"]), awaiting)
    refused(job, lambda: miss(job, clock), awaiting)
    refused(job, lambda: duplicate(job, clock, ["m1", "m2"]), awaiting)
    refused(job, lambda: resolve(job, clock, "sent"), awaiting)
    escalate(job, clock, "rejected")
    assert job.state is JobState.REVIEW
    assert only_event(job, SendJob.Escalated).reason == "rejected"


def test_permanent_rejection_is_never_retried(clock: FakeClock) -> None:
    job = attempted_job(clock)
    refused(
        job,
        lambda: reject(job, clock, transient=False, retry_at=clock.now + timedelta(seconds=1)),
        "a permanent rejection is never retried",
    )


def test_transient_rejection_refuses_a_retry_in_the_past(clock: FakeClock) -> None:
    job = attempted_job(clock)
    refused(
        job,
        lambda: reject(job, clock, transient=True, retry_at=clock.now - timedelta(hours=1)),
        "cannot Rejected",
    )


@pytest.mark.parametrize("make", [new_job, unknown_job, review_job], ids=lambda f: f.__name__)
def test_reject_refused_without_an_attempt(make: Callable[[FakeClock], SendJob]) -> None:
    clock = FakeClock()
    job = make(clock)
    refused(job, lambda: reject(job, clock, transient=False, retry_at=None), "cannot Rejected")


# -- confirm ----------------------------------------------------------------------------


def test_confirm_via_response(clock: FakeClock) -> None:
    job = attempted_job(clock)
    confirm(job, clock, "response", ["18c3f0a1"])
    assert job.state is JobState.CONFIRMED
    assert job.provider_message_ids == ["18c3f0a1"]
    assert job.due_at is None
    assert job.settled
    event = only_event(job, SendJob.Confirmed)
    assert event.via == "response"
    assert event.provider_message_ids == ["18c3f0a1"]
    assert (event.policy, event.fingerprint) == (POLICY, FINGERPRINT)


@pytest.mark.parametrize("ids", [[], ["m1", "m2"]], ids=["no id", "two ids"])
def test_confirm_via_response_needs_exactly_one_id(ids: list[str]) -> None:
    clock = FakeClock()
    job = attempted_job(clock)
    refused(job, lambda: confirm(job, clock, "response", ids), "exactly one copy is required")


def test_confirm_via_search_after_the_search_is_due(clock: FakeClock) -> None:
    job = unknown_job(clock)
    clock.advance(SEARCH_AFTER.total_seconds() - 1)
    refused(job, lambda: confirm(job, clock, "search", ["m1"]), "search not due before")
    clock.advance(1)
    confirm(job, clock, "search", ["m1"])
    assert job.state is JobState.CONFIRMED
    assert only_event(job, SendJob.Confirmed).via == "search"


def test_confirm_via_search_after_misses(clock: FakeClock) -> None:
    job = searched_job(clock, 1, believed=False)
    clock.advance(SEARCH_AFTER.total_seconds())
    confirm(job, clock, "search", ["m1"])
    assert job.state is JobState.CONFIRMED


@pytest.mark.parametrize("ids", [[], ["m1", "m2"]], ids=["no id", "two ids"])
def test_confirm_via_search_needs_exactly_one_id(ids: list[str]) -> None:
    clock = FakeClock()
    job = unknown_job(clock)
    clock.advance(SEARCH_AFTER.total_seconds())
    refused(job, lambda: confirm(job, clock, "search", ids), "exactly one copy is required")


def test_confirm_via_the_wrong_source_for_the_state(clock: FakeClock) -> None:
    job = attempted_job(clock)
    refused(job, lambda: confirm(job, clock, "search", ["m1"]), "is attempted: cannot Confirmed")
    job = unknown_job(clock)
    clock.advance(3600)
    refused(job, lambda: confirm(job, clock, "response", ["m1"]), "is unknown: cannot Confirmed")
    job = new_job(clock)
    refused(job, lambda: confirm(job, clock, "response", ["m1"]), "is requested")


def test_confirm_via_operator_needs_a_sent_resolution(clock: FakeClock) -> None:
    job = review_job(clock)
    refused(
        job,
        lambda: confirm(job, clock, "operator", ["m1"]),
        "an operator's 'sent' decision must come first",
    )


def test_confirm_via_an_unknown_source_is_a_value_error(clock: FakeClock) -> None:
    job = attempted_job(clock)
    refused(
        job,
        lambda: confirm(job, clock, "guess", ["m1"]),
        "unknown confirmation source: 'guess'",
        ValueError,
    )


@pytest.mark.parametrize(
    "make", [confirmed_job, abandoned_job], ids=["after confirmed", "after abandoned"]
)
def test_confirm_refused_once_settled(make: Callable[[FakeClock], SendJob]) -> None:
    clock = FakeClock()
    job = make(clock)
    for via in ("response", "search", "operator"):
        refused(job, functools.partial(confirm, job, clock, via, ["m1"]), "cannot Confirmed")


# -- record_duplicate -------------------------------------------------------------------


def test_duplicate_from_unknown(clock: FakeClock) -> None:
    job = unknown_job(clock)
    clock.advance(SEARCH_AFTER.total_seconds())
    duplicate(job, clock, ["m1", "m2", "m3"])
    assert job.state is JobState.UNKNOWN
    assert job.duplicate
    assert job.provider_message_ids == ["m1", "m2", "m3"]
    assert job.awaiting == "Escalated"
    assert job.due_at is None
    event = only_event(job, SendJob.Duplicate)
    assert event.hits == 3
    assert (event.policy, event.fingerprint) == (POLICY, FINGERPRINT)


@pytest.mark.parametrize("ids", [[], ["m1"]], ids=["no id", "one id"])
def test_duplicate_needs_two_or_more_ids(ids: list[str]) -> None:
    clock = FakeClock()
    job = unknown_job(clock)
    refused(job, lambda: duplicate(job, clock, ids), "two or more copies are required")


def test_after_duplicate_only_escalation(clock: FakeClock) -> None:
    job = duplicate_job(clock, escalated=False)
    clock.advance(3600)
    awaiting = "Escalated must come first"
    refused(job, lambda: miss(job, clock), awaiting)
    refused(job, lambda: confirm(job, clock, "search", ["m1"]), awaiting)
    refused(job, lambda: requeue(job, clock, misses_required=1), awaiting)
    refused(job, lambda: duplicate(job, clock, ["m1", "m2"]), awaiting)
    escalate(job, clock, "duplicate")
    assert job.state is JobState.REVIEW
    assert job.duplicate


def test_duplicate_found_during_review(clock: FakeClock) -> None:
    job = review_job(clock)
    duplicate(job, clock, ["m1", "m2"])
    assert job.state is JobState.REVIEW
    assert job.awaiting == "Escalated"
    appended(job)
    refused(job, lambda: resolve(job, clock, "sent"), "Escalated must come first")
    escalate(job, clock, "duplicate")
    assert job.reason == "duplicate"
    assert job.awaiting is None


@pytest.mark.parametrize(
    "make", [new_job, attempted_job, confirmed_job, abandoned_job], ids=lambda f: f.__name__
)
def test_duplicate_refused_elsewhere(make: Callable[[FakeClock], SendJob]) -> None:
    clock = FakeClock()
    job = make(clock)
    refused(job, lambda: duplicate(job, clock, ["m1", "m2"]), "cannot Duplicate")


# -- escalate ---------------------------------------------------------------------------


def test_escalate_from_requested_without_a_policy(clock: FakeClock) -> None:
    job = new_job(clock)
    escalate(job, clock, "no-policy")
    assert job.state is JobState.REVIEW
    assert job.reason == "no-policy"
    assert job.due_at is None
    assert job.settled
    event = only_event(job, SendJob.Escalated)
    assert (event.reason, event.detail) == ("no-policy", "needs a human")
    assert (event.policy, event.fingerprint) == (POLICY, FINGERPRINT)


def test_escalate_unknown_reason_is_a_value_error(clock: FakeClock) -> None:
    job = unknown_job(clock)
    refused(
        job, lambda: escalate(job, clock, "bored"), "unknown escalation reason: 'bored'", ValueError
    )


def test_escalate_refused_when_already_in_review(clock: FakeClock) -> None:
    job = review_job(clock)
    refused(job, lambda: escalate(job, clock, "unknown-outcome"), "already in review")


def test_escalate_refused_twice_for_one_duplicate(clock: FakeClock) -> None:
    job = duplicate_job(clock, escalated=True)
    refused(job, lambda: escalate(job, clock, "duplicate"), "already in review")


@pytest.mark.parametrize("make", [confirmed_job, abandoned_job], ids=["confirmed", "abandoned"])
def test_escalate_refused_once_settled(make: Callable[[FakeClock], SendJob]) -> None:
    clock = FakeClock()
    job = make(clock)
    refused(job, lambda: escalate(job, clock, "unknown-outcome"), "cannot Escalated")


# -- resolve ----------------------------------------------------------------------------


def test_resolve_sent_confirms_via_operator(clock: FakeClock) -> None:
    job = review_job(clock)
    resolve(job, clock, "sent")
    events = appended(job)
    assert [type(e) for e in events] == [SendJob.Resolved, SendJob.Confirmed]
    resolved, confirmed = events
    assert (resolved.decision, resolved.note, resolved.by) == (
        "sent",
        "checked the mailbox",
        "alice",
    )
    assert confirmed.via == "operator"
    assert (confirmed.policy, confirmed.fingerprint) == ("operator", "alice")
    assert job.state is JobState.CONFIRMED
    assert job.awaiting is None


def test_resolve_sent_after_duplicate_keeps_the_copies(clock: FakeClock) -> None:
    job = duplicate_job(clock, escalated=True)
    resolve(job, clock, "sent")
    assert job.state is JobState.CONFIRMED
    assert job.provider_message_ids == ["m1", "m2"]


def test_resolve_resend_reopens_the_job(clock: FakeClock) -> None:
    job = review_job(clock)
    clock.advance(600)
    resolve(job, clock, "resend")
    event = only_event(job, SendJob.Resolved)
    assert event.decision == "resend"
    assert job.state is JobState.REQUESTED
    assert job.due_at == clock.now
    assert job.round_attempts == 0
    assert job.attempts == 1
    assert job.reason == "resolved: resend"
    assert attempt(job, clock) == 2
    assert job.round_attempts == 1


def test_resolve_abandon(clock: FakeClock) -> None:
    job = review_job(clock)
    resolve(job, clock, "abandon")
    assert only_event(job, SendJob.Resolved).decision == "abandon"
    assert job.state is JobState.ABANDONED
    assert job.due_at is None
    assert job.settled


@pytest.mark.parametrize("escalated", [False, True], ids=["duplicate", "duplicate+escalated"])
def test_resolve_resend_refused_after_duplicate(escalated: bool) -> None:
    clock = FakeClock()
    job = duplicate_job(clock, escalated=escalated)
    match = "two copies already exist" if escalated else "Escalated must come first"
    refused(job, lambda: resolve(job, clock, "resend"), match)


def test_resolve_unknown_decision_is_a_value_error(clock: FakeClock) -> None:
    job = review_job(clock)
    refused(
        job,
        lambda: resolve(job, clock, "maybe"),
        r"unknown decision: 'maybe' \(sent, resend or abandon\)",
        ValueError,
    )


@pytest.mark.parametrize(
    "make",
    [new_job, attempted_job, unknown_job, confirmed_job, abandoned_job],
    ids=lambda f: f.__name__,
)
@pytest.mark.parametrize("decision", ["sent", "resend", "abandon"])
def test_resolve_refused_outside_review(
    make: Callable[[FakeClock], SendJob], decision: str
) -> None:
    clock = FakeClock()
    job = make(clock)
    refused(job, lambda: resolve(job, clock, decision), "cannot Resolved")


# -- settled jobs stay settled ----------------------------------------------------------


@pytest.mark.parametrize("make", [confirmed_job, abandoned_job], ids=["confirmed", "abandoned"])
def test_every_command_refused_once_final(make: Callable[[FakeClock], SendJob]) -> None:
    clock = FakeClock()
    job = make(clock)
    clock.advance(86400)
    commands: list[Callable[[], object]] = [
        lambda: attempt(job, clock),
        lambda: unknown(job, clock),
        lambda: miss(job, clock),
        lambda: requeue(job, clock, misses_required=1),
        lambda: reject(job, clock, transient=True, retry_at=clock.now),
        lambda: reject(job, clock, transient=False, retry_at=None),
        lambda: confirm(job, clock, "response", ["m1"]),
        lambda: confirm(job, clock, "search", ["m1"]),
        lambda: confirm(job, clock, "operator", ["m1"]),
        lambda: duplicate(job, clock, ["m1", "m2"]),
        lambda: escalate(job, clock, "unknown-outcome"),
        lambda: resolve(job, clock, "sent"),
        lambda: resolve(job, clock, "resend"),
        lambda: resolve(job, clock, "abandon"),
    ]
    state = job.state.value
    for command in commands:
        refused(job, command, f"is {state}: cannot ")
