"""The engine's steps on a memory store and a fake provider, with injected time.

No sockets and no files: each test runs the real dispatch, recover, sweep and verify code
against the fake provider's mailbox and counts copies there.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from tests.unit.engine_rig import GRACE, TIMEOUT, EngineRig, policy

from daemon.doubles.fake_provider import Scripted
from ledger.content import parse_job
from ledger.job import SendJob
from ledger.vocabulary import JobState, Resolution, Sender

RETRY = policy("receipts", on_unknown="retry")
SEARCH_THEN_REVIEW = policy("alerts", on_unknown="search-then-review")
REVIEW = policy("legal", on_unknown="review")


@pytest.fixture
def rig() -> Iterator[EngineRig]:
    rig = EngineRig(RETRY, SEARCH_THEN_REVIEW, REVIEW)
    yield rig
    rig.close()


def test_a_send_confirmed_by_response(rig: EngineRig) -> None:
    rig.submit("receipts", "k1")
    report = rig.tick()
    assert (report.sent, report.confirmed) == (1, 1)
    assert rig.job("k1").state is JobState.CONFIRMED
    assert rig.events("k1") == ["Requested", "Attempted", "Confirmed"]
    assert rig.copies("k1") == 1


def test_a_dropped_response_is_searched_only_after_the_lag_then_confirmed(rig: EngineRig) -> None:
    rig.submit("receipts", "k1")
    rig.provider.script(Scripted.dropped_response())
    assert rig.tick().unknown == 1
    assert rig.job("k1").state is JobState.UNKNOWN
    assert rig.advance_and_tick(59).searched == 0  # search_after is 60s
    report = rig.advance_and_tick(1)
    assert (report.searched, report.confirmed) == (1, 1)
    confirmed = rig.ledger.history("k1")[-1]
    assert isinstance(confirmed, SendJob.Confirmed) and confirmed.via == "search"
    assert rig.copies("k1") == 1 and rig.provider.sends == 1


def test_a_lost_request_is_resent_after_enough_misses_and_verified(rig: EngineRig) -> None:
    rig.submit("receipts", "k1")
    rig.provider.script(Scripted.lost_request())
    rig.tick()
    rig.advance_and_tick(60)  # first miss
    assert rig.job("k1").misses == 1 and rig.job("k1").state is JobState.UNKNOWN
    rig.advance_and_tick(30)  # second miss: believed, requeued and resent in the next tick
    rig.tick()
    assert rig.job("k1").state is JobState.CONFIRMED and rig.job("k1").verifying
    assert rig.copies("k1") == 1
    rig.advance_and_tick(600)  # verify_after: one copy
    job = rig.job("k1")
    assert job.state is JobState.CONFIRMED and not job.verifying
    assert rig.events("k1") == [
        "Requested",
        "Attempted",
        "Unknown",
        "SearchedMiss",
        "SearchedMiss",
        "Requeued",
        "Attempted",
        "Confirmed",
        "Verified",
    ]


def test_the_recorded_query_is_the_one_the_provider_was_sent(rig: EngineRig) -> None:
    message_id = rig.submit("receipts", "k1")
    rig.provider.script(Scripted.lost_request())
    rig.tick()
    rig.advance_and_tick(60)
    miss = rig.ledger.history("k1")[-1]
    assert isinstance(miss, SendJob.SearchedMiss)
    assert miss.query == f"rfc822msgid:{message_id.strip('<>')}"


def test_an_index_lag_longer_than_the_windows_is_caught_as_a_duplicate_by_verification() -> None:
    rig = EngineRig(RETRY, index_lag=300)  # longer than search_after + interval
    try:
        rig.submit("receipts", "k1")
        rig.provider.script(Scripted.dropped_response())
        rig.tick()
        rig.advance_and_tick(60)
        rig.advance_and_tick(30)  # two misses believed though a copy exists
        rig.tick()  # the resend, confirmed by response
        assert rig.copies("k1") == 2 and rig.job("k1").verifying
        rig.advance_and_tick(600)
        job = rig.job("k1")
        assert job.state is JobState.REVIEW and job.duplicate and job.reason == "duplicate"
        assert rig.events("k1")[-2:] == ["Duplicate", "Escalated"]
        rig.advance_and_tick(3600)
        assert rig.provider.sends == 2  # never a third
    finally:
        rig.close()


def test_two_copies_found_by_the_sweep_go_to_review_and_are_never_resent(rig: EngineRig) -> None:
    message_id = rig.submit("receipts", "k1")
    rig.provider.script(Scripted.dropped_response())
    rig.tick()
    rig.provider.store_copy(message_id)
    rig.advance_and_tick(60)
    job = rig.job("k1")
    assert job.state is JobState.REVIEW and job.duplicate
    with pytest.raises(Exception, match="two copies already exist"):
        rig.ledger.update(
            "k1", lambda j: j.resolve(Resolution.RESEND, note="", by="op", at=rig.clock())
        )


def test_search_then_review_sends_a_believed_miss_to_review(rig: EngineRig) -> None:
    rig.submit("alerts", "a1")
    rig.provider.script(Scripted.lost_request())
    rig.tick()
    rig.advance_and_tick(60)
    rig.advance_and_tick(30)
    job = rig.job("a1")
    assert (job.state, job.reason) == (JobState.REVIEW, "unknown-outcome")
    assert rig.provider.sends == 1


def test_a_review_channel_sends_every_unknown_straight_to_review(rig: EngineRig) -> None:
    rig.submit("legal", "l1")
    rig.provider.script(Scripted.server_error_after_send())
    report = rig.tick()
    assert (report.unknown, report.escalated, report.searched) == (1, 1, 0)
    assert rig.events("l1")[-2:] == ["Unknown", "Escalated"]


def test_a_transient_rejection_waits_its_backoff_then_max_attempts_goes_to_review(
    rig: EngineRig,
) -> None:
    rig.submit("receipts", "k1")
    rig.provider.script(*[Scripted.rejected(transient=True)] * 3)
    assert rig.tick().rejected == 1
    job = rig.job("k1")
    assert job.state is JobState.REQUESTED and job.due_at is not None
    assert rig.tick().sent == 0  # not before the backoff
    rig.clock.now = job.due_at
    rig.tick()
    rig.clock.now = rig.job("k1").due_at or rig.clock.now
    rig.tick()
    job = rig.job("k1")
    assert (job.state, job.reason) == (JobState.REVIEW, "max-attempts")
    assert rig.provider.sends == 3 and rig.copies("k1") == 0


def test_retry_after_is_a_floor_for_the_backoff(rig: EngineRig) -> None:
    rig.submit("receipts", "k1")
    rig.provider.script(Scripted.rejected(transient=True, retry_after=45.0))
    start = rig.clock()
    rig.tick()
    due = rig.job("k1").due_at
    assert due is not None and (due - start).total_seconds() >= 45.0


def test_a_permanent_rejection_goes_to_review(rig: EngineRig) -> None:
    rig.submit("receipts", "k1")
    rig.provider.script(Scripted.rejected(transient=False))
    rig.tick()
    job = rig.job("k1")
    assert (job.state, job.reason) == (JobState.REVIEW, "rejected")
    assert rig.events("k1")[-2:] == ["Rejected", "Escalated"]


def test_a_2xx_without_an_id_is_unknown(rig: EngineRig) -> None:
    rig.submit("receipts", "k1")
    rig.provider.script(Scripted.confirmed_without_id())
    rig.tick()
    assert rig.job("k1").reason == "2xx without a readable message id"
    rig.advance_and_tick(60)
    assert rig.job("k1").state is JobState.CONFIRMED and rig.copies("k1") == 1


def test_an_attempt_without_outcome_is_recovered_after_its_deadline(rig: EngineRig) -> None:
    """A daemon killed between the claim and the outcome: the claim is in the store, the
    copy at the provider, and nothing else."""
    message_id = rig.submit("receipts", "k1")
    rig.ledger.update(
        "k1",
        lambda job: job.claim(
            provider="fake", deadline=rig.clock.now.replace(minute=1), at=rig.clock()
        ),
    )
    rig.provider.store_copy(message_id)
    rig.restart()
    assert rig.tick().recovered == 0  # the deadline has not passed
    rig.clock.advance(60)
    assert rig.tick().recovered == 1
    assert rig.job("k1").state is JobState.UNKNOWN
    rig.advance_and_tick(60)
    assert rig.job("k1").state is JobState.CONFIRMED
    assert rig.provider.sends == 0 and rig.copies("k1") == 1


def test_the_claim_deadline_is_timeout_plus_grace(rig: EngineRig) -> None:
    rig.submit("receipts", "k1")
    rig.provider.script(Scripted.dropped_response())
    start = rig.clock()
    rig.tick()
    attempted = rig.ledger.history("k1")[1]
    assert isinstance(attempted, SendJob.Attempted)
    assert (attempted.deadline - start).total_seconds() == TIMEOUT + GRACE


def test_a_job_without_policy_goes_to_review(rig: EngineRig) -> None:
    rig.submit("gone", "g1")
    rig.tick()
    job = rig.job("g1")
    assert (job.state, job.reason) == (JobState.REVIEW, "no-policy")
    assert rig.provider.sends == 0


def test_a_provider_that_replaces_message_ids_sends_unknowns_to_review(rig: EngineRig) -> None:
    rig.provider.replaces_message_id = True
    rig.submit("receipts", "k1")
    rig.tick()  # confirmed, but the read-back sees another Message-ID
    assert rig.job("k1").state is JobState.CONFIRMED
    assert rig.engine.unreliable_providers() == ["fake"]
    handle = rig.ledger.handle("fake")
    assert handle is not None and not handle.reliable
    rig.submit("receipts", "k2")
    rig.provider.script(Scripted.dropped_response())
    rig.tick()
    job = rig.job("k2")
    assert (job.state, job.reason) == (JobState.REVIEW, "handle-unreliable")
    assert rig.provider.searches == 0


def test_a_failed_search_records_nothing_and_waits(rig: EngineRig) -> None:
    rig.submit("receipts", "k1")
    rig.provider.script(Scripted.dropped_response())
    rig.tick()
    rig.clock.advance(60)
    rig.provider.fail_searches(1)
    assert rig.tick(errors=1).searched == 0
    assert rig.events("k1")[-1] == "Unknown"
    assert rig.tick().searched == 0  # held back for the provider's retry-after
    rig.clock.advance(1)
    assert rig.tick().confirmed == 1


def test_stop_makes_no_new_provider_calls(rig: EngineRig) -> None:
    rig.submit("receipts", "k1")
    rig.engine.stop()
    rig.tick()
    assert rig.provider.sends == 0 and rig.job("k1").state is JobState.REQUESTED


def test_two_engines_racing_make_one_call_per_job() -> None:
    rig = EngineRig(RETRY)
    other = rig.new_engine()
    try:
        for n in range(40):
            rig.submit("receipts", f"k{n}")
        barrier = threading.Barrier(2)
        reports = []

        def run(engine: object) -> None:
            barrier.wait()
            reports.append(engine.tick())  # type: ignore[attr-defined]

        threads = [threading.Thread(target=run, args=(e,)) for e in (rig.engine, other)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert sum(r.sent for r in reports) == 40 == rig.provider.sends
        assert all(rig.copies(f"k{n}") == 1 for n in range(40))
        assert all(r.errors == 0 for r in reports)
    finally:
        other.close()
        rig.close()


def test_a_message_that_cannot_be_built_is_never_claimed(rig: EngineRig) -> None:
    bad_from = Sender("Bad\x0bName <support@example.com>", "mail.example.com", RETRY.ref)
    content = parse_job(
        {"channel": "receipts", "key": "k1", "to": "a@example.net", "subject": "s", "body": "b"}
    )
    rig.ledger.submit(content, bad_from)
    rig.tick()
    job = rig.job("k1")
    assert (job.state, job.reason, job.attempts) == (JobState.REVIEW, "rejected", 0)
    assert rig.events("k1")[-1] == "Escalated" and rig.provider.sends == 0


@pytest.mark.parametrize("misses", [2, 3])
@pytest.mark.parametrize("late", [False, True])
def test_the_last_search_is_at_the_end_of_the_windows(misses: int, late: bool) -> None:
    """A copy indexed within search_after + (confirm_misses - 1) x search_interval is found;
    one indexed later is believed missing and a `retry` channel sends again."""
    search_after, interval = 60, 30
    window = search_after + (misses - 1) * interval
    rig = EngineRig(
        policy("receipts", on_unknown="retry", confirm_misses=misses),
        index_lag=window + 1 if late else window - 1,
    )
    try:
        rig.submit("receipts", "k1")
        rig.provider.script(Scripted.dropped_response())
        rig.tick()
        rig.advance_and_tick(search_after)
        for _ in range(misses - 1):
            rig.advance_and_tick(interval)
        rig.tick()
        assert rig.provider.sends == (2 if late else 1)
        assert rig.job("k1").state is JobState.CONFIRMED
    finally:
        rig.close()


def test_a_stop_asked_while_the_claim_is_saved_starts_no_send() -> None:
    """SIGTERM while a worker's claim is being saved (a slow commit: PostgreSQL's fsync
    under load): the claim is durable, but the stopping daemon starts no new provider call
    (docs/operations.md "Stopping"); the job's history says it was not sent, and it is sent
    once by the next run, not recovered as an unknown outcome for a human."""
    rig = EngineRig(policy("receipts", on_unknown="review"))
    try:
        rig.submit("receipts", "k1")
        save_job = rig.ledger.save_job

        def stop_during_claim_save(job: Any, **kwargs: Any) -> None:
            claiming = any(type(e).__name__ == "Attempted" for e in job.pending_events)
            save_job(job, **kwargs)
            if claiming:
                rig.engine.stop()  # the signal comes while the claim is being committed

        rig.ledger.save_job = stop_during_claim_save  # type: ignore[method-assign]
        rig.tick()
        rig.ledger.save_job = save_job  # type: ignore[method-assign]
        assert rig.provider.sends == 0, rig.events("k1")
        assert rig.job("k1").state is JobState.REQUESTED, rig.events("k1")
        rig.restart()
        for _ in range(3):
            rig.advance_and_tick(60)
        assert rig.job("k1").state is JobState.CONFIRMED, rig.events("k1")
        assert (rig.provider.sends, rig.copies("k1")) == (1, 1)
    finally:
        rig.close()


def test_a_store_that_cannot_be_written_is_one_line_per_job_not_a_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A full disk or a read-only store fails every due job's claim at every tick: each
    was logged as an 'unexpected failure' with a traceback of some twenty lines, burying
    the one line that names the store and why. It is that line, still counted an error."""
    from daemon.engine.report import Counter
    from daemon.engine.work import count_failure
    from ledger.stores.causes import StoreUnavailable

    refused = StoreUnavailable(
        "sqlite:/var/lib/sendledger/ledger.sqlite",
        "disk full: nothing more can be written",
        OSError("database or disk is full"),
    )
    counter = Counter()
    with caplog.at_level("ERROR", logger="sendledger.engine"):
        count_failure("k-1", refused, counter, "Dispatch")
    [record] = caplog.records
    assert record.getMessage() == (
        "job k-1: Dispatch failed: store sqlite:/var/lib/sendledger/ledger.sqlite: "
        "disk full: nothing more can be written (database or disk is full)"
    )
    assert record.exc_info is None
    assert counter.take().errors == 1
