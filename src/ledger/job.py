"""The SendJob aggregate: one send job's whole life as events.

Event topics are explicit ("sendledger:SendJob.Requested", ...) so that moving or renaming
this module never orphans stored history. An event whose stored shape changed carries a
``class_version`` and an ``upcast_vN_vM`` per change (Requested is at version 4, Attempted
at 3, Unknown at 2), so every event any release wrote still loads
(``tests/fixtures/store-v1`` proves a first-release store does).

Commands are named after facts: a claim before a provider call, the call's outcome, a
search's result, a human's resolution. Each takes the policy's typed decision
(:mod:`ledger.decision_types`) and records every event that decision implies in one step, so a
job is never saved half-way through a transition. Every rule about what may happen when is
checked here, once: a daemon bug cannot record an impossible history (a second Attempted
before the first has an outcome, a search before the index lag has passed, a resend after a
duplicate). The numbered invariants are in ``docs/architecture.md``.

Another's words (a provider's error body, an SMTP reply, a failure's text) reach the events
only through the commands that record a reason or a detail (`record_unknown`,
`record_rejection`, `record_history_unusable`, every escalation), and each records them
through ``ledger.characters.recorded``: bounded here, the one place the words of every
provider, step and recovery pass through (docs/how-it-works.md "Another's words").

A search's copies reach the events with their count: at most ``COPIES_KEPT`` provider ids
(the search result cut them: ``daemon.providers.outcomes.SearchResult``), and the count of
all of them, which the decision checks (docs/how-it-works.md "Counting copies").
"""

from __future__ import annotations

import copy
import hashlib
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from eventsourcing.domain import Aggregate

from ledger import decision_types as decide
from ledger.characters import recorded
from ledger.content import LATER_FIELDS, JobContent, JobInputError
from ledger.copies import COPIES_KEPT, copies_found, found_only_in_trash
from ledger.delivery_reports import BouncedRecipient, DeliveryReport, ReportRefusal
from ledger.display import printable
from ledger.exceptions import Refusal, SendledgerError
from ledger.keys import MAX_NAME_LENGTH, identifier_problem, note_problem
from ledger.vocabulary import (
    FINAL_STATES,
    SETTLED_STATES,
    ConfirmedVia,
    EscalationReason,
    JobState,
    PolicyRef,
    Resolution,
)

_HISTORY_DECISIONS = (decide.Confirm, decide.Duplicate, decide.HistoryMiss)
_SEARCH_DECISIONS = (
    decide.Confirm,
    decide.Duplicate,
    decide.SearchAgainAt,
    decide.ResendAt,
    decide.Review,
    decide.StopVerifying,
)

#: Why unsent drafts of a job were deleted (DraftsDeleted.why).
DRAFTS_TIDY = "tidy"  # the job is settled: no draft of it may be sent any more
DRAFTS_FENCE = "fence"  # before counting a lapsed claim's copies: its draft is never sent late
DRAFTS_CLAIM_LOST = "claim lost"  # the draft step's draft, whose claim another writer beat

#: The reason of a Rejected that released a claim unsent, with no provider call made: its
#: save failed with the commit not known and the store, read back, held it
#: (docs/architecture.md "Ambiguous commits"). The store's lost answer, not the provider's
#: refusal: no attempt spent, yet no sign of an unavailable provider either.
CLAIM_READ_BACK = (
    "not sent: its claim's commit was not known (the store's answer lost), read back "
    "stored, and released with no call made"
)
#: The reasons of the other claims released with no provider call made, by the daemon's
#: own doing (`daemon.engine.dispatch`): its circuit held the send (a call of its scope
#: hung or failed while the claim was saved: the circuit counts it, the job only waits
#: behind it), its claim's lease ran short or its quota scope went to another daemon, or
#: it was stopping.
WITHHELD = (
    "not sent: a call of its scope timed out, or its circuit opened, while the claim was saved"
)
NOT_OURS = (
    "not sent: its claim's lease ran short, or its quota scope went to another daemon, "
    "before the call"
)
STOPPED = "not sent: the daemon was stopping when its claim was saved"
#: Every reason of a claim released unsent (`SendJob.Rejected.released`). Stored in
#: events and read by every later release: a reworded reason keeps its old wording here
#: too, or the old events would read as the provider's refusal again.
RELEASED_UNSENT = frozenset((CLAIM_READ_BACK, WITHHELD, NOT_OURS, STOPPED))
DRAFT_DELETIONS = (DRAFTS_TIDY, DRAFTS_FENCE, DRAFTS_CLAIM_LOST)

JOB_NAMESPACE = uuid.UUID("6b0f6a52-3a8e-5d55-9b7e-5e4d1e0a7c11")
_NAMESPACE_BYTES = JOB_NAMESPACE.bytes


def waits_for_provider(reason: str) -> bool:
    """Whether a send rejected as unavailable, for `reason` as recorded, waits for the
    provider: its refusal, or its circuit's hold of the claim (`WITHHELD`), but no other
    release with no call made (`RELEASED_UNSENT`). The one rule the job's replay
    (`SendJob.Rejected.waits_for_provider`: where its `give_up_after` counts from) and the
    daemon's decision on the release (`Dispatch._after_rejection`: whether a give-up is
    due) both read, so the two cannot disagree."""
    return reason == WITHHELD or reason not in RELEASED_UNSENT


def created_at(at: datetime, index: int, count: int) -> datetime:
    """When the `index`-th of `count` jobs submitted at `at` is created: a microsecond
    apart, the last at `at`, so the jobs of a batch fall due in the batch's order (a job
    is due at its creation) and none later than the submission. The intake renders each
    message with the Date its job will have."""
    return at - timedelta(microseconds=count - 1 - index)


def job_id_for(key: str) -> uuid.UUID:
    """The job's aggregate id: ``uuid.uuid5(JOB_NAMESPACE, key)``, worked out as that does
    it (RFC 4122: the SHA-1 of the namespace's bytes and the key's UTF-8, the variant and
    version 5 set in its first 16 bytes), the UUID made once from its integer. Every load
    and every new job asks it; `uuid5` imports `sha1` at each call and makes the UUID
    from bytes and a version, nearly twice the CPU (docs/performance.md "Performance and
    scaling")."""
    digest = hashlib.sha1(_NAMESPACE_BYTES + key.encode("utf-8")).digest()
    number = int.from_bytes(digest[:16])
    number = (number & ~(0xC000 << 48)) | (0x8000 << 48)  # the variant: RFC 4122
    return uuid.UUID(int=(number & ~(0xF000 << 64)) | (5 << 76))  # version 5


class TransitionError(SendledgerError):
    """A command that the job's current state does not allow."""

    kind = Refusal.BAD_INPUT

    def __init__(self, key: str, state: str, action: str, why: str = "") -> None:
        detail = f": {why}" if why else ""
        super().__init__(f"job {key!r} is {state}: cannot {action}{detail}")
        self.key = key
        self.state = state
        self.action = action


def resolved_reason(decision: str) -> str:
    """A job's `reason` once a person's decision (`Resolved`) is its latest: replaced by
    the next outcome's, a claim's refusal included."""
    return f"resolved: {decision}"


def _nothing_yet(job: Any) -> None:
    """A requested job's history so far: no attempt, search, draft, bounce or review."""
    job.attempts = 0
    job.round_attempts = 0
    job.searches = 0
    job.misses = 0
    job.reason = None
    job.provider_message_ids = []
    job.duplicate = False
    job.last_provider = None
    job.claimed_by = ""
    job.resent = False
    job.requeued = False
    job.verifying = False
    job.verifications = 0
    job.purged_at = None
    job.purged_by = ""
    job.draft_id = None
    job.draft_message_id = None
    job.fenced_draft = None
    job.deleted_drafts = frozenset()
    job.made_drafts = ()
    job.unavailable_since = None
    job.last_attempt_at = None
    job.draft_gone_at = None
    job.first_attempt_at = None
    job.unrefused_claims = {}
    job.verify_at = None
    job.tidy_at = None
    job.checked_version = 0
    job.checked_copies = ()
    job.checked_count = 0
    job.duplicate_count = 0
    job.duplicate_complete = True
    job.history_id = None
    job.history_due_at = None
    job.search_due_at = None
    job.unknown_at = None
    job.watch_until = None
    job.bounce_ids = ()
    job.bounced_pairs = frozenset()
    job.escalated_at = None


