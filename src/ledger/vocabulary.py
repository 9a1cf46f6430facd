"""The words every layer shares: job states, escalation reasons, resolutions, and the
reference to the policy that made a decision.

They are StrEnums so that the stored events, the index and the command line keep the
plain strings they always had ("review", "max-attempts", ...), while the code names them
once, here.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class JobState(StrEnum):
    REQUESTED = "requested"
    ATTEMPTED = "attempted"
    UNKNOWN = "unknown"
    CONFIRMED = "confirmed"
    REVIEW = "review"
    ABANDONED = "abandoned"
    CANCELLED = "cancelled"  # withdrawn before any attempt: never sent


#: States in which the daemon has nothing more to do on its own.
SETTLED_STATES = frozenset(
    {JobState.CONFIRMED, JobState.REVIEW, JobState.ABANDONED, JobState.CANCELLED}
)
#: States that end a job's life (review waits for a human).
FINAL_STATES = frozenset({JobState.CONFIRMED, JobState.ABANDONED, JobState.CANCELLED})

#: States a tick or an operator still has to act on.
OPEN_STATES = tuple(state for state in JobState if state not in FINAL_STATES)


class EscalationReason(StrEnum):
    """Why a job waits in review for a human."""

    UNKNOWN_OUTCOME = "unknown-outcome"
    DUPLICATE = "duplicate"
    MAX_ATTEMPTS = "max-attempts"
    REJECTED = "rejected"
    HANDLE_UNRELIABLE = "handle-unreliable"
    NO_POLICY = "no-policy"
    #: The rendered bytes do not say what the job says (`ledger/wire_check.py`): never sent.
    RENDER_MISMATCH = "render-mismatch"
    #: The provider stayed unavailable (nothing sent) longer than the channel's
    #: `give_up_after`.
    PROVIDER_UNAVAILABLE = "provider-unavailable"
    #: A delivery report says the confirmed message failed for good for a recipient, and
    #: the channel's `on_bounce = "review"` asks a human to look.
    BOUNCED = "bounced"
    #: The job's From is neither its channel's `from` nor allowed by its `allowed_from`
    #: any more (the policy was narrowed after the job was accepted): never sent.
    SENDER_NOT_ALLOWED = "sender-not-allowed"
    #: A draft made earlier for the job (`send_via = "drafts"`) was edited in the mailbox:
    #: it no longer says what the job says, and is not sent.
    DRAFT_CHANGED = "draft-changed"
    #: The only copies a search found are in the sender's trash: a message sent and
    #: deleted by its sender, or one received with the job's Message-ID and deleted
    #: (anyone who knows a job key can compute it). Neither a confirmation nor a miss.
    ONLY_IN_TRASH = "only-in-trash"


class Resolution(StrEnum):
    """A human's decision on a job in review."""

    SENT = "sent"
    RESEND = "resend"
    ABANDON = "abandon"


class ConfirmedVia(StrEnum):
    RESPONSE = "response"
    SEARCH = "search"
    OPERATOR = "operator"
    # The job's draft was consumed and its message is SENT (docs/providers.md "Gmail setup").
    DRAFT = "draft"
    # A copy of ours among the SENT messages the mailbox's history lists since the claim
    # (docs/providers.md "What each handle proves").
    HISTORY = "history"


@dataclass(frozen=True)
class PolicyRef:
    """The policy that made a decision, as recorded on the decision's events."""

    name: str
    fingerprint: str

    def event_fields(self) -> dict[str, str]:
        return {"policy": self.name, "fingerprint": self.fingerprint}

    @classmethod
    def missing(cls, channel: str) -> PolicyRef:
        """No policy is loaded for the channel: the channel stands in for its name."""
        return cls(channel, "")

    @classmethod
    def operator(cls, by: str) -> PolicyRef:
        """A human's decision: recorded as the policy "operator" with who made it."""
        return cls("operator", by)


@dataclass(frozen=True)
class Sender:
    """What the channel's policy contributes to a new job."""

    from_addr: str
    message_id_domain: str
    policy: PolicyRef
