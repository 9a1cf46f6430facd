"""Every SendJob command: the events its decision implies, and every refusal it must make.

An accepted command records, in one step, exactly the events its decision implies, each
carrying the decision's policy, and the whole history reloads to the live job. A refusal
raises (TransitionError for a state or a decision the job does not allow, ValueError for an
unknown resolution or reason) and leaves the aggregate untouched: same state, no event.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest
from eventsourcing.utils import get_topic, resolve_topic
from tests.unit.jobs import (
    CHANNEL,
    CONTENT,
    DEADLINE,
    FROM,
    KEY,
    MAPPER,
    MESSAGE_ID,
    PROVIDER,
    QUERY,
    SEARCH_AFTER,
    assert_reloads,
    fields_of,
    reload,
    requested_job,
)

from daemon.doubles.fake_time import FakeClock
from ledger.content import JobContent
from ledger.decision_types import (
    Confirm,
    Duplicate,
    ResendAt,
    RetryAt,
    Review,
    SearchAgainAt,
    SearchAt,
    Send,
    StopVerifying,
)
from ledger.job import JOB_NAMESPACE, JobState, SendJob, TransitionError, job_id_for
from ledger.vocabulary import ConfirmedVia, EscalationReason, PolicyRef, Resolution
from policies import decisions as policy_decisions
from policies.model import ChannelPolicy

# The policy as reloaded after the job was requested: decision events must carry the
# decision's reference, not the one the job was requested under.
RELOADED = PolicyRef(CHANNEL, "sha256:fedcba9876543210")
VERIFY_AFTER = timedelta(minutes=30)
LATER = FakeClock().now + timedelta(days=365)  # a time after any a test reaches

EVENT_CLASSES: list[type[Any]] = [
    SendJob.Requested,
    SendJob.Attempted,
    SendJob.Unknown,
    SendJob.SearchedMiss,
    SendJob.Requeued,
    SendJob.Rejected,
    SendJob.Confirmed,
    SendJob.Verified,
    SendJob.Duplicate,
    SendJob.Escalated,
    SendJob.Resolved,
]

Make = Callable[[FakeClock], SendJob]


# -- commands, with the arguments most tests use ------------------------------------------


def claim(job: SendJob, clock: FakeClock) -> int:
    return job.claim(provider=PROVIDER, deadline=clock.now + DEADLINE, at=clock.now)


def respond(job: SendJob, clock: FakeClock, decision: Any = None, msg_id: str = "m1") -> None:
    job.record_response(
        provider_message_id=msg_id, decision=decision or Confirm(RELOADED), at=clock.now
    )


def unknown(job: SendJob, clock: FakeClock, decision: Any = None) -> None:
    decision = decision or SearchAt(RELOADED, clock.now + SEARCH_AFTER)
    job.record_unknown(reason="timeout", decision=decision, at=clock.now)


def reject(job: SendJob, clock: FakeClock, decision: Any, *, transient: bool) -> None:
    job.record_rejection(
        transient=transient,
        reason="429 rateLimitExceeded" if transient else "400 invalidArgument",
        status=429 if transient else 400,
        decision=decision,
        at=clock.now,
    )


def search(job: SendJob, clock: FakeClock, copies: list[str], decision: Any) -> None:
    job.record_search(query=QUERY, copies=copies, decision=decision, at=clock.now)


def miss(job: SendJob, clock: FakeClock) -> None:
    search(job, clock, [], SearchAgainAt(RELOADED, clock.now + SEARCH_AFTER))


def escalate(job: SendJob, clock: FakeClock, decision: Any = None) -> None:
    decision = decision or Review(RELOADED, EscalationReason.UNKNOWN_OUTCOME)
    job.escalate(decision, detail="needs a human", at=clock.now)


def resolve(job: SendJob, clock: FakeClock, resolution: Any) -> None:
    job.resolve(resolution, note="checked the mailbox", by="alice", at=clock.now)


# -- jobs in each situation, built through the commands (whole history still pending) ----


def attempted_job(clock: FakeClock) -> SendJob:
    job = requested_job(clock)
    claim(job, clock)
    return job


def unknown_job(clock: FakeClock) -> SendJob:
    """Unknown, its first search due SEARCH_AFTER from now."""
    job = attempted_job(clock)
    clock.advance(DEADLINE.total_seconds())
    unknown(job, clock)
    return job


def searched_job(clock: FakeClock, misses: int = 1) -> SendJob:
    """Unknown after `misses` empty searches, the next one due SEARCH_AFTER from now."""
    job = unknown_job(clock)
    for _ in range(misses):
        clock.advance(SEARCH_AFTER.total_seconds())
        miss(job, clock)
    return job


def review_job(clock: FakeClock) -> SendJob:
    job = attempted_job(clock)
    unknown(job, clock, Review(RELOADED, EscalationReason.UNKNOWN_OUTCOME))
    return job


def duplicate_job(clock: FakeClock) -> SendJob:
    """In review: the first search found two copies."""
    job = unknown_job(clock)
    clock.advance(SEARCH_AFTER.total_seconds())
    search(job, clock, ["m1", "m2"], Duplicate(RELOADED))
    return job


def rejected_job(clock: FakeClock) -> SendJob:
    """In review after a permanent rejection."""
    job = attempted_job(clock)
    reject(job, clock, Review(RELOADED, EscalationReason.REJECTED), transient=False)
    return job


def confirmed_job(clock: FakeClock) -> SendJob:
    job = attempted_job(clock)
    respond(job, clock)
    return job


def resent_job(clock: FakeClock) -> SendJob:
    """Requested again after two empty searches were believed."""
    job = searched_job(clock, 1)
    clock.advance(SEARCH_AFTER.total_seconds())
    search(job, clock, [], ResendAt(RELOADED, clock.now, misses_required=2))
    return job


def verifying_job(clock: FakeClock) -> SendJob:
    """Confirmed after a resend, its copies to be counted VERIFY_AFTER from now."""
    job = resent_job(clock)
    claim(job, clock)
    respond(job, clock, Confirm(RELOADED, verify_at=clock.now + VERIFY_AFTER), msg_id="m2")
    return job


def verified_job(clock: FakeClock) -> SendJob:
    """Confirmed after a resend, and the count found one copy."""
    job = verifying_job(clock)
    clock.advance(VERIFY_AFTER.total_seconds())
    search(job, clock, ["m2"], Confirm(RELOADED))
    return job


def abandoned_job(clock: FakeClock) -> SendJob:
    job = review_job(clock)
    resolve(job, clock, Resolution.ABANDON)
    return job


# -- what a command appended, and what it must refuse ------------------------------------


def record(job: SendJob, command: Callable[[], object]) -> list[Any]:
    """Run a command that must be accepted: the events it appended (all stamped with one
    time); the job's whole history must then reload to the live job."""
    start = len(job.pending_events)
    command()
    new = list(job.pending_events[start:])
    assert new, "an accepted command recorded nothing"
    assert len({event.timestamp for event in new}) == 1, "one step, one time"
    assert_reloads(job)
    return new