class SendJob(Aggregate):
    TOPIC = "sendledger:SendJob"

    # -- state (set only by events) -------------------------------------------------
    key: str
    channel: str
    content: JobContent
    submitted_by: str  # "" for jobs stored before it was recorded
    proved_by: str  # the writer that proved its message at intake; "" none (message.py)
    from_addr: str
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
    last_provider: str | None
    claimed_by: str  # the daemon of the latest Attempted ("" before v2 or none)
    resent: bool  # sent again without proof the earlier attempt failed
    # Due again because the daemon believed its searches' misses (Requeued), not by a
    # person's resend: that decision holds only while the provider keeps our Message-ID.
    # A later attempt's answer (refused, its draft found unsent) says nothing of the
    # attempt the misses judged: only a person's resend ends it.
    requeued: bool
    verifying: bool  # confirmed, and its copies are to be counted once more
    verifications: int
    purged_at: datetime | None  # its content was purged then (ledger/redaction.py)
    purged_by: str
    # send_via = "drafts": the provider's draft made for this job (None: none recorded).
    draft_id: str | None
    draft_message_id: str | None
    # The draft (id, message id) a sweep's fence recorded as deleted, written before the
    # deletion (docs/architecture.md "The life of one job on a drafts provider"): asked
    # in place of a recorded one until the answer, so its SENT message still confirms
    # the job, whichever daemon asks (gone and not SENT, it proves nothing: DraftGone).
    fenced_draft: tuple[str, str] | None
    # Every draft id recorded as deleted (`DraftsDeleted`): never reused by a later
    # attempt, whose listing by Message-ID may still show one whose deletion was
    # recorded before it was made (a fence, a claim that lost its race).
    deleted_drafts: frozenset[str]
    # The draft each claim's call was to send, made before the claim by a provider whose
    # every send is a draft first (Graph: `Attempted.made_draft`), oldest first: a fence
    # or a tidy deletes those still unsent by id, whoever made them, where the provider's
    # search by Message-ID may not list them yet.
    made_drafts: tuple[str, ...]
    # Since when its provider has been unavailable to it (the first of the unavailable
    # rejections in a row), for the channel's `give_up_after`; None otherwise.
    unavailable_since: datetime | None
    last_attempt_at: datetime | None  # the latest claim's time (a resend's index rule)
    # When a recorded draft was last found gone with no SENT message of its own
    # (`DraftGone`): a person may have sent it from the mailbox just before, under a
    # message id of its own, so a resend's index rule counts from here too.
    draft_gone_at: datetime | None
    first_attempt_at: datetime | None  # the first claim's: no report of it is older
    # The claims (attempt -> its time) no Rejected answered: the attempts that may have
    # sent the message. No real report is older than the earliest of them; an attempt
    # the provider refused (nothing sent) gives a forger's report no earlier start.
    unrefused_claims: dict[int, datetime]
    # A confirmed job whose copies are to be counted again then (after a resend).
    verify_at: datetime | None
    # A settled job whose provider may have left unsent drafts of it: they are deleted
    # then (docs/architecture.md "Drafts never outlive their job").
    tidy_at: datetime | None
    # The version of the latest Checked event and the copies it found: a check that
    # finds the same on a settled job adds nothing to its history.
    checked_version: int
    checked_copies: tuple[str, ...]
    checked_count: int  # all it found: `checked_copies` are the first COPIES_KEPT
    # A duplicate's copies found in all (its `provider_message_ids` are the first
    # COPIES_KEPT), and False when the search stopped reading before it had them all.
    duplicate_count: int
    duplicate_complete: bool
    # The mailbox's historyId recorded with the latest claim (None: none known then, or
    # its history can no longer answer): the history since it holds that attempt's copy.
    history_id: str | None
    # While unknown: when the mailbox's history is read (None: not), when the search is
    # due (the job's due_at is the sooner), and when the outcome became unknown.
    history_due_at: datetime | None
    search_due_at: datetime | None
    unknown_at: datetime | None
    # A confirmed job on a channel with `watch_bounces`: delivery reports naming it are
    # looked for in its mailbox until then (None: not watched, or the watch ended), and
    # the reports recorded (their DSN ids), each once (docs/how-it-works.md "Bounces").
    watch_until: datetime | None
    bounce_ids: tuple[str, ...]
    # (recipient, permanent) of every Bounced recorded (addresses lower-cased): a report
    # that adds none is not recorded, so a flood of reports adds at most two events per
    # recipient (docs/how-it-works.md "Bounces: what a report proves").
    bounced_pairs: frozenset[tuple[str, bool]]
    # When it last went to review (its latest Escalated event; None: never): how long a
    # job in review has waited, which a check or a triage writing to it does not reset.
    # Set by the events alone, so a job stored by any release has it once replayed.
    escalated_at: datetime | None

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
        # v2 records who submitted the job (an API token's name, the CLI's OS user); v3
        # the later message fields (bcc, headers, in_reply_to, references, send_at,
        # attachments); v4 the job's own From (`sender`) and Gmail `thread_id`; v5 which
        # writer proved the job's message at intake (`proved_by`).
        class_version = 5
        # The job's content, flat as the first release stored it (JobContent.stored()).
        key: str
        channel: str
        to: list[str]
        cc: list[str]
        reply_to: str | None
        subject: str
        body: str
        html: str | None
        bcc: list[str]
        headers: dict[str, str]
        in_reply_to: str | None
        references: list[str]
        send_at: str | None
        attachments: list[dict[str, str]]
        sender: str | None
        thread_id: str | None
        # What the channel's policy added.
        from_addr: str
        message_id: str
        content_hash: str
        policy: str
        fingerprint: str
        submitted_by: str
        # The writer that proved this very message at intake (`ledger/message.py:
        # writer_fingerprint`); "" when none did.
        proved_by: str

        @staticmethod
        def upcast_v1_v2(state: dict[str, Any]) -> None:
            state["submitted_by"] = ""  # the first release did not record it

        @staticmethod
        def upcast_v2_v3(state: dict[str, Any]) -> None:
            # Jobs stored before these fields existed had none of them.
            for name, empty in LATER_FIELDS.items():
                state[name] = copy.deepcopy(empty)

        @staticmethod
        def upcast_v3_v4(state: dict[str, Any]) -> None:
            # Jobs stored before the job's own From and thread id were sent as the policy's.
            state["sender"] = None
            state["thread_id"] = None

        @staticmethod
        def upcast_v4_v5(state: dict[str, Any]) -> None:
            state["proved_by"] = ""  # proved again before the claim, as then

        def apply(self, job: Any) -> None:
            job.content = JobContent.from_canonical(vars(self))
            job.submitted_by = self.submitted_by
            job.proved_by = self.proved_by
            job.key = self.key
            job.channel = self.channel
            job.from_addr = self.from_addr
            job.message_id = self.message_id
            job.content_hash = self.content_hash
            job.state = JobState.REQUESTED
            # A job with a send_at is first due then (never before it was requested).
            send_at = job.content.send_at_time
            job.due_at = self.timestamp if send_at is None else max(self.timestamp, send_at)
            _nothing_yet(job)

    class Attempted(Event):
        TOPIC = "sendledger:SendJob.Attempted"
        # v2 names the daemon that claimed (`daemon.name`): at start-up a daemon recovers
        # its own claims at once, others' at their deadline. v3 records the mailbox's
        # historyId known at the claim (None: none), the start of the history read after an
        # unknown outcome (docs/architecture.md "The history handle"). v4 records the
        # draft the claim's call sends when the provider made it before the claim (Graph;
        # None: none), so any daemon can fence it by id (docs/architecture.md "Microsoft
        # Graph").
        class_version = 4
        attempt: int
        provider: str
        deadline: datetime
        daemon: str
        history_id: str | None
        made_draft: str | None

        @staticmethod
        def upcast_v1_v2(state: dict[str, Any]) -> None:
            state["daemon"] = ""  # claims of the first release name no daemon

        @staticmethod
        def upcast_v2_v3(state: dict[str, Any]) -> None:
            state["history_id"] = None  # claims before the history handle recorded none

        @staticmethod
        def upcast_v3_v4(state: dict[str, Any]) -> None:
            state["made_draft"] = None  # claims before it recorded no draft made for them

        def apply(self, job: Any) -> None:
            job.state = JobState.ATTEMPTED
            job.attempts = self.attempt
            job.round_attempts += 1
            job.due_at = self.deadline
            job.last_provider = self.provider
            job.claimed_by = self.daemon
            job.last_attempt_at = self.timestamp
            if job.first_attempt_at is None:
                job.first_attempt_at = self.timestamp
            job.unrefused_claims = {**job.unrefused_claims, self.attempt: self.timestamp}
            job.reason = None
            job.history_id = self.history_id
            job.fenced_draft = None
            if self.made_draft is not None:
                job.made_drafts = (*job.made_drafts, self.made_draft)

    class LeaseRenewed(Event):
        """The claim's call is still in flight in the daemon that made it, which pushes
        the claim's deadline on: recovery waits for the new one (docs/architecture.md
        "Leases"). Written only while the call runs longer than a third of its lease."""

        TOPIC = "sendledger:SendJob.LeaseRenewed"
        attempt: int
        deadline: datetime
        daemon: str

        def apply(self, job: Any) -> None:
            job.due_at = self.deadline

    class DraftCreated(Event):
        """The provider stored the job's message as a draft (nothing sent): written before
        the claim, so the claim's send names this draft (docs/providers.md "Gmail setup")."""

        TOPIC = "sendledger:SendJob.DraftCreated"
        draft_id: str
        provider_message_id: str  # the draft's message id at the provider

        def apply(self, job: Any) -> None:
            job.draft_id = self.draft_id
            job.draft_message_id = self.provider_message_id
            job.fenced_draft = None

    class DraftPending(Event):
        """The job's draft still exists after an attempt whose outcome was unknown: the
        attempt sent nothing. The same draft is sent again (due `retry_at`) or a human
        decides."""

        TOPIC = "sendledger:SendJob.DraftPending"
        draft_id: str
        retry_at: datetime | None  # None: review
        policy: str
        fingerprint: str

        def apply(self, job: Any) -> None:
            job.reason = f"draft {self.draft_id} still unsent: not sent"
            job.fenced_draft = None
            if self.retry_at is not None:
                job.state = JobState.REQUESTED
                job.due_at = self.retry_at
                # `requeued` stays: the draft proves this attempt unsent, not the one
                # whose searches' misses requeued the job.
            else:
                job.due_at = None
            job.searches = 0
            job.misses = 0

    class DraftGone(Event):
        """The job's draft is gone and no SENT message has its id (someone deleted one of
        them): the draft is forgotten (a resend makes a new one) and the Message-ID search
        decides, or a human."""

        TOPIC = "sendledger:SendJob.DraftGone"
        draft_id: str
        search_due_at: datetime | None  # None: review
        policy: str
        fingerprint: str

        def apply(self, job: Any) -> None:
            job.draft_id = None
            job.draft_message_id = None
            job.fenced_draft = None
            job.draft_gone_at = self.timestamp
            if job.state is JobState.UNKNOWN:  # else found outside a check: no search
                job.search_due_at = self.search_due_at
                job.due_at = self.search_due_at

    class Unknown(Event):
        TOPIC = "sendledger:SendJob.Unknown"
        # v2: when the mailbox's history since the claim is read (None: not read).
        class_version = 2
        attempt: int
        reason: str
        search_due_at: datetime | None  # None: the policy sends it to review instead
        policy: str
        fingerprint: str
        history_due_at: datetime | None

        @staticmethod
        def upcast_v1_v2(state: dict[str, Any]) -> None:
            state["history_due_at"] = None  # before the history handle: the search alone

        def apply(self, job: Any) -> None:
            job.state = JobState.UNKNOWN
            job.unavailable_since = None
            job.searches = 0
            job.misses = 0
            job.reason = self.reason
            job.unknown_at = self.timestamp
            job.search_due_at = self.search_due_at
            job.history_due_at = self.history_due_at
            job.due_at = _earliest(self.search_due_at, self.history_due_at)

    class HistoryMissed(Event):
        """The mailbox's history since the claim lists no copy of ours. Not believed while
        the history may lag: read again `next_history_at` (None: not again); believed (the
        policy's `history_after` had passed since the unknown outcome): the search is due
        `search_due_at`, its index wait over (docs/architecture.md "The history handle")."""

        TOPIC = "sendledger:SendJob.HistoryMissed"
        query: str  # the history read as the provider was sent it
        next_history_at: datetime | None
        search_due_at: datetime | None
        believed: bool
        policy: str
        fingerprint: str

        def apply(self, job: Any) -> None:
            job.history_due_at = self.next_history_at
            job.search_due_at = self.search_due_at
            job.due_at = _earliest(self.search_due_at, self.next_history_at)

    class HistoryUnusable(Event):
        """The mailbox's history cannot answer for the claim (its historyId expired: Gmail
        keeps about a week; or the provider reads none now): the search decides."""

        TOPIC = "sendledger:SendJob.HistoryUnusable"
        history_id: str
        reason: str

        def apply(self, job: Any) -> None:
            job.history_id = None
            job.history_due_at = None
            job.due_at = job.search_due_at

    class SearchedMiss(Event):
        TOPIC = "sendledger:SendJob.SearchedMiss"
        search: int
        query: str  # the query the provider was sent
        next_search_at: datetime | None  # None: misses are believed; a decision follows
        policy: str
        fingerprint: str

        def apply(self, job: Any) -> None:
            job.searches = self.search
            job.misses += 1
            job.search_due_at = self.next_search_at
            job.history_due_at = None  # the search has begun: it decides from here
            job.due_at = self.next_search_at

    class Requeued(Event):
        """Back to `requested` with the same Message-ID: enough empty searches were
        believed and the policy resends."""

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
            job.resent = True
            job.requeued = True

    class Rejected(Event):
        TOPIC = "sendledger:SendJob.Rejected"
        attempt: int
        transient: bool
        reason: str
        status: int | None
        retry_at: datetime | None  # None: no retry (permanent, or attempts exhausted)
        policy: str
        fingerprint: str
        # Nothing sent and the provider unavailable: the call does not count against
        # `max_attempts` (absent from events stored before it existed).
        unavailable: bool = False

        @property
        def released(self) -> bool:
            """A claim released unsent by its daemon (`RELEASED_UNSENT`), no provider
            call made: no refusal of the provider's (no `rejected` webhook), and but for
            its circuit's hold (`waits_for_provider`) its wait is left as it was. Read
            from the reason, so events stored before this property read the same way."""
            return self.unavailable and self.reason in RELEASED_UNSENT

        @property
        def waits_for_provider(self) -> bool:
            """Nothing sent because the provider is unavailable: its refusal, or its
            circuit's hold of the claim (`WITHHELD`). The job's `give_up_after` counts from
            the first of them no answer to its send has followed: a circuit that opens at
            each of its claims (opened, probed, opened again) must not restart the wait at
            each (docs/architecture.md "Outages: waited out, not escalated")."""
            return self.unavailable and waits_for_provider(self.reason)

        def apply(self, job: Any) -> None:
            job.reason = self.reason
            job.unrefused_claims = {
                n: at for n, at in job.unrefused_claims.items() if n != self.attempt
            }
            if self.unavailable:
                job.round_attempts -= 1
                if self.waits_for_provider:
                    job.unavailable_since = job.unavailable_since or self.timestamp
            else:
                job.unavailable_since = None
            if self.retry_at is not None:
                job.state = JobState.REQUESTED
                job.due_at = self.retry_at
            else:
                job.due_at = None

    class Confirmed(Event):
        TOPIC = "sendledger:SendJob.Confirmed"
        via: str
        provider_message_ids: list[str]
        policy: str
        fingerprint: str
        verify_at: datetime | None = None  # count the copies again then (after a resend)
        tidy_at: datetime | None = None  # delete the job's unsent drafts then

        def apply(self, job: Any) -> None:
            job.state = JobState.CONFIRMED
            job.unavailable_since = None
            if self.via != ConfirmedVia.OPERATOR:  # "resolved: sent" stays visible
                job.reason = None
            job.provider_message_ids = list(self.provider_message_ids)
            job.verify_at = self.verify_at
            job.verifying = self.verify_at is not None
            job.verifications = 0
            job.tidy_at = self.tidy_at
            job.watch_until = None  # a WatchingBounces recorded with it sets it
            job.due_at = _settled_due(job)
            job.fenced_draft = None

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
            job.verify_at = self.next_verify_at
            job.verifying = self.next_verify_at is not None
            job.due_at = _settled_due(job)

    class Duplicate(Event):
        """A search found two or more copies: `hits` of them in all, the first
        COPIES_KEPT by id; `complete` False when the search stopped reading with more
        left (`hits` is then at least that many)."""

        TOPIC = "sendledger:SendJob.Duplicate"
        hits: int
        provider_message_ids: list[str]
        policy: str
        fingerprint: str
        complete: bool = True  # recorded before the copies were bounded: every one read

        def apply(self, job: Any) -> None:
            job.duplicate = True
            job.duplicate_count = self.hits
            job.duplicate_complete = self.complete
            job.provider_message_ids = list(self.provider_message_ids)
            job.due_at = None
            job.verify_at = None
            job.verifying = False

    class Escalated(Event):
        TOPIC = "sendledger:SendJob.Escalated"
        reason: str
        detail: str
        policy: str
        fingerprint: str

        def apply(self, job: Any) -> None:
            job.state = JobState.REVIEW
            job.escalated_at = self.timestamp
            job.unavailable_since = None
            job.reason = self.reason
            job.due_at = None
            # In review a human may still resend the recorded draft: its drafts are
            # tidied when the human's decision settles it.
            job.tidy_at = None
            job.watch_until = None  # a bounce watch ends with the confirmation it followed

    class Resolved(Event):
        TOPIC = "sendledger:SendJob.Resolved"
        decision: str
        note: str
        by: str
        tidy_at: datetime | None = None  # abandon: delete the job's unsent drafts then

        def apply(self, job: Any) -> None:
            job.reason = resolved_reason(self.decision)
            job.unavailable_since = None
            if self.decision == Resolution.RESEND:
                job.state = JobState.REQUESTED
                job.resent = True
                job.requeued = False
                job.due_at = self.timestamp
                job.round_attempts = 0
                job.searches = 0
                job.misses = 0
            elif self.decision == Resolution.ABANDON:
                job.state = JobState.ABANDONED
                job.tidy_at = self.tidy_at
                job.due_at = self.tidy_at
            # "sent": the Confirmed event recorded with it moves the job on.

    class Checked(Event):
        """A human (or triage) searched the sender's mailbox for the job's Message-ID:
        who asked, why, the query sent and the copies found. It changes no state; it is
        the trail of what the human saw before deciding (docs/review.md "Review")."""

        TOPIC = "sendledger:SendJob.Checked"
        by: str
        purpose: str  # "check", "resend" (the search before one), "triage"
        query: str
        provider_message_ids: list[str]  # the first COPIES_KEPT found
        # All it found, and whether the search read them all; None: recorded before the
        # copies were bounded, when `provider_message_ids` held every one.
        count: int | None = None
        complete: bool = True

        def apply(self, job: Any) -> None:
            job.checked_version = self.originator_version
            job.checked_copies = tuple(self.provider_message_ids)
            job.checked_count = len(self.provider_message_ids) if self.count is None else self.count

    class DraftsDeleted(Event):
        """Unsent drafts of the job deleted at the provider, so nobody can send them
        later: once the job is settled (`tidy`), before a lapsed claim's copies are
        counted (`fence`), or the draft a claim that lost its race had made (`claim
        lost`). Empty when a tidy found none (docs/architecture.md "Drafts never outlive
        their job")."""

        TOPIC = "sendledger:SendJob.DraftsDeleted"
        draft_ids: list[str]
        why: str

        def apply(self, job: Any) -> None:
            job.deleted_drafts = job.deleted_drafts | set(self.draft_ids)
            if self.why == DRAFTS_TIDY:
                job.tidy_at = None
                job.due_at = _settled_due(job)
            if job.draft_id in self.draft_ids:
                if self.why == DRAFTS_FENCE:
                    # A sweep's fence is written before its deletion: the draft is
                    # asked once more, for its SENT message.
                    job.fenced_draft = (job.draft_id, job.draft_message_id)
                # Deleted: a later attempt makes a new one (prepare_draft).
                job.draft_id = None
                job.draft_message_id = None

    class Cancelled(Event):
        """Withdrawn before any provider call: the job is never sent."""

        TOPIC = "sendledger:SendJob.Cancelled"
        by: str
        note: str
        tidy_at: datetime | None = None  # delete the job's unsent drafts then

        def apply(self, job: Any) -> None:
            job.state = JobState.CANCELLED
            job.reason = "cancelled"
            job.tidy_at = self.tidy_at
            job.due_at = self.tidy_at

    class Purged(Event):
        """The job's content was made unreadable in the store (``ledger/redaction.py``):
        its trail stays, its recipients, subject, bodies, attachments and headers do not."""

        TOPIC = "sendledger:SendJob.Purged"
        by: str
        rule: str  # why: "purge_after = 90d", "admin purge --older-than 30d", ...

        def apply(self, job: Any) -> None:
            job.purged_at = self.timestamp
            job.purged_by = self.by
            job.content = job.content.redacted()

    class WatchingBounces(Event):
        """Confirmed on a channel with `watch_bounces`: delivery reports naming the job's
        Message-ID are looked for in its mailbox until `until` (docs/how-it-works.md
        "Bounces"). Recorded with the Confirmed event it follows."""

        TOPIC = "sendledger:SendJob.WatchingBounces"
        until: datetime
        policy: str
        fingerprint: str

        def apply(self, job: Any) -> None:
            job.watch_until = self.until
            job.due_at = _settled_due(job)

    class Bounced(Event):
        """A delivery report in the job's mailbox says some of its recipients did not get
        it (`permanent`: failed for good; else delayed). It changes nothing of the job's
        sending: the message was sent, and a report is a claim, not a proof
        (docs/how-it-works.md "Bounces"). At most one per report (`dsn_id`)."""

        TOPIC = "sendledger:SendJob.Bounced"
        dsn_id: str  # the report's own Message-ID, else "mailbox:" and its id there
        provider_message_id: str  # the report's id in the mailbox
        reporter: str  # its Reporting-MTA, or ""
        # {"address", "status", "action", "permanent", "diagnostic"} per recipient
        recipients: list[dict[str, Any]]
        permanent: bool
        policy: str
        fingerprint: str

        def apply(self, job: Any) -> None:
            job.bounce_ids = (*job.bounce_ids, self.dsn_id)
            job.bounced_pairs = job.bounced_pairs | bounced_pairs(self.recipients)

    class BounceWatchEnded(Event):
        """The job's bounce watch is over (`watch_bounces` after its confirmation): no
        report is looked for any more, and nothing of the job is due for it."""

        TOPIC = "sendledger:SendJob.BounceWatchEnded"
        bounces: int  # reports recorded on the job by then
        # "": its mailbox was read through after its end; "unread": it was not (the
        # watch waited `BounceWatch.unread_bound` for a read, or nothing reads that
        # mailbox any more), so a report it received near the end may be unrecorded.
        # Earlier events have none: "".
        reason: str = ""

        def apply(self, job: Any) -> None:
            job.watch_until = None
            job.due_at = _settled_due(job)

    # -- commands -------------------------------------------------------------------

    @classmethod
    def request(
        cls,
        content: JobContent,
        *,
        from_addr: str,
        message_id: str,
        policy: PolicyRef,
        at: datetime,
        by: str = "",
        proved_by: str = "",
    ) -> SendJob:
        """`proved_by`: the writer that proved this job's message, rendered at `at`, at
        intake (`ledger/message.py: writer_fingerprint`)."""
        return cls._create(
            cls.Requested,
            id=job_id_for(content.key),
            timestamp=at,
            **content.stored(),
            from_addr=from_addr,
            message_id=message_id,
            content_hash=content.content_hash,
            **policy.event_fields(),
            submitted_by=by,
            proved_by=proved_by,
        )

    def claim(
        self,
        *,
        provider: str,
        deadline: datetime,
        at: datetime,
        daemon: str = "",
        history_id: str | None = None,
        made_draft: str | None = None,
    ) -> int:
        """The write-ahead claim (Attempted) by the daemon named `daemon`: durable before
        the provider is called. `history_id`: the mailbox's historyId known now, whose
        history holds this attempt's copy if it is sent (None: none known). `made_draft`:
        the draft the call sends, made before the claim (Graph), kept for any daemon's
        fence."""
        self._require("Attempted", JobState.REQUESTED)
        self._require_due(at, "Attempted", "not due")
        if deadline <= at:
            raise self._refuse("Attempted", "deadline must be after the attempt")
        number = self.attempts + 1
        self.trigger_event(
            self.Attempted,
            timestamp=at,
            attempt=number,
            provider=provider,
            deadline=deadline,
            daemon=daemon,
            history_id=history_id,
            made_draft=made_draft,
        )
        return number

    def renew_lease(self, *, deadline: datetime, at: datetime, daemon: str) -> None:
        """The claim's call is still running in `daemon`, the daemon that claimed: its
        deadline moves on to `deadline` (never back). Refused for anyone else's claim, so
        a daemon that lost its claim to recovery cannot take it back."""
        self._require("LeaseRenewed", JobState.ATTEMPTED)
        if daemon != self.claimed_by:
            raise self._refuse("LeaseRenewed", f"the claim is {self.claimed_by or 'unnamed'}'s")
        if deadline <= at or (self.due_at is not None and deadline <= self.due_at):
            raise self._refuse("LeaseRenewed", "a renewed deadline must be later")
        self.trigger_event(
            self.LeaseRenewed, timestamp=at, attempt=self.attempts, deadline=deadline, daemon=daemon
        )

    def record_drafts_deleted(self, *, draft_ids: Sequence[str], why: str, at: datetime) -> None:
        """Unsent drafts of the job deleted at the provider (`why`: DRAFTS_TIDY once the
        job is settled, DRAFTS_FENCE before a lapsed claim's copies are counted,
        DRAFTS_CLAIM_LOST for the draft a claim that lost its race had made). Never while
        a call is in flight: its draft is the claim's to send."""
        if why not in DRAFT_DELETIONS:
            raise ValueError(f"unknown reason for deleting drafts: {why!r}")
        if why == DRAFTS_TIDY:
            self._require("DraftsDeleted", *FINAL_STATES)
            if self.tidy_at is None:
                raise self._refuse("DraftsDeleted", "no tidy is due")
            if at < self.tidy_at:
                due = self.tidy_at.isoformat()
                raise self._refuse("DraftsDeleted", f"tidy not due before {due}")
        else:
            states = [state for state in JobState if state is not JobState.ATTEMPTED]
            self._require("DraftsDeleted", *states)
        if why != DRAFTS_TIDY and not draft_ids:
            raise self._refuse("DraftsDeleted", "nothing was deleted")
        self.trigger_event(self.DraftsDeleted, timestamp=at, draft_ids=list(draft_ids), why=why)

    def record_draft(self, *, draft_id: str, provider_message_id: str, at: datetime) -> None:
        """The job's message stored as a draft at the provider, before the claim."""
        self._require("DraftCreated", JobState.REQUESTED)
        if not draft_id or not provider_message_id:
            raise self._refuse("DraftCreated", "a draft needs its id and its message id")
        self.trigger_event(
            self.DraftCreated,
            timestamp=at,
            draft_id=draft_id,
            provider_message_id=provider_message_id,
        )

    def record_draft_sent(
        self,
        *,
        provider_message_id: str,
        decision: decide.Confirm,
        at: datetime,
        tidy_at: datetime | None = None,
    ) -> None:
        """The job's draft is consumed and its message is SENT: one copy, whatever became of
        the attempt's answer and whether the provider kept our Message-ID."""
        self._require("Confirmed", JobState.REQUESTED, JobState.ATTEMPTED, JobState.UNKNOWN)
        self._require_decision("Confirmed", decision, decide.Confirm)
        asked = self.asked_draft
        if asked is None:
            raise self._refuse("Confirmed", "no draft is recorded")
        if provider_message_id != asked[1]:
            raise self._refuse("Confirmed", "the sent copy is not the draft's message")
        self._confirm(ConfirmedVia.DRAFT, [provider_message_id], decision, at, tidy_at)

    def record_draft_pending(self, *, decision: decide.AfterDraftPending, at: datetime) -> None:
        """The job's draft still exists after an attempt (its outcome unknown, or a crash):
        that attempt sent nothing, so sending the same draft again is no resend of a message
        (the provider makes at most one message of a draft)."""
        self._require("DraftPending", JobState.ATTEMPTED, JobState.UNKNOWN)
        self._require_decision("DraftPending", decision, decide.RetryAt, decide.Review)
        asked = self.asked_draft
        if asked is None:
            raise self._refuse("DraftPending", "no draft is recorded")
        retry_at = decision.at if isinstance(decision, decide.RetryAt) else None
        if retry_at is not None and retry_at < at:
            raise self._refuse("DraftPending", "a retry cannot be due before the check")
        self.trigger_event(
            self.DraftPending,
            timestamp=at,
            draft_id=asked[0],
            retry_at=retry_at,
            **decision.policy.event_fields(),
        )
        if isinstance(decision, decide.Review):
            self._escalate(decision, f"draft {asked[0]} still unsent", at)

    def record_draft_gone(self, *, decision: decide.AfterUnknown, at: datetime) -> None:
        """The job's draft is gone and its message is not SENT: the Message-ID search at
        the decision's time, or review."""
        self._require("DraftGone", JobState.UNKNOWN)
        self._require_decision("DraftGone", decision, decide.SearchAt, decide.Review)
        asked = self.asked_draft
        if asked is None:
            raise self._refuse("DraftGone", "no draft is recorded")
        draft_id = asked[0]
        search_at = decision.at if isinstance(decision, decide.SearchAt) else None
        self.trigger_event(
            self.DraftGone,
            timestamp=at,
            draft_id=draft_id,
            search_due_at=search_at,
            **decision.policy.event_fields(),
        )
        if isinstance(decision, decide.Review):
            self._escalate(decision, f"draft {draft_id} gone and no sent copy has its id", at)

    def record_draft_found_gone(self, *, policy: PolicyRef, at: datetime) -> None:
        """The job's recorded draft found gone with its message not SENT outside an
        attempt's check: before its claim (`DraftVanished`, then review) or by a person's
        resend (its fence). Perhaps sent from the mailbox a moment ago, under a message
        id of its own, its copy not yet in the search's index: the draft is forgotten and
        the moment kept (`draft_gone_at`), and a resend waits `search_after` from it
        (docs/architecture.md "The life of one job on a drafts provider")."""
        self._require("DraftGone", JobState.REQUESTED, JobState.REVIEW)
        # The recorded draft, or one a resend's fence recorded before deleting it.
        asked = self.asked_draft
        if asked is None:
            raise self._refuse("DraftGone", "no draft is recorded")
        self.trigger_event(
            self.DraftGone,
            timestamp=at,
            draft_id=asked[0],
            search_due_at=None,
            **policy.event_fields(),
        )

    def record_response(
        self,
        *,
        provider_message_id: str,
        decision: decide.Confirm,
        at: datetime,
        tidy_at: datetime | None = None,
    ) -> None:
        """The provider answered 2xx with its id for the message: one copy exists.
        `tidy_at` (on every command that settles a job): when its unsent drafts are to be
        deleted, for a provider that may leave some (`decisions.tidy_at`)."""
        self._require("Confirmed", JobState.ATTEMPTED)
        self._require_decision("Confirmed", decision, decide.Confirm)
        if not provider_message_id:
            raise self._refuse("Confirmed", "a response without the provider's id proves nothing")
        self._confirm(ConfirmedVia.RESPONSE, [provider_message_id], decision, at, tidy_at)

    def record_unknown(self, *, reason: str, decision: decide.AfterUnknown, at: datetime) -> None:
        """The call's outcome cannot be known (timeout, reset, 5xx, crash): Unknown, then a
        search when the index has caught up, or review."""
        self._require("Unknown", JobState.ATTEMPTED)
        self._require_decision("Unknown", decision, decide.SearchAt, decide.Review)
        search_at = decision.at if isinstance(decision, decide.SearchAt) else None
        history_at = decision.history_at if isinstance(decision, decide.SearchAt) else None
        if search_at is not None and search_at < at:
            raise self._refuse("Unknown", "a search cannot be due before the outcome")
        if history_at is not None and self.history_id is None:
            raise self._refuse("Unknown", "no historyId was recorded with the claim")
        if history_at is not None and history_at < at:
            raise self._refuse("Unknown", "a history read cannot be due before the outcome")
        self.trigger_event(
            self.Unknown,
            timestamp=at,
            attempt=self.attempts,
            reason=recorded(reason),
            search_due_at=search_at,
            **decision.policy.event_fields(),
            history_due_at=history_at,
        )
        if isinstance(decision, decide.Review):
            self._escalate(decision, reason, at)

    def record_rejection(
        self,
        *,
        transient: bool,
        reason: str,
        status: int | None,
        decision: decide.AfterRejection,
        at: datetime,
        unavailable: bool = False,
    ) -> None:
        """The provider definitely did not accept the message: nothing was sent.
        `unavailable` (transient only): because the provider was unavailable; the call
        then does not count against `max_attempts`."""
        self._require("Rejected", JobState.ATTEMPTED)
        self._require_decision("Rejected", decision, decide.RetryAt, decide.Review)
        retry_at = decision.at if isinstance(decision, decide.RetryAt) else None
        if retry_at is not None and not transient:
            raise self._refuse("Rejected", "a permanent rejection is never retried")
        if unavailable and not transient:
            raise self._refuse("Rejected", "an unavailable provider is a transient refusal")
        if retry_at is not None and retry_at < at:
            raise self._refuse("Rejected", "a retry cannot be due before the rejection")
        self.trigger_event(
            self.Rejected,
            timestamp=at,
            attempt=self.attempts,
            transient=transient,
            reason=recorded(reason),
            status=status,
            retry_at=retry_at,
            **decision.policy.event_fields(),
            unavailable=unavailable,
        )
        if isinstance(decision, decide.Review):
            self._escalate(decision, reason, at)

    def record_search(
        self,
        *,
        query: str,
        copies: Sequence[str],
        decision: decide.AfterSearch | decide.AfterVerification,
        at: datetime,
        tidy_at: datetime | None = None,
        count: int | None = None,
        complete: bool = True,
    ) -> None:
        """What one search of the sender's mailbox found, by provider message id: at
        most COPIES_KEPT `copies`, and `count` in all (None: `len(copies)`), `complete`
        False when the search stopped reading with more left (`_found`).

        This is the one place where a search result becomes events: while the outcome is
        unknown (SearchedMiss, Confirmed, Duplicate, Requeued, Escalated), or when a resent
        job's copies are counted again after it was confirmed (Verified, Duplicate).
        """
        action = type(decision).__name__
        self._require_decision(action, decision, *_SEARCH_DECISIONS)
        found = _found(copies, count, complete)
        if self.state is JobState.CONFIRMED and self.verifying:
            self._require_verification_due(at, action, "search not due")
            self._record_count(found, decision, at)
            return
        self._require(action, JobState.UNKNOWN)
        # A search before its due time would read a lagging index and could be mistaken
        # for proof that nothing was sent (not `due_at`: a history read may be due sooner).
        if self.search_due_at is not None and at < self.search_due_at:
            raise self._refuse(action, f"search not due before {self.search_due_at.isoformat()}")
        self._require_copies(action, decision, found.count)
        if isinstance(decision, decide.Confirm):
            self._confirm(ConfirmedVia.SEARCH, list(copies), decision, at, tidy_at)
        elif isinstance(decision, decide.Duplicate):
            self._record_duplicate(found, decision, "", at)
        elif isinstance(decision, decide.SearchAgainAt):
            self._record_miss(query, decision.at, decision.policy, at)
        elif isinstance(decision, decide.ResendAt):
            self._resend(query, decision, at)
        elif isinstance(decision, decide.Review) and _only_in_trash(decision):
            # Neither a miss (it would count toward a resend) nor a confirmation.
            self._escalate(decision, _only_in_trash_detail(found), at)
        elif isinstance(decision, decide.Review):
            self._record_miss(query, None, decision.policy, at)
            self._escalate(decision, f"no copy found in {self.misses} searches", at)
        else:
            raise self._refuse(action, "the outcome is unknown, nothing to verify")

    def record_history(
        self,
        *,
        query: str,
        copies: Sequence[str],
        decision: decide.AfterHistory,
        at: datetime,
        tidy_at: datetime | None = None,
        count: int | None = None,
        complete: bool = True,
    ) -> None:
        """What a read of the mailbox's history since the claim found, by provider message
        id: the SENT copies of ours added since the claim's historyId. One confirms
        (Confirmed via history), two or more are a duplicate; none is HistoryMissed, which
        decides nothing about a resend (the search does, or a believed miss makes it due).
        Refused before the read is due or without a recorded historyId. `count` and
        `complete` as `record_search` has them."""
        action = type(decision).__name__
        self._require_decision(action, decision, *_HISTORY_DECISIONS)
        self._require(action, JobState.UNKNOWN)
        if self.history_id is None or self.history_due_at is None:
            raise self._refuse(action, "no history read is due")
        if at < self.history_due_at:
            raise self._refuse(
                action, f"history read not due before {self.history_due_at.isoformat()}"
            )
        found = _found(copies, count, complete)
        self._require_copies(action, decision, found.count)
        if isinstance(decision, decide.Confirm):
            self._confirm(ConfirmedVia.HISTORY, list(copies), decision, at, tidy_at)
        elif isinstance(decision, decide.Duplicate):
            self._record_duplicate(found, decision, " in the history", at)
        else:
            assert isinstance(decision, decide.HistoryMiss)
            for moment in (decision.next_at, decision.search_at):
                if moment is not None and moment < at:
                    raise self._refuse(action, "nothing can be due before this read")
            search_due = self.search_due_at
            if decision.search_at is not None:
                # Believed: the search's index wait is over (never later than it was).
                search_due = _earliest(decision.search_at, search_due)
            self.trigger_event(
                self.HistoryMissed,
                timestamp=at,
                query=query,
                next_history_at=decision.next_at,
                search_due_at=search_due,
                believed=decision.search_at is not None,
                **decision.policy.event_fields(),
            )

    def record_history_unusable(self, *, reason: str, at: datetime) -> None:
        """The mailbox's history cannot answer for the claim (its historyId expired, or the
        provider reads none now): the job's history read is dropped and the search decides,
        when it was due."""
        self._require("HistoryUnusable", JobState.UNKNOWN)
        if self.history_id is None:
            raise self._refuse("HistoryUnusable", "no historyId is recorded")
        self.trigger_event(
            self.HistoryUnusable,
            timestamp=at,
            history_id=self.history_id,
            reason=recorded(reason),
        )

    def stop_verifying(self, decision: decide.StopVerifying, *, at: datetime) -> None:
        """Give up counting a confirmed job's copies without a search (no policy or no
        provider to search with): the job stays confirmed; a human can check it."""
        self._require("Verified", JobState.CONFIRMED)
        self._require_decision("Verified", decision, decide.StopVerifying)
        if not self.verifying:
            raise self._refuse("Verified", "no verification is pending")
        self._require_verification_due(at, "Verified", "verification not due")
        self._verified(0, None, decision.policy, at)

    def escalate(self, decision: decide.Review, *, detail: str, at: datetime) -> None:
        """Straight to review before a call or a search (max attempts, no policy, a
        message that cannot be built, a provider that replaces Message-IDs)."""
        self._require("Escalated", JobState.REQUESTED, JobState.UNKNOWN)
        self._require_decision("Escalated", decision, decide.Review)
        self._escalate(decision, detail, at)

    def resolve(
        self,
        resolution: Resolution,
        *,
        note: str,
        by: str,
        at: datetime,
        found: Sequence[str] | None = None,
        tidy_at: datetime | None = None,
    ) -> None:
        """A human's decision on a job in review. A `by` or `note` that `ledger.keys`
        refuses is JobInputError (docs/cli.md "Keys"), before anything else. `found`: the
        copies a search made just before it found (docs/review.md "Review": a resend is searched
        for first); a copy found refuses a resend, and a job resolved as sent keeps the
        copies found."""
        check_name(by)
        if problem := note_problem(note):
            raise JobInputError("note", problem)
        resolution = Resolution(resolution)
        self._require("Resolved", JobState.REVIEW)
        if resolution is Resolution.RESEND and self.duplicate:
            raise self._refuse(
                "Resolved", "two copies already exist; resolve as 'sent' or 'abandon'"
            )
        if resolution is Resolution.RESEND and self.reason == EscalationReason.BOUNCED:
            raise self._refuse("Resolved", "it was sent and bounced: resolve as sent or abandon")
        if resolution is Resolution.RESEND and found:
            raise self._refuse("Resolved", f"{copies_found(len(found))}: resolve as sent")
        abandoned = resolution is Resolution.ABANDON
        self.trigger_event(
            self.Resolved,
            timestamp=at,
            decision=resolution,
            note=note,
            by=by,
            tidy_at=tidy_at if abandoned else None,
        )
        if resolution is Resolution.SENT:
            self._confirm(
                ConfirmedVia.OPERATOR,
                list(found) if found else list(self.provider_message_ids),
                decide.Confirm(PolicyRef.operator(by)),
                at,
                tidy_at,
            )

    def record_bounce(
        self,
        report: DeliveryReport,
        *,
        provider_message_id: str,
        decision: decide.AfterBounce,
        at: datetime,
        received_at: datetime | None = None,
        skew: float = 0.0,
        date: datetime | None = None,
    ) -> None:
        """A delivery report about this job found in its mailbox (docs/how-it-works.md
        "Bounces"): Bounced, with the report's recipients that are the job's own, and
        Escalated when the policy sends a permanent bounce to review. Refused
        (BounceRefused) for a job not watched now, a report recorded already, a report
        about none of its recipients or about another message, and one the mailbox
        received (`received_at`, the provider's clock; None: not known) more than `skew`
        seconds before the earliest attempt that may have sent it (`unrefused_claims`):
        no report of a message is older than it, and its Message-ID, derived from the
        key, can be guessed. `date`: the Date its
        message was sent with (`message.message_date`), when the provider sends ours
        unchanged (None: not known): a report whose original quotes no Date or another
        moment is about a message someone else put the guessed Message-ID on."""
        self._require_decision("Bounced", decision, decide.RecordBounce, decide.Review)
        if self.purged or self.state is not JobState.CONFIRMED or self.watch_until is None:
            raise BounceRefused(self, ReportRefusal.NOT_WATCHED, "its bounces are not watched")
        if report.original_message_id != self.message_id:
            raise BounceRefused(self, ReportRefusal.UNKNOWN_JOB, "the report names another message")
        if date is not None and report.original_moment != date.replace(microsecond=0):
            quoted = printable(report.original_date[:80]) or "no Date"
            ours = date.replace(microsecond=0).isoformat()
            raise BounceRefused(
                self, ReportRefusal.OTHER_DATE, f"its original has {quoted}, the job's is {ours}"
            )
        # The earliest claim that may have sent it (a human who resolved a job sent whose
        # every attempt was refused: the first claim).
        first_attempt = min(self.unrefused_claims.values(), default=self.first_attempt_at)
        if (
            received_at is not None
            and first_attempt is not None
            and received_at < first_attempt - timedelta(seconds=skew)
        ):
            raise BounceRefused(
                self,
                ReportRefusal.BEFORE_SEND,
                f"received {received_at.isoformat()}, before its first attempt"
                f" {first_attempt.isoformat()} (margin {skew:g}s)",
            )
        dsn_id = report.report_id or f"mailbox:{provider_message_id}"
        if dsn_id in self.bounce_ids:
            raise BounceRefused(
                self, ReportRefusal.RECORDED_ALREADY, f"{dsn_id} is recorded already"
            )
        if not _own_recipients(self, report):
            raise BounceRefused(
                self, ReportRefusal.NOT_A_RECIPIENT, "no recipient of the report is"
            )
        recipients = bounce_recipients(self, report)
        if not recipients:
            raise BounceRefused(
                self,
                ReportRefusal.REPEATED,
                "each of its recipients has a bounce of that kind recorded already",
            )
        permanent = any(r.permanent for r in recipients)
        if isinstance(decision, decide.Review) and not permanent:
            raise self._refuse("Bounced", "only a permanent bounce goes to review")
        self.trigger_event(
            self.Bounced,
            timestamp=at,
            dsn_id=dsn_id,
            provider_message_id=provider_message_id,
            reporter=report.reporter,
            recipients=[r.as_dict() for r in recipients],
            permanent=permanent,
            **decision.policy.event_fields(),
        )
        if isinstance(decision, decide.Review):
            first = recipients[0]
            self._escalate(decision, f"bounced: {first.status} {first.address}", at)

    def end_bounce_watch(self, *, at: datetime, reason: str = "") -> None:
        """The bounce watch is over: nothing of the job is due for it any more. `reason`:
        "unread" when its mailbox was not read through after its end (`BounceWatchEnded`)."""
        self._require("BounceWatchEnded", JobState.CONFIRMED)
        if self.watch_until is None:
            raise self._refuse("BounceWatchEnded", "no bounce watch")
        if at < self.watch_until:
            until = self.watch_until.isoformat()
            raise self._refuse("BounceWatchEnded", f"watched until {until}")
        self.trigger_event(
            self.BounceWatchEnded, timestamp=at, bounces=len(self.bounce_ids), reason=reason
        )

    def record_check(
        self,
        *,
        by: str,
        purpose: str,
        query: str,
        copies: Sequence[str],
        at: datetime,
        count: int | None = None,
        complete: bool = True,
    ) -> None:
        """What a search a human asked for found (`count` and `complete` as
        `record_search` has them). Refused while a provider call is in
        flight (attempted): the daemon's outcome is about to be written and must not meet
        another writer; refused on a purged job. A `by` that `ledger.keys` refuses is
        JobInputError."""
        check_name(by)
        # A purged job's trail ends with Purged (docs/configuration.md "Retention"): a
        # check still answers (`Services.check`), but records nothing after it.
        if self.purged:
            raise self._refuse("Checked", f"its content was purged {self.purged_at:%Y-%m-%d}")
        if self.state is JobState.ATTEMPTED:
            raise self._refuse("Checked", "a send is in flight")
        found = _found(copies, count, complete)
        self.trigger_event(
            self.Checked,
            timestamp=at,
            by=by,
            purpose=purpose,
            query=query,
            provider_message_ids=list(found.ids),
            count=found.count,
            complete=found.complete,
        )

    def cancel(self, *, by: str, note: str, at: datetime, tidy_at: datetime | None = None) -> None:
        """Withdraw a job no provider was ever called for (requested, never attempted,
        with or without `send_at`). A `by` or `note` that `ledger.keys` refuses is
        JobInputError."""
        check_name(by)
        if problem := note_problem(note):
            raise JobInputError("note", problem)
        self._require("Cancelled", JobState.REQUESTED)
        if self.attempts:
            raise self._refuse("Cancelled", f"{self.attempts} attempts were made")
        self.trigger_event(self.Cancelled, timestamp=at, by=by, note=note, tidy_at=tidy_at)

    def purge(self, *, by: str, rule: str, at: datetime) -> None:
        """Retention: forget the content of a job that is settled for good (confirmed or
        abandoned, nothing left to verify). The store rewrites its earlier events in the
        same transaction (``Ledger.purge``). A `by` that `ledger.keys` refuses is
        JobInputError."""
        check_name(by)
        self._require("Purged", *FINAL_STATES)
        if self.due_at is not None:
            what = "a verification" if self.verifying else "the deletion of its drafts"
            if self.state is JobState.CONFIRMED and self.watch_until is not None:
                what = what if self.due_at < self.watch_until else "its bounce watch"
            raise self._refuse("Purged", f"{what} is still due")
        self.trigger_event(self.Purged, timestamp=at, by=by, rule=rule)

    @property
    def purged(self) -> bool:
        return self.purged_at is not None

    @property
    def purgeable(self) -> bool:
        """Settled for good (confirmed, abandoned or cancelled), nothing due, not purged yet."""
        return not self.purged and self.state in FINAL_STATES and self.due_at is None

    # -- the events each decision implies -------------------------------------------

    def _confirm(
        self,
        via: ConfirmedVia,
        provider_message_ids: list[str],
        decision: decide.Confirm,
        at: datetime,
        tidy_at: datetime | None = None,
    ) -> None:
        if via is not ConfirmedVia.OPERATOR and len(provider_message_ids) != 1:
            raise self._refuse("Confirmed", "exactly one copy is required")
        if decision.verify_at is not None and decision.verify_at < at:
            raise self._refuse("Confirmed", "a verification cannot be due before the confirmation")
        self.trigger_event(
            self.Confirmed,
            timestamp=at,
            via=via,
            provider_message_ids=provider_message_ids,
            verify_at=decision.verify_at,
            **decision.policy.event_fields(),
            tidy_at=tidy_at,
        )
        if decision.watch_until is not None:
            if decision.watch_until <= at:
                raise self._refuse("WatchingBounces", "a watch must end after it starts")
            self.trigger_event(
                self.WatchingBounces,
                timestamp=at,
                until=decision.watch_until,
                **decision.policy.event_fields(),
            )

    def _record_miss(
        self, query: str, next_search_at: datetime | None, policy: PolicyRef, at: datetime
    ) -> None:
        if next_search_at is not None and next_search_at < at:
            raise self._refuse("SearchedMiss", "the next search cannot be due before this one")
        self.trigger_event(
            self.SearchedMiss,
            timestamp=at,
            search=self.searches + 1,
            query=query,
            next_search_at=next_search_at,
            **policy.event_fields(),
        )

    def _resend(self, query: str, decision: decide.ResendAt, at: datetime) -> None:
        if self.duplicate:
            raise self._refuse("Requeued", "a duplicate is never resent automatically")
        misses = self.misses + 1  # counting this search
        if decision.misses_required < 1:
            raise self._refuse("Requeued", "at least one empty search is required")
        if misses < decision.misses_required:
            required = decision.misses_required
            raise self._refuse("Requeued", f"{misses} empty searches, {required} required")
        self._record_miss(query, None, decision.policy, at)
        self.trigger_event(
            self.Requeued,
            timestamp=at,
            # What was observed, not what it is taken to mean: the policy believes the miss.
            reason=f"no copy found in {misses} searches: sending again (same Message-ID)",
            due_at=max(decision.at, at),
            misses_required=decision.misses_required,
            **decision.policy.event_fields(),
        )

    def _record_count(
        self,
        found: _Found,
        decision: decide.AfterSearch | decide.AfterVerification,
        at: datetime,
    ) -> None:
        """A resent job's copies counted again after its confirmation."""
        action = type(decision).__name__
        self._require_copies(action, decision, found.count)
        if isinstance(decision, decide.Duplicate):
            self._record_duplicate(found, decision, " after a resend", at)
        elif isinstance(decision, decide.Confirm):
            self._verified(1, None, decision.policy, at)
        elif isinstance(decision, decide.SearchAgainAt):
            self._verified(0, decision.at, decision.policy, at)
        elif isinstance(decision, decide.StopVerifying):
            self._verified(0, None, decision.policy, at)
        else:
            raise self._refuse(action, "a confirmed job is only verified")

    def _verified(
        self, hits: int, next_verify_at: datetime | None, policy: PolicyRef, at: datetime
    ) -> None:
        if next_verify_at is not None and next_verify_at < at:
            raise self._refuse("Verified", "the next verification cannot be due before this one")
        self.trigger_event(
            self.Verified,
            timestamp=at,
            search=self.verifications + 1,
            hits=hits,
            next_verify_at=next_verify_at,
            **policy.event_fields(),
        )

    def _record_duplicate(
        self, found: _Found, decision: decide.Duplicate, when: str, at: datetime
    ) -> None:
        self.trigger_event(
            self.Duplicate,
            timestamp=at,
            hits=found.count,
            provider_message_ids=list(found.ids),
            complete=found.complete,
            **decision.policy.event_fields(),
        )
        counted = copies_found(found.count, found.complete).removesuffix(" found")
        detail = f"{counted}{when}: {_listed(found)}"
        self._escalate(decide.Review(decision.policy, EscalationReason.DUPLICATE), detail, at)

    def _escalate(self, decision: decide.Review, detail: str, at: datetime) -> None:
        self.trigger_event(
            self.Escalated,
            timestamp=at,
            reason=EscalationReason(decision.reason),
            detail=recorded(detail),
            **decision.policy.event_fields(),
        )

    # -- checks ---------------------------------------------------------------------

    def _refuse(self, action: str, why: str = "") -> TransitionError:
        return TransitionError(self.key, self.state.value, action, why)

    def _require(self, action: str, *states: JobState) -> None:
        # A purged job has no content left to send, resend or decide on.
        if self.purged:
            raise self._refuse(action, f"its content was purged {self.purged_at:%Y-%m-%d}")
        if self.state not in states:
            raise self._refuse(action)

    def _require_due(self, at: datetime, action: str, what: str) -> None:
        if self.due_at is not None and at < self.due_at:
            raise self._refuse(action, f"{what} before {self.due_at.isoformat()}")

    def _require_verification_due(self, at: datetime, action: str, what: str) -> None:
        # Not `due_at`: a tidy of the job's drafts may be due sooner than its count.
        if self.verify_at is not None and at < self.verify_at:
            raise self._refuse(action, f"{what} before {self.verify_at.isoformat()}")

    def _require_decision(self, action: str, decision: object, *allowed: type) -> None:
        """Refused before anything is recorded: a decision of another kind
        (TransitionError), a review for a reason that does not exist (ValueError), a
        review for a bounce from anything but a delivery report, or one for a duplicate
        (recorded only with the copies a search found: `_record_duplicate`) (TransitionError)."""
        if not isinstance(decision, allowed):
            raise self._refuse(action, f"{type(decision).__name__} does not decide this")
        if isinstance(decision, decide.Review):
            try:
                reason = EscalationReason(decision.reason)
            except ValueError:
                raise ValueError(f"unknown escalation reason: {decision.reason!r}") from None
            # A job in review as bounced was confirmed and then bounced: a resend is refused
            # (`resolve`), triage leaves it, the review page counts its one copy. Recorded
            # by any other command, it would hold a job never sent that no one could resend.
            if reason is EscalationReason.BOUNCED and action != "Bounced":
                why = "only a delivery report sends a job to review as bounced"
                raise self._refuse(action, why)
            # As a duplicate, the review page and guidance count the copies a search found
            # (`_record_duplicate` records them first); without them it would hold nothing.
            if reason is EscalationReason.DUPLICATE:
                why = "only a search finding two or more copies makes a job a duplicate"
                raise self._refuse(action, why)

    def _require_copies(self, action: str, decision: object, copies: int) -> None:
        if isinstance(decision, decide.Confirm):
            fits, expected = copies == 1, "exactly one"
        elif isinstance(decision, decide.Duplicate):
            fits, expected = copies >= 2, "two or more"
        elif isinstance(decision, decide.Review) and _only_in_trash(decision):
            fits, expected = copies >= 1, "one or more, in the trash"
        else:
            fits, expected = copies == 0, "none"
        if not fits:
            raise self._refuse(action, f"{copies} copies found, {expected} expected")

    # -- derived --------------------------------------------------------------------

    @property
    def asked_draft(self) -> tuple[str, str] | None:
        """The draft (id, message id) whose answer settles an attempt: the recorded one,
        else the one a sweep's fence recorded as deleted, not yet answered."""
        if self.draft_id is not None and self.draft_message_id is not None:
            return (self.draft_id, self.draft_message_id)
        return self.fenced_draft

    @property
    def settled(self) -> bool:
        return self.state in SETTLED_STATES

    @property
    def due_besides_watch(self) -> datetime | None:
        """When anything of a settled job other than its bounce watch's end is due: its
        verification or the tidy of its drafts, the earlier (None: neither)."""
        return _earliest(self.verify_at if self.verifying else None, self.tidy_at)


