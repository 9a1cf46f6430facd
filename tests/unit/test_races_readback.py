"""A read-back's mark racing a search or a resend (docs/architecture.md "The message",
docs/how-it-works.md "The read-back of the Message-ID"): a provider found replacing our
Message-ID makes every search miss, so a miss read while a read-back (of this daemon or
another) marked the handle is no evidence that nothing was sent, nor is a resend those
misses decided before the mark. Each race is driven deterministically: the provider's
search answer, or the save of the requeue, runs the other worker's send and read-back
before the daemon goes on."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import nullcontext
from typing import Any

import pytest
from tests.unit.engine_rig import EngineRig, policy

from daemon.doubles.fake_drafts import FakeDraftsProvider
from daemon.doubles.fake_provider import Scripted
from daemon.engine import Engine
from daemon.service_layer.services import ChannelPolicies, Services
from ledger.job import SendJob
from ledger.message import render
from ledger.vocabulary import EscalationReason, JobState

RETRY = policy("receipts", on_unknown="retry")


@pytest.fixture
def rig() -> Iterator[EngineRig]:
    rig = EngineRig(RETRY)
    # The provider replaces every Message-ID it stores: no search can find a copy.
    rig.provider.replaces_message_id = True
    yield rig
    rig.close()


def another_worker_marks(rig: EngineRig) -> None:
    """What a send worker does meanwhile: job `k2` sent and confirmed, its stored copy's
    Message-ID read back and found replaced (the handle marked unreliable)."""
    rig.submit("receipts", "k2")
    job = rig.job("k2")
    raw = render(job)
    sent = rig.provider.send_raw(raw)
    assert sent.provider_message_id is not None
    rig.engine.health.read_back(job, "fake", rig.provider, sent.provider_message_id, raw=raw)
    assert not rig.engine.health.reliable("fake")


def unknown_with_its_copy(rig: EngineRig) -> None:
    """`k1` sent, its answer lost (a copy stored, under a replaced Message-ID): Unknown;
    its first search misses, the second is due."""
    rig.submit("receipts", "k1")
    rig.provider.script(Scripted.dropped_response())
    rig.tick()
    assert rig.job("k1").state is JobState.UNKNOWN
    rig.advance_and_tick(61)  # the first search: a miss, searched again
    assert rig.job("k1").misses == 1
    rig.clock.advance(31)


def test_a_miss_read_while_the_handle_was_marked_sends_the_job_to_review_not_again(
    rig: EngineRig,
) -> None:
    """The search that would believe the misses is out when another worker's read-back
    finds the provider replacing Message-IDs. Its miss was recorded as evidence, the job
    resent on a `retry` channel: a second copy, though the daemon knew before it recorded
    the miss that its searches cannot find one."""
    unknown_with_its_copy(rig)

    def hook() -> None:
        rig.provider.during_search = None
        another_worker_marks(rig)

    rig.provider.during_search = hook
    rig.tick()
    job = rig.job("k1")
    assert job.state is JobState.REVIEW
    assert job.reason == EscalationReason.HANDLE_UNRELIABLE
    rig.advance_and_tick(60)
    assert rig.copies("k1") == 1


def test_a_miss_read_while_another_daemon_marked_the_handle_sends_the_job_to_review(
    rig: EngineRig,
) -> None:
    """The same race across two daemons sharing the store: the mark is written by the
    other daemon's read-back, and this one reads the handles from the store once a tick.
    Its miss, read after the mark was written and before its next tick, was believed."""
    unknown_with_its_copy(rig)
    other = rig.new_engine("other")

    def hook() -> None:
        rig.provider.during_search = None
        another_worker_marks(rig)  # this rig's first daemon, not `other`
        assert other.health.reliable("fake")

    rig.provider.during_search = hook
    other.tick()
    in_review_with_one_copy(rig, other)


def in_review_with_one_copy(rig: EngineRig, other: Engine) -> None:
    """`k1` in review for the handle, and neither daemon sends it again later."""
    job = rig.job("k1")
    assert job.state is JobState.REVIEW, rig.events("k1")
    assert job.reason == EscalationReason.HANDLE_UNRELIABLE
    rig.clock.advance(60)
    other.tick()
    rig.tick()
    assert rig.copies("k1") == 1


def test_a_resend_the_misses_decided_before_the_handle_was_marked_is_not_sent(
    rig: EngineRig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The misses were believed on a handle taken for reliable, and the job requeued
    (due at once); a read-back then found the provider replacing Message-IDs before the
    send worker claimed the job. The resend rested on searches that could never have
    found its copy, and went out all the same: a second copy."""
    unknown_with_its_copy(rig)
    save_job = rig.ledger.save_job
    marked: list[bool] = []

    def then_another_worker_marks(job: SendJob, **kwargs: Any) -> None:
        save_job(job, **kwargs)
        if not marked and job.state is JobState.REQUESTED:
            marked.append(True)  # the requeue is durable: the read-back lands now
            another_worker_marks(rig)

    monkeypatch.setattr(rig.ledger, "save_job", then_another_worker_marks)
    rig.tick()
    assert marked and rig.job("k1").state is JobState.REQUESTED  # requeued, then marked
    rig.tick()  # the send worker takes it
    job = rig.job("k1")
    assert job.state is JobState.REVIEW
    assert job.reason == EscalationReason.HANDLE_UNRELIABLE
    rig.advance_and_tick(60)
    assert rig.copies("k1") == 1


