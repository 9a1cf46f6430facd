"""Gmail drafts mode (`send_via = "drafts"`) met by the other actor at one exact point
(tests/unit/meanwhile.py; docs/architecture.md "The life of one job on a drafts
provider"): a claim whose call outlived its lease lands while another daemon's recovery
looks at its draft."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from tests.unit.engine_rig import GRACE, TIMEOUT, EngineRig, policy
from tests.unit.meanwhile import Meanwhile

from daemon.doubles.fake_drafts import FakeDraftsProvider
from daemon.doubles.fake_provider import Scripted
from daemon.providers.base import SendOutcome
from daemon.providers.draft_handle import Draft
from ledger.job import SendJob
from ledger.vocabulary import ConfirmedVia, JobState

#: A channel where "not sent" would go to a person: a wrong one is a spurious review.
LEGAL = policy("legal", on_unknown="review", pending_draft="review", search_after="60s")


@pytest.fixture
def rig() -> Iterator[EngineRig]:
    rig = EngineRig(LEGAL)
    rig.engine.close()
    rig.provider = FakeDraftsProvider("fake", clock=rig.clock)
    rig.engine = rig.new_engine()
    yield rig
    rig.close()


def fake(rig: EngineRig) -> FakeDraftsProvider:
    assert isinstance(rig.provider, FakeDraftsProvider)
    return rig.provider


def lapsed_claim_with_its_draft(rig: EngineRig, key: str) -> Draft:
    """`key` claimed with its draft recorded, its call gone quiet (the worker died in
    it, nothing stored yet), and its lease run out: the next tick recovers it as unknown
    and, a draft being recorded, asks the draft at once. The recorded draft."""
    rig.submit("legal", key)
    fake(rig).script(Scripted.crash_during_call(stored=False))
    rig.tick(errors=1)
    job = rig.job(key)
    assert job.state is JobState.ATTEMPTED and job.draft_id is not None
    assert job.draft_message_id is not None
    rig.clock.advance(TIMEOUT + GRACE + 1)
    return Draft(job.draft_id, job.draft_message_id)


def the_call_lands_after(rig: EngineRig, call: str, draft: Draft) -> list[SendOutcome]:
    """The lapsed claim's drafts.send of `draft` lands once the provider's `call` (the
    recovery's check, or its fence) has answered, the first time only; what it answered
    is appended to the list returned."""
    provider = fake(rig)
    answered = getattr(provider, call)
    landed: list[SendOutcome] = []
    lands = Meanwhile(lambda: landed.append(provider.send_draft(draft)))

    def then_the_call_lands(*args: Any) -> Any:
        answer = answered(*args)
        lands()
        return answer

    setattr(provider, call, then_the_call_lands)
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