#: Events recorded beside a job's state, changing nothing a search or a draft check of
#: it is evidence of: a person's check, drafts deleted. An answer another writer overtook
#: with these alone still holds on the version they left (`Services._moves`,
#: `daemon/engine/work.py: Work.beside_facts`).
FACTS = (SendJob.Checked, SendJob.DraftsDeleted)


def _only_in_trash(decision: decide.Review) -> bool:
    return decision.reason == EscalationReason.ONLY_IN_TRASH


def _only_in_trash_detail(found: _Found) -> str:
    """The review's detail of copies found only in the trash, with their ids."""
    return f"{found_only_in_trash(found.count, found.complete)}: {_listed(found)}"


def _listed(found: _Found) -> str:
    """The kept copies' ids, and how many more were counted."""
    rest = found.count - len(found.ids)
    return ", ".join(found.ids) + (f" and {rest} more" if rest else "")


@dataclass(frozen=True)
class _Found:
    """A search's copies as the events keep them: the first COPIES_KEPT ids, the count of
    all, and whether the search read them all."""

    ids: tuple[str, ...]
    count: int
    complete: bool


def _found(copies: Sequence[str], count: int | None, complete: bool) -> _Found:
    """Refused (ValueError) before anything is recorded: more than COPIES_KEPT ids (the
    search result cuts them: an event would hold every copy a mailbox lists), or a count
    below the ids given."""
    if len(copies) > COPIES_KEPT:
        raise ValueError(f"{len(copies)} copies given, at most {COPIES_KEPT} are kept")
    total = len(copies) if count is None else count
    if total < len(copies):
        raise ValueError(f"a count of {total} for {len(copies)} copies")
    return _Found(tuple(copies), total, complete)


