"""The copy count after a resend: the aggregate's rules and the policy decisions."""

from __future__ import annotations

from datetime import timedelta

import pytest
from tests.conftest import FakeClock

from ledger.job import JobState, SendJob, TransitionError
from policies import decisions
from policies.model import ChannelPolicy

POLICY = ChannelPolicy.model_validate(
    {
        "channel": "receipts",
        "provider": "support",
        "from": "Support <support@example.com>",
        "message_id_domain": "mail.example.com",
        "on_unknown": "retry",
        "search_after": "1m",
        "search_interval": "2m",
        "confirm_misses": 2,
        "verify_after": "30m",
    }
)
P = {"policy": "receipts", "fingerprint": "f"}


def attempted(clock: FakeClock, key: str) -> SendJob:
    job = SendJob.request(
        key=key,
        channel="receipts",
        to=["a@example.com"],
        cc=[],
        reply_to=None,
        from_addr="s@example.com",
        subject="s",
        body="b",
        html=None,
        message_id=f"<job-{key}@mail.example.com>",
        content_hash="h",
        at=clock(),
        **P,
    )
    job.attempt(provider="support", deadline=clock() + timedelta(seconds=30), at=clock())
    return job


def resent_and_confirmed(clock: FakeClock, *, verify: bool = True) -> SendJob:
    job = attempted(clock, "k")
    job.record_unknown(reason="timeout", search_due_at=clock(), at=clock(), **P)
    job.record_miss(query="q", next_search_at=clock(), at=clock(), **P)
    job.record_miss(query="q", next_search_at=None, at=clock(), **P)
    job.requeue(reason="misses", due_at=clock(), misses_required=2, at=clock(), **P)
    assert job.resent
    job.attempt(provider="support", deadline=clock() + timedelta(seconds=30), at=clock())
    verify_at = decisions.after_confirmation(POLICY, resent=verify, now=clock())
    job.confirm(via="response", provider_message_ids=["m2"], verify_at=verify_at, at=clock(), **P)
    return job


def test_decisions() -> None:
    now = FakeClock().now
    assert decisions.after_confirmation(POLICY, resent=False, now=now) is None
    assert decisions.after_confirmation(POLICY, resent=True, now=now) == now + timedelta(minutes=30)
    assert decisions.after_verification(POLICY, hits=1, verifications_before=0, now=now).action == (
        "confirm"
    )
    dup = decisions.after_verification(POLICY, hits=3, verifications_before=0, now=now)
    assert (dup.action, dup.reason) == ("duplicate", "duplicate")
    again = decisions.after_verification(POLICY, hits=0, verifications_before=0, now=now)
    assert (again.action, again.due_at) == ("miss", now + timedelta(minutes=2))
    last = decisions.after_verification(POLICY, hits=0, verifications_before=1, now=now)
    assert (last.action, last.due_at) == ("miss", None)


def test_a_resent_confirmation_is_due_for_verification(clock: FakeClock) -> None:
    job = resent_and_confirmed(clock)
    assert job.state is JobState.CONFIRMED and job.verifying
    assert job.due_at == clock() + timedelta(minutes=30)
    with pytest.raises(TransitionError, match="not due"):
        job.record_verification(hits=1, next_verify_at=None, at=clock(), **P)
    clock.advance(1800)
    job.record_verification(hits=1, next_verify_at=None, at=clock(), **P)
    assert not job.verifying and job.due_at is None and job.state is JobState.CONFIRMED
    with pytest.raises(TransitionError, match="no verification"):
        job.record_verification(hits=1, next_verify_at=None, at=clock(), **P)


def test_two_copies_reopen_a_confirmed_job_for_review_only_while_verifying(
    clock: FakeClock,
) -> None:
    job = resent_and_confirmed(clock)
    clock.advance(1800)
    with pytest.raises(TransitionError, match="Duplicate"):
        job.record_verification(hits=2, next_verify_at=None, at=clock(), **P)
    with pytest.raises(TransitionError, match="duplicate"):
        job.escalate(reason="duplicate", detail="", at=clock(), **P)
    job.record_duplicate(provider_message_ids=["m1", "m2"], at=clock(), **P)
    with pytest.raises(TransitionError, match="Escalated must come first"):
        job.record_verification(hits=1, next_verify_at=None, at=clock(), **P)
    job.escalate(reason="duplicate", detail="2 copies", at=clock(), **P)
    assert job.state is JobState.REVIEW and job.duplicate
    with pytest.raises(TransitionError):
        job.resolve(decision="resend", note="", by="ana", at=clock())


def test_a_plain_confirmation_is_final(clock: FakeClock) -> None:
    job = resent_and_confirmed(clock, verify=False)
    assert not job.verifying and job.due_at is None
    clock.advance(3600)
    with pytest.raises(TransitionError, match="no verification"):
        job.record_duplicate(provider_message_ids=["m1", "m2"], at=clock(), **P)
    with pytest.raises(TransitionError, match="no verification"):
        job.record_verification(hits=0, next_verify_at=None, at=clock(), **P)


def test_verification_refuses_odd_inputs(clock: FakeClock) -> None:
    job = resent_and_confirmed(clock)
    clock.advance(1800)
    with pytest.raises(TransitionError, match="one copy ends"):
        job.record_verification(hits=1, next_verify_at=clock(), at=clock(), **P)
    with pytest.raises(TransitionError, match="before this one"):
        job.record_verification(
            hits=0, next_verify_at=clock() - timedelta(seconds=1), at=clock(), **P
        )


def test_a_verification_cannot_be_due_before_the_confirmation(clock: FakeClock) -> None:
    job = attempted(clock, "k2")
    with pytest.raises(TransitionError, match="before the confirmation"):
        job.confirm(
            via="response",
            provider_message_ids=["m"],
            verify_at=clock() - timedelta(seconds=1),
            at=clock(),
            **P,
        )
