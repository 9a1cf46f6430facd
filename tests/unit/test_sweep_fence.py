"""A sweep fences a lapsed claim's drafts for the version it loaded, never for a later one
(docs/architecture.md "Drafts never outlive their job"): on a provider that leaves drafts
(Graph), a daemon whose sweep of an Unknown job stalled while another daemon swept it and
made its next attempt must not delete that attempt's draft under its send."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from tests.unit.engine_rig import GRACE, TIMEOUT, EngineRig, policy
from tests.unit.meanwhile import Meanwhile
from tests.unit.test_resend_fence import GatedGraph, _Gate

from daemon.engine import Engine
from daemon.providers.base import ProviderError
from daemon.providers.draft_handle import Draft
from ledger.job import DRAFTS_FENCE, SendJob
from ledger.vocabulary import JobState

#: One miss is believed: the other daemon's sweep requeues the job at once.
RECEIPTS = policy("receipts", on_unknown="retry", search_after="60s", confirm_misses=1)


@pytest.fixture
def rig() -> Iterator[EngineRig]:
    with EngineRig(RECEIPTS) as made:
        made.engine.close()
        made.provider = GatedGraph("fake", clock=made.clock)
        made.provider.gate = _Gate()
        made.engine = made.new_engine()
        yield made


def graph(rig: EngineRig) -> GatedGraph:
    assert isinstance(rig.provider, GatedGraph)
    return rig.provider


def unknown_with_its_draft_left(rig: EngineRig) -> str:
    """k1's Graph send made its draft and the daemon died before sending it; recovered as
    Unknown, its sweep due now. Its Message-ID."""
    message_id = rig.submit("receipts", "k1")
    graph(rig).crash_on_create()
    rig.tick(errors=1)
    assert graph(rig).unsent_drafts(message_id) == 1
    rig.clock.advance(TIMEOUT + GRACE + 1)
    assert rig.tick().recovered == 1
    rig.clock.advance(61)
    return message_id


def before_the_listing(rig: EngineRig, hook: Meanwhile) -> None:
    """`hook` runs right before the provider's next listing of drafts by Message-ID (a
    fence's, between its load of the job and its deletions), the first time only."""
    provider = graph(rig)
    listed = provider.find_drafts

    def hook_then_list(message_id: str) -> list[Draft]:
        hook()
        return listed(message_id)

    provider.find_drafts = hook_then_list  # type: ignore[method-assign]


def test_a_stalled_sweep_s_fence_deletes_no_draft_of_the_attempt_made_since(
    rig: EngineRig,
) -> None:
    """This daemon loaded the Unknown job and began its fence; before its listing, the
    other daemon (the mailbox's scope moved to it) swept the job, fenced, missed,
    requeued it and made the next attempt's draft, its send about to go. The fence
    deleted every unsent draft with the job's Message-ID, that one too, before its save
    was refused: the send found its draft gone (Unknown) for a job nobody sent twice.
    The fence is now recorded on the version the sweep loaded before any deletion:
    refused there, it deletes nothing, and the other daemon's send is confirmed."""
    message_id = unknown_with_its_draft_left(rig)
    gate = graph(rig).gate
    other: Engine = rig.new_engine("other")

    def the_other_daemon_first() -> None:
        other.tick()  # its sweep: the fence, a miss, requeued
        assert rig.job("k1").state is JobState.REQUESTED, rig.events("k1")
        rig.clock.advance(60)  # its retry backoff
        gate.armed = True
        other.hand_out()  # the next attempt: its draft made, its send held
        assert gate.made.wait(10)
        assert graph(rig).unsent_drafts(message_id) == 1

    before_the_listing(rig, Meanwhile(the_other_daemon_first))
    try:
        report = rig.tick()
        assert graph(rig).unsent_drafts(message_id) == 1  # the next attempt's draft is there
        assert report.skipped == 1 and report.searched == 0, report  # left to the other
    finally:
        gate.release.set()
        assert other.settle(timeout=10)
    events = rig.events("k1")
    assert rig.job("k1").state is JobState.CONFIRMED, events
    assert "Unknown" not in events[events.index("Requeued") :], events
    fences = [
        e
        for e in rig.ledger.history("k1")
        if isinstance(e, SendJob.DraftsDeleted) and e.why == DRAFTS_FENCE
    ]
    assert len(fences) == 1, events  # the other daemon's, of the first attempt's draft
    assert rig.copies("k1") == 1 and graph(rig).unsent_drafts(message_id) == 0


def test_a_fence_whose_deletion_keeps_failing_records_its_drafts_once(rig: EngineRig) -> None:
    """The sweep's fence records the drafts it listed before it deletes them. When the
    deletion keeps failing (a DELETE refused each time), the sweep comes back after its
    one-second backoff, lists the same draft, and recorded it again each time: one
    DraftsDeleted more per try, without end. A draft every id of which the job records as
    deleted already is fenced without a new record: no later attempt's draft has such an
    id, so the record on the version loaded has nothing to hold back."""
    message_id = unknown_with_its_draft_left(rig)
    provider = graph(rig)
    deleted = provider.delete_draft

    def refused(draft_id: str) -> bool:
        raise ProviderError(f"delete {draft_id}: HTTP 403 (scripted)")

    provider.delete_draft = refused  # type: ignore[method-assign]
    for _ in range(3):
        rig.tick(errors=1)  # listed, (recorded,) the DELETE refused
        rig.clock.advance(2)  # past the failed fence's backoff
    provider.delete_draft = deleted  # type: ignore[method-assign]
    report = rig.tick()  # the fence deletes it now; the search misses
    assert report.searched == 1, report
    fences = [
        list(e.draft_ids)
        for e in rig.ledger.history("k1")
        if isinstance(e, SendJob.DraftsDeleted) and e.why == DRAFTS_FENCE
    ]
    assert len(fences) == 1, rig.events("k1")
    assert provider.unsent_drafts(message_id) == 0
