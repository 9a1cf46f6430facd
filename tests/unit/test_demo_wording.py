"""The demo tells the method (docs/operations.md "What the demo shows"): each job's line says
what was observed and what was done, step by step, from the job's own events
(`daemon.tools.demo_story`), and says its final state once."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from tests.unit.engine_rig import EngineRig, policy

from daemon.doubles.fake_provider import Scripted
from daemon.service_layer.read_models import event_record
from daemon.tools.demo_story import line, steps

T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)


def at(seconds: float) -> str:
    return (T0 + timedelta(seconds=seconds)).isoformat().replace("+00:00", "Z")


def test_an_ambiguous_send_confirmed_by_its_search() -> None:
    records: list[dict[str, Any]] = [
        {"type": "Requested", "at": at(0)},
        {"type": "Attempted", "at": at(0.1), "attempt": 1},
        {
            "type": "Unknown",
            "at": at(1.6),
            "reason": "POST sent to 127.0.0.1:8027, then timed out",
            "search_due_at": at(4.6),
        },
        {"type": "Confirmed", "at": at(4.7), "via": "search", "verify_at": None},
    ]
    assert line(steps(records, "Gmail")) == (
        "no answer (POST sent to 127.0.0.1:8027, then timed out) -> outcome unknown -> "
        "waited 3.0 s for the search index -> searched rfc822msgid -> 1 copy -> confirmed"
    )


def test_misses_then_a_resend_then_its_copies_counted_again() -> None:
    records: list[dict[str, Any]] = [
        {"type": "Attempted", "at": at(0), "attempt": 1},
        {
            "type": "Unknown",
            "at": at(0.1),
            "reason": "HTTP 500: backendError: Internal error.",
            "search_due_at": at(3.1),
        },
        {"type": "SearchedMiss", "at": at(3.1), "next_search_at": at(4.1)},
        {"type": "SearchedMiss", "at": at(4.1), "next_search_at": None},
        {"type": "Requeued", "at": at(4.1), "misses_required": 2},
        {"type": "Attempted", "at": at(4.4), "attempt": 2},
        {"type": "Confirmed", "at": at(4.5), "via": "response", "verify_at": at(8.0)},
        {"type": "Verified", "at": at(8.3), "hits": 1},
    ]
    assert steps(records, "Gmail") == [
        "answered HTTP 500 (backendError: Internal error), which does not say whether it went out",
        "outcome unknown",
        "waited 3.0 s for the search index",
        "searched rfc822msgid",
        "no copy",
        "waited 1.0 s",
        "searched rfc822msgid",
        "no copy",
        "no copy in 2 searches: the send did not arrive",
        "sent again (same Message-ID)",
        "Gmail answered with the message's id",
        "confirmed",
        "copies counted again 3.8 s later",
        "1 copy",
    ]


def test_a_refusal_that_sent_nothing_and_a_review() -> None:
    refused: list[dict[str, Any]] = [
        {"type": "Attempted", "at": at(0), "attempt": 1},
        {
            "type": "Rejected",
            "at": at(0),
            "reason": "HTTP 429: rateLimitExceeded.",
            "transient": True,
            "unavailable": True,
            "retry_at": at(1),
        },
        {"type": "Attempted", "at": at(1), "attempt": 2},
        {"type": "Confirmed", "at": at(1.1), "via": "response"},
    ]
    assert line(steps(refused, "Gmail")) == (
        "refused (HTTP 429: rateLimitExceeded): nothing sent, the provider is busy -> "
        "tried again 1.0 s later -> Gmail answered with the message's id -> confirmed"
    )
    review: list[dict[str, Any]] = [
        {
            "type": "Unknown",
            "at": at(0),
            "reason": "POST sent to h, then connection closed without a response",
            "search_due_at": None,
        },
        {"type": "Escalated", "at": at(0), "reason": "unknown-outcome"},
    ]
    assert steps(review)[-1] == "to review (unknown-outcome): waiting for a human"


def test_a_human_check_and_resend_is_the_second_line() -> None:
    records: list[dict[str, Any]] = [
        {
            "type": "Checked",
            "at": at(0),
            "by": "ann",
            "purpose": "check",
            "provider_message_ids": [],
        },
        {
            "type": "Checked",
            "at": at(0),
            "by": "ann",
            "purpose": "resend",
            "provider_message_ids": [],
        },
        {"type": "Resolved", "at": at(0), "by": "ann", "decision": "resend"},
        {"type": "Requeued", "at": at(0), "misses_required": 0},
        {"type": "Attempted", "at": at(1), "attempt": 2},
        {"type": "Confirmed", "at": at(1), "via": "response"},
    ]
    assert steps(records, "Gmail") == [
        "ann checked the mailbox",
        "0 copies",
        "searched once more before the resend",
        "0 copies",
        "ann resolved it as resend",
        "sent again (same Message-ID)",
        "Gmail answered with the message's id",
        "confirmed",
    ]


def _history(script: Any, **policy_fields: Any) -> list[dict[str, Any]]:
    rig = EngineRig(policy("legal", **policy_fields))
    try:
        rig.submit("legal", "k1")
        rig.provider.script(script)
        rig.tick()
        rig.advance_and_tick(120)
        rig.advance_and_tick(120)
        return [event_record(event) for event in rig.ledger.history("k1")]
    finally:
        rig.close()


def test_the_events_the_engine_writes_read_as_the_story_says() -> None:
    """Real histories (the fake provider, the real engine): the fields the story reads are
    the events' own."""
    dropped = steps(_history(Scripted.dropped_response(), on_unknown="retry"), "Gmail")
    assert dropped[0].startswith("no answer (") and dropped[1] == "outcome unknown"
    assert dropped[2].startswith("waited ") and dropped[2].endswith(" for the search index")
    assert dropped[-3:] == ["searched rfc822msgid", "1 copy", "confirmed"]
    review = steps(_history(Scripted.lost_request(), on_unknown="review"))
    assert review[-1] == "to review (unknown-outcome): waiting for a human"


