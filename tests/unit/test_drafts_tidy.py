"""No draft outlives its job (docs/architecture.md "Drafts never outlive their job"): once a
job is settled, every unsent draft of it is deleted `search_after` later and the deletion
is an event in its history; a sweep fences a lapsed claim's drafts before it counts; a
person's check deletes nothing."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from datetime import timedelta

import pytest
from tests.unit.engine_rig import GRACE, TIMEOUT, EngineRig, policy
from tests.unit.jobs import MESSAGE_ID, POLICY, QUERY, requested_job
from tests.unit.test_races_drafts import a_check_after

from daemon.doubles.fake_drafts import FakeDraftsProvider, FakeGraphProvider
from daemon.doubles.fake_provider import Scripted
from daemon.doubles.fake_time import FakeClock
from daemon.engine.tick import Engine
from daemon.providers.draft_handle import BeforeDeleting
from daemon.service_layer.services import ChannelPolicies, Refusal, ServiceError, Services
from ledger import decision_types as decide
from ledger.delivery_reports import BouncedRecipient, DeliveryReport
from ledger.job import DRAFTS_FENCE, DRAFTS_TIDY, SendJob, TransitionError
from ledger.lifecycle import LIFECYCLE
from ledger.vocabulary import FINAL_STATES, EscalationReason, JobState, Resolution

LAG = 30.0
RECEIPTS = policy("receipts", on_unknown="retry", search_after="60s")
LEGAL = policy("legal", on_unknown="review", pending_draft="review", search_after="60s")


def rig_with(provider_class: type[FakeDraftsProvider]) -> EngineRig:
    rig = EngineRig(RECEIPTS, LEGAL, index_lag=LAG)
    rig.engine.close()
    rig.provider = provider_class("fake", clock=rig.clock, index_lag=LAG)
    rig.engine = rig.new_engine()
    return rig


@pytest.fixture
def drafts() -> Iterator[EngineRig]:
    rig = rig_with(FakeDraftsProvider)
    yield rig
    rig.close()


@pytest.fixture
def graph() -> Iterator[EngineRig]:
    rig = rig_with(FakeGraphProvider)
    yield rig
    rig.close()


def fake(rig: EngineRig) -> FakeDraftsProvider:
    assert isinstance(rig.provider, FakeDraftsProvider)
    return rig.provider


def deletions(rig: EngineRig, key: str) -> list[SendJob.DraftsDeleted]:
    return [e for e in rig.ledger.history(key) if isinstance(e, SendJob.DraftsDeleted)]


def test_a_draft_a_lost_create_answer_left_is_deleted_once_the_job_is_confirmed(
    drafts: EngineRig,
) -> None:
    drafts.submit("receipts", "k1")
    fake(drafts).lose_create_answers(1)
    drafts.tick(errors=1)  # the draft exists; the answer never came: no claim
    drafts.tick()  # the list does not show it yet (lag): a second draft, claimed, sent
    job = drafts.job("k1")
    assert job.state is JobState.CONFIRMED and drafts.copies("k1") == 1
    assert fake(drafts).unsent_drafts(job.message_id) == 1  # the first one
    assert job.tidy_at is not None and not job.purgeable
    drafts.clock.advance(59)
    assert drafts.tick().tidied == 0  # the lag is waited out first
    drafts.clock.advance(1)
    assert drafts.tick().tidied == 1
    [deleted] = deletions(drafts, "k1")
    assert deleted.why == DRAFTS_TIDY and len(deleted.draft_ids) == 1
    job = drafts.job("k1")
    assert fake(drafts).unsent_drafts(job.message_id) == 0
    assert job.tidy_at is None and job.purgeable and drafts.copies("k1") == 1


def test_a_persons_check_during_the_tidy_leaves_its_deletion_in_the_trail(
    drafts: EngineRig,
) -> None:
    """A person's `review check` of the confirmed job recorded while its tidy deleted
    the draft a lost create answer left: the tidy's save conflicted and its record was
    dropped, and the next tidy, finding nothing left, recorded that none was deleted.
    The deletion is recorded after the check, on the version it left."""
    drafts.submit("receipts", "k1")
    fake(drafts).lose_create_answers(1)
    drafts.tick(errors=1)
    drafts.tick()  # a second draft, sent: the first one is left
    message_id = drafts.job("k1").message_id
    assert fake(drafts).unsent_drafts(message_id) == 1
    checked = a_check_after(drafts, "delete_drafts", "k1")
    drafts.clock.advance(60)
    assert drafts.tick().tidied == 1 and checked == [True]
    types = [type(e).__name__ for e in drafts.ledger.history("k1")]
    assert types[-2:] == ["Checked", "DraftsDeleted"], types
    [deleted] = deletions(drafts, "k1")
    assert deleted.why == DRAFTS_TIDY and len(deleted.draft_ids) == 1
    assert drafts.job("k1").purgeable and fake(drafts).unsent_drafts(message_id) == 0


def test_a_tidy_that_finds_nothing_says_so_once(drafts: EngineRig) -> None:
    drafts.submit("receipts", "k1")
    drafts.tick()
    drafts.clock.advance(61)
    drafts.tick()
    drafts.clock.advance(600)
    drafts.tick()
    [deleted] = deletions(drafts, "k1")
    assert deleted.draft_ids == [] and drafts.job("k1").due_at is None


def test_a_running_daemon_tidies_its_confirmed_jobs(
    drafts: EngineRig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The daemon's tick (`hand_out`) waits for nothing. Verify and the confirmed jobs' Tidy
    read the same due rows; handed out apart, Verify's loads of the rows due for a tidy
    held every check worker when Tidy was offered them, tick after tick, and no confirmed
    job was ever tidied (bench/soak.py --mode drafts: 97 of 137 after 15 minutes). The
    check workers start only once `hand_out` has returned, as on a busy machine."""
    keys = [f"k{n}" for n in range(6)]
    for key in keys:
        drafts.submit("receipts", key)
    drafts.tick()
    drafts.clock.advance(60)
    gate = threading.Event()
    get_job = drafts.ledger.get_job

    def held(key: str) -> SendJob:
        assert gate.wait(10)
        return get_job(key)

    monkeypatch.setattr(drafts.ledger, "get_job", held)
    for _ in range(len(keys)):  # two check workers (the rig's concurrency): two a tick
        gate.clear()
        drafts.engine.hand_out()
        gate.set()
        assert drafts.engine.settle(timeout=10)
    assert [[d.why for d in deletions(drafts, key)] for key in keys] == [[DRAFTS_TIDY]] * 6
    assert all(drafts.job(key).due_at is None for key in keys)


