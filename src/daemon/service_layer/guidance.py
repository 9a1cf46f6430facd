"""What a job in review means and what to do next, in words (docs/review.md "Review").

One sentence of meaning per reason, a recommended next action that follows what is known
of the job (the last check's copies, a duplicate's count), and what each offered decision
does. The job page and `review show` say the same, from here. "sent" needs evidence: a
check (or the searches that made a duplicate) found a copy; without it the decision is
still offered, but only with a note that says how the person knows (`sent_needs_note`).
A resend of a job whose provider replaces Message-IDs needs a note as well: its search
cannot find a copy, so only the person's word says none was sent (`resend_needs_note`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ledger.copies import only_in_trash
from ledger.job import SendJob
from ledger.vocabulary import EscalationReason, Resolution

#: One sentence per reason: what it means for the customer.
MEANING: dict[EscalationReason, str] = {
    EscalationReason.UNKNOWN_OUTCOME: (
        "The provider may or may not have sent this message (its answer was lost or "
        "ambiguous), and no search has settled it: the customer may or may not have it."
    ),
    EscalationReason.DUPLICATE: (
        "Searches (or the mailbox's history) found more than one copy of this message in "
        "the sender's mailbox: the customer received it more than once."
    ),
    EscalationReason.MAX_ATTEMPTS: (
        "The provider was called the channel's max_attempts times without a confirmed send."
    ),
    EscalationReason.REJECTED: (
        "The provider refused this message for good (or it could not be built), so that "
        "attempt sent nothing."
    ),
    EscalationReason.HANDLE_UNRELIABLE: (
        "The provider replaces the Message-ID sendledger writes, so neither a search nor "
        "the mailbox's history can find this job's copies and the daemon cannot tell "
        "whether it was sent."
    ),
    EscalationReason.NO_POLICY: (
        "The job's channel has no policy file, so the daemon does not know how to send it."
    ),
    EscalationReason.RENDER_MISMATCH: (
        "The message rendered at dispatch does not say what the job says, so it was never sent."
    ),
    EscalationReason.PROVIDER_UNAVAILABLE: (
        "The provider stayed unavailable (nothing was sent) for longer than the channel's "
        "give_up_after."
    ),
    EscalationReason.SENDER_NOT_ALLOWED: (
        "The job's From is no longer the channel's from nor allowed by its allowed_from "
        "(the policy changed after the job was accepted), so it was never sent as it."
    ),
    EscalationReason.DRAFT_CHANGED: (
        "The job's draft in the sender's mailbox was edited there (its recipients, subject "
        "or text are no longer the job's), so it was not sent."
    ),
    EscalationReason.BOUNCED: (
        "The message was sent (the provider confirmed it), but a delivery report in the "
        "sender's mailbox says a recipient's server refused it for good, unverified: a "
        "report is mail, and whoever knows the job's Message-ID and that recipient could "
        "have written it."
    ),
    EscalationReason.ONLY_IN_TRASH: (
        "The only copies a search found are in the sender's trash, none in its sent "
        "folder: a copy sent and deleted by its sender, or a message received with this "
        "Message-ID (anyone who knows the job's key can send one) and deleted, so the "
        "customer may or may not have it."
    ),
}

#: The next step for each reason when nothing more is known (no check yet).
NEXT: dict[EscalationReason, str] = {
    EscalationReason.UNKNOWN_OUTCOME: (
        "Check the mailbox first: one copy found, resolve as sent; none found once the "
        "search index has caught up, resend (it searches once more before sending)."
    ),
    EscalationReason.DUPLICATE: (
        "Resolve as sent: the customer has the message, and no action can take a copy back."
    ),
    EscalationReason.MAX_ATTEMPTS: (
        "Check the mailbox first; read the refusals in the timeline, fix their cause, then "
        "resend, or abandon."
    ),
    EscalationReason.REJECTED: (
        "Read the refusal in the timeline; when its cause is fixed, resend, or abandon and "
        "submit a corrected job under a new key."
    ),
    EscalationReason.HANDLE_UNRELIABLE: (
        "Look for the message in the sender's Sent folder by hand (To, Subject, time): "
        "found, resolve as sent saying where in the note; not found, resend or abandon."
    ),
    EscalationReason.NO_POLICY: (
        "Add the channel's policy file (sendledger policy check), reload the daemon "
        "(SIGHUP), then resend; or abandon."
    ),
    EscalationReason.RENDER_MISMATCH: ("Abandon it, and submit a corrected job under a new key."),
    EscalationReason.PROVIDER_UNAVAILABLE: (
        "When the provider answers again (/healthz), resend; or abandon."
    ),
    EscalationReason.SENDER_NOT_ALLOWED: (
        "If the job may still send as its From, add it to the channel's allowed_from, "
        "reload the daemon (SIGHUP), then resend; otherwise abandon it."
    ),
    EscalationReason.DRAFT_CHANGED: (
        "Ask who edited the draft and why; then resend (the edited draft is deleted first "
        "and a new one made from the job; refused if someone sent the edited draft), or "
        "abandon (its drafts are deleted)."
    ),
    EscalationReason.BOUNCED: (
        "Read the report in the timeline (the recipient, the server's words, the reporter), "
        "settle the address with the customer before suppressing it (a new job under a new "
        "key), then resolve as sent: the message went out, and a resend would reach the "
        "other recipients twice."
    ),
    EscalationReason.ONLY_IN_TRASH: (
        "Open the copy in the sender's trash (the check lists where each copy was found): "
        "if this mailbox sent it (it is in the sent mail's thread, its From, To and Date "
        "are the job's), resolve as sent saying so in the note; if it was received, delete "
        "it for good, then resend (a resend is refused while a copy is found)."
    ),
}


@dataclass(frozen=True)
class Choice:
    """One decision offered, what it does, and whether it must come with a note."""

    decision: Resolution
    effect: str
    needs_note: bool = False
    recommended: bool = False


@dataclass(frozen=True)
class Guidance:
    reason: str
    meaning: str
    next_action: str
    copies: int | None  # what the customer has, when a search said so
    choices: list[Choice]
    #: False when that search stopped reading with more copies left: at least `copies`.
    copies_complete: bool = True
    #: Every copy that search found was in the sender's trash: perhaps received, no proof
    #: the customer has one (docs/review.md "Check").
    in_trash: bool = False

    @property
    def sent_needs_note(self) -> bool:
        return any(c.decision is Resolution.SENT and c.needs_note for c in self.choices)

    def as_dict(self) -> dict[str, Any]:
        return {
            "reason": self.reason,
            "meaning": self.meaning,
            "next": self.next_action,
            "copies": self.copies,
            "copies_complete": self.copies_complete,
            "in_trash": self.in_trash,
            "choices": [
                {
                    "as": c.decision.value,
                    "effect": c.effect,
                    "needs_note": c.needs_note,
                    "recommended": c.recommended,
                }
                for c in self.choices
            ],
        }


#: The sentence a door says when "sent" comes without evidence and without a note.
SENT_NEEDS_NOTE = (
    "no check has found a copy of this message: to resolve it as sent, say in the note how "
    "you know the customer has it (or check the mailbox first)"
)


#: The sentence a door says for a resend of a job in review for `handle-unreliable`
#: without a note (`resend_needs_note`).
RESEND_NEEDS_NOTE = (
    "the provider replaces Message-IDs, so the resend's search cannot find a copy already "
    "sent: to resend it, say in the note how you know it was not sent (the sender's Sent "
    "folder looked through by hand: To, Subject, time)"
)


#: The same when the copies the last check found were only in the sender's trash.
SENT_NEEDS_NOTE_IN_TRASH = (
    "the copies found are only in the sender's trash, and may have been received: to "
    "resolve it as sent, say in the note how you know this mailbox sent it"
)


def copies_known(job: SendJob, last_check: dict[str, Any] | None) -> int | None:
    """The copies the last search showed: the latest check's, else a duplicate's, else
    a bounced job's confirmed one."""
    if last_check is not None:
        count = last_check.get("count")  # None: recorded before copies were bounded
        return len(last_check.get("provider_message_ids") or []) if count is None else int(count)
    if job.duplicate:
        return job.duplicate_count or len(job.provider_message_ids)
    if job.reason == EscalationReason.BOUNCED:
        return len(job.provider_message_ids)
    return None