RECORDS = st.sampled_from(
    [
        {"type": "Requested", "at": at(0)},
        {"type": "Attempted", "at": at(0), "attempt": 1},
        {"type": "Attempted", "at": at(0), "attempt": 3},
        {"type": "Unknown", "at": at(0), "reason": "HTTP 503: x.", "search_due_at": at(2)},
        {"type": "Unknown", "at": at(0), "reason": "POST sent to h, then timed out"},
        {"type": "SearchedMiss", "at": at(2), "next_search_at": at(3)},
        {"type": "Requeued", "at": at(3), "misses_required": 2},
        {"type": "Rejected", "at": at(0), "reason": "HTTP 400: bad.", "transient": False},
        {"type": "Confirmed", "at": at(4), "via": "search"},
        {"type": "Confirmed", "at": at(4), "via": "response"},
        {"type": "Duplicate", "at": at(4), "hits": 2},
        {"type": "Escalated", "at": at(4), "reason": "duplicate"},
        {"type": "Verified", "at": at(5), "hits": 1},
        {"type": "Checked", "at": at(6), "by": "ann", "provider_message_ids": ["a"]},
        {"type": "Resolved", "at": at(6), "by": "ann", "decision": "sent"},
        {"type": "Confirmed", "at": at(6), "via": "operator"},
    ]
)


@given(st.lists(RECORDS, max_size=12))
def test_every_step_is_words_and_a_confirmation_is_said_once_per_event(
    records: list[dict[str, Any]],
) -> None:
    said = steps(records, "Gmail")
    for step in said:
        assert step and step == step.strip() and ".:" not in step and ". (" not in step, step
    confirmations = sum(1 for r in records if r["type"] == "Confirmed")
    assert sum(1 for s in said if s.startswith("confirmed")) == confirmations
    assert "copies to be counted again" not in line(said)
