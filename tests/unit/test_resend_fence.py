"""A person's resend fences the job's unsent drafts for the version it decided on, never
for a later one (docs/architecture.md "Drafts never outlive their job"): two people resend
one job at the same moment on a provider that leaves drafts (Graph; Gmail with `send_via =
"drafts"`), and the one whose read is stale must not delete the draft the other's resend
made the daemon send."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from tests.unit.engine_rig import EngineRig, policy
from tests.unit.test_races_drafts import door_of

from daemon.doubles.fake_drafts import FakeDraftsProvider, FakeGraphProvider
from daemon.doubles.fake_provider import Scripted
from daemon.providers.base import Provider
from daemon.providers.draft_handle import Draft
from daemon.providers.outcomes import SendOutcome
from daemon.service_layer.services import ChannelPolicies, Refusal, ServiceError, Services
from ledger.vocabulary import JobState, Resolution

RECEIPTS = policy("receipts", on_unknown="retry", search_after="60s")
LEGAL = policy("legal", on_unknown="review", search_after="60s")


class _Gate:
    """Holds the next draft send, once its draft is made, until `release` is set."""

    def __init__(self) -> None:
        self.armed = False
        self.made = threading.Event()
        self.release = threading.Event()

    def hold(self) -> None:
        if self.armed:
            self.armed = False
            self.made.set()
            assert self.release.wait(10)


class GatedDrafts(FakeDraftsProvider):
    gate: _Gate

    def send_draft(self, draft: Draft) -> SendOutcome:
        self.gate.hold()
        return super().send_draft(draft)


class GatedGraph(FakeGraphProvider):
    gate: _Gate

    def send_draft(self, draft: Draft) -> SendOutcome:
        self.gate.hold()
        return super().send_draft(draft)


def in_review(rig: EngineRig, kind: str) -> None:
    """Job k1 in review on a drafts provider with no draft recorded, the index caught up:
    Graph's unanswered call (its draft left, the resends' to fence); in drafts mode its
    recorded draft deleted in the mailbox before the next claim (`DraftVanished`)."""
    rig.engine.close()
    provider_class = GatedGraph if kind == "graph" else GatedDrafts
    rig.provider = provider_class("fake", clock=rig.clock)
    rig.provider.gate = _Gate()
    rig.engine = rig.new_engine()
    rig.submit("legal" if kind == "graph" else "receipts", "k1")
    rig.provider.script(Scripted.lost_request())
    rig.tick()
    if kind == "drafts":
        draft_id = rig.job("k1").draft_id
        assert draft_id is not None
        rig.provider.delete_by_person(draft_id)
        rig.tick()
    job = rig.job("k1")
    assert job.state is JobState.REVIEW and job.draft_id is None, rig.events("k1")
    rig.clock.advance(61)


@pytest.fixture(params=["graph", "drafts"])
def rig(request: pytest.FixtureRequest) -> Iterator[EngineRig]:
    with EngineRig(RECEIPTS, LEGAL) as made:
        in_review(made, request.param)
        yield made


def gated(rig: EngineRig) -> GatedDrafts | GatedGraph:
    assert isinstance(rig.provider, (GatedDrafts, GatedGraph))
    return rig.provider


def test_a_resend_decided_on_a_stale_read_deletes_no_draft_of_the_resend_saved_first(
    rig: EngineRig,
) -> None:
    """Bob's resend read the job in review; before its fence, Alice's resend of the same
    job was saved and the daemon made the next attempt's draft, its send about to go. Bob's
    fence deleted every unsent draft with the job's Message-ID, that draft too, before his
    save was refused: the send found the draft gone, and the job, sent by nobody twice,
    was recorded Unknown and searched or reviewed (a false alarm). The fence is recorded
    on the version Bob read before anything is deleted: refused there, it deletes
    nothing, and the daemon's send is confirmed."""
    provider = gated(rig)
    gate = provider.gate
    message_id = rig.job("k1").message_id

    @contextmanager
    def alice_first(_: str) -> Iterator[Provider]:
        door_of(rig).resolve("k1", Resolution.RESEND, note="not in Sent", by="alice")
        gate.armed = True
        rig.engine.hand_out()  # the next attempt: its draft made, its send held
        assert gate.made.wait(10)
        assert provider.unsent_drafts(message_id) == 1
        yield provider

    bob = Services(rig.ledger, lambda: ChannelPolicies(rig.policies), providers=alice_first)
    stale_resend_refused(rig, bob, gate.release, lambda: provider.unsent_drafts(message_id))
    assert rig.copies("k1") == 1


def stale_resend_refused(
    rig: EngineRig, bob: Services, release: threading.Event, drafts: Callable[[], int]
) -> None:
    """Bob's resend of k1, made while Alice's attempt is held with its draft made (`drafts`
    counts the job's unsent ones): refused as moved, that draft left; the attempt, then
    released, is confirmed with no Unknown after Alice's resend."""
    try:
        with pytest.raises(ServiceError) as refused:
            bob.resolve("k1", Resolution.RESEND, note="not in Sent", by="bob")
        assert refused.value.kind is Refusal.CONFLICT
        assert "resolved as resend by alice" in refused.value.message, refused.value.message
        assert drafts() == 1  # the attempt's draft is there
    finally:
        release.set()
        assert rig.engine.settle(timeout=10)
    events = rig.events("k1")
    assert rig.job("k1").state is JobState.CONFIRMED, events
    assert "Unknown" not in events[events.index("Resolved") :], events


def test_a_fence_the_store_could_not_record_deletes_nothing_and_says_so() -> None:
    """The fence's record is the first write of a resend and is made inside the provider
    call: a store that fails it then is said as the store's failure, not the mailbox's,
    and no draft is deleted (the lapsed call's draft, left here, stays for the next
    resend's fence)."""
    with EngineRig(RECEIPTS, LEGAL) as rig:
        in_review(rig, "graph")
        provider = gated(rig)
        message_id = rig.job("k1").message_id
        assert provider.unsent_drafts(message_id) == 1  # the unanswered call's draft
        ledger = rig.ledger
        saves = ledger.save_job

        def refused_once(*args: Any, **kwargs: Any) -> Any:
            ledger.save_job = saves  # type: ignore[method-assign]
            raise OSError("disk I/O error")

        ledger.save_job = refused_once  # type: ignore[method-assign]
        with pytest.raises(ServiceError) as refused:
            door_of(rig).resolve("k1", Resolution.RESEND, note="not in Sent", by="bob")
        assert refused.value.kind is Refusal.UNAVAILABLE
        assert "could not be recorded in the store" in refused.value.message
        assert "disk I/O error" in refused.value.message
        assert provider.unsent_drafts(message_id) == 1
        assert rig.job("k1").state is JobState.REVIEW