def copies_complete(job: SendJob, last_check: dict[str, Any] | None) -> bool:
    """Whether the search `copies_known` counts read every copy (else: at least)."""
    if last_check is not None:
        return last_check.get("complete") is not False
    return job.duplicate_complete if job.duplicate else True


def _meaning(job: SendJob, reason: EscalationReason | None, copies: int | None, least: str) -> str:
    """What the page says the job's review means, with the copies known where they tell."""
    if reason is EscalationReason.DUPLICATE and copies:
        return (
            f"Searches found {least}{copies} copies of this message in the sender's mailbox: "
            f"the customer received it {least}{copies} times."
        )
    if reason is EscalationReason.UNKNOWN_OUTCOME and copies is not None:
        seen = {0: "no copy", 1: "one copy"}.get(copies, f"{least}{copies} copies")
        return (
            "The provider's answer to this send was lost or ambiguous, so the daemon could "
            f"not tell whether it went out; the last check of the mailbox found {seen}."
        )
    return MEANING[reason] if reason else f"In review: {job.reason}."


def guidance_for(
    job: SendJob,
    last_check: dict[str, Any] | None,
    decisions: list[Resolution],
    *,
    handle_marked: bool = False,
) -> Guidance | None:
    """What the page and `review show` say of a job in review (None: not in review).
    `handle_marked`: the provider its copy would be on was found replacing Message-IDs
    (whatever the job went to review for)."""
    if not decisions:
        return None
    reason = EscalationReason(job.reason) if job.reason in _REASONS else None
    # The copies the last search found were all in the trash: perhaps received, no proof
    # the customer has one, whatever the job went to review for (the trash-only reason's
    # meaning and step, no recommendation, and "sent" on a note). A later check that found
    # a copy in the sent folder is advised on as any copy found.
    if last_check is not None:
        trashed = only_in_trash(last_check.get("provider_message_ids") or [])
    else:
        trashed = reason is EscalationReason.ONLY_IN_TRASH
    if trashed:
        reason = EscalationReason.ONLY_IN_TRASH
    copies = copies_known(job, last_check)
    complete = copies_complete(job, last_check)
    least = "" if complete else "at least "
    meaning = _meaning(job, reason, copies, least)
    advised = reason if trashed or reason is not EscalationReason.ONLY_IN_TRASH else None
    next_action = _next(advised, copies)
    found = bool(copies) and not trashed
    on_a_note = resend_needs_note(job.reason, handle_marked=handle_marked)
    choices = [
        Choice(
            decision,
            _effect(decision, copies, least, trashed),
            needs_note=(decision is Resolution.SENT and not found)
            or (decision is Resolution.RESEND and on_a_note),
            recommended=decision is _recommended(advised, copies),
        )
        for decision in decisions
    ]
    if on_a_note:
        choices = [_resend_on_a_note(c) for c in choices]
    return Guidance(job.reason or "", meaning, next_action, copies, choices, complete, trashed)