def kinds(events: list[Any]) -> list[type[Any]]:
    return [type(event) for event in events]


def ref(event: Any) -> PolicyRef:
    return PolicyRef(event.policy, event.fingerprint)


def refused(
    job: SendJob,
    command: Callable[[], object],
    match: str,
    exc: type[Exception] = TransitionError,
) -> Exception:
    """Run a command that must be refused: the job must be left exactly as it was."""
    before, pending = fields_of(job), list(job.pending_events)
    with pytest.raises(exc, match=match) as info:
        command()
    recorded = [type(e).__name__ for e in job.pending_events[len(pending) :]]
    assert fields_of(job) == before, f"a refused command changed the job, recorded {recorded}"
    assert job.pending_events == pending, f"a refused command recorded {recorded}"
    return info.value


def state(job: SendJob) -> JobState:
    """The state, read afresh (keeps mypy from narrowing across commands)."""
    return job.state


def every_kind(at: datetime) -> list[Any]:
    """One decision of every kind."""
    return [
        Send(RELOADED),
        SearchAt(RELOADED, at),
        Confirm(RELOADED),
        Duplicate(RELOADED),
        SearchAgainAt(RELOADED, at),
        ResendAt(RELOADED, at, misses_required=1),
        RetryAt(RELOADED, at),
        Review(RELOADED, EscalationReason.UNKNOWN_OUTCOME),
        StopVerifying(RELOADED),
    ]


def mishandled(
    make: Make,
    command: Callable[[SendJob, FakeClock, Any], object],
    accepted: tuple[type[Any], ...],
    *,
    wait: timedelta = timedelta(0),
) -> list[str]:
    """Each decision of a kind the command does not take, on a fresh job from `make`: how
    it was mishandled (anything but a TransitionError that records nothing), the kinds
    mishandled alike grouped in one line."""
    problems: dict[str, list[str]] = {}
    for decision in every_kind(FakeClock().now + timedelta(days=1)):
        if isinstance(decision, accepted):
            continue
        clock = FakeClock()
        job = make(clock)
        clock.advance(wait.total_seconds())
        before, start = fields_of(job), len(job.pending_events)
        try:
            command(job, clock, decision)
        except TransitionError:
            problem = ""
        except Exception as exc:
            problem = f"{type(exc).__name__} instead of TransitionError"
        else:
            problem = "accepted"
        recorded = [type(e).__name__ for e in job.pending_events[start:]]
        if fields_of(job) != before or recorded:
            problem = (
                f"{problem or 'refused'}, recorded {recorded} and left the job "
                f"{job.state.value} with due_at={job.due_at}"
            )
        elif problem:
            problem += " (nothing recorded)"
        if problem:
            problems.setdefault(problem, []).append(type(decision).__name__)
    return [f"{', '.join(names)}: {problem}" for problem, names in problems.items()]


# -- identity, topics, stored shape ------------------------------------------------------


def test_aggregate_id_is_uuid5_of_the_key(clock: FakeClock) -> None:
    job = requested_job(clock)
    assert job.id == job_id_for(KEY) == uuid.uuid5(JOB_NAMESPACE, KEY)
    assert job_id_for("other") != job.id
    assert job_id_for("ключ-🎉") == uuid.uuid5(JOB_NAMESPACE, "ключ-🎉")


@pytest.mark.parametrize("cls", EVENT_CLASSES, ids=lambda c: c.__name__)
def test_event_classes_have_explicit_topics_that_resolve_to_them(cls: type[Any]) -> None:
    topic = cls.TOPIC
    assert topic == f"sendledger:SendJob.{cls.__name__}"
    assert get_topic(cls) == topic
    assert resolve_topic(topic) is cls


def test_aggregate_topic_is_explicit() -> None:
    assert SendJob.TOPIC == "sendledger:SendJob"
    assert resolve_topic("sendledger:SendJob") is SendJob


def test_no_two_event_classes_share_a_topic() -> None:
    nested = [
        value
        for value in vars(SendJob).values()
        if isinstance(value, type) and issubclass(value, SendJob.Event)
    ]
    for cls in nested:
        assert resolve_topic(get_topic(cls)) is cls
    assert len({get_topic(cls) for cls in nested}) == len(nested)


def full_history(clock: FakeClock) -> SendJob:
    """Every kind of event, through the commands."""
    job = requested_job(clock)
    claim(job, clock)
    reject(job, clock, RetryAt(RELOADED, clock.now), transient=True)
    claim(job, clock)
    unknown(job, clock)
    clock.advance(SEARCH_AFTER.total_seconds())
    miss(job, clock)
    clock.advance(SEARCH_AFTER.total_seconds())
    search(job, clock, [], ResendAt(RELOADED, clock.now, misses_required=2))
    claim(job, clock)
    respond(job, clock, Confirm(RELOADED, verify_at=clock.now + VERIFY_AFTER), msg_id="m3")
    clock.advance(VERIFY_AFTER.total_seconds())
    search(job, clock, [], SearchAgainAt(RELOADED, clock.now + SEARCH_AFTER))
    clock.advance(SEARCH_AFTER.total_seconds())
    search(job, clock, ["m1", "m3"], Duplicate(RELOADED))
    resolve(job, clock, Resolution.SENT)
    return job


def test_stored_topics_resolve_back_to_the_event_classes(clock: FakeClock) -> None:
    job = full_history(clock)
    events = list(job.pending_events)
    assert {type(e) for e in events} == set(EVENT_CLASSES)
    for event in events:
        stored = MAPPER.to_stored_event(event)
        assert stored.topic == f"sendledger:SendJob.{type(event).__name__}"
        assert MAPPER.to_domain_event(stored) == event
    reloaded = reload(events)
    assert fields_of(reloaded) == fields_of(job)
    assert reloaded.state is JobState.CONFIRMED
    assert reloaded.provider_message_ids == ["m1", "m3"]
    assert (reloaded.attempts, reloaded.version) == (3, len(events))


# -- request ----------------------------------------------------------------------------


def test_request_creates_a_requested_job_due_now(clock: FakeClock) -> None:
    job = requested_job(clock)
    assert job.state is JobState.REQUESTED
    assert job.due_at == clock.now
    assert job.created_on == clock.now
    assert job.version == 1
    assert (job.attempts, job.round_attempts, job.searches, job.misses) == (0, 0, 0, 0)
    assert (job.verifications, job.provider_message_ids) == (0, [])
    assert job.reason is None and job.last_provider is None
    assert not (job.duplicate or job.resent or job.verifying or job.settled)
    assert job.content == CONTENT
    assert (job.key, job.channel, job.from_addr, job.message_id) == (KEY, CHANNEL, FROM, MESSAGE_ID)
    assert job.content_hash == CONTENT.content_hash
    assert_reloads(job)


