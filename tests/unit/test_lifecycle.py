"""The job's life (docs/how-it-works.md "A job's life"): `ledger.lifecycle.LIFECYCLE` is
what the aggregate does, both ways, and the page's picture is drawn from it.

The aggregate is explored, not read: from a new job, every command with every kind of
decision a policy or a human can give is tried on a copy of each job reached (breadth
first, times moving past every due time), and each event an accepted command records is
noted with the state before and after it. The table must be exactly what was seen, so a
rule changed in `ledger/job.py` changes the table, and the table the picture."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

from tests.unit.docs_page import DOCS
from tests.unit.jobs import MESSAGE_ID, POLICY, QUERY, requested_job, twins

from daemon.doubles.fake_time import FakeClock
from ledger import decision_types as decide
from ledger.delivery_reports import BouncedRecipient, DeliveryReport
from ledger.job import SendJob, TransitionError
from ledger.lifecycle import LIFECYCLE, Edge, mermaid
from ledger.vocabulary import EscalationReason, JobState, Resolution

Move = Callable[[SendJob, datetime], object]
HOUR = timedelta(hours=1)
HISTORY_QUERY = "history.list startHistoryId=1000 labelId=SENT historyTypes=messageAdded"


def _review(reason: EscalationReason) -> decide.Review:
    return decide.Review(POLICY, reason)


#: A report of the job's one recipient failing for good (docs/how-it-works.md "Bounces").
BOUNCE = DeliveryReport(
    report_id="<report-1@mx.example.net>",
    original_message_id=MESSAGE_ID,
    reporter="dns; mx.example.net",
    recipients=(BouncedRecipient("bob@example.com", "5.1.1", "failed", "550 unknown"),),
)


MOVES: dict[str, Move] = {
    "claim": lambda j, at: j.claim(provider="support", deadline=at + HOUR, at=at),
    "claim with a historyId": lambda j, at: j.claim(
        provider="support", deadline=at + HOUR, at=at, history_id="1000"
    ),
    "response": lambda j, at: j.record_response(
        provider_message_id="m1", decision=decide.Confirm(POLICY), at=at
    ),
    "response, verify later": lambda j, at: j.record_response(
        provider_message_id="m1", decision=decide.Confirm(POLICY, verify_at=at + HOUR), at=at
    ),
    "response, watch": lambda j, at: j.record_response(
        provider_message_id="m1", decision=decide.Confirm(POLICY, watch_until=at + HOUR), at=at
    ),
    "bounce": lambda j, at: j.record_bounce(
        BOUNCE, provider_message_id="r1", decision=decide.RecordBounce(POLICY), at=at
    ),
    "bounce, review": lambda j, at: j.record_bounce(
        BOUNCE, provider_message_id="r1", decision=_review(EscalationReason.BOUNCED), at=at
    ),
    "end watch": lambda j, at: j.end_bounce_watch(at=at),
    "unknown, search": lambda j, at: j.record_unknown(
        reason="timed out", decision=decide.SearchAt(POLICY, at + HOUR), at=at
    ),
    "unknown, history now": lambda j, at: j.record_unknown(
        reason="timed out", decision=decide.SearchAt(POLICY, at + HOUR, history_at=at), at=at
    ),
    "unknown, review": lambda j, at: j.record_unknown(
        reason="timed out", decision=_review(EscalationReason.UNKNOWN_OUTCOME), at=at
    ),
    "rejected, retry": lambda j, at: j.record_rejection(
        transient=True, reason="429", status=429, decision=decide.RetryAt(POLICY, at + HOUR), at=at
    ),
    "rejected, review": lambda j, at: j.record_rejection(
        transient=False,
        reason="400",
        status=400,
        decision=_review(EscalationReason.REJECTED),
        at=at,
    ),
    "search: one copy": lambda j, at: j.record_search(
        query=QUERY, copies=["m1"], decision=decide.Confirm(POLICY), at=at
    ),
    "search: two copies": lambda j, at: j.record_search(
        query=QUERY, copies=["m1", "m2"], decision=decide.Duplicate(POLICY), at=at
    ),
    "search: none, again": lambda j, at: j.record_search(
        query=QUERY, copies=[], decision=decide.SearchAgainAt(POLICY, at + HOUR), at=at
    ),
    "search: none, resend": lambda j, at: j.record_search(
        query=QUERY, copies=[], decision=decide.ResendAt(POLICY, at, misses_required=1), at=at
    ),
    "search: none, review": lambda j, at: j.record_search(
        query=QUERY, copies=[], decision=_review(EscalationReason.UNKNOWN_OUTCOME), at=at
    ),
    "history: one copy": lambda j, at: j.record_history(
        query=HISTORY_QUERY, copies=["m1"], decision=decide.Confirm(POLICY), at=at
    ),
    "history: two copies": lambda j, at: j.record_history(
        query=HISTORY_QUERY, copies=["m1", "m2"], decision=decide.Duplicate(POLICY), at=at
    ),
    "history: none, again": lambda j, at: j.record_history(
        query=HISTORY_QUERY, copies=[], decision=decide.HistoryMiss(POLICY, next_at=at), at=at
    ),
    "history: none, believed": lambda j, at: j.record_history(
        query=HISTORY_QUERY, copies=[], decision=decide.HistoryMiss(POLICY, search_at=at), at=at
    ),
    "history unusable": lambda j, at: j.record_history_unusable(reason="expired", at=at),
    "stop verifying": lambda j, at: j.stop_verifying(decide.StopVerifying(POLICY), at=at),
    "escalate": lambda j, at: j.escalate(
        _review(EscalationReason.MAX_ATTEMPTS), detail="3 calls", at=at
    ),
    "resolve sent": lambda j, at: j.resolve(Resolution.SENT, note="n", by="b", at=at),
    "resolve resend": lambda j, at: j.resolve(Resolution.RESEND, note="n", by="b", at=at),
    "resolve abandon": lambda j, at: j.resolve(Resolution.ABANDON, note="n", by="b", at=at),
    "check": lambda j, at: j.record_check(
        by="b", purpose="check", query=QUERY, copies=["m1"], at=at
    ),
    "cancel": lambda j, at: j.cancel(by="b", note="n", at=at),
    "purge": lambda j, at: j.purge(by="b", rule="test", at=at),
    "draft": lambda j, at: j.record_draft(draft_id="d1", provider_message_id="m1", at=at),
    "draft sent": lambda j, at: j.record_draft_sent(
        provider_message_id="m1", decision=decide.Confirm(POLICY), at=at
    ),
    "draft pending, retry": lambda j, at: j.record_draft_pending(
        decision=decide.RetryAt(POLICY, at + HOUR), at=at
    ),
    "draft pending, review": lambda j, at: j.record_draft_pending(
        decision=_review(EscalationReason.UNKNOWN_OUTCOME), at=at
    ),
    "draft gone, search": lambda j, at: j.record_draft_gone(
        decision=decide.SearchAt(POLICY, at + HOUR), at=at
    ),
    "draft gone, review": lambda j, at: j.record_draft_gone(
        decision=_review(EscalationReason.UNKNOWN_OUTCOME), at=at
    ),
    "draft found gone": lambda j, at: j.record_draft_found_gone(policy=POLICY, at=at),
}


def _shape(job: SendJob) -> tuple[object, ...]:
    return (job.state, job.verifying, job.duplicate, job.misses, job.draft_id is not None,
            min(job.attempts, 2), job.purged, job.history_id is not None,
            job.history_due_at is not None, job.watch_until is not None,
            len(job.bounce_ids))  # fmt: skip


def explored(depth: int = 7) -> set[Edge]:
    """Every (state before, event, state after) seen from a new job within `depth` commands
    (the whole table is reached by 5: 7 leaves a margin)."""
    clock = FakeClock()
    start = requested_job(clock)
    seen: set[Edge] = {(None, "Requested", JobState.REQUESTED)}
    frontier = [(start, clock.now)]
    shapes = {_shape(start)}
    for _ in range(depth):
        reached = []
        for job, now in frontier:
            at = now + 2 * HOUR  # past every due time a move sets
            twin = twins(job)  # copies that share nothing a move changes
            for move in MOVES.values():
                tried = twin()
                try:
                    move(tried, at)
                except (TransitionError, ValueError):
                    continue
                replay = twin()
                for event in tried.pending_events:
                    was = replay.state
                    event.apply(replay)
                    seen.add((was, type(event).__name__, replay.state))
                if _shape(tried) not in shapes:
                    shapes.add(_shape(tried))
                    reached.append((tried, at))
        frontier = reached
    return seen


def test_the_table_is_what_the_aggregate_does() -> None:
    seen = explored()
    assert set(LIFECYCLE) == seen, (
        f"in the table, never seen: {sorted(set(LIFECYCLE) - seen, key=str)}\n"
        f"seen, not in the table: {sorted(seen - set(LIFECYCLE), key=str)}"
    )


def test_the_pages_picture_is_drawn_from_the_table() -> None:
    page = (DOCS / "how-it-works.md").read_text(encoding="utf-8")
    assert f"```mermaid\n{mermaid()}```" in page, mermaid()


def test_the_message_id_of_the_explored_job_is_the_fixtures() -> None:
    assert requested_job(FakeClock()).message_id == MESSAGE_ID
