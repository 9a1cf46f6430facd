"""Gmail drafts mode (`send_via = "drafts"`) met by the other actor at one exact point
(tests/unit/meanwhile.py; docs/architecture.md "The life of one job on a drafts
provider"): a claim whose call outlived its lease lands while another daemon's recovery
looks at its draft; a person's check lands while the recovery fences it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import nullcontext
from typing import Any

import pytest
from tests.unit.engine_rig import GRACE, TIMEOUT, EngineRig, policy
from tests.unit.meanwhile import Meanwhile

from daemon.doubles.fake_drafts import FakeDraftsProvider
from daemon.doubles.fake_provider import Scripted
from daemon.providers.base import SendOutcome
from daemon.providers.draft_handle import Draft
from daemon.service_layer.services import ChannelPolicies, Services
from ledger.decision_types import Review
from ledger.job import SendJob
from ledger.vocabulary import ConfirmedVia, EscalationReason, JobState

#: A channel where "not sent" would go to a person: a wrong one is a spurious review.
LEGAL = policy("legal", on_unknown="review", pending_draft="review", search_after="60s")
#: A channel that sends a draft known unsent again, and reviews an outcome it cannot know.
NOTICES = policy("notices", on_unknown="review", pending_draft="send", search_after="60s")


@pytest.fixture
def rig() -> Iterator[EngineRig]:
    rig = EngineRig(LEGAL, NOTICES)
    rig.engine.close()
    rig.provider = FakeDraftsProvider("fake", clock=rig.clock)
    rig.engine = rig.new_engine()
    yield rig
    rig.close()


def fake(rig: EngineRig) -> FakeDraftsProvider:
    assert isinstance(rig.provider, FakeDraftsProvider)
    return rig.provider


def lapsed_claim_with_its_draft(rig: EngineRig, key: str, channel: str = "legal") -> Draft:
    """`key` claimed with its draft recorded, its call gone quiet (the worker died in
    it, nothing stored yet), and its lease run out: the next tick recovers it as unknown
    and, a draft being recorded, asks the draft at once. The recorded draft."""
    rig.submit(channel, key)
    fake(rig).script(Scripted.crash_during_call(stored=False))
    rig.tick(errors=1)
    job = rig.job(key)
    assert job.state is JobState.ATTEMPTED and job.draft_id is not None
    assert job.draft_message_id is not None
    rig.clock.advance(TIMEOUT + GRACE + 1)
    return Draft(job.draft_id, job.draft_message_id)


def after(rig: EngineRig, call: str, hook: Callable[[], None]) -> None:
    """`hook` runs once the provider's `call` has answered, the first time only."""
    provider = fake(rig)
    answered = getattr(provider, call)
    once = Meanwhile(hook)

    def then_the_hook(*args: Any) -> Any:
        answer = answered(*args)
        once()
        return answer

    setattr(provider, call, then_the_hook)


def door_of(rig: EngineRig) -> Services:
    """The service layer a person's command or page acts through, on the rig's store."""
    return Services(
        rig.ledger,
        lambda: ChannelPolicies(rig.policies),
        providers=lambda _: nullcontext(rig.provider),
    )


def a_check_after(rig: EngineRig, call: str, key: str) -> list[bool]:
    """A person's `review check` of `key` made once the provider's `call` has answered,
    the first time only; whether it was recorded is appended to the list returned."""
    door = door_of(rig)
    checked: list[bool] = []
    after(rig, call, lambda: checked.append(door.check(key, by="alice").recorded))
    return checked


def the_call_lands_after(rig: EngineRig, call: str, draft: Draft) -> list[SendOutcome]:
    """The lapsed claim's drafts.send of `draft` lands once the provider's `call` (the
    recovery's check, or its fence) has answered, the first time only; what it answered
    is appended to the list returned."""
    landed: list[SendOutcome] = []
    after(rig, call, lambda: landed.append(fake(rig).send_draft(draft)))
    return landed