def test_request_stores_the_content_flat_as_the_first_release(clock: FakeClock) -> None:
    job = requested_job(clock, policy=RELOADED)
    [event] = job.pending_events
    assert isinstance(event, SendJob.Requested)
    stored = {name: getattr(event, name) for name in CONTENT.canonical()}
    assert stored == {
        "channel": CHANNEL,
        "key": KEY,
        "to": ["Bob <bob@example.com>"],
        "cc": ["carol@example.com"],
        "reply_to": "help@example.com",
        "subject": "Your receipt",
        "body": "Thanks!",
        "html": "<p>Thanks!</p>",
    }
    assert (event.from_addr, event.message_id) == (FROM, MESSAGE_ID)
    assert event.content_hash == CONTENT.content_hash
    assert ref(event) == RELOADED
    assert event.timestamp == clock.now


def test_request_without_optional_content(clock: FakeClock) -> None:
    bare = JobContent(channel="c", key="k", to=("a@example.com",), subject="s", body="b")
    job = requested_job(clock, bare)
    assert job.content == bare
    assert job.id == job_id_for("k")
    assert_reloads(job)


# -- claim ------------------------------------------------------------------------------


def test_claim_records_the_attempt(clock: FakeClock) -> None:
    job = requested_job(clock)
    events = record(job, lambda: claim(job, clock))
    assert kinds(events) == [SendJob.Attempted]
    [event] = events
    assert (event.attempt, event.provider, event.deadline) == (1, PROVIDER, clock.now + DEADLINE)
    assert event.timestamp == clock.now
    assert job.state is JobState.ATTEMPTED
    assert (job.attempts, job.round_attempts) == (1, 1)
    assert job.due_at == clock.now + DEADLINE
    assert job.last_provider == PROVIDER


def test_claim_returns_the_attempt_number(clock: FakeClock) -> None:
    job = attempted_job(clock)
    reject(job, clock, RetryAt(RELOADED, clock.now), transient=True)
    assert claim(job, clock) == 2
    assert (job.attempts, job.round_attempts) == (2, 2)


def test_no_second_claim_before_an_outcome(clock: FakeClock) -> None:
    job = attempted_job(clock)
    clock.advance(3600)  # even long after the deadline: an outcome must come first
    error = refused(job, lambda: claim(job, clock), r"is attempted: cannot Attempted")
    assert isinstance(error, TransitionError)
    assert (error.key, error.state, error.action) == (KEY, "attempted", "Attempted")


def test_claim_refused_before_due(clock: FakeClock) -> None:
    job = attempted_job(clock)
    reject(job, clock, RetryAt(RELOADED, clock.now + timedelta(seconds=60)), transient=True)
    clock.advance(59)
    refused(job, lambda: claim(job, clock), "not due before")
    clock.advance(1)
    assert claim(job, clock) == 2


def test_claim_refused_with_a_deadline_not_after_the_claim(clock: FakeClock) -> None:
    job = requested_job(clock)
    refused(
        job,
        lambda: job.claim(provider=PROVIDER, deadline=clock.now, at=clock.now),
        "deadline must be after the attempt",
    )


@pytest.mark.parametrize(
    "make",
    [unknown_job, review_job, duplicate_job, confirmed_job, verifying_job, abandoned_job],
    ids=lambda f: f.__name__,
)
def test_claim_refused_outside_requested(make: Make) -> None:
    clock = FakeClock()
    job = make(clock)
    clock.advance(86400)
    refused(job, lambda: claim(job, clock), "cannot Attempted")


# -- record_response ----------------------------------------------------------------------


def test_response_confirms_one_copy(clock: FakeClock) -> None:
    job = attempted_job(clock)
    clock.advance(2)
    events = record(job, lambda: respond(job, clock, msg_id="18c3f0a1"))
    assert kinds(events) == [SendJob.Confirmed]
    [event] = events
    assert event.via == ConfirmedVia.RESPONSE
    assert event.via == "response"  # the stored string
    assert event.provider_message_ids == ["18c3f0a1"]
    assert event.verify_at is None
    assert ref(event) == RELOADED
    assert job.state is JobState.CONFIRMED
    assert job.provider_message_ids == ["18c3f0a1"]
    assert job.due_at is None and job.reason is None
    assert job.settled and not job.verifying


def test_response_after_a_resend_schedules_a_count(clock: FakeClock) -> None:
    job = resent_job(clock)
    claim(job, clock)
    verify_at = clock.now + VERIFY_AFTER
    [event] = record(job, lambda: respond(job, clock, Confirm(RELOADED, verify_at=verify_at)))
    assert event.verify_at == verify_at
    assert job.state is JobState.CONFIRMED
    assert job.verifying and job.due_at == verify_at and job.verifications == 0


def test_response_without_the_providers_id_proves_nothing(clock: FakeClock) -> None:
    job = attempted_job(clock)
    refused(job, lambda: respond(job, clock, msg_id=""), "proves nothing")


def test_response_refuses_a_count_due_before_it(clock: FakeClock) -> None:
    job = attempted_job(clock)
    early = Confirm(RELOADED, verify_at=clock.now - timedelta(seconds=1))
    refused(job, lambda: respond(job, clock, early), "verification cannot be due before")


@pytest.mark.parametrize(
    "make",
    [requested_job, unknown_job, review_job, confirmed_job, verifying_job, abandoned_job],
    ids=lambda f: f.__name__,
)
def test_response_refused_without_an_open_attempt(make: Make) -> None:
    clock = FakeClock()
    job = make(clock)
    clock.advance(86400)
    refused(job, lambda: respond(job, clock), "cannot Confirmed")


def test_response_refuses_any_decision_but_confirm() -> None:
    problems = mishandled(attempted_job, respond, (Confirm,))
    assert problems == [], (
        f"record_response: a decision it does not take must be refused (TransitionError) "
        f"before anything is recorded: {problems}"
    )


# -- record_unknown -----------------------------------------------------------------------


def test_unknown_schedules_the_first_search(clock: FakeClock) -> None:
    job = attempted_job(clock)
    clock.advance(31)
    due = clock.now + SEARCH_AFTER
    events = record(job, lambda: unknown(job, clock, SearchAt(RELOADED, due)))
    assert kinds(events) == [SendJob.Unknown]
    [event] = events
    assert (event.attempt, event.reason, event.search_due_at) == (1, "timeout", due)
    assert ref(event) == RELOADED
    assert job.state is JobState.UNKNOWN
    assert job.due_at == due
    assert (job.searches, job.misses) == (0, 0)
    assert job.reason == "timeout"
    assert not job.settled


