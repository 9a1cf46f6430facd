"""Another daemon's handle mark written between a decision's read of the handle and the
save of that decision (docs/how-it-works.md "The read-back of the Message-ID"): the
sweep after an empty search and the claim of a job its searches requeued read the
handle from the store, decide, then save; the save holds to the handle as read and is
withdrawn by a mark written in between, in memory under the store's one lock (the real
stores: tests/integration/test_handle_guard_stores.py). Two daemons share one store;
the mark lands right after the deciding daemon's read."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import pytest
from tests.unit.engine_rig import EngineRig, policy
from tests.unit.test_races_readback import (
    RETRY,
    another_worker_marks,
    in_review_with_one_copy,
    requeued_on_a_drafts_provider,
    unknown_with_its_copy,
)

from daemon.doubles.fake_drafts import FakeDraftsProvider
from daemon.engine import Engine
from daemon.engine.readback import ProviderHealth
from ledger.application import Ledger
from ledger.job import SendJob
from ledger.provider_handle import ProviderHandle
from ledger.vocabulary import JobState


def mark_after_the_read(
    rig: EngineRig, other: Engine, monkeypatch: pytest.MonkeyPatch
) -> list[str]:
    """Once `other`'s tick has read its handles (`refresh`), its next read of the handle
    from the store, the one a decision rests on, is followed at once by the first
    daemon's read-back marking it: the list says the mark landed."""
    refresh, handle = ProviderHealth.refresh, Ledger.handle
    armed: list[bool] = []
    marked: list[str] = []

    def refreshed(health: ProviderHealth, providers: Iterable[str]) -> None:
        refresh(health, providers)
        if health is other.health and not marked:
            armed[:] = [True]

    def read(ledger: Ledger, provider: str) -> ProviderHandle | None:
        found = handle(ledger, provider)
        if armed and (found is None or found.reliable):
            armed.clear()
            marked.append(provider)
            another_worker_marks(rig)
        return found

    monkeypatch.setattr(ProviderHealth, "refresh", refreshed)
    monkeypatch.setattr(Ledger, "handle", read)
    return marked


@pytest.fixture
def rig() -> Iterator[EngineRig]:
    with EngineRig(RETRY) as rig:
        rig.provider.replaces_message_id = True  # no search can find a copy
        yield rig


def test_a_miss_decided_before_another_daemon_s_mark_is_not_saved_after_it(
    rig: EngineRig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sweep's miss read the handle unmarked, and the other daemon's read-back marked
    it before the miss was saved: the last miss was believed (the job requeued for a
    resend) on a handle marked at its commit. The save is withdrawn, nothing recorded as
    a miss, and the job goes to review."""
    unknown_with_its_copy(rig)
    other = rig.new_engine("other")
    marked = mark_after_the_read(rig, other, monkeypatch)
    other.tick()
    assert marked == ["fake"]
    assert rig.job("k1").misses == 1, rig.events("k1")  # the second miss: not recorded
    in_review_with_one_copy(rig, other)


def test_a_resend_claimed_after_another_daemon_s_mark_is_not_sent(
    rig: EngineRig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A requeued job's claim read the handle unmarked, and the other daemon's read-back
    marked it before the claim was saved: the resend went out on misses that could never
    see the first copy, a second copy. The claim's save is withdrawn, nothing sent, and
    the job goes to review at once."""
    unknown_with_its_copy(rig)
    rig.tick()  # the misses believed: requeued
    assert rig.job("k1").state is JobState.REQUESTED and rig.job("k1").requeued
    other = rig.new_engine("other")
    marked = mark_after_the_read(rig, other, monkeypatch)
    other.tick()
    assert marked == ["fake"]
    assert rig.copies("k1") == 1
    in_review_with_one_copy(rig, other)


def test_a_withdrawn_claim_s_draft_is_deleted_and_recorded() -> None:
    """With `send_via = "drafts"` the claim's draft step made a draft before the save
    was withdrawn: it is deleted as a lost claim's, its deletion in the trail, so no
    unsent copy of a job in review waits in the mailbox."""
    with (
        EngineRig(policy("receipts", on_unknown="retry")) as rig,
        pytest.MonkeyPatch.context() as mp,
    ):
        requeued_on_a_drafts_provider(rig)
        other = rig.new_engine("other")
        marked = mark_after_the_read(rig, other, mp)
        other.tick()
        assert marked == ["fake"]
        job = rig.job("k1")
        assert job.state is JobState.REVIEW, rig.events("k1")
        assert rig.copies("k1") == 1
        assert isinstance(rig.provider, FakeDraftsProvider)
        assert rig.provider.unsent_drafts(job.message_id) == 0, rig.events("k1")
        assert SendJob.DraftsDeleted in [type(e) for e in rig.ledger.history("k1")]
