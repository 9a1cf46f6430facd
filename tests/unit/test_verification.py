"""The copy count after a resend: the policy decisions and the aggregate's rules.

A job sent again without proof that the earlier attempt failed (believed misses, or a
human's resend) may have a twin the index did not show yet. Its confirmation carries a
``verify_at``; then one more search counts its copies, through the same ``record_search``
as the sweep, with the decisions of ``after_verification``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from daemon.doubles.fake_time import FakeClock
from ledger.content import JobContent
from ledger.decision_types import (
    AfterVerification,
    Confirm,
    Duplicate,
    ResendAt,
    Review,
    SearchAgainAt,
    StopVerifying,
)
from ledger.job import JobState, SendJob, TransitionError
from ledger.vocabulary import EscalationReason, PolicyRef, Resolution
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
REF = POLICY.ref
VERIFY_AFTER = 1800.0


def events(job: SendJob) -> list[Any]:
    return list(job.collect_events())


def attempted(clock: FakeClock, key: str) -> SendJob:
    content = JobContent(channel="receipts", key=key, to=("a@example.com",), subject="s", body="b")
    job = SendJob.request(
        content,
        from_addr="s@example.com",
        message_id=f"<job-{key}@mail.example.com>",
        policy=REF,
        at=clock(),
    )
    job.claim(provider="support", deadline=clock() + timedelta(seconds=30), at=clock())
    return job


def unknown(clock: FakeClock, key: str) -> SendJob:
    job = attempted(clock, key)
    job.record_unknown(
        reason="timeout", decision=decisions.after_unknown(POLICY, now=clock()), at=clock()
    )
    clock.advance(POLICY.search_after)
    return job


def search(job: SendJob, clock: FakeClock, copies: list[str]) -> None:
    """One sweep search, decided by the policy as the daemon does."""
    decision = decisions.after_search(
        POLICY, hits=len(copies), misses_before=job.misses, resent=job.resent, now=clock()
    )
    job.record_search(query="q", copies=copies, decision=decision, at=clock())


def verify(job: SendJob, clock: FakeClock, copies: list[str]) -> None:
    """One verification search, decided by the policy as the daemon does."""
    decision = decisions.after_verification(
        POLICY, hits=len(copies), verifications_before=job.verifications, now=clock()
    )
    job.record_search(query="q", copies=copies, decision=decision, at=clock())


def resent(clock: FakeClock) -> SendJob:
    """Believed misses: requeued with the same Message-ID, and claimed again."""
    job = unknown(clock, "k")
    search(job, clock, [])
    clock.advance(POLICY.effective_search_interval)
    search(job, clock, [])
    assert job.state is JobState.REQUESTED and job.resent
    job.claim(provider="support", deadline=clock() + timedelta(seconds=30), at=clock())
    return job


def resent_and_confirmed(clock: FakeClock, *, verify: bool = True) -> SendJob:
    job = resent(clock)
    decision = decisions.after_response(POLICY, resent=verify, now=clock())
    job.record_response(provider_message_id="m2", decision=decision, at=clock())
    events(job)  # the tests below look only at the events their commands append
    return job


# -- decisions -------------------------------------------------------------------------------


def test_decisions() -> None:
    now = FakeClock().now
    assert decisions.after_response(POLICY, resent=False, now=now) == Confirm(REF)
    assert decisions.after_response(POLICY, resent=True, now=now) == Confirm(
        REF, verify_at=now + timedelta(minutes=30)
    )
    found = decisions.after_search(POLICY, hits=1, misses_before=0, resent=True, now=now)
    assert found == Confirm(REF, verify_at=now + timedelta(minutes=30))
    found = decisions.after_search(POLICY, hits=1, misses_before=0, resent=False, now=now)
    assert found == Confirm(REF)

    def verification(hits: int, before: int) -> object:
        return decisions.after_verification(POLICY, hits=hits, verifications_before=before, now=now)

    assert verification(1, 0) == Confirm(REF)
    assert verification(3, 0) == Duplicate(REF)
    assert verification(0, 0) == SearchAgainAt(REF, now + timedelta(minutes=2))
    assert verification(0, 1) == StopVerifying(REF)


# -- the aggregate ---------------------------------------------------------------------------


def test_a_resent_confirmation_is_due_for_verification(clock: FakeClock) -> None:
    job = resent_and_confirmed(clock)
    assert job.state is JobState.CONFIRMED and job.verifying
    assert job.due_at == clock() + timedelta(seconds=VERIFY_AFTER)
    with pytest.raises(TransitionError, match="not due"):
        verify(job, clock, ["m2"])
    assert events(job) == []
    clock.advance(VERIFY_AFTER)
    verify(job, clock, ["m2"])
    assert not job.verifying and job.due_at is None and job.state is JobState.CONFIRMED
    [verified] = events(job)
    assert isinstance(verified, SendJob.Verified)
    assert (verified.search, verified.hits, verified.next_verify_at) == (1, 1, None)
    assert (verified.policy, verified.fingerprint) == (REF.name, REF.fingerprint)
    # one copy ended the verification: no more counts
    with pytest.raises(TransitionError, match="confirmed"):
        verify(job, clock, ["m2"])
    with pytest.raises(TransitionError, match="no verification"):
        job.stop_verifying(StopVerifying(REF), at=clock())


def test_a_job_confirmed_by_search_after_a_resend_is_verified_too(clock: FakeClock) -> None:
    job = resent(clock)
    job.record_unknown(
        reason="timeout", decision=decisions.after_unknown(POLICY, now=clock()), at=clock()
    )
    clock.advance(POLICY.search_after)
    search(job, clock, ["m2"])
    assert job.state is JobState.CONFIRMED and job.verifying
    assert job.due_at == clock() + timedelta(seconds=VERIFY_AFTER)


def test_a_human_resend_is_verified_too(clock: FakeClock) -> None:
    job = attempted(clock, "h")
    job.record_unknown(
        reason="timeout",
        decision=decisions.after_unknown(POLICY, now=clock(), handle_reliable=False),
        at=clock(),
    )
    assert job.state is JobState.REVIEW and not job.resent
    job.resolve(Resolution.RESEND, note="", by="ana", at=clock())
    assert job.resent
    job.claim(provider="support", deadline=clock() + timedelta(seconds=30), at=clock())
    decision = decisions.after_response(POLICY, resent=job.resent, now=clock())
    job.record_response(provider_message_id="m2", decision=decision, at=clock())
    assert job.verifying and job.due_at == clock() + timedelta(seconds=VERIFY_AFTER)


def test_a_first_send_is_not_verified(clock: FakeClock) -> None:
    job = attempted(clock, "first")
    decision = decisions.after_response(POLICY, resent=job.resent, now=clock())
    job.record_response(provider_message_id="m1", decision=decision, at=clock())
    assert job.state is JobState.CONFIRMED and not job.verifying and job.due_at is None


def test_empty_counts_look_again_then_stop(clock: FakeClock) -> None:
    job = resent_and_confirmed(clock)
    clock.advance(VERIFY_AFTER)
    verify(job, clock, [])
    interval = timedelta(seconds=POLICY.effective_search_interval)
    assert job.verifying and job.due_at == clock() + interval
    [first] = events(job)
    assert (first.search, first.hits, first.next_verify_at) == (1, 0, clock() + interval)
    with pytest.raises(TransitionError, match="not due"):
        verify(job, clock, [])
    clock.advance(POLICY.effective_search_interval)
    verify(job, clock, [])  # confirm_misses = 2 empty counts: a missing entry is no twin
    assert job.state is JobState.CONFIRMED and not job.verifying and job.due_at is None
    [second] = events(job)
    assert (second.search, second.hits, second.next_verify_at) == (2, 0, None)
    assert job.verifications == 2


def test_two_copies_reopen_a_confirmed_job_for_review_only_while_verifying(
    clock: FakeClock,
) -> None:
    job = resent_and_confirmed(clock)
    clock.advance(VERIFY_AFTER)
    with pytest.raises(TransitionError, match="two or more expected"):
        job.record_search(query="q", copies=["m1"], decision=Duplicate(REF), at=clock())
    with pytest.raises(TransitionError, match="confirmed"):
        job.escalate(Review(REF, EscalationReason.DUPLICATE), detail="", at=clock())
    assert events(job) == []
    verify(job, clock, ["m1", "m2"])
    assert job.state is JobState.REVIEW and job.duplicate and not job.verifying
    assert job.reason == EscalationReason.DUPLICATE and job.due_at is None
    duplicate, escalated = events(job)  # both in one step: never half-way
    assert isinstance(duplicate, SendJob.Duplicate)
    assert (duplicate.hits, duplicate.provider_message_ids) == (2, ["m1", "m2"])
    assert isinstance(escalated, SendJob.Escalated)
    assert (escalated.reason, escalated.detail) == ("duplicate", "2 copies after a resend: m1, m2")
    assert (escalated.policy, escalated.fingerprint) == (REF.name, REF.fingerprint)
    with pytest.raises(TransitionError, match="two copies already exist"):
        job.resolve(Resolution.RESEND, note="", by="ana", at=clock())


def test_a_plain_confirmation_is_final(clock: FakeClock) -> None:
    job = resent_and_confirmed(clock, verify=False)
    assert not job.verifying and job.due_at is None
    clock.advance(3600)
    attempts: list[tuple[list[str], AfterVerification]] = [
        (["m1", "m2"], Duplicate(REF)),
        (["m2"], Confirm(REF)),
        ([], SearchAgainAt(REF, clock() + timedelta(minutes=2))),
        ([], StopVerifying(REF)),
    ]
    for copies, decision in attempts:
        with pytest.raises(TransitionError, match="confirmed"):
            job.record_search(query="q", copies=copies, decision=decision, at=clock())
    with pytest.raises(TransitionError, match="no verification"):
        job.stop_verifying(StopVerifying(REF), at=clock())
    assert events(job) == []
    assert job.state is JobState.CONFIRMED and not job.duplicate


def test_verification_refuses_odd_inputs(clock: FakeClock) -> None:
    job = resent_and_confirmed(clock)
    clock.advance(VERIFY_AFTER)
    now = clock()
    later = now + timedelta(minutes=2)
    refused: list[tuple[list[str], Any, str]] = [
        ([], Confirm(REF), "0 copies found, exactly one expected"),
        (["m1", "m2"], Confirm(REF), "2 copies found, exactly one expected"),
        (["m2"], SearchAgainAt(REF, later), "1 copies found, none expected"),
        (["m2"], StopVerifying(REF), "1 copies found, none expected"),
        ([], SearchAgainAt(REF, now - timedelta(seconds=1)), "before this one"),
        # a confirmed job is only counted: never resent, never reviewed for its misses
        ([], ResendAt(REF, now, misses_required=2), "only verified"),
        ([], Review(REF, EscalationReason.UNKNOWN_OUTCOME), "only verified"),
    ]
    for copies, decision, why in refused:
        with pytest.raises(TransitionError, match=why):
            job.record_search(query="q", copies=copies, decision=decision, at=now)
        assert events(job) == []
        assert job.state is JobState.CONFIRMED and job.verifying


def test_one_copy_ends_the_verification_whatever_the_decision_says(clock: FakeClock) -> None:
    job = resent_and_confirmed(clock)
    clock.advance(VERIFY_AFTER)
    later = clock() + timedelta(hours=1)
    job.record_search(query="q", copies=["m2"], decision=Confirm(REF, verify_at=later), at=clock())
    assert not job.verifying and job.due_at is None
    [verified] = events(job)
    assert (verified.hits, verified.next_verify_at) == (1, None)


def test_stop_verifying_without_a_search(clock: FakeClock) -> None:
    # No policy or no provider to search with: the job stays confirmed; a human can check it.
    job = resent_and_confirmed(clock)
    clock.advance(VERIFY_AFTER)
    job.stop_verifying(StopVerifying(PolicyRef.missing("receipts")), at=clock())
    assert job.state is JobState.CONFIRMED and not job.verifying and job.due_at is None
    [verified] = events(job)
    assert isinstance(verified, SendJob.Verified)
    assert (verified.search, verified.hits, verified.next_verify_at) == (1, 0, None)
    assert (verified.policy, verified.fingerprint) == ("receipts", "")
    with pytest.raises(TransitionError, match="no verification"):
        job.stop_verifying(StopVerifying(REF), at=clock())


def test_stop_verifying_is_not_a_search_result_while_the_outcome_is_unknown(
    clock: FakeClock,
) -> None:
    job = unknown(clock, "u")
    with pytest.raises(TransitionError, match="nothing to verify"):
        job.record_search(query="q", copies=[], decision=StopVerifying(REF), at=clock())
    with pytest.raises(TransitionError):
        job.stop_verifying(StopVerifying(REF), at=clock())
    assert job.state is JobState.UNKNOWN


def test_a_verification_cannot_be_due_before_the_confirmation(clock: FakeClock) -> None:
    job = attempted(clock, "k2")
    with pytest.raises(TransitionError, match="before the confirmation"):
        job.record_response(
            provider_message_id="m",
            decision=Confirm(REF, verify_at=clock() - timedelta(seconds=1)),
            at=clock(),
        )
    assert job.state is JobState.ATTEMPTED