def test_unknown_for_review_escalates_in_the_same_step(clock: FakeClock) -> None:
    job = attempted_job(clock)
    decision = Review(RELOADED, EscalationReason.UNKNOWN_OUTCOME)
    events = record(job, lambda: unknown(job, clock, decision))
    assert kinds(events) == [SendJob.Unknown, SendJob.Escalated]
    unknown_event, escalated = events
    assert unknown_event.search_due_at is None
    assert ref(unknown_event) == RELOADED
    assert (escalated.reason, escalated.detail) == ("unknown-outcome", "timeout")
    assert ref(escalated) == RELOADED
    assert job.state is JobState.REVIEW
    assert job.reason == "unknown-outcome"
    assert job.due_at is None and job.settled


def test_unknown_for_an_unreliable_handle_escalates(clock: FakeClock) -> None:
    job = attempted_job(clock)
    decision = Review(RELOADED, EscalationReason.HANDLE_UNRELIABLE)
    [_, escalated] = record(job, lambda: unknown(job, clock, decision))
    assert escalated.reason == "handle-unreliable"
    assert job.reason == "handle-unreliable"


def test_unknown_refuses_a_search_due_before_the_outcome(clock: FakeClock) -> None:
    job = attempted_job(clock)
    early = SearchAt(RELOADED, clock.now - timedelta(seconds=1))
    refused(job, lambda: unknown(job, clock, early), "a search cannot be due before the outcome")


@pytest.mark.parametrize(
    "make",
    [requested_job, unknown_job, review_job, confirmed_job, abandoned_job],
    ids=lambda f: f.__name__,
)
def test_unknown_refused_without_an_open_attempt(make: Make) -> None:
    clock = FakeClock()
    job = make(clock)
    refused(job, lambda: unknown(job, clock), "cannot Unknown")


def test_unknown_refuses_any_decision_but_search_at_or_review() -> None:
    problems = mishandled(attempted_job, unknown, (SearchAt, Review))
    assert problems == [], (
        f"record_unknown: a decision it does not take must be refused (TransitionError) "
        f"before anything is recorded: {problems}"
    )


# -- record_rejection ---------------------------------------------------------------------


def test_transient_rejection_retried_later(clock: FakeClock) -> None:
    job = attempted_job(clock)
    retry_at = clock.now + timedelta(seconds=30)
    events = record(job, lambda: reject(job, clock, RetryAt(RELOADED, retry_at), transient=True))
    assert kinds(events) == [SendJob.Rejected]
    [event] = events
    assert (event.attempt, event.transient, event.status, event.retry_at) == (
        1,
        True,
        429,
        retry_at,
    )
    assert event.reason == "429 rateLimitExceeded"
    assert ref(event) == RELOADED
    assert job.state is JobState.REQUESTED
    assert job.due_at == retry_at
    assert job.reason == "429 rateLimitExceeded"
    assert job.attempts == 1


def test_transient_rejection_after_max_attempts_escalates(clock: FakeClock) -> None:
    job = attempted_job(clock)
    decision = Review(RELOADED, EscalationReason.MAX_ATTEMPTS)
    events = record(job, lambda: reject(job, clock, decision, transient=True))
    assert kinds(events) == [SendJob.Rejected, SendJob.Escalated]
    rejected, escalated = events
    assert rejected.transient and rejected.retry_at is None
    assert (escalated.reason, escalated.detail) == ("max-attempts", "429 rateLimitExceeded")
    assert ref(rejected) == ref(escalated) == RELOADED
    assert job.state is JobState.REVIEW
    assert job.reason == "max-attempts"
    assert job.due_at is None


def test_permanent_rejection_escalates_and_is_never_retried(clock: FakeClock) -> None:
    job = attempted_job(clock)
    decision = Review(RELOADED, EscalationReason.REJECTED)
    events = record(job, lambda: reject(job, clock, decision, transient=False))
    assert kinds(events) == [SendJob.Rejected, SendJob.Escalated]
    rejected, escalated = events
    assert (rejected.transient, rejected.status, rejected.retry_at) == (False, 400, None)
    assert (escalated.reason, escalated.detail) == ("rejected", "400 invalidArgument")
    assert job.state is JobState.REVIEW
    clock.advance(86400)
    refused(job, lambda: claim(job, clock), "is review: cannot Attempted")
    refused(job, lambda: respond(job, clock), "cannot Confirmed")
    refused(job, lambda: unknown(job, clock), "cannot Unknown")


def test_permanent_rejection_with_a_retry_is_refused(clock: FakeClock) -> None:
    job = attempted_job(clock)
    refused(
        job,
        lambda: reject(job, clock, RetryAt(RELOADED, clock.now + timedelta(1)), transient=False),
        "a permanent rejection is never retried",
    )


def test_rejection_refuses_a_retry_in_the_past(clock: FakeClock) -> None:
    job = attempted_job(clock)
    past = RetryAt(RELOADED, clock.now - timedelta(hours=1))
    refused(
        job,
        lambda: reject(job, clock, past, transient=True),
        "a retry cannot be due before the rejection",
    )


@pytest.mark.parametrize(
    "make",
    [requested_job, unknown_job, review_job, confirmed_job, abandoned_job],
    ids=lambda f: f.__name__,
)
def test_rejection_refused_without_an_open_attempt(make: Make) -> None:
    clock = FakeClock()
    job = make(clock)
    decision = Review(RELOADED, EscalationReason.REJECTED)
    refused(job, lambda: reject(job, clock, decision, transient=False), "cannot Rejected")


def test_rejection_refuses_any_decision_but_retry_at_or_review() -> None:
    def transient(job: SendJob, clock: FakeClock, decision: Any) -> None:
        reject(job, clock, decision, transient=True)

    problems = mishandled(attempted_job, transient, (RetryAt, Review))
    assert problems == [], (
        f"record_rejection: a decision it does not take must be refused (TransitionError) "
        f"before anything is recorded: {problems}"
    )


# -- record_search while the outcome is unknown -------------------------------------------


def search_decisions(at: datetime) -> list[tuple[list[str], Any]]:
    """Each decision a search can lead to, with the copies that fit it."""
    return [
        (["m1"], Confirm(RELOADED)),
        (["m1", "m2"], Duplicate(RELOADED)),
        ([], SearchAgainAt(RELOADED, at + SEARCH_AFTER)),
        ([], ResendAt(RELOADED, at, misses_required=1)),
        ([], Review(RELOADED, EscalationReason.UNKNOWN_OUTCOME)),
    ]


@pytest.mark.parametrize("index", range(5), ids=["Confirm", "Duplicate", "Again", "Resend", "Rev"])
@pytest.mark.parametrize("misses", [0, 1], ids=["first search", "after a miss"])
def test_no_search_before_it_is_due(index: int, misses: int) -> None:
    # A search inside the lag window reads a lagging index: it proves nothing.
    clock = FakeClock()
    job = searched_job(clock, misses)
    clock.advance(SEARCH_AFTER.total_seconds() - 1)
    copies, decision = search_decisions(clock.now)[index]
    refused(job, lambda: search(job, clock, copies, decision), "search not due before")
    clock.advance(1)
    record(job, lambda: search(job, clock, copies, decision))