def test_no_draft_is_made_for_a_job_another_daemon_settled_since_it_was_loaded(
    drafts: EngineRig,
) -> None:
    """A send worker loads its jobs 8 or more at a time; another daemon may claim, send
    and tidy one before this worker's draft step reaches it. A draft made then would be
    deleted only by this claim's loss: with its create answer lost, or this daemon killed
    first, it stayed in the mailbox (bench/soak.py --mode drafts: 18 of 4,000 jobs). The
    step now sees that the job moved and makes none."""
    drafts.submit("receipts", "k1")
    [stale] = drafts.engine._send_steps.load(["k1"])  # loaded here, sent by the other daemon
    other = drafts.new_engine("other-daemon")
    try:
        other.tick()
        drafts.clock.advance(60)
        other.tick()  # and tidied
    finally:
        other.close()
    assert [d.why for d in deletions(drafts, "k1")] == [DRAFTS_TIDY]
    assert drafts.engine._dispatch.dispatch(stale) is False
    assert fake(drafts).drafts_created == 1  # the other daemon's, sent
    assert fake(drafts).unsent_drafts(drafts.job("k1").message_id) == 0
    assert drafts.copies("k1") == 1


def test_an_abandoned_job_loses_its_pending_draft(drafts: EngineRig) -> None:
    drafts.submit("legal", "k1")
    drafts.provider.script(Scripted.lost_request())  # the draft stays: pending, review
    drafts.tick()
    job = drafts.job("k1")
    assert job.state is JobState.REVIEW and fake(drafts).unsent_drafts(job.message_id) == 1
    door = Services(
        drafts.ledger,
        lambda: ChannelPolicies(drafts.policies),
        providers=lambda name: nullcontext(drafts.provider),
        draft_providers=frozenset({"fake"}),
    )
    door.resolve("k1", Resolution.ABANDON, note="not needed", by="alice")
    drafts.clock.advance(61)
    assert drafts.tick().tidied == 1
    assert fake(drafts).unsent_drafts(job.message_id) == 0
    assert drafts.copies("k1") == 0


