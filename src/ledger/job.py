"""The SendJob aggregate: one send job's whole life as events.

Event topics are explicit ("sendledger:SendJob.Requested", ...) so that moving or renaming
this module never orphans stored history. Every transition is checked here, so a daemon
bug cannot record an impossible history (for example a second Attempted before the first
one has an outcome, or a resend after a duplicate).
"""

from __future__ import annotations

import uuid
from datetime import datetime
from enum import StrEnum
from typing import Any

from eventsourcing.domain import Aggregate

JOB_NAMESPACE = uuid.UUID("6b0f6a52-3a8e-5d55-9b7e-5e4d1e0a7c11")


def job_id_for(key: str) -> uuid.UUID:
    return uuid.uuid5(JOB_NAMESPACE, key)


class JobState(StrEnum):
    REQUESTED = "requested"
    ATTEMPTED = "attempted"
    UNKNOWN = "unknown"
    CONFIRMED = "confirmed"
    REVIEW = "review"
    ABANDONED = "abandoned"


SETTLED_STATES = frozenset({JobState.CONFIRMED, JobState.REVIEW, JobState.ABANDONED})
FINAL_STATES = frozenset({JobState.CONFIRMED, JobState.ABANDONED})

ESCALATION_REASONS = frozenset(
    {
        "unknown-outcome",
        "duplicate",
        "max-attempts",
        "rejected",
        "handle-unreliable",
        "no-policy",
    }
)
CONFIRM_VIA = frozenset({"response", "search", "operator"})
RESOLUTIONS = frozenset({"sent", "resend", "abandon"})


class TransitionError(Exception):
    """A command that the job's current state does not allow."""

    def __init__(self, key: str, state: str, action: str, why: str = "") -> None:
        detail = f": {why}" if why else ""
        super().__init__(f"job {key!r} is {state}: cannot {action}{detail}")
        self.key = key
        self.state = state
        self.action = action