def test_search_finding_one_copy_confirms(clock: FakeClock) -> None:
    job = searched_job(clock, 1)
    clock.advance(SEARCH_AFTER.total_seconds())
    events = record(job, lambda: search(job, clock, ["m1"], Confirm(RELOADED)))
    assert kinds(events) == [SendJob.Confirmed]
    [event] = events
    assert (event.via, event.provider_message_ids, event.verify_at) == ("search", ["m1"], None)
    assert ref(event) == RELOADED
    assert job.state is JobState.CONFIRMED
    assert job.provider_message_ids == ["m1"]
    assert job.reason is None and job.due_at is None and not job.verifying


def test_search_confirming_a_resent_job_schedules_a_count(clock: FakeClock) -> None:
    job = resent_job(clock)
    claim(job, clock)
    unknown(job, clock)
    clock.advance(SEARCH_AFTER.total_seconds())
    verify_at = clock.now + VERIFY_AFTER
    [event] = record(job, lambda: search(job, clock, ["m1"], Confirm(RELOADED, verify_at)))
    assert (event.via, event.verify_at) == ("search", verify_at)
    assert job.verifying and job.due_at == verify_at


@pytest.mark.parametrize("copies", [[], ["m1", "m2"]], ids=["no copy", "two copies"])
def test_confirm_needs_exactly_one_copy(copies: list[str]) -> None:
    clock = FakeClock()
    job = unknown_job(clock)
    clock.advance(SEARCH_AFTER.total_seconds())
    n = len(copies)
    refused(
        job,
        lambda: search(job, clock, copies, Confirm(RELOADED)),
        f"{n} copies found, exactly one expected",
    )


def test_search_finding_copies_is_a_duplicate_for_review(clock: FakeClock) -> None:
    job = searched_job(clock, 1)
    clock.advance(SEARCH_AFTER.total_seconds())
    copies = ["m1", "m2", "m3"]
    events = record(job, lambda: search(job, clock, copies, Duplicate(RELOADED)))
    assert kinds(events) == [SendJob.Duplicate, SendJob.Escalated]
    duplicate, escalated = events
    assert (duplicate.hits, duplicate.provider_message_ids) == (3, copies)
    assert (escalated.reason, escalated.detail) == ("duplicate", "3 copies: m1, m2, m3")
    assert ref(duplicate) == ref(escalated) == RELOADED
    assert job.state is JobState.REVIEW
    assert job.duplicate
    assert job.provider_message_ids == copies
    assert job.reason == "duplicate"
    assert job.due_at is None


@pytest.mark.parametrize("copies", [[], ["m1"]], ids=["no copy", "one copy"])
def test_duplicate_needs_two_or_more_copies(copies: list[str]) -> None:
    clock = FakeClock()
    job = unknown_job(clock)
    clock.advance(SEARCH_AFTER.total_seconds())
    refused(
        job,
        lambda: search(job, clock, copies, Duplicate(RELOADED)),
        f"{len(copies)} copies found, two or more expected",
    )


def test_empty_search_schedules_the_next(clock: FakeClock) -> None:
    job = unknown_job(clock)
    clock.advance(SEARCH_AFTER.total_seconds())
    next_at = clock.now + SEARCH_AFTER
    events = record(job, lambda: search(job, clock, [], SearchAgainAt(RELOADED, next_at)))
    assert kinds(events) == [SendJob.SearchedMiss]
    [event] = events
    assert (event.search, event.query, event.next_search_at) == (1, QUERY, next_at)
    assert ref(event) == RELOADED
    assert job.state is JobState.UNKNOWN
    assert (job.searches, job.misses) == (1, 1)
    assert job.due_at == next_at


def test_second_search_only_when_due(clock: FakeClock) -> None:
    job = searched_job(clock, 1)
    clock.advance(SEARCH_AFTER.total_seconds() - 1)
    refused(job, lambda: miss(job, clock), "search not due before")
    clock.advance(1)
    [event] = record(job, lambda: miss(job, clock))
    assert event.search == 2
    assert (job.searches, job.misses) == (2, 2)


@pytest.mark.parametrize("index", [0, 1, 2], ids=["Confirm", "Duplicate", "SearchAgainAt"])
def test_an_empty_search_is_never_a_copy_nor_copies_a_miss(index: int) -> None:
    clock = FakeClock()
    job = unknown_job(clock)
    clock.advance(SEARCH_AFTER.total_seconds())
    copies, decision = search_decisions(clock.now)[index]
    wrong = {0: ["m1", "m2"], 1: ["m1"], 2: ["m1"]}[index]
    assert copies != wrong
    refused(job, lambda: search(job, clock, wrong, decision), "copies found")


@pytest.mark.parametrize(
    "decision",
    [
        ResendAt(RELOADED, LATER, 1),
        Review(RELOADED, EscalationReason.UNKNOWN_OUTCOME),
    ],
    ids=["ResendAt", "Review"],
)
def test_a_search_with_copies_never_resends_nor_reviews_as_a_miss(decision: Any) -> None:
    clock = FakeClock()
    job = searched_job(clock, 1)
    clock.advance(SEARCH_AFTER.total_seconds())
    refused(job, lambda: search(job, clock, ["m1"], decision), "1 copies found, none expected")


def test_next_search_never_due_before_this_one(clock: FakeClock) -> None:
    job = unknown_job(clock)
    clock.advance(SEARCH_AFTER.total_seconds())
    past = SearchAgainAt(RELOADED, clock.now - timedelta(seconds=1))
    refused(
        job,
        lambda: search(job, clock, [], past),
        "the next search cannot be due before this one",
    )


def test_believed_misses_resend_with_the_same_message_id(clock: FakeClock) -> None:
    job = searched_job(clock, 1)
    clock.advance(SEARCH_AFTER.total_seconds())
    resend_at = clock.now + timedelta(seconds=5)
    decision = ResendAt(RELOADED, resend_at, misses_required=2)
    events = record(job, lambda: search(job, clock, [], decision))
    assert kinds(events) == [SendJob.SearchedMiss, SendJob.Requeued]
    missed, requeued = events
    assert (missed.search, missed.next_search_at, missed.query) == (2, None, QUERY)
    assert requeued.reason == "no copy found in 2 searches: sending again (same Message-ID)"
    assert (requeued.due_at, requeued.misses_required) == (resend_at, 2)
    assert ref(missed) == ref(requeued) == RELOADED
    assert job.state is JobState.REQUESTED
    assert job.due_at == resend_at
    assert (job.searches, job.misses) == (0, 0)
    assert job.resent
    assert job.message_id == MESSAGE_ID
    assert job.reason == "no copy found in 2 searches: sending again (same Message-ID)"
    refused(job, lambda: claim(job, clock), "not due before")
    clock.advance(5)
    assert claim(job, clock) == 2
    assert (job.attempts, job.round_attempts) == (2, 2)