def test_a_lapsed_claims_send_landing_between_the_check_and_the_fence_confirms(
    rig: EngineRig,
) -> None:
    """The recovery's drafts.get says the draft is unsent; the call of the claim whose
    lease lapsed lands right after it, consuming the draft; the fence's delete finds it
    gone. "Not sent" would be false (a person asked to resend a job already delivered):
    the draft is asked again and the job confirmed by the copy it made."""
    draft = lapsed_claim_with_its_draft(rig, "k1")
    landed = the_call_lands_after(rig, "check_draft", draft)
    assert rig.tick().recovered == 1
    job = rig.job("k1")
    assert job.state is JobState.CONFIRMED, rig.events("k1")
    assert len(landed) == 1 and rig.copies("k1") == 1 and fake(rig).drafts_created == 1
    history = rig.ledger.history("k1")
    assert not [e for e in history if isinstance(e, SendJob.DraftPending | SendJob.Escalated)]
    confirmed = [e for e in history if isinstance(e, SendJob.Confirmed)]
    assert [c.via for c in confirmed] == [ConfirmedVia.DRAFT]
    assert not [e for e in history if isinstance(e, SendJob.DraftsDeleted)]  # nothing fenced


def test_a_lapsed_claims_send_landing_after_the_fence_finds_no_draft_to_send(
    rig: EngineRig,
) -> None:
    """The same call landing once the fence deleted the draft: it sends nothing (a 404),
    so "not sent" holds, and the next attempt's new draft is the one copy."""
    draft = lapsed_claim_with_its_draft(rig, "k2")
    late = the_call_lands_after(rig, "delete_draft", draft)
    assert rig.tick().recovered == 1
    assert rig.copies("k2") == 0 and len(late) == 1
    history = rig.ledger.history("k2")
    assert [e for e in history if isinstance(e, SendJob.DraftPending)]
    assert rig.job("k2").state is JobState.REVIEW  # pending_draft = "review": truly unsent


def test_a_persons_check_while_the_recovery_fences_the_draft_keeps_its_answer(
    rig: EngineRig,
) -> None:
    """The recovery's drafts.get says the lapsed claim's draft is unsent and its fence
    deletes it; a person's `review check` is recorded right then, so the recovery's save
    conflicts. Its answer was dropped with the conflict, and the next sweep found the
    draft gone, as if sent or deleted by someone: DraftGone, and on this channel a review
    of a job the daemon knew unsent (it deleted the draft itself). The answer is recorded
    on the version the check left, and the draft sent again: one copy, no review."""
    draft = lapsed_claim_with_its_draft(rig, "k3", "notices")
    checked = a_check_after(rig, "delete_draft", "k3")
    assert rig.tick().recovered == 1
    assert checked == [True]
    history = rig.ledger.history("k3")
    assert [type(e).__name__ for e in history][-3:] == ["Checked", "DraftPending", "DraftsDeleted"]
    [fence] = [e for e in history if isinstance(e, SendJob.DraftsDeleted)]
    assert fence.draft_ids == [draft.draft_id]
    rig.tick()  # the draft known unsent: a new one, sent
    assert rig.job("k3").state is JobState.CONFIRMED, rig.events("k3")
    assert rig.copies("k3") == 1
    assert not [
        e for e in rig.ledger.history("k3") if isinstance(e, SendJob.DraftGone | SendJob.Escalated)
    ]


def test_a_decision_while_the_recovery_fences_the_draft_is_not_written_over(
    rig: EngineRig,
) -> None:
    """Only facts beside the state (a check, drafts deleted) let the recovery's answer
    onto a later version: a decision made meanwhile (here another daemon's escalation)
    stands, and the recovery's save is skipped as any conflicting step's is."""
    lapsed_claim_with_its_draft(rig, "k4", "notices")
    review = Review(NOTICES.ref, EscalationReason.HANDLE_UNRELIABLE)

    def escalated() -> None:
        rig.ledger.update("k4", lambda job: job.escalate(review, detail="", at=rig.clock()))

    after(rig, "delete_draft", escalated)
    report = rig.tick()
    assert report.recovered == 1 and report.skipped == 1
    assert rig.events("k4")[-1] == "Escalated"
    assert rig.job("k4").state is JobState.REVIEW
