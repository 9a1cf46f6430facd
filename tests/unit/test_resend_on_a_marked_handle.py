"""A person's resend of a job in review for another reason than `handle-unreliable`
(here `unknown-outcome`) whose provider a read-back found replacing Message-IDs later
(docs/review.md "Resolve"): the resend's own search can no more find its copy than for
a job sent to review for the handle, so it needs a note at every door too. The rule
looks at the handle as it is at the resend, in the write of the decision: a mark
landing after the rule's read and before the commit refuses the resend as well."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from tests.unit.engine_rig import EngineRig, policy
from tests.unit.test_races_readback import another_worker_marks
from tests.unit.test_resend_on_a_note import refused_at_every_door
from tests.unit.test_services import refused, services

from daemon.doubles.fake_provider import Scripted
from daemon.service_layer.guidance import RESEND_NEEDS_NOTE
from daemon.service_layer.services import Refusal, resolve_as_a_person
from ledger.vocabulary import EscalationReason, JobState, Resolution


@pytest.fixture
def rig() -> Iterator[EngineRig]:
    """`k1` in review for `unknown-outcome` (its answer lost, its copy stored under a
    replaced Message-ID), its index caught up for a resend's search."""
    with EngineRig(policy("receipts", on_unknown="review")) as rig:
        rig.provider.replaces_message_id = True
        rig.submit("receipts", "k1")
        rig.provider.script(Scripted.dropped_response())
        rig.tick()
        assert rig.job("k1").reason == EscalationReason.UNKNOWN_OUTCOME
        rig.clock.advance(61)
        yield rig


def test_a_resend_after_a_later_mark_needs_a_note_at_every_door(rig: EngineRig) -> None:
    another_worker_marks(rig)
    s = services(rig)
    refused_at_every_door(rig, s)
    rig.tick()
    assert rig.job("k1").state is JobState.REVIEW
    assert rig.copies("k1") == 1
    note = "not in the Sent folder (To, Subject, 10:00-10:30)"
    assert resolve_as_a_person(s, "k1", Resolution.RESEND, note=note, by="ann").state is (
        JobState.REQUESTED
    )


def test_a_mark_landing_while_the_resend_searched_refuses_it(rig: EngineRig) -> None:
    """The rule read the handle unmarked; the other worker's read-back marked it while
    the resend's search was out (which, on this provider, missed the copy): the resend
    was written and sent, a second copy. It is refused as needing a note, nothing
    written or sent."""
    s = services(rig)

    def hook() -> None:
        rig.provider.during_search = None
        another_worker_marks(rig)

    rig.provider.during_search = hook
    message = refused(
        lambda: resolve_as_a_person(s, "k1", Resolution.RESEND, note="", by="ann"),
        Refusal.BAD_INPUT,
    )
    assert message == f"job.note: {RESEND_NEEDS_NOTE}"
    assert rig.job("k1").state is JobState.REVIEW
    rig.tick()
    assert rig.copies("k1") == 1


def test_a_resend_on_an_unmarked_handle_needs_no_note(rig: EngineRig) -> None:
    s = services(rig)
    job = resolve_as_a_person(s, "k1", Resolution.RESEND, note="", by="ann")
    assert job.state is JobState.REQUESTED
