"""The demo's story of one job: each step what was observed, then what was done, from the
job's own events (as `history --json` gives them), e.g.

    no answer (POST sent to 127.0.0.1:8027, then timed out) -> waited 3 s for the search
    index -> searched rfc822msgid -> 1 copy -> confirmed

The demo prints a job's line once it has settled, so each job's final state is said once
(a verification is part of the confirmation, not a second one); a job a human takes out of
review gets a second line, for what came after (docs/operations.md "What the demo shows").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from ledger.job import DRAFTS_TIDY

Record = Mapping[str, Any]


def steps(records: Sequence[Record], provider: str = "the provider") -> list[str]:
    """What each event says, in order; events that say nothing a reader needs (the claim,
    the request itself) add no step of their own."""
    said: list[str] = []
    previous: Record | None = None
    for record in records:
        said += _step(record, previous, provider)
        previous = record
    return said


def line(parts: Sequence[str]) -> str:
    return " -> ".join(parts)


def _step(record: Record, previous: Record | None, provider: str) -> list[str]:
    kind = record["type"]
    if kind in ("Requested", "DraftCreated", "Purged", "LeaseRenewed"):
        return []
    if kind == "DraftsDeleted":
        # A settled job's tidy is housekeeping; a fence is part of the job's story.
        if record.get("why") == DRAFTS_TIDY or not record.get("draft_ids"):
            return []
        return ["its unsent draft deleted, so it can never go out"]
    if kind == "Attempted":
        attempt = int(record.get("attempt") or 1)
        if attempt == 1 or (previous and previous["type"] in ("Rejected", "Requeued")):
            return []  # the step before said it goes again
        return [f"sent again (attempt {attempt}, same Message-ID)"]
    if kind == "Confirmed":
        return _confirmed(record, provider)
    if kind == "Unknown":
        said = [_no_answer(str(record.get("reason", ""))), "outcome unknown"]
        if record.get("history_due_at"):
            return said  # the history is read at once; what it found says the rest
        wait = _seconds(record, "search_due_at")
        return [*said, f"waited {wait} for the search index"] if wait else said
    if kind == "SearchedMiss":
        wait = _seconds(record, "next_search_at")
        said = ["searched rfc822msgid", "no copy"]
        return [*said, f"waited {wait}"] if wait else said
    if kind == "Requeued":
        if previous and previous["type"] in ("Resolved", "Checked"):
            return ["sent again (same Message-ID)"]
        misses = record.get("misses_required")
        return [
            f"no copy in {misses} searches: the send did not arrive",
            "sent again (same Message-ID)",
        ]
    if kind == "Rejected":
        return _rejected(record)
    if kind == "Duplicate":
        return ["searched rfc822msgid", f"{record.get('hits')} copies", "a duplicate"]
    if kind == "Escalated":
        if record.get("reason") == "duplicate":
            return ["to review: waiting for a human"]
        return [f"to review ({record.get('reason')}): waiting for a human"]
    if kind == "Verified":
        hits = int(record.get("hits") or 0)
        copies = "1 copy" if hits == 1 else f"{hits} copies"
        when = _between(previous, record)
        return [f"copies counted again{f' {when} later' if when else ''}", copies]
    if kind == "Checked":
        counted = record.get("count")  # None: recorded before the copies were bounded
        found = len(record.get("provider_message_ids") or []) if counted is None else counted
        copies = "1 copy" if found == 1 else f"{found} copies"
        if record.get("purpose") == "resend":
            return ["searched once more before the resend", copies]
        return [f"{record.get('by') or 'a human'} checked the mailbox", copies]
    if kind == "Resolved":
        return [f"{record.get('by') or 'a human'} resolved it as {record.get('decision')}"]
    if kind == "Cancelled":
        return ["cancelled before any send"]
    if kind == "DraftPending":
        return ["the draft is still unsent: not sent"]
    if kind == "DraftGone":
        return ["the draft is gone and no sent message holds it"]
    if kind == "HistoryMissed":
        said = ["read the mailbox's history since the claim", "no copy"]
        if record.get("believed"):
            return [*said, "believed: searched at once"]
        if record.get("next_history_at"):
            return [*said, f"read again {_seconds(record, 'next_history_at')} later"]
        wait = _seconds(record, "search_due_at")
        return [*said, f"waited {wait} for the search index"] if wait else said
    if kind == "HistoryUnusable":
        return [f"the mailbox's history cannot answer ({record.get('reason')})"]
    return [str(kind)]


def _confirmed(record: Record, provider: str) -> list[str]:
    via = record.get("via")
    if via == "search":
        return ["searched rfc822msgid", "1 copy", "confirmed"]
    if via == "operator":
        return ["confirmed on a human's word"]
    if via == "draft":
        return ["the draft was sent", "confirmed"]
    if via == "history":
        return ["read the mailbox's history since the claim", "1 copy", "confirmed"]
    return [f"{provider} answered with the message's id", "confirmed"]


def _no_answer(reason: str) -> str:
    """An unknown outcome as it was observed: no answer, or an answer that proves nothing."""
    reason = reason.rstrip(". ")
    if reason.startswith("HTTP "):
        status, _, rest = reason.partition(": ")
        shown = f"{status} ({rest})" if rest else status
        return f"answered {shown}, which does not say whether it went out"
    return f"no answer ({reason})"


def _rejected(record: Record) -> list[str]:
    reason = str(record.get("reason", "")).rstrip(". ")
    wait = _seconds(record, "retry_at")
    if record.get("unavailable"):
        said = [f"refused ({reason}): nothing sent, the provider is busy"]
    elif record.get("transient"):
        said = [f"refused ({reason}): nothing sent"]
    else:
        return [f"refused for good ({reason}): nothing sent"]
    return [*said, f"tried again {wait} later"] if wait else said


def _at(value: object) -> datetime | None:
    if not isinstance(value, str):
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def _seconds(record: Record, field: str) -> str:
    start, end = _at(record.get("at")), _at(record.get(field))
    return _duration(start, end)


def _between(first: Record | None, then: Record) -> str:
    return _duration(_at(first.get("at")) if first else None, _at(then.get("at")))


def _duration(start: datetime | None, end: datetime | None) -> str:
    if start is None or end is None:
        return ""
    seconds = max(0.0, (end - start).total_seconds())
    return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"


__all__ = ["line", "steps"]
