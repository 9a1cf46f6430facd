"""The engine with the history handle (docs/architecture.md "The history handle"), on the
memory store and the fake provider's history variant (`daemon/doubles/fake_history.py`),
with injected time: a lost reply confirmed through the history at once, no search; a miss
that proves nothing (the search decides, invariant 2 unchanged) or, with `history_after`,
one believed; a read that fails is no information and feeds the circuit; an expired start,
a claim without a historyId, a provider that reads no history, a handle marked unreliable
all leave it to the search (or review) as before; a recovered claim reads its history too;
a second writer during a read makes its save conflict, never a second confirmation."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from tests.unit.engine_rig import EngineRig, policy

from daemon.doubles.fake_history import FakeHistoryProvider
from daemon.doubles.fake_provider import FakeProvider, Scripted
from ledger.job import SendJob
from ledger.vocabulary import ConfirmedVia, EscalationReason, JobState

SEARCH_AFTER = 60.0  # the rig's policies: search_after 60s, search_interval 30s


def history_rig(
    *fields: dict[str, Any], history_lag: float = 0.0, replaces: bool = False, **options: Any
) -> EngineRig:
    """The rig with a provider that reads its history (`replaces`: and stores another
    Message-ID than ours); one channel per `fields` (named "c0", "c1", ...), "receipts"
    (retry) when none is given."""
    policies = [policy(f"c{n}", **f) for n, f in enumerate(fields)] or [
        policy("receipts", on_unknown="retry")
    ]
    rig = EngineRig(*policies, **options)
    rig.engine.close()
    rig.provider = FakeHistoryProvider(
        "fake",
        clock=rig.clock,
        index_lag=options.get("index_lag", 0.0),
        history_lag=history_lag,
        replaces_message_id=replaces,
    )
    rig.engine = rig.new_engine()
    return rig


def events(rig: EngineRig, key: str, kind: type[Any]) -> list[Any]:
    return [e for e in rig.ledger.history(key) if isinstance(e, kind)]


def vias(rig: EngineRig, key: str) -> list[str]:
    return [str(e.via) for e in events(rig, key, SendJob.Confirmed)]


def provider(rig: EngineRig) -> FakeHistoryProvider:
    assert isinstance(rig.provider, FakeHistoryProvider)
    return rig.provider


def test_a_dropped_reply_is_confirmed_through_the_history_at_once_without_a_search() -> None:
    rig = history_rig(index_lag=200.0)  # the search index would not show it for minutes
    try:
        rig.submit("receipts", "r-1")
        rig.provider.script(Scripted.dropped_response())
        rig.tick()  # the send and its Unknown, then the sweep reads the history
        job = rig.job("r-1")
        assert job.state is JobState.CONFIRMED, rig.events("r-1")
        assert vias(rig, "r-1") == [ConfirmedVia.HISTORY]
        assert rig.provider.searches == 0 and rig.copies("r-1") == 1
        [attempted] = events(rig, "r-1", SendJob.Attempted)
        [unknown] = events(rig, "r-1", SendJob.Unknown)
        assert attempted.history_id is not None
        assert unknown.history_due_at == unknown.timestamp  # read at once
        assert unknown.search_due_at == unknown.timestamp + timedelta(seconds=SEARCH_AFTER)
    finally:
        rig.close()


def test_a_lost_request_is_a_miss_that_proves_nothing_and_the_search_decides() -> None:
    rig = history_rig()
    try:
        rig.submit("receipts", "r-1")
        rig.provider.script(Scripted.lost_request())
        rig.tick()
        assert rig.events("r-1")[-2:] == ["Unknown", "HistoryMissed"]
        [missed] = events(rig, "r-1", SendJob.HistoryMissed)
        assert not missed.believed and missed.next_history_at is None
        rig.advance_and_tick(SEARCH_AFTER - 1)  # nothing before search_after
        assert rig.provider.searches == 0 and rig.provider.sends == 1
        rig.advance_and_tick(1)  # the first search: a miss
        rig.advance_and_tick(30)  # the second: believed, resent (receipts is retry)
        rig.tick()
        assert rig.provider.searches == 2 and rig.provider.sends == 2
        assert rig.job("r-1").state is JobState.CONFIRMED
        assert provider(rig).history_reads == 1  # the resend was confirmed by its answer
    finally:
        rig.close()


def test_a_failed_read_is_no_information_and_the_search_settles_it_as_before() -> None:
    rig = history_rig()
    try:
        rig.submit("receipts", "r-1")
        provider(rig).fail_history(100)
        rig.provider.script(Scripted.dropped_response())
        rig.tick(errors=1)
        assert rig.events("r-1")[-1] == "Unknown"  # nothing recorded for the failed read
        for _ in range(5):  # tried again after its backoff, never a miss
            rig.clock.advance(2)
            rig.tick(errors=1)
        assert rig.events("r-1")[-1] == "Unknown"
        rig.clock.advance(SEARCH_AFTER)
        rig.tick()  # the search is due: it decides, whatever the history does
        assert vias(rig, "r-1") == [ConfirmedVia.SEARCH] and rig.copies("r-1") == 1
    finally:
        rig.close()


def test_unavailable_reads_feed_the_circuit_as_failed_searches_do() -> None:
    rig = history_rig()
    try:
        keys = [f"r-{n}" for n in range(3)]
        for key in keys:
            rig.submit("receipts", key)
        provider(rig).fail_history(3, unavailable=True)
        rig.provider.script(*[Scripted.dropped_response() for _ in keys])
        rig.engine.tick()  # two check workers: two reads fail
        rig.engine.tick()  # the third
        assert [(c.scope, c.failures) for c in rig.engine.open_circuits()] == [("fake", 3)]
        assert all(rig.events(key)[-1] == "Unknown" for key in keys)
    finally:
        rig.close()


def unknown_unread(rig: EngineRig, key: str, channel: str = "receipts") -> str:
    """`key` sent with its reply dropped, and its first history read failed: Unknown, its
    history still to read (after the read's backoff). Its Message-ID."""
    message_id = rig.submit(channel, key)
    rig.provider.script(Scripted.dropped_response())
    provider(rig).fail_history(1)
    rig.tick(errors=1)
    assert rig.events(key)[-1] == "Unknown"
    rig.clock.advance(2)  # past the failed read's backoff
    return message_id


def test_an_expired_start_falls_back_to_the_search_and_says_so() -> None:
    rig = history_rig()
    try:
        unknown_unread(rig, "r-1")
        provider(rig).expire_history()
        rig.tick()
        [unusable] = events(rig, "r-1", SendJob.HistoryUnusable)
        assert "expired" in unusable.reason
        assert rig.job("r-1").state is JobState.UNKNOWN and rig.job("r-1").history_id is None
        rig.advance_and_tick(SEARCH_AFTER)
        assert vias(rig, "r-1") == [ConfirmedVia.SEARCH]
    finally:
        rig.close()


def test_without_a_mark_the_claim_goes_ahead_and_the_search_decides() -> None:
    rig = history_rig()
    try:
        rig.submit("receipts", "r-1")
        provider(rig).fail_marks(1)
        rig.provider.script(Scripted.dropped_response())
        rig.tick()
        [attempted] = events(rig, "r-1", SendJob.Attempted)
        [unknown] = events(rig, "r-1", SendJob.Unknown)
        assert attempted.history_id is None and unknown.history_due_at is None
        assert rig.provider.sends == 1 and provider(rig).history_reads == 0
        rig.advance_and_tick(SEARCH_AFTER)
        assert vias(rig, "r-1") == [ConfirmedVia.SEARCH]
    finally:
        rig.close()


def test_a_provider_that_reads_no_history_plans_no_read() -> None:
    rig = EngineRig(policy("receipts", on_unknown="retry"))
    try:
        assert isinstance(rig.provider, FakeProvider) and rig.provider.history() is None
        rig.submit("receipts", "r-1")
        rig.provider.script(Scripted.dropped_response())
        rig.tick()
        [attempted] = events(rig, "r-1", SendJob.Attempted)
        [unknown] = events(rig, "r-1", SendJob.Unknown)
        assert attempted.history_id is None and unknown.history_due_at is None
    finally:
        rig.close()


def test_a_job_whose_provider_no_longer_reads_history_is_left_to_the_search() -> None:
    rig = history_rig()
    try:
        unknown_unread(rig, "r-1")
        # The daemon comes back with a provider that keeps no history (a changed config).
        mailbox = rig.provider
        rig.engine.close()
        plain = FakeProvider("fake", clock=rig.clock)
        plain.copies = mailbox.copies
        rig.provider = plain
        rig.engine = rig.new_engine()
        rig.tick()
        [unusable] = events(rig, "r-1", SendJob.HistoryUnusable)
        assert unusable.reason == "provider fake reads no history"
        rig.advance_and_tick(SEARCH_AFTER)
        assert vias(rig, "r-1") == [ConfirmedVia.SEARCH]
    finally:
        rig.close()


def test_a_recovered_claim_reads_its_history_too() -> None:
    rig = history_rig()
    try:
        rig.submit("receipts", "r-1")
        rig.provider.script(Scripted.crash_during_call(stored=True))
        rig.tick(errors=1)  # the call "crashed": its claim stays, as after kill -9
        assert rig.job("r-1").state is JobState.ATTEMPTED
        rig.restart()  # the daemon's own claim: Unknown at once, its historyId kept
        rig.engine.recover_own_claims()
        rig.tick()
        assert vias(rig, "r-1") == [ConfirmedVia.HISTORY] and rig.copies("r-1") == 1
        assert rig.provider.searches == 0
    finally:
        rig.close()


def test_two_copies_in_the_history_are_a_duplicate_for_review() -> None:
    rig = history_rig()
    try:
        message_id = unknown_unread(rig, "r-1")
        rig.provider.store_copy(message_id)  # a second sender of the same message
        rig.tick()
        job = rig.job("r-1")
        assert job.state is JobState.REVIEW and job.duplicate
        assert job.reason == EscalationReason.DUPLICATE
    finally:
        rig.close()


def test_an_unreliable_handle_sends_the_unknown_to_review_without_a_read() -> None:
    rig = history_rig(replaces=True)
    try:
        rig.submit("receipts", "r-1")
        rig.tick()  # confirmed by its answer; the read-back finds another Message-ID
        rig.submit("receipts", "r-2")
        rig.provider.script(Scripted.dropped_response())
        rig.tick()
        assert rig.job("r-2").state is JobState.REVIEW
        assert rig.job("r-2").reason == EscalationReason.HANDLE_UNRELIABLE
        assert provider(rig).history_reads == 0 and rig.provider.searches == 0
    finally:
        rig.close()


def test_a_replaced_message_id_is_never_confirmed_through_the_history() -> None:
    # Before any read-back could tell: the history lists the copy, with Gmail's Message-ID.
    rig = history_rig(replaces=True)
    try:
        rig.submit("receipts", "r-1")
        rig.provider.script(Scripted.dropped_response())
        rig.tick()
        assert rig.events("r-1")[-1] == "HistoryMissed"
        assert rig.job("r-1").state is JobState.UNKNOWN
    finally:
        rig.close()


def test_history_after_confirms_a_copy_the_history_showed_late() -> None:
    rig = history_rig({"on_unknown": "retry", "history_after": "10s"}, history_lag=5.0)
    try:
        rig.submit("c0", "c-1")
        rig.provider.script(Scripted.dropped_response())
        rig.tick()
        [missed] = events(rig, "c-1", SendJob.HistoryMissed)
        [unknown] = events(rig, "c-1", SendJob.Unknown)
        assert not missed.believed
        assert missed.next_history_at == unknown.timestamp + timedelta(seconds=10)
        rig.advance_and_tick(10)
        assert vias(rig, "c-1") == [ConfirmedVia.HISTORY] and rig.provider.searches == 0
    finally:
        rig.close()


def test_history_after_believes_a_later_miss_and_the_search_follows_at_once() -> None:
    rig = history_rig({"on_unknown": "retry", "history_after": "10s"})
    try:
        rig.submit("c0", "c-1")
        rig.provider.script(Scripted.lost_request())
        rig.tick()
        unknown_at = events(rig, "c-1", SendJob.Unknown)[0].timestamp
        rig.advance_and_tick(10)  # believed: the search is due now
        rig.tick()  # and made at once
        missed = events(rig, "c-1", SendJob.HistoryMissed)
        assert [m.believed for m in missed] == [False, True]
        assert missed[1].search_due_at == unknown_at + timedelta(seconds=10)
        assert rig.provider.searches == 1  # the first search, 50 s before search_after
        rig.advance_and_tick(30)  # the second miss: believed, resent (confirm_misses = 2)
        rig.tick()
        assert rig.provider.sends == 2
        [_, miss] = events(rig, "c-1", SendJob.SearchedMiss)
        assert miss.timestamp - unknown_at == timedelta(seconds=40)  # not 60 + 30
    finally:
        rig.close()


def test_a_read_that_meets_another_writer_saves_nothing_and_the_next_one_confirms() -> None:
    rig = history_rig()
    try:
        rig.submit("receipts", "r-1")
        rig.provider.script(Scripted.dropped_response())

        def a_person_checks() -> None:
            provider(rig).during_history = None
            rig.ledger.update(
                "r-1",
                lambda job: job.record_check(
                    by="ann", purpose="check", query="q", copies=[], at=rig.clock()
                ),
            )

        provider(rig).during_history = a_person_checks
        report = rig.engine.tick()
        assert report.skipped == 1, report  # the read's save met the person's Checked
        assert rig.events("r-1")[-1] == "Checked"
        rig.tick()
        assert vias(rig, "r-1") == [ConfirmedVia.HISTORY]
        # Two daemons reading at once: the other confirms while this one's read is on its
        # way back; this one's save conflicts.
        unknown_unread(rig, "r-2")
        other = rig.new_engine("other")
        seen: list[Any] = []

        def the_other_daemon_reads() -> None:
            provider(rig).during_history = None
            seen.append(other.tick())

        provider(rig).during_history = the_other_daemon_reads
        try:
            first = rig.engine.tick()
        finally:
            other.close()
        assert (first.skipped, first.errors, seen[0].confirmed) == (1, 0, 1)
        assert vias(rig, "r-2") == [ConfirmedVia.HISTORY]
        assert provider(rig).history_reads == 5  # r-1: 2; r-2: the failed one and these two
    finally:
        rig.close()


def test_the_observed_provider_forwards_every_capability_of_the_port() -> None:
    """A daemon with metrics (its API) times the steps' calls through ObservedProvider:
    a capability it did not forward would fall back to ProviderBase's default, and the
    history would silently never be read there."""
    from daemon.engine.observer import NullObserver, ObservedProvider
    from daemon.providers.base import Provider

    declared = {
        name
        for name, value in vars(Provider).items()
        if callable(value) and not name.startswith("_")
    }
    assert declared - set(vars(ObservedProvider)) == set()
    rig = history_rig()
    try:
        assert isinstance(rig.provider, FakeHistoryProvider)
        assert ObservedProvider(rig.provider, NullObserver()).history() is rig.provider
    finally:
        rig.close()


def test_a_received_message_deleted_to_the_trash_is_not_in_the_sent_history() -> None:
    """Gmail's history lists the messages added with the SENT label: a message received
    with the job's Message-ID and deleted is not one (docs/how-it-works.md "Counting
    copies"), so the history does not confirm the job on it; the search then finds it
    only in the trash and sends the job to review."""
    rig = history_rig({"on_unknown": "retry", "history_after": "30s"})
    try:
        message_id = rig.submit("c0", "r-1")
        rig.provider.script(Scripted.lost_request())
        rig.tick()
        assert rig.events("r-1")[-2:] == ["Unknown", "HistoryMissed"]
        rig.provider.store_copy(message_id, in_trash=True)
        rig.advance_and_tick(30)  # history_after: read again, a miss believed
        rig.tick()
        job = rig.job("r-1")
        assert vias(rig, "r-1") == []
        assert (job.state, job.reason) == (JobState.REVIEW, EscalationReason.ONLY_IN_TRASH)
    finally:
        rig.close()