def test_a_failed_tidy_records_nothing_and_is_tried_again(drafts: EngineRig) -> None:
    drafts.submit("receipts", "k1")
    drafts.tick()
    drafts.clock.advance(61)
    original = fake(drafts).delete_drafts
    failures = iter([True])

    def flaky(message_id: str, before_deleting: BeforeDeleting | None = None) -> list[str]:
        if next(failures, False):
            from daemon.providers.base import ProviderError

            raise ProviderError("drafts.list: timed out", timed_out=True)
        return original(message_id, before_deleting)

    fake(drafts).delete_drafts = flaky  # type: ignore[method-assign]
    assert drafts.tick(errors=1).tidied == 0 and deletions(drafts, "k1") == []
    drafts.clock.advance(2)
    assert drafts.tick().tidied == 1


def test_a_messages_mode_provider_tidies_nothing() -> None:
    rig = EngineRig(RECEIPTS)
    try:
        rig.submit("receipts", "k1")
        rig.tick()
        assert rig.job("k1").tidy_at is None and rig.job("k1").purgeable
    finally:
        rig.close()


def test_graph_a_lapsed_claims_draft_is_fenced_before_the_count(graph: EngineRig) -> None:
    graph.submit("receipts", "k1")
    fake(graph).crash_on_create()  # the draft exists, the daemon died before its send
    graph.tick(errors=1)
    job = graph.job("k1")
    assert job.state is JobState.ATTEMPTED and fake(graph).unsent_drafts(job.message_id) == 1
    graph.clock.advance(TIMEOUT + GRACE + 1)
    assert graph.tick().recovered == 1
    graph.clock.advance(61)
    graph.tick()  # the sweep: the fence first, then the search
    fences = [d for d in deletions(graph, "k1") if d.why == DRAFTS_FENCE]
    assert len(fences) == 1 and len(fences[0].draft_ids) == 1
    for _ in range(4):
        graph.clock.advance(61)
        graph.tick()
    assert graph.job("k1").state is JobState.CONFIRMED
    assert graph.copies("k1") == 1
    assert fake(graph).unsent_drafts(job.message_id) == 0


def test_graph_a_persons_check_while_the_sweep_fences_leaves_the_fence_in_the_trail(
    graph: EngineRig,
) -> None:
    """A person's `review check` recorded between the fence's listing and its record: the
    sweep's save conflicted, and the deletion (it happened) and the search's answer were
    both dropped; the next sweep found nothing to delete, so the trail never said the
    lapsed claim's draft was deleted. The fence (recorded before its deletion) and the
    answer are now recorded on the version the check left."""
    graph.submit("receipts", "k1")
    fake(graph).crash_on_create()  # the draft exists, the daemon died before its send
    graph.tick(errors=1)
    graph.clock.advance(TIMEOUT + GRACE + 1)
    assert graph.tick().recovered == 1
    checked = a_check_after(graph, "find_drafts", "k1")
    graph.clock.advance(61)
    assert graph.tick().searched == 1 and checked == [True]
    types = [type(e).__name__ for e in graph.ledger.history("k1")]
    assert types[-3:] == ["Checked", "DraftsDeleted", "SearchedMiss"], types
    [fence] = [d for d in deletions(graph, "k1") if d.why == DRAFTS_FENCE]
    assert len(fence.draft_ids) == 1


def test_graph_a_persons_check_during_a_send_deletes_nothing(graph: EngineRig) -> None:
    import threading

    release = threading.Event()
    graph.submit("legal", "k1")
    graph.provider.script(Scripted.slow(release))
    graph.engine.hand_out()
    assert graph.engine.settle(busy=lambda: graph.provider.hanging, timeout=10)
    door = Services(
        graph.ledger,
        lambda: ChannelPolicies(graph.policies),
        providers=lambda name: nullcontext(graph.provider),
    )
    message_id = graph.job("k1").message_id
    answer = door.check("k1", by="alice")
    assert answer.count == 0 and not answer.recorded  # a send is in flight
    assert fake(graph).unsent_drafts(message_id) == 1  # its draft is still there
    release.set()
    assert graph.engine.settle(timeout=10)
    assert graph.job("k1").state is JobState.CONFIRMED and graph.copies("k1") == 1


@contextmanager
def stalled_in_review(graph: EngineRig) -> Iterator[tuple[threading.Event, Engine, Services]]:
    """Job k1 of "legal" whose draft is made and whose send hangs in this daemon; no
    renewal reached the store, so another daemon recovered the claim and the job is in
    review, the index caught up. Yields the hung call's release, the other daemon and a
    door with the provider (the hung call is released and the daemon closed after)."""
    release = threading.Event()
    graph.submit("legal", "k1")
    graph.provider.script(Scripted.slow(release))  # the draft is made, its send hangs
    graph.engine.hand_out()
    assert graph.engine.settle(busy=lambda: graph.provider.hanging, timeout=10)
    other = graph.new_engine("other")
    try:
        graph.clock.advance(TIMEOUT + GRACE + 1)
        assert other.tick().recovered == 1
        assert graph.job("k1").state is JobState.REVIEW
        graph.clock.advance(61)
        door = Services(
            graph.ledger,
            lambda: ChannelPolicies(graph.policies),
            providers=lambda name: nullcontext(graph.provider),
            draft_providers=frozenset({"fake"}),
        )
        yield release, other, door
    finally:
        release.set()
        other.close()