class SendJob(Aggregate):
    TOPIC = "sendledger:SendJob"

    # -- state (set only by events) -------------------------------------------------
    key: str
    channel: str
    to: list[str]
    cc: list[str]
    reply_to: str | None
    from_addr: str
    subject: str
    body: str
    html: str | None
    message_id: str
    content_hash: str
    state: JobState
    due_at: datetime | None
    attempts: int  # provider calls ever made
    round_attempts: int  # provider calls since the job was (re)opened by a human
    searches: int  # searches since the last Unknown
    misses: int  # empty searches since the last Unknown
    reason: str | None
    provider_message_ids: list[str]
    duplicate: bool
    awaiting: str | None  # an event that must come next ("Escalated", "Confirmed")
    last_provider: str | None
    resent: bool  # sent again without proof the earlier attempt failed
    verifying: bool  # confirmed, and its copies are to be counted once more
    verifications: int

    def __init__(self) -> None:
        # State is set by the Requested event's apply(), so replay and creation agree.
        pass

    class Event(Aggregate.Event):
        TOPIC = "sendledger:SendJob.Event"

    # eventsourcing would otherwise define SendJob.Created itself, inheriting Event's topic.
    class Created(Event, Aggregate.Created):
        TOPIC = "sendledger:SendJob.Created"

    class Requested(Aggregate.Created):
        TOPIC = "sendledger:SendJob.Requested"
        key: str
        channel: str
        to: list[str]
        cc: list[str]
        reply_to: str | None
        from_addr: str
        subject: str
        body: str
        html: str | None
        message_id: str
        content_hash: str
        policy: str
        fingerprint: str

        def apply(self, job: Any) -> None:
            job.key = self.key
            job.channel = self.channel
            job.to = list(self.to)
            job.cc = list(self.cc)
            job.reply_to = self.reply_to
            job.from_addr = self.from_addr
            job.subject = self.subject
            job.body = self.body
            job.html = self.html
            job.message_id = self.message_id
            job.content_hash = self.content_hash
            job.state = JobState.REQUESTED
            job.due_at = self.timestamp
            job.attempts = 0
            job.round_attempts = 0
            job.searches = 0
            job.misses = 0
            job.reason = None
            job.provider_message_ids = []
            job.duplicate = False
            job.awaiting = None
            job.last_provider = None
            job.resent = False
            job.verifying = False
            job.verifications = 0

    class Attempted(Event):
        TOPIC = "sendledger:SendJob.Attempted"
        attempt: int
        provider: str
        deadline: datetime

        def apply(self, job: Any) -> None:
            job.state = JobState.ATTEMPTED
            job.attempts = self.attempt
            job.round_attempts += 1
            job.due_at = self.deadline
            job.last_provider = self.provider
            job.reason = None

    class Unknown(Event):
        TOPIC = "sendledger:SendJob.Unknown"
        attempt: int
        reason: str
        search_due_at: datetime | None  # None: the policy sends it to review instead
        policy: str
        fingerprint: str

        def apply(self, job: Any) -> None:
            job.state = JobState.UNKNOWN
            job.searches = 0
            job.misses = 0
            job.reason = self.reason
            job.due_at = self.search_due_at
            job.awaiting = None if self.search_due_at is not None else "Escalated"

    class SearchedMiss(Event):
        TOPIC = "sendledger:SendJob.SearchedMiss"
        search: int
        query: str
        next_search_at: datetime | None  # None: misses are believed; a decision follows
        policy: str
        fingerprint: str

        def apply(self, job: Any) -> None:
            job.searches = self.search
            job.misses += 1
            job.due_at = self.next_search_at
            job.awaiting = None if self.next_search_at is not None else "Requeued|Escalated"

    class Requeued(Event):
        """Back to `requested` with the same Message-ID: the policy (after enough
        misses or a transient rejection) or a human decided on a resend."""

        TOPIC = "sendledger:SendJob.Requeued"
        reason: str
        due_at: datetime
        misses_required: int
        policy: str
        fingerprint: str

        def apply(self, job: Any) -> None:
            job.state = JobState.REQUESTED
            job.due_at = self.due_at
            job.reason = self.reason
            job.searches = 0
            job.misses = 0
            job.awaiting = None
            job.resent = True

    class Rejected(Event):
        TOPIC = "sendledger:SendJob.Rejected"
        attempt: int
        transient: bool
        reason: str
        status: int | None
        retry_at: datetime | None  # None: no retry (permanent, or attempts exhausted)
        policy: str
        fingerprint: str

        def apply(self, job: Any) -> None:
            job.reason = self.reason
            if self.retry_at is not None:
                job.state = JobState.REQUESTED
                job.due_at = self.retry_at
                job.awaiting = None
            else:
                job.due_at = None
                job.awaiting = "Escalated"

    class Confirmed(Event):
        TOPIC = "sendledger:SendJob.Confirmed"
        via: str
        provider_message_ids: list[str]
        policy: str
        fingerprint: str
        verify_at: datetime | None = None  # count the copies again then (after a resend)

        def apply(self, job: Any) -> None:
            job.state = JobState.CONFIRMED
            if self.via != "operator":  # an operator's "resolved: sent" stays visible
                job.reason = None
            job.provider_message_ids = list(self.provider_message_ids)
            job.due_at = self.verify_at
            job.verifying = self.verify_at is not None
            job.verifications = 0
            job.awaiting = None

    class Verified(Event):
        """A confirmed job's copies counted once more: one (done), or none yet."""

        TOPIC = "sendledger:SendJob.Verified"
        search: int
        hits: int
        next_verify_at: datetime | None
        policy: str
        fingerprint: str

        def apply(self, job: Any) -> None:
            job.verifications = self.search
            job.due_at = self.next_verify_at
            job.verifying = self.next_verify_at is not None

    class Duplicate(Event):
        TOPIC = "sendledger:SendJob.Duplicate"
        hits: int
        provider_message_ids: list[str]
        policy: str
        fingerprint: str

        def apply(self, job: Any) -> None:
            job.duplicate = True
            job.provider_message_ids = list(self.provider_message_ids)
            job.due_at = None
            job.verifying = False
            job.awaiting = "Escalated"

    class Escalated(Event):
        TOPIC = "sendledger:SendJob.Escalated"
        reason: str
        detail: str
        policy: str
        fingerprint: str

        def apply(self, job: Any) -> None:
            job.state = JobState.REVIEW
            job.reason = self.reason
            job.due_at = None
            job.awaiting = None

    class Resolved(Event):
        TOPIC = "sendledger:SendJob.Resolved"
        decision: str
        note: str
        by: str

        def apply(self, job: Any) -> None:
            job.reason = f"resolved: {self.decision}"
            if self.decision == "resend":
                job.state = JobState.REQUESTED
                job.resent = True
                job.due_at = self.timestamp
                job.round_attempts = 0
                job.searches = 0
                job.misses = 0
                job.awaiting = None
            elif self.decision == "abandon":
                job.state = JobState.ABANDONED
                job.due_at = None
                job.awaiting = None
            else:
                job.awaiting = "Confirmed"

    # -- commands -------------------------------------------------------------------

    @classmethod
    def request(
        cls,
        *,
        key: str,
        channel: str,
        to: list[str],
        cc: list[str],
        reply_to: str | None,
        from_addr: str,
        subject: str,
        body: str,
        html: str | None,
        message_id: str,
        content_hash: str,
        policy: str,
        fingerprint: str,
        at: datetime,
    ) -> SendJob:
        return cls._create(
            cls.Requested,
            id=job_id_for(key),
            timestamp=at,
            key=key,
            channel=channel,
            to=list(to),
            cc=list(cc),
            reply_to=reply_to,
            from_addr=from_addr,
            subject=subject,
            body=body,
            html=html,
            message_id=message_id,
            content_hash=content_hash,
            policy=policy,
            fingerprint=fingerprint,
        )

    def _refuse(self, action: str, why: str = "") -> TransitionError:
        return TransitionError(self.key, self.state.value, action, why)

    def _require(self, action: str, *states: JobState) -> None:
        if self.awaiting is not None and not _awaits(self.awaiting, action):
            raise self._refuse(action, f"{self.awaiting} must come first")
        if self.state not in states:
            raise self._refuse(action)

    def attempt(self, *, provider: str, deadline: datetime, at: datetime) -> int:
        """The write-ahead claim: durable before the provider is called."""
        self._require("Attempted", JobState.REQUESTED)
        if self.due_at is not None and at < self.due_at:
            raise self._refuse("Attempted", f"not due before {self.due_at.isoformat()}")
        if deadline <= at:
            raise self._refuse("Attempted", "deadline must be after the attempt")
        number = self.attempts + 1
        self.trigger_event(
            self.Attempted, timestamp=at, attempt=number, provider=provider, deadline=deadline
        )
        return number

    def record_unknown(
        self,
        *,
        reason: str,
        search_due_at: datetime | None,
        policy: str,
        fingerprint: str,
        at: datetime,
    ) -> None:
        self._require("Unknown", JobState.ATTEMPTED)
        if search_due_at is not None and search_due_at < at:
            raise self._refuse("Unknown", "a search cannot be due before the outcome")
        self.trigger_event(
            self.Unknown,
            timestamp=at,
            attempt=self.attempts,
            reason=reason,
            search_due_at=search_due_at,
            policy=policy,
            fingerprint=fingerprint,
        )

    def record_miss(
        self,
        *,
        query: str,
        next_search_at: datetime | None,
        policy: str,
        fingerprint: str,
        at: datetime,
    ) -> None:
        self._require("SearchedMiss", JobState.UNKNOWN)
        self._require_search_due(at, "SearchedMiss")
        if next_search_at is not None and next_search_at < at:
            raise self._refuse("SearchedMiss", "the next search cannot be due before this one")
        self.trigger_event(
            self.SearchedMiss,
            timestamp=at,
            search=self.searches + 1,
            query=query,
            next_search_at=next_search_at,
            policy=policy,
            fingerprint=fingerprint,
        )

    def _require_search_due(self, at: datetime, action: str) -> None:
        # A search before its due time would read a lagging index and could be
        # mistaken for proof that nothing was sent (the seed's first caveat).
        if self.due_at is not None and at < self.due_at:
            raise self._refuse(action, f"search not due before {self.due_at.isoformat()}")

    def requeue(
        self,
        *,
        reason: str,
        due_at: datetime,
        misses_required: int,
        policy: str,
        fingerprint: str,
        at: datetime,
    ) -> None:
        """After enough misses the policy may resend (same Message-ID)."""
        self._require("Requeued", JobState.UNKNOWN)
        if self.duplicate:
            raise self._refuse("Requeued", "a duplicate is never resent automatically")
        if misses_required < 1 or self.misses < misses_required:
            raise self._refuse(
                "Requeued", f"{self.misses} empty searches, {max(misses_required, 1)} required"
            )
        self.trigger_event(
            self.Requeued,
            timestamp=at,
            reason=reason,
            due_at=max(due_at, at),
            misses_required=misses_required,
            policy=policy,
            fingerprint=fingerprint,
        )

    def reject(
        self,
        *,
        transient: bool,
        reason: str,
        status: int | None,
        retry_at: datetime | None,
        policy: str,
        fingerprint: str,
        at: datetime,
    ) -> None:
        self._require("Rejected", JobState.ATTEMPTED)
        if not transient and retry_at is not None:
            raise self._refuse("Rejected", "a permanent rejection is never retried")
        if retry_at is not None and retry_at < at:
            raise self._refuse("Rejected", "a retry cannot be due before the rejection")
        self.trigger_event(
            self.Rejected,
            timestamp=at,
            attempt=self.attempts,
            transient=transient,
            reason=reason,
            status=status,
            retry_at=retry_at,
            policy=policy,
            fingerprint=fingerprint,
        )

    def confirm(
        self,
        *,
        via: str,
        provider_message_ids: list[str],
        policy: str,
        fingerprint: str,
        at: datetime,
        verify_at: datetime | None = None,
    ) -> None:
        if via not in CONFIRM_VIA:
            raise ValueError(f"unknown confirmation source: {via!r}")
        allowed = {
            "response": (JobState.ATTEMPTED,),
            "search": (JobState.UNKNOWN,),
            "operator": (JobState.REVIEW,),
        }[via]
        self._require("Confirmed", *allowed)
        if via != "operator" and len(provider_message_ids) != 1:
            raise self._refuse("Confirmed", "exactly one copy is required")
        if via == "search":
            self._require_search_due(at, "Confirmed")
        if via == "operator" and self.awaiting != "Confirmed":
            raise self._refuse("Confirmed", "an operator's 'sent' decision must come first")
        if verify_at is not None and verify_at < at:
            raise self._refuse("Confirmed", "a verification cannot be due before the confirmation")
        self.trigger_event(
            self.Confirmed,
            timestamp=at,
            via=via,
            provider_message_ids=list(provider_message_ids),
            policy=policy,
            fingerprint=fingerprint,
            verify_at=verify_at,
        )

    def record_verification(
        self,
        *,
        hits: int,
        next_verify_at: datetime | None,
        policy: str,
        fingerprint: str,
        at: datetime,
    ) -> None:
        """One copy (done) or none yet (again at `next_verify_at`, or give up: None).
        Two or more copies are a Duplicate, not a verification."""
        self._require("Verified", JobState.CONFIRMED)
        if not self.verifying:
            raise self._refuse("Verified", "no verification is pending")
        self._require_search_due(at, "Verified")
        if hits not in (0, 1):
            raise self._refuse("Verified", "two or more copies are a Duplicate")
        if hits == 1 and next_verify_at is not None:
            raise self._refuse("Verified", "one copy ends the verification")
        if next_verify_at is not None and next_verify_at < at:
            raise self._refuse("Verified", "the next verification cannot be due before this one")
        self.trigger_event(
            self.Verified,
            timestamp=at,
            search=self.verifications + 1,
            hits=hits,
            next_verify_at=next_verify_at,
            policy=policy,
            fingerprint=fingerprint,
        )

    def record_duplicate(
        self, *, provider_message_ids: list[str], policy: str, fingerprint: str, at: datetime
    ) -> None:
        self._require("Duplicate", JobState.UNKNOWN, JobState.REVIEW, JobState.CONFIRMED)
        if self.state is JobState.CONFIRMED:
            # Only the copy count after a resend may reopen a confirmed job.
            if not self.verifying:
                raise self._refuse("Duplicate", "no verification is pending")
            self._require_search_due(at, "Duplicate")
        if len(provider_message_ids) < 2:
            raise self._refuse("Duplicate", "two or more copies are required")
        self.trigger_event(
            self.Duplicate,
            timestamp=at,
            hits=len(provider_message_ids),
            provider_message_ids=list(provider_message_ids),
            policy=policy,
            fingerprint=fingerprint,
        )

    def escalate(
        self, *, reason: str, detail: str, policy: str, fingerprint: str, at: datetime
    ) -> None:
        if reason not in ESCALATION_REASONS:
            raise ValueError(f"unknown escalation reason: {reason!r}")
        self._require(
            "Escalated",
            JobState.REQUESTED,
            JobState.ATTEMPTED,
            JobState.UNKNOWN,
            JobState.REVIEW,
            JobState.CONFIRMED,
        )
        if self.state is JobState.REVIEW and self.awaiting != "Escalated":
            raise self._refuse("Escalated", "already in review")
        if self.state is JobState.CONFIRMED and self.awaiting != "Escalated":
            raise self._refuse("Escalated", "a confirmed job goes to review only as a duplicate")
        self.trigger_event(
            self.Escalated,
            timestamp=at,
            reason=reason,
            detail=detail,
            policy=policy,
            fingerprint=fingerprint,
        )

    def resolve(self, *, decision: str, note: str, by: str, at: datetime) -> None:
        if decision not in RESOLUTIONS:
            raise ValueError(f"unknown decision: {decision!r} (sent, resend or abandon)")
        self._require("Resolved", JobState.REVIEW)
        if decision == "resend" and self.duplicate:
            raise self._refuse(
                "Resolved", "two copies already exist; resolve as 'sent' or 'abandon'"
            )
        self.trigger_event(self.Resolved, timestamp=at, decision=decision, note=note, by=by)
        if decision == "sent":
            self.confirm(
                via="operator",
                provider_message_ids=list(self.provider_message_ids),
                policy="operator",
                fingerprint=by,
                at=at,
            )

    # -- derived --------------------------------------------------------------------

    @property
    def settled(self) -> bool:
        return self.state in SETTLED_STATES


def _awaits(awaiting: str, action: str) -> bool:
    return action in awaiting.split("|")