def test_resend_never_due_in_the_past(clock: FakeClock) -> None:
    job = unknown_job(clock)
    clock.advance(SEARCH_AFTER.total_seconds())
    decision = ResendAt(RELOADED, clock.now - timedelta(hours=1), misses_required=1)
    [_, requeued] = record(job, lambda: search(job, clock, [], decision))
    assert requeued.due_at == clock.now
    assert job.due_at == clock.now


@pytest.mark.parametrize(
    ("misses", "required", "message"),
    [
        (0, 2, "1 empty searches, 2 required"),
        (1, 3, "2 empty searches, 3 required"),
        (0, 0, "required"),  # below one never turns a single search into a resend rule
        (2, -1, "required"),
    ],
)
def test_resend_only_after_enough_misses(misses: int, required: int, message: str) -> None:
    clock = FakeClock()
    job = searched_job(clock, misses)
    clock.advance(SEARCH_AFTER.total_seconds())
    decision = ResendAt(RELOADED, clock.now, misses_required=required)
    refused(job, lambda: search(job, clock, [], decision), message)


def test_believed_misses_for_review(clock: FakeClock) -> None:
    job = searched_job(clock, 1)
    clock.advance(SEARCH_AFTER.total_seconds())
    decision = Review(RELOADED, EscalationReason.UNKNOWN_OUTCOME)
    events = record(job, lambda: search(job, clock, [], decision))
    assert kinds(events) == [SendJob.SearchedMiss, SendJob.Escalated]
    missed, escalated = events
    assert (missed.search, missed.next_search_at) == (2, None)
    assert (escalated.reason, escalated.detail) == (
        "unknown-outcome",
        "no copy found in 2 searches",
    )
    assert ref(missed) == ref(escalated) == RELOADED
    assert job.state is JobState.REVIEW
    assert not job.resent
    assert job.due_at is None


@pytest.mark.parametrize(
    "make",
    [requested_job, attempted_job, review_job, duplicate_job, confirmed_job, abandoned_job],
    ids=lambda f: f.__name__,
)
@pytest.mark.parametrize("index", range(5), ids=["Confirm", "Duplicate", "Again", "Resend", "Rev"])
def test_search_refused_unless_unknown_or_verifying(make: Make, index: int) -> None:
    clock = FakeClock()
    job = make(clock)
    clock.advance(86400)
    copies, decision = search_decisions(clock.now)[index]
    refused(job, lambda: search(job, clock, copies, decision), "cannot ")


def test_search_while_unknown_refuses_any_other_decision() -> None:
    problems = mishandled(
        unknown_job,
        lambda job, clock, decision: search(job, clock, [], decision),
        (Confirm, Duplicate, SearchAgainAt, ResendAt, Review),
        wait=SEARCH_AFTER,
    )
    assert problems == [], (
        f"record_search (unknown): a decision it does not take must be refused (TransitionError) "
        f"before anything is recorded: {problems}"
    )


def test_the_policys_decisions_drive_a_search_to_a_resend(clock: FakeClock) -> None:
    policy = ChannelPolicy.model_validate(
        {
            "channel": CHANNEL,
            "provider": PROVIDER,
            "from": FROM,
            "message_id_domain": "mail.example.com",
            "on_unknown": "retry",
            "search_after": "5m",
            "search_interval": "5m",
            "confirm_misses": 2,
        }
    )
    job = attempted_job(clock)
    unknown(job, clock, policy_decisions.after_unknown(policy, now=clock.now))
    for _ in range(2):
        assert job.due_at is not None
        clock.now = job.due_at
        decision = policy_decisions.after_search(
            policy, hits=0, misses_before=job.misses, resent=job.resent, now=clock.now
        )
        record(job, functools.partial(search, job, clock, [], decision))
    assert state(job) is JobState.REQUESTED and job.resent
    assert {ref(e) for e in job.pending_events[2:]} == {policy.ref}
    claim(job, clock)
    confirm = policy_decisions.after_response(policy, resent=job.resent, now=clock.now)
    respond(job, clock, confirm)
    assert job.verifying and job.due_at == clock.now + timedelta(seconds=policy.verify_after)


# -- the count after a resend (record_search while verifying, stop_verifying) -----------


@pytest.mark.parametrize(
    ("copies", "decision"),
    [
        (["m2"], Confirm(RELOADED)),
        (["m1", "m2"], Duplicate(RELOADED)),
        ([], SearchAgainAt(RELOADED, LATER)),
        ([], StopVerifying(RELOADED)),
    ],
    ids=lambda v: type(v).__name__ if not isinstance(v, list) else str(len(v)),
)
def test_no_count_before_it_is_due(copies: list[str], decision: Any) -> None:
    clock = FakeClock()
    job = verifying_job(clock)
    clock.advance(VERIFY_AFTER.total_seconds() - 1)
    refused(job, lambda: search(job, clock, copies, decision), "search not due before")
    clock.advance(1)
    record(job, lambda: search(job, clock, copies, decision))


def test_count_finding_one_copy_ends_the_verification(clock: FakeClock) -> None:
    job = verifying_job(clock)
    clock.advance(VERIFY_AFTER.total_seconds())
    events = record(job, lambda: search(job, clock, ["m2"], Confirm(RELOADED)))
    assert kinds(events) == [SendJob.Verified]
    [event] = events
    assert (event.search, event.hits, event.next_verify_at) == (1, 1, None)
    assert ref(event) == RELOADED
    assert job.state is JobState.CONFIRMED
    assert not job.verifying and job.due_at is None
    assert job.verifications == 1
    assert job.provider_message_ids == ["m2"]


def test_count_finding_nothing_looks_again_then_stops(clock: FakeClock) -> None:
    job = verifying_job(clock)
    clock.advance(VERIFY_AFTER.total_seconds())
    next_at = clock.now + SEARCH_AFTER
    [event] = record(job, lambda: search(job, clock, [], SearchAgainAt(RELOADED, next_at)))
    assert (event.search, event.hits, event.next_verify_at) == (1, 0, next_at)
    assert job.verifying and job.due_at == next_at
    clock.advance(SEARCH_AFTER.total_seconds() - 1)
    refused(job, lambda: search(job, clock, [], StopVerifying(RELOADED)), "search not due")
    clock.advance(1)
    [event] = record(job, lambda: search(job, clock, [], StopVerifying(RELOADED)))
    assert (event.search, event.hits, event.next_verify_at) == (2, 0, None)
    assert state(job) is JobState.CONFIRMED
    assert not job.verifying and job.due_at is None


