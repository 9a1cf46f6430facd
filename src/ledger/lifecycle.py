"""A job's life as a table: every (state before, event, state after) the aggregate
(`ledger/job.py`) can go through, one row per event a command records (a command may
record two: a refusal and its escalation, a human's "sent" and its confirmation).
tests/unit/test_lifecycle.py explores the aggregate and holds this table to what it does,
both ways; docs/how-it-works.md "A job's life" is drawn from it (`mermaid`), so the
picture cannot drift from the code."""

from __future__ import annotations

from ledger.vocabulary import FINAL_STATES, JobState

Edge = tuple[JobState | None, str, JobState]

_R, _A, _U = JobState.REQUESTED, JobState.ATTEMPTED, JobState.UNKNOWN
_C, _V = JobState.CONFIRMED, JobState.REVIEW
_X, _N = JobState.ABANDONED, JobState.CANCELLED

LIFECYCLE: tuple[Edge, ...] = (
    (None, "Requested", _R),
    (_R, "Attempted", _A),
    (_R, "Cancelled", _N),
    (_R, "Checked", _R),
    (_R, "Confirmed", _C),  # drafts: an earlier run's draft was sent
    (_R, "DraftCreated", _R),
    (_R, "DraftGone", _R),  # drafts: the recorded draft vanished before its claim, then Escalated
    (_R, "Escalated", _V),
    (_A, "Confirmed", _C),
    (_A, "DraftPending", _R),
    (_A, "DraftPending", _A),  # then Escalated
    (_A, "Escalated", _V),
    (_A, "Rejected", _R),
    (_A, "Rejected", _A),  # then Escalated
    (_A, "Unknown", _U),
    (_U, "Checked", _U),
    (_U, "Confirmed", _C),
    (_U, "DraftGone", _U),
    (_U, "DraftPending", _R),
    (_U, "DraftPending", _U),  # then Escalated
    (_U, "Duplicate", _U),  # then Escalated
    (_U, "Escalated", _V),
    (_U, "HistoryMissed", _U),
    (_U, "HistoryUnusable", _U),
    (_U, "Requeued", _R),
    (_U, "SearchedMiss", _U),
    (_C, "BounceWatchEnded", _C),
    (_C, "Bounced", _C),  # on_bounce = "review" and permanent: then Escalated
    (_C, "Checked", _C),
    (_C, "Duplicate", _C),  # a resent job's recount found two: then Escalated
    (_C, "Escalated", _V),
    (_C, "Purged", _C),
    (_C, "Verified", _C),
    (_C, "WatchingBounces", _C),  # recorded with the Confirmed it follows
    (_V, "Checked", _V),
    (_V, "DraftGone", _V),  # drafts: a person's resend found the recorded draft gone
    (_V, "Confirmed", _C),
    (_V, "Resolved", _R),  # resend
    (_V, "Resolved", _V),  # sent: then Confirmed
    (_V, "Resolved", _X),  # abandon
    (_X, "Checked", _X),
    (_X, "Purged", _X),
    (_N, "Checked", _N),
    (_N, "Purged", _N),
)


def mermaid() -> str:
    """The table as a Mermaid state diagram: one arrow per pair of states, labelled with
    the events that take it (an arrow back to its own state: events that keep the
    state), and the final states ending."""
    order = list(JobState)
    labels: dict[tuple[JobState | None, JobState], list[str]] = {}
    for before, event, after in LIFECYCLE:
        labels.setdefault((before, after), []).append(event)

    def rank(pair: tuple[JobState | None, JobState]) -> tuple[int, int, int]:
        before, after = pair
        return (-1 if before is None else order.index(before), before == after,
                order.index(after))  # fmt: skip

    lines = ["stateDiagram-v2"]
    for before, after in sorted(labels, key=rank):
        start = "[*]" if before is None else before.value
        events = ", ".join(dict.fromkeys(labels[(before, after)]))
        lines.append(f"    {start} --> {after.value}: {events}")
    lines += [f"    {state.value} --> [*]" for state in order if state in FINAL_STATES]
    return "\n".join(lines) + "\n"


__all__ = ["LIFECYCLE", "Edge", "mermaid"]