_REASONS = {reason.value for reason in EscalationReason}


def resend_needs_note(reason: str | None, *, handle_marked: bool = False) -> bool:
    """Whether a person's resend of a job in review for `reason` must come with a note:
    for `handle-unreliable`, or any reason once the provider's handle is marked
    (`handle_marked`), the resend's own search, which guards against a second copy,
    cannot find one (docs/how-it-works.md "The read-back of the Message-ID")."""
    return handle_marked or reason == EscalationReason.HANDLE_UNRELIABLE


def _resend_on_a_note(choice: Choice) -> Choice:
    """The resend of such a job as the person makes it: on their word, never recommended."""
    if choice.decision is not Resolution.RESEND:
        return choice
    return Choice(choice.decision, _RESEND_ON_A_NOTE, needs_note=True)


_RESEND_ON_A_NOTE = (
    "sends the same message again, on your word that the first was not sent: the search "
    "it makes first cannot find a copy on this provider (the note says how you know, e.g. "
    "the Sent folder looked through by hand)"
)


def _next(reason: EscalationReason | None, copies: int | None) -> str:
    if reason in (EscalationReason.BOUNCED, EscalationReason.ONLY_IN_TRASH):
        # In the trash, a copy found is no proof the customer has it: the step is the same.
        return NEXT[reason]
    if copies == 1:
        return "The last check found one copy: the customer has it. Resolve as sent."
    if copies is not None and copies > 1:
        return "Resolve as sent: no action can take a copy back, and a resend would add one."
    if copies == 0 and reason in (EscalationReason.UNKNOWN_OUTCOME, EscalationReason.MAX_ATTEMPTS):
        return (
            "The last check found no copy. If it was made after the search index had caught "
            "up, resend (it searches once more first); if in doubt, check again later."
        )
    return NEXT[reason] if reason else "Check the mailbox, then resolve."


def _recommended(reason: EscalationReason | None, copies: int | None) -> Resolution | None:
    if reason is EscalationReason.ONLY_IN_TRASH:
        return None  # a person tells a sent copy from a received one first
    if copies:
        return Resolution.SENT
    if reason is EscalationReason.RENDER_MISMATCH:
        return Resolution.ABANDON
    if copies == 0:
        return Resolution.RESEND
    return None  # check the mailbox first


def _effect(
    decision: Resolution, copies: int | None, least: str = "", trashed: bool = False
) -> str:
    if trashed:
        return _TRASHED_EFFECT[decision]
    if decision is Resolution.SENT:
        if copies and copies > 1:
            return (
                f"records that the customer has it ({least}{copies} copies); nothing more is sent"
            )
        if copies:
            return "records that the customer has it (the copy found); nothing more is sent"
        return "records that the customer has it, on your word (the note says how you know)"
    if decision is Resolution.RESEND:
        return (
            "searches the mailbox once more, then sends the same message again (same "
            "Message-ID); refused if a copy is found"
        )
    if copies:
        return (
            f"records that nothing more will be done; the customer keeps the "
            f"{'copy' if copies == 1 else f'{least}{copies} copies'} it has"
        )
    return "records that the message will not be sent; nothing more is sent"


#: What each decision does when the copies found were only in the trash.
_TRASHED_EFFECT = {
    Resolution.SENT: (
        "records that the customer has it, on your word that this mailbox sent the copy in "
        "the trash (the note says how you know)"
    ),
    Resolution.RESEND: (
        "searches the mailbox once more, then sends the same message again (same "
        "Message-ID); refused while a copy is found, in the trash too: delete a received "
        "one for good first"
    ),
    Resolution.ABANDON: (
        "records that the message will not be sent; the customer may or may not have a copy"
    ),
}


__all__ = [
    "MEANING",
    "NEXT",
    "RESEND_NEEDS_NOTE",
    "SENT_NEEDS_NOTE",
    "SENT_NEEDS_NOTE_IN_TRASH",
    "Choice",
    "Guidance",
    "copies_complete",
    "copies_known",
    "guidance_for",
]