def test_count_finding_copies_is_a_duplicate_for_review(clock: FakeClock) -> None:
    job = verifying_job(clock)
    clock.advance(VERIFY_AFTER.total_seconds())
    events = record(job, lambda: search(job, clock, ["m1", "m2"], Duplicate(RELOADED)))
    assert kinds(events) == [SendJob.Duplicate, SendJob.Escalated]
    duplicate, escalated = events
    assert (duplicate.hits, duplicate.provider_message_ids) == (2, ["m1", "m2"])
    assert escalated.reason == "duplicate"
    assert escalated.detail == "2 copies after a resend: m1, m2"
    assert ref(duplicate) == ref(escalated) == RELOADED
    assert job.state is JobState.REVIEW
    assert job.duplicate and not job.verifying
    assert job.provider_message_ids == ["m1", "m2"]


@pytest.mark.parametrize(
    ("copies", "decision", "expected"),
    [
        ([], Confirm(RELOADED), "exactly one"),
        (["m1", "m2"], Confirm(RELOADED), "exactly one"),
        (["m1"], Duplicate(RELOADED), "two or more"),
        (["m1"], StopVerifying(RELOADED), "none"),
        (["m1"], SearchAgainAt(RELOADED, LATER), ""),
    ],
    ids=["Confirm-0", "Confirm-2", "Duplicate-1", "Stop-1", "Again-1"],
)
def test_count_needs_copies_that_fit_the_decision(
    copies: list[str], decision: Any, expected: str
) -> None:
    clock = FakeClock()
    job = verifying_job(clock)
    clock.advance(VERIFY_AFTER.total_seconds())
    match = f"{len(copies)} copies found, {expected or 'none'} expected"
    refused(job, lambda: search(job, clock, copies, decision), match)


def test_next_count_never_due_before_this_one(clock: FakeClock) -> None:
    job = verifying_job(clock)
    clock.advance(VERIFY_AFTER.total_seconds())
    past = SearchAgainAt(RELOADED, clock.now - timedelta(seconds=1))
    refused(job, lambda: search(job, clock, [], past), "cannot be due before this one")


def test_count_refuses_any_other_decision() -> None:
    problems = mishandled(
        verifying_job,
        lambda job, clock, decision: search(job, clock, [], decision),
        (Confirm, Duplicate, SearchAgainAt, StopVerifying),
        wait=VERIFY_AFTER,
    )
    assert problems == [], (
        f"record_search (verifying): a decision it does not take must be refused (TransitionError) "
        f"before anything is recorded: {problems}"
    )


def test_count_refused_once_verified(clock: FakeClock) -> None:
    job = verified_job(clock)
    clock.advance(86400)
    refused(job, lambda: search(job, clock, ["m2"], Confirm(RELOADED)), "is confirmed: cannot")
    refused(job, lambda: search(job, clock, ["m1", "m2"], Duplicate(RELOADED)), "cannot")


def test_stop_verifying_without_a_search(clock: FakeClock) -> None:
    job = verifying_job(clock)
    clock.advance(VERIFY_AFTER.total_seconds())
    missing = PolicyRef.missing(CHANNEL)
    events = record(job, lambda: job.stop_verifying(StopVerifying(missing), at=clock.now))
    assert kinds(events) == [SendJob.Verified]
    [event] = events
    assert (event.search, event.hits, event.next_verify_at) == (1, 0, None)
    assert (event.policy, event.fingerprint) == (CHANNEL, "")
    assert job.state is JobState.CONFIRMED
    assert not job.verifying and job.due_at is None


def test_stop_verifying_refused_before_the_count_is_due(clock: FakeClock) -> None:
    job = verifying_job(clock)
    clock.advance(VERIFY_AFTER.total_seconds() - 1)
    stop = StopVerifying(RELOADED)
    refused(job, lambda: job.stop_verifying(stop, at=clock.now), "verification not due before")
    clock.advance(1)
    record(job, lambda: job.stop_verifying(stop, at=clock.now))


@pytest.mark.parametrize(
    "make",
    [requested_job, attempted_job, unknown_job, review_job, confirmed_job, verified_job],
    ids=lambda f: f.__name__,
)
def test_stop_verifying_refused_without_a_pending_count(make: Make) -> None:
    clock = FakeClock()
    job = make(clock)
    clock.advance(86400)
    refused(job, lambda: job.stop_verifying(StopVerifying(RELOADED), at=clock.now), "Verified")


def test_stop_verifying_refuses_any_other_decision() -> None:
    def stop(job: SendJob, clock: FakeClock, decision: Any) -> None:
        job.stop_verifying(decision, at=clock.now)

    problems = mishandled(verifying_job, stop, (StopVerifying,), wait=VERIFY_AFTER)
    assert problems == [], (
        f"stop_verifying: a decision it does not take must be refused (TransitionError) "
        f"before anything is recorded: {problems}"
    )


# -- escalate ---------------------------------------------------------------------------


def test_escalate_a_requested_job_without_a_policy(clock: FakeClock) -> None:
    job = requested_job(clock)
    missing = PolicyRef.missing(CHANNEL)
    decision = Review(missing, EscalationReason.NO_POLICY)
    events = record(job, lambda: escalate(job, clock, decision))
    assert kinds(events) == [SendJob.Escalated]
    [event] = events
    assert (event.reason, event.detail) == ("no-policy", "needs a human")
    assert (event.policy, event.fingerprint) == (CHANNEL, "")
    assert job.state is JobState.REVIEW
    assert job.reason == "no-policy"
    assert job.due_at is None
    assert job.settled


def test_escalate_a_requested_job_after_max_attempts(clock: FakeClock) -> None:
    job = attempted_job(clock)
    reject(job, clock, RetryAt(RELOADED, clock.now), transient=True)
    decision = Review(RELOADED, EscalationReason.MAX_ATTEMPTS)
    [event] = record(job, lambda: escalate(job, clock, decision))
    assert (event.reason, ref(event)) == ("max-attempts", RELOADED)
    assert job.attempts == 1


def test_escalate_an_unknown_job_before_its_search(clock: FakeClock) -> None:
    job = unknown_job(clock)  # the search is not due: a review needs no search
    decision = Review(RELOADED, EscalationReason.HANDLE_UNRELIABLE)
    [event] = record(job, lambda: escalate(job, clock, decision))
    assert event.reason == "handle-unreliable"
    assert job.state is JobState.REVIEW
    assert job.due_at is None


def test_escalate_with_an_unknown_reason_is_a_value_error(clock: FakeClock) -> None:
    job = unknown_job(clock)
    bad = Review(RELOADED, "bored")  # type: ignore[arg-type]
    refused(job, lambda: escalate(job, clock, bad), "bored", ValueError)


@pytest.mark.parametrize(
    "make",
    [
        attempted_job,
        review_job,
        duplicate_job,
        confirmed_job,
        verifying_job,
        verified_job,
        abandoned_job,
    ],
    ids=lambda f: f.__name__,
)
def test_escalate_refused_outside_requested_and_unknown(make: Make) -> None:
    clock = FakeClock()
    job = make(clock)
    refused(job, lambda: escalate(job, clock), "cannot Escalated")


