"""What a policy can decide about a job: a closed set of small frozen types.

The policy functions (``policies.decisions``) return these; the aggregate
(:class:`ledger.job.SendJob`) has one command per fact that takes the decision and records
every event it implies in one step. Each decision carries the :class:`PolicyRef` that made
it, which every decision event records.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from ledger.vocabulary import EscalationReason, PolicyRef


@dataclass(frozen=True)
class _Decided:
    policy: PolicyRef


@dataclass(frozen=True)
class _DecidedFor(_Decided):
    at: datetime


class Send(_Decided):
    """Call the provider now."""


@dataclass(frozen=True)
class SearchAt(_DecidedFor):
    """The outcome is unknown: search the sender's mailbox at ``at`` (after the index lag).
    ``history_at``: read the mailbox's history since the claim then, before the search (the
    claim recorded a historyId); None: no history read."""

    history_at: datetime | None = None


@dataclass(frozen=True)
class Confirm(_Decided):
    """Exactly one copy exists. ``verify_at``: count the copies once more then (a job that
    was sent again without proof that the earlier attempt failed may have a hidden twin).
    ``watch_until``: look for delivery reports about it until then (``watch_bounces``)."""

    verify_at: datetime | None = None
    watch_until: datetime | None = None


class Duplicate(_Decided):
    """Two or more copies exist: a human looks, and nothing is ever sent again on its own."""


class SearchAgainAt(_DecidedFor):
    """No copy found yet; one empty search is no evidence while the index may lag."""


@dataclass(frozen=True)
class ResendAt(_DecidedFor):
    """``misses_required`` empty searches are believed: send again (same Message-ID)."""

    misses_required: int


@dataclass(frozen=True)
class HistoryMiss(_Decided):
    """No copy of ours among the SENT messages the history lists since the claim. Absence
    proves nothing while the history may lag: read it again at ``next_at`` (None: not
    again). ``search_at``: the miss is believed (the policy's ``history_after`` has passed
    since the unknown outcome), so the search is due then, its index wait over; None: the
    search stays due when it was."""

    next_at: datetime | None = None
    search_at: datetime | None = None


class RetryAt(_DecidedFor):
    """The provider refused for now (nothing was sent): try again at ``at``."""


@dataclass(frozen=True)
class Review(_Decided):
    """A human decides."""

    reason: EscalationReason


class RecordBounce(_Decided):
    """A delivery report about a watched job: record it, and nothing more."""


class StopVerifying(_Decided):
    """A confirmed job's copy did not show up in the index again: the provider confirmed it,
    and a missing index entry is not a second copy. Nothing more to do."""


Decision = (
    Send
    | SearchAt
    | Confirm
    | Duplicate
    | SearchAgainAt
    | ResendAt
    | RetryAt
    | Review
    | StopVerifying
    | HistoryMiss
    | RecordBounce
)
#: What may follow a provider call whose outcome is unknown.
AfterUnknown = SearchAt | Review
#: What may follow a definite refusal.
AfterRejection = RetryAt | Review
#: What may follow a check that finds the job's draft still unsent (docs/providers.md
#: "Gmail setup").
AfterDraftPending = RetryAt | Review
#: What may follow a search of the mailbox while the outcome is unknown.
AfterSearch = Confirm | Duplicate | SearchAgainAt | ResendAt | Review
#: What may follow a read of the mailbox's history while the outcome is unknown.
AfterHistory = Confirm | Duplicate | HistoryMiss
#: What may follow a count of a confirmed (resent) job's copies.
AfterVerification = Confirm | Duplicate | SearchAgainAt | StopVerifying
#: What may follow a delivery report about a watched job (``on_bounce``).
AfterBounce = RecordBounce | Review

__all__ = [
    "AfterBounce",
    "AfterDraftPending",
    "AfterHistory",
    "AfterRejection",
    "AfterSearch",
    "AfterUnknown",
    "AfterVerification",
    "Confirm",
    "Decision",
    "Duplicate",
    "HistoryMiss",
    "RecordBounce",
    "ResendAt",
    "RetryAt",
    "Review",
    "SearchAgainAt",
    "SearchAt",
    "Send",
    "StopVerifying",
]