def test_a_check_after_the_handle_was_marked_advises_no_resend_on_its_miss() -> None:
    """A job in review (an unknown outcome, its searches made on trust); a read-back then
    found the provider replacing Message-IDs. A person's check finds no copy, as every
    search of that provider would, and its advice said a resend was safe."""
    with EngineRig(policy("receipts", on_unknown="review")) as rig:
        rig.provider.replaces_message_id = True
        rig.submit("receipts", "k1")
        rig.provider.script(Scripted.dropped_response())
        rig.tick()
        assert rig.job("k1").state is JobState.REVIEW
        another_worker_marks(rig)
        rig.clock.advance(61)
        door = Services(
            rig.ledger,
            lambda: ChannelPolicies(rig.policies),
            providers=lambda name: nullcontext(rig.provider),
        )
        answer = door.check("k1", by="alice")
        assert answer.count == 0 and answer.recorded
        assert "is safe" not in answer.advice
        assert "replaces Message-IDs" in answer.advice and "by hand" in answer.advice
        assert answer.as_dict()["advice"] == answer.advice


def test_a_resend_the_misses_decided_stays_theirs_after_a_later_draft_was_found_unsent() -> None:
    """The misses were believed (the first attempt's copy under a replaced Message-ID)
    and the job requeued; the resend, made through a draft, lost its answer and its
    draft was found unsent, so it was due again; a read-back then found the provider
    replacing Message-IDs. The draft proved the resend unsent, not the first attempt:
    sending again still rested on misses that could never see its copy."""
    with EngineRig(policy("receipts", on_unknown="retry", pending_draft="send")) as rig:
        requeued_on_a_drafts_provider(rig)
        rig.provider.script(Scripted.lost_request())
        rig.tick()  # the resend: its draft made, its answer lost, the draft still unsent
        job = rig.job("k1")
        assert job.state is JobState.REQUESTED, rig.events("k1")
        assert [type(e) for e in rig.ledger.history("k1")].count(SendJob.DraftPending) == 1
        another_worker_marks(rig)
        rig.advance_and_tick(60)
        job = rig.job("k1")
        assert job.state is JobState.REVIEW, rig.events("k1")
        assert job.reason == EscalationReason.HANDLE_UNRELIABLE
        assert rig.copies("k1") == 1


def requeued_on_a_drafts_provider(rig: EngineRig) -> None:
    """`k1`'s first attempt made without a draft on a drafts provider that replaces
    Message-IDs, its misses believed (requeued), then the daemon in drafts mode."""
    rig.engine.close()
    rig.provider = FakeDraftsProvider("fake", clock=rig.clock, replaces_message_id=True)
    rig.engine = rig.new_engine()
    rig.provider.send_via = "messages"  # the first attempt made without a draft
    unknown_with_its_copy(rig)
    rig.tick()  # the misses believed: requeued
    assert rig.job("k1").state is JobState.REQUESTED and rig.job("k1").requeued
    rig.provider.send_via = "drafts"  # restarted in drafts mode