def test_escalate_refuses_any_decision_but_review() -> None:
    problems = mishandled(requested_job, escalate, (Review,))
    assert problems == [], (
        f"escalate: a decision it does not take must be refused (TransitionError) "
        f"before anything is recorded: {problems}"
    )


@pytest.mark.parametrize("command", ["record_unknown", "record_rejection", "record_search"])
def test_a_review_for_an_unknown_reason_records_nothing(command: str) -> None:
    # Checked before the first event: the Unknown, Rejected or SearchedMiss that comes
    # with the Escalated must not be left behind on its own.
    clock = FakeClock()
    bad = Review(RELOADED, "bored")  # type: ignore[arg-type]
    if command == "record_search":
        job = searched_job(clock, 1)
        clock.advance(SEARCH_AFTER.total_seconds())
    else:
        job = attempted_job(clock)
    run: dict[str, Callable[[], object]] = {
        "record_unknown": lambda: unknown(job, clock, bad),
        "record_rejection": lambda: reject(job, clock, bad, transient=False),
        "record_search": lambda: search(job, clock, [], bad),
    }
    refused(job, run[command], "bored", ValueError)


# -- resolve ----------------------------------------------------------------------------


def test_resolve_sent_confirms_via_operator(clock: FakeClock) -> None:
    job = review_job(clock)
    clock.advance(600)
    events = record(job, lambda: resolve(job, clock, Resolution.SENT))
    assert kinds(events) == [SendJob.Resolved, SendJob.Confirmed]
    resolved, confirmed = events
    assert (resolved.decision, resolved.note, resolved.by) == (
        "sent",
        "checked the mailbox",
        "alice",
    )
    assert (confirmed.via, confirmed.provider_message_ids, confirmed.verify_at) == (
        "operator",
        [],
        None,
    )
    assert ref(confirmed) == PolicyRef.operator("alice") == PolicyRef("operator", "alice")
    assert job.state is JobState.CONFIRMED
    assert job.reason == "resolved: sent"  # stays visible
    assert job.due_at is None and not job.verifying


@pytest.mark.parametrize("make", [duplicate_job, verifying_job], ids=["search", "count"])
def test_resolve_sent_after_a_duplicate_keeps_the_copies(make: Make) -> None:
    clock = FakeClock()
    job = make(clock)
    if job.state is JobState.CONFIRMED:  # the count after the resend finds two copies
        clock.advance(VERIFY_AFTER.total_seconds())
        search(job, clock, ["m1", "m2"], Duplicate(RELOADED))
    [_, confirmed] = record(job, lambda: resolve(job, clock, Resolution.SENT))
    assert confirmed.provider_message_ids == ["m1", "m2"]
    assert job.state is JobState.CONFIRMED
    assert job.provider_message_ids == ["m1", "m2"]
    assert job.duplicate


@pytest.mark.parametrize("make", [review_job, rejected_job], ids=lambda f: f.__name__)
def test_resolve_resend_reopens_the_job(make: Make) -> None:
    clock = FakeClock()
    job = make(clock)
    clock.advance(600)
    events = record(job, lambda: resolve(job, clock, Resolution.RESEND))
    assert kinds(events) == [SendJob.Resolved]
    assert events[0].decision == "resend"
    assert job.state is JobState.REQUESTED
    assert job.due_at == clock.now
    assert (job.round_attempts, job.attempts) == (0, 1)
    assert job.resent
    assert job.reason == "resolved: resend"
    assert claim(job, clock) == 2
    assert job.round_attempts == 1


def test_resolve_abandon(clock: FakeClock) -> None:
    job = review_job(clock)
    events = record(job, lambda: resolve(job, clock, Resolution.ABANDON))
    assert kinds(events) == [SendJob.Resolved]
    assert events[0].decision == "abandon"
    assert job.state is JobState.ABANDONED
    assert job.due_at is None
    assert job.settled


def test_resolve_takes_the_plain_strings(clock: FakeClock) -> None:
    job = review_job(clock)
    [event] = record(job, lambda: resolve(job, clock, "abandon"))
    assert event.decision == Resolution.ABANDON


@pytest.mark.parametrize("make", [duplicate_job, verifying_job], ids=["search", "count"])
def test_no_resend_after_a_duplicate(make: Make) -> None:
    clock = FakeClock()
    job = make(clock)
    if job.state is JobState.CONFIRMED:
        clock.advance(VERIFY_AFTER.total_seconds())
        search(job, clock, ["m1", "m2"], Duplicate(RELOADED))
    clock.advance(86400)
    refused(job, lambda: resolve(job, clock, Resolution.RESEND), "two copies already exist")
    refused(job, lambda: claim(job, clock), "is review: cannot Attempted")
    resend = ResendAt(RELOADED, clock.now, misses_required=1)
    refused(job, lambda: search(job, clock, [], resend), "is review: cannot ResendAt")


def test_resolve_unknown_decision_is_a_value_error(clock: FakeClock) -> None:
    job = review_job(clock)
    refused(job, lambda: resolve(job, clock, "maybe"), "maybe", ValueError)


@pytest.mark.parametrize(
    "make",
    [requested_job, attempted_job, unknown_job, confirmed_job, verifying_job, abandoned_job],
    ids=lambda f: f.__name__,
)
@pytest.mark.parametrize("resolution", list(Resolution))
def test_resolve_refused_outside_review(make: Make, resolution: Resolution) -> None:
    clock = FakeClock()
    job = make(clock)
    refused(job, lambda: resolve(job, clock, resolution), "cannot Resolved")


# -- settled jobs stay settled ----------------------------------------------------------


@pytest.mark.parametrize(
    "make", [confirmed_job, verified_job, abandoned_job], ids=lambda f: f.__name__
)
def test_every_command_refused_once_final(make: Make) -> None:
    clock = FakeClock()
    job = make(clock)
    clock.advance(86400)
    later = clock.now + SEARCH_AFTER
    review = Review(RELOADED, EscalationReason.UNKNOWN_OUTCOME)
    commands: list[Callable[[], object]] = [
        lambda: claim(job, clock),
        lambda: respond(job, clock),
        lambda: unknown(job, clock),
        lambda: unknown(job, clock, review),
        lambda: reject(job, clock, RetryAt(RELOADED, later), transient=True),
        lambda: reject(job, clock, review, transient=False),
        *(
            lambda copies=copies, decision=decision: search(job, clock, copies, decision)
            for copies, decision in search_decisions(clock.now)
        ),
        lambda: search(job, clock, [], StopVerifying(RELOADED)),
        lambda: job.stop_verifying(StopVerifying(RELOADED), at=clock.now),
        lambda: escalate(job, clock, review),
        *(lambda r=r: resolve(job, clock, r) for r in Resolution),
    ]
    for command in commands:
        refused(job, command, f"is {job.state.value}: cannot ")