def test_graph_a_persons_resend_fences_a_lapsed_claims_draft_first(graph: EngineRig) -> None:
    """The daemon stalled with its send out: the lease lapsed, the job went to review, and
    the late call could still send its draft after the person's search missed. The resend
    deletes the job's unsent drafts before it searches, so the late call sends nothing."""
    with stalled_in_review(graph) as (release, other, door):
        message_id = graph.job("k1").message_id
        door.resolve("k1", Resolution.RESEND, note="", by="alice")
        [fence] = [d for d in deletions(graph, "k1") if d.why == DRAFTS_FENCE]
        types = [type(e).__name__ for e in graph.ledger.history("k1")]
        assert types.index("DraftsDeleted") < types.index("Resolved")
        assert fence.draft_ids and fake(graph).unsent_drafts(message_id) == 0
        release.set()  # the late call: its draft is gone, nothing goes out
        assert graph.engine.settle(timeout=10)
        assert graph.copies("k1") == 0
        other.tick()  # the resend
        assert graph.job("k1").state is JobState.CONFIRMED and graph.copies("k1") == 1


def test_graph_a_resend_whose_search_fails_after_the_fence_records_the_deletion(
    graph: EngineRig,
) -> None:
    """The fence deleted the lapsed claim's draft, then the search could not be made: the
    resend is refused (nothing sent), and the deletion, which happened, is in the trail."""
    with stalled_in_review(graph) as (release, _, door):
        message_id = graph.job("k1").message_id
        fake(graph).fail_searches(1)
        with pytest.raises(ServiceError) as refused:
            door.resolve("k1", Resolution.RESEND, note="", by="alice")
        assert refused.value.kind is Refusal.UNAVAILABLE
        assert "nothing was sent" in refused.value.message
        [fence] = [d for d in deletions(graph, "k1") if d.why == DRAFTS_FENCE]
        assert fence.draft_ids and fake(graph).unsent_drafts(message_id) == 0
        assert graph.job("k1").state is JobState.REVIEW
        release.set()
        assert graph.engine.settle(timeout=10)
        assert graph.copies("k1") == 0


def test_no_job_a_tidy_runs_on_is_ever_sent_again() -> None:
    """The tidy deletes first and records after (`search.py: Tidy`), which is safe only
    because no final job is ever sent again: the only way out of a final state is a
    confirmed job's escalation, for a permanent bounce or for a recount that found two
    copies, and a resend of either is refused. Were one resent, a tidy stalled between
    its load and its listing could list the next attempt's draft and delete it under its
    send."""
    leaving = {
        (event, after)
        for before, event, after in LIFECYCLE
        if before in FINAL_STATES and after not in FINAL_STATES
    }
    assert leaving == {("Escalated", JobState.REVIEW)}
    clock = FakeClock()
    at = clock.now
    bounce = DeliveryReport(
        report_id="<report-1@mx.example.net>",
        original_message_id=MESSAGE_ID,
        reporter="dns; mx.example.net",
        recipients=(BouncedRecipient("bob@example.com", "5.1.1", "failed", "550 unknown"),),
    )
    to_review: list[Callable[[SendJob], None]] = [
        lambda job: job.record_bounce(
            bounce,
            provider_message_id="r1",
            decision=decide.Review(POLICY, EscalationReason.BOUNCED),
            at=at,
        ),
        lambda job: job.record_search(
            query=QUERY,
            copies=["m1", "m2"],
            count=2,
            complete=True,
            decision=decide.Duplicate(POLICY),
            at=at,
        ),
    ]
    for escalate in to_review:
        job = requested_job(clock)
        job.claim(provider="support", deadline=at + timedelta(seconds=30), at=at)
        confirm = decide.Confirm(POLICY, verify_at=at, watch_until=at + timedelta(days=1))
        job.record_response(provider_message_id="m1", decision=confirm, at=at)
        escalate(job)
        assert job.state is JobState.REVIEW
        with pytest.raises(TransitionError):
            job.resolve(Resolution.RESEND, note="try again", by="alice", at=at)
