"""A person's resend of a job in review for `handle-unreliable` (docs/review.md
"Resolve"): the search a resend makes first is its guard against a second copy, and on a
provider that replaces Message-IDs it can never find one. So the resend needs a note
saying how the person knows the message was not sent, at every door, as "sent" without a
copy found does; without one it is bad input naming `note`, and nothing is sent."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from tests.unit.engine_rig import EngineRig
from tests.unit.test_api_routes import AUTH, api_context
from tests.unit.test_races_readback import RETRY, another_worker_marks, unknown_with_its_copy
from tests.unit.test_services import refused, services

from daemon.api.app import create_app
from daemon.service_layer.guidance import RESEND_NEEDS_NOTE
from daemon.service_layer.services import Refusal, Services, resolve_as_a_person
from ledger.vocabulary import EscalationReason, JobState, Resolution


@pytest.fixture
def rig() -> Iterator[EngineRig]:
    rig = EngineRig(RETRY)
    rig.provider.replaces_message_id = True  # no search can find a copy
    yield rig
    rig.close()


def in_review_for_the_handle(rig: EngineRig) -> None:
    """`k1` sent (its copy stored under a replaced Message-ID), its answer lost; the
    handle marked before its next search, which sends it to review instead."""
    unknown_with_its_copy(rig)
    another_worker_marks(rig)
    rig.tick()
    job = rig.job("k1")
    assert job.state is JobState.REVIEW
    assert job.reason == EscalationReason.HANDLE_UNRELIABLE


def test_a_resend_without_a_note_is_refused_at_every_door_and_nothing_is_sent(
    rig: EngineRig,
) -> None:
    in_review_for_the_handle(rig)
    s = services(rig)
    refused_at_every_door(rig, s)
    assert rig.job("k1").state is JobState.REVIEW
    assert rig.copies("k1") == 1
    # With the note, the person's word: resent.
    note = "not in the Sent folder (To, Subject, 10:00-10:30)"
    assert resolve_as_a_person(s, "k1", Resolution.RESEND, note=note, by="ann").state is not (
        JobState.REVIEW
    )


def refused_at_every_door(rig: EngineRig, s: Services) -> None:
    """`k1`'s resend without a note: marked as needing one and never recommended, and
    refused as bad input naming `note` at the CLI's door, the API and the page."""
    view = s.job_view("k1")
    assert view.guidance is not None
    resend = next(c for c in view.guidance.choices if c.decision is Resolution.RESEND)
    assert resend.needs_note and not resend.recommended
    # The CLI's door (and the page's, below): a blank note is no note.
    message = refused(
        lambda: resolve_as_a_person(s, "k1", Resolution.RESEND, note=" ", by="ann"),
        Refusal.BAD_INPUT,
    )
    assert message == f"job.note: {RESEND_NEEDS_NOTE}"
    with TestClient(create_app(api_context(rig))) as client:
        answer = client.post(
            "/v1/review/k1/resolve", json={"as": "resend", "note": ""}, headers=AUTH
        )
        assert answer.status_code == 422, answer.text
        assert "note" in answer.text and "Sent" in answer.text
        form = {"as": "resend", "note": ""}
        answer = client.post("/ui/jobs/k1/resolve", data=form, headers=AUTH)
        assert answer.status_code == 422, answer.text