def _earliest(*moments: datetime | None) -> datetime | None:
    """The soonest of the moments given, None when none is."""
    return min((m for m in moments if m is not None), default=None)


def _settled_due(job: Any) -> datetime | None:
    """When a settled job is next due: its verification, the tidy of its drafts, or (a
    confirmed job) the end of its bounce watch, whichever is first."""
    watch = job.watch_until if job.state is JobState.CONFIRMED else None
    return _earliest(job.verify_at, job.tidy_at, watch)


def _own_recipients(job: SendJob, report: DeliveryReport) -> list[BouncedRecipient]:
    """The recipients of a report that are the job's own (To, Cc, Bcc)."""
    ours = job.content.recipient_addresses()
    return [r for r in report.recipients if r.address.lower() in ours]


def bounce_recipients(job: SendJob, report: DeliveryReport) -> list[BouncedRecipient]:
    """What a report would record on the job: its recipients that are the job's own,
    each (address, permanent) once and only if no Bounced recorded it before
    (`bounced_pairs`). So a job holds at most two Bounced per recipient (delayed, failed)
    however many reports name it: a forged report is mail anyone can send, and a flood
    of them must not grow the job's history (docs/how-it-works.md "Bounces: what a
    report proves")."""
    kept: list[BouncedRecipient] = []
    seen = set(job.bounced_pairs)
    for recipient in _own_recipients(job, report):
        pair = (recipient.address.lower(), recipient.permanent)
        if pair not in seen:
            seen.add(pair)
            kept.append(recipient)
    return kept


def bounced_pairs(recipients: Iterable[Mapping[str, Any]]) -> frozenset[tuple[str, bool]]:
    """(address lower-cased, permanent) of each recipient a Bounced event recorded."""
    return frozenset(
        (str(r.get("address", "")).lower(), r.get("action") == "failed") for r in recipients
    )


class BounceRefused(TransitionError):
    """A delivery report that is not recorded on the job, and why (`refusal`)."""

    def __init__(self, job: SendJob, refusal: ReportRefusal, why: str) -> None:
        super().__init__(job.key, job.state.value, "Bounced", why)
        self.refusal = refusal


def check_name(by: str) -> None:
    """Who decided, as a person reads it in a history (docs/cli.md "Keys")."""
    if problem := identifier_problem(by):
        raise JobInputError("by", problem)
    if len(by) > MAX_NAME_LENGTH:
        raise JobInputError("by", f"longer than {MAX_NAME_LENGTH} characters")


__all__ = [
    "FACTS",
    "BounceRefused",
    "JobState",
    "SendJob",
    "TransitionError",
    "bounce_recipients",
    "bounced_pairs",
    "created_at",
    "job_id_for",
    "waits_for_provider",
]
