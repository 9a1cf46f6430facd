"""A copy found only in the sender's trash settles nothing (docs/how-it-works.md "Counting
copies"): a message *received* with a job's Message-ID (anyone who knows the job's key
can compute it) and deleted lies there as a sent copy deleted by its sender does. The
sweep sends such a job to review (`only-in-trash`), never Confirmed and never a miss; a
human's check says where each copy was found, and triage leaves the job for a person.
"""

from __future__ import annotations

from collections.abc import Iterator
from html import unescape

import pytest
from fastapi.testclient import TestClient
from tests.unit.engine_rig import EngineRig, policy
from tests.unit.test_api_routes import AUTH, api_context
from tests.unit.test_services import services

from daemon.api.app import create_app
from daemon.doubles.fake_provider import Scripted
from daemon.providers.outcomes import SearchHit, SearchResult
from daemon.service_layer.services import ServiceError, resolve_as_a_person
from ledger.decision_types import Review
from ledger.job import SendJob, TransitionError
from ledger.vocabulary import EscalationReason, JobState, Resolution

RETRY = policy("receipts", on_unknown="retry")
TRASH_SAYS = "a copy only in the trash: sent and deleted by its sender, or received and deleted"


@pytest.fixture
def rig() -> Iterator[EngineRig]:
    with EngineRig(RETRY) as rig:
        yield rig


def _lost_then_received_in_trash(rig: EngineRig, key: str) -> str:
    """A send that never reached the provider (Unknown to the daemon), and a message with
    the job's Message-ID received and deleted by the mailbox's user: the received copy
    is the trash's only one. Its provider id."""
    message_id = rig.submit("receipts", key)
    rig.provider.script(Scripted.lost_request())
    assert rig.tick().unknown == 1
    return rig.provider.store_copy(message_id, in_trash=True)


def _in_review(rig: EngineRig, key: str) -> str:
    """The job sent to review by its search (`_lost_then_received_in_trash`)."""
    trashed = _lost_then_received_in_trash(rig, key)
    rig.advance_and_tick(60)  # search_after
    return trashed


def test_a_received_message_in_the_trash_sends_an_unknown_job_to_review_not_confirmed(
    rig: EngineRig,
) -> None:
    trashed = _lost_then_received_in_trash(rig, "k1")
    report = rig.advance_and_tick(60)  # search_after
    job = rig.job("k1")
    assert (report.searched, report.confirmed) == (1, 0)
    assert (job.state, job.reason) == (JobState.REVIEW, EscalationReason.ONLY_IN_TRASH)
    # Neither a confirmation nor a miss toward a resend: one search, one escalation.
    assert rig.events("k1")[-1:] == ["Escalated"] and job.misses == 0
    escalated = rig.ledger.history("k1")[-1]
    assert isinstance(escalated, SendJob.Escalated)
    assert escalated.detail == f"{TRASH_SAYS}: {trashed}"
    rig.advance_and_tick(3600)
    assert rig.provider.sends == 1 and rig.job("k1").state is JobState.REVIEW


def test_beside_a_sent_copy_the_trash_is_not_counted(rig: EngineRig) -> None:
    message_id = rig.submit("receipts", "k1")
    rig.provider.script(Scripted.dropped_response())  # the sent copy is stored
    rig.tick()
    rig.provider.store_copy(message_id, in_trash=True)
    rig.advance_and_tick(60)
    job = rig.job("k1")
    assert job.state is JobState.CONFIRMED and not job.duplicate
    assert rig.provider.sends == 1


def test_two_copies_only_in_the_trash_are_no_duplicate_either(rig: EngineRig) -> None:
    message_id = rig.submit("receipts", "k1")
    rig.provider.script(Scripted.lost_request())
    rig.tick()
    first = rig.provider.store_copy(message_id, in_trash=True)
    second = rig.provider.store_copy(message_id, in_trash=True)
    rig.advance_and_tick(60)
    job = rig.job("k1")
    assert (job.reason, job.duplicate) == (EscalationReason.ONLY_IN_TRASH, False)
    escalated = rig.ledger.history("k1")[-1]
    assert isinstance(escalated, SendJob.Escalated)
    assert escalated.detail == (
        "2 copies only in the trash: sent and deleted by their sender, or received and"
        f" deleted: {first}, {second}"
    )


def test_the_job_refuses_an_only_in_the_trash_review_without_a_copy(rig: EngineRig) -> None:
    rig.submit("receipts", "k1")
    rig.provider.script(Scripted.lost_request())
    rig.tick()
    job = rig.job("k1")
    assert job.search_due_at is not None
    with pytest.raises(TransitionError, match="0 copies found, one or more, in the trash"):
        job.record_search(
            query="q",
            copies=[],
            decision=Review(RETRY.ref, EscalationReason.ONLY_IN_TRASH),
            at=job.search_due_at,
        )


def test_a_search_result_is_only_in_the_trash_when_every_copy_is() -> None:
    sent = SearchHit("1:1", "<a@b>")
    trashed = SearchHit("trash:1:2", "<a@b>", in_trash=True)
    assert SearchResult("q", (trashed,)).only_in_trash
    assert SearchResult("q", (trashed, trashed), more=3, complete=False).only_in_trash
    assert not SearchResult("q", (sent, trashed)).only_in_trash
    assert not SearchResult("q", ()).only_in_trash


def test_a_check_says_the_copy_is_only_in_the_trash_and_triage_leaves_the_job(
    rig: EngineRig,
) -> None:
    trashed = _in_review(rig, "k1")
    s = services(rig)
    answer = s.check("k1", by="ann")
    assert answer.only_in_trash and [c.in_trash for c in answer.copies] == [True]
    shown = answer.as_dict()
    assert shown["only_in_trash"] is True and shown["copies"][0]["in_trash"] is True
    assert shown["hits"][0]["in_trash"] is True
    assert answer.advice.startswith(f"{TRASH_SAYS}: open it")
    view = s.job_view("k1")
    assert view.guidance is not None and view.guidance.next_action.startswith("Open the copy")
    assert not any(choice.recommended for choice in view.guidance.choices)
    # Triage resolves a job on one copy found, but not on one only in the trash.
    (item,) = s.triage(by="ann", dry_run=True)
    assert (item.action, item.copies) == ("left", [trashed])
    assert item.detail == f"{TRASH_SAYS}: left in review"
    (item,) = s.triage(by="ann")
    assert item.action == "left" and rig.job("k1").state is JobState.REVIEW
    assert rig.events("k1")[-1] == "Checked"
    assert Resolution.SENT in view.decisions  # a person who opened it may still say so


def test_the_job_page_shows_where_the_copy_was_found(rig: EngineRig) -> None:
    _in_review(rig, "k1")
    with TestClient(create_app(api_context(rig))) as client:
        page = client.get("/ui/jobs/k1", headers=AUTH).text
        assert "the customer may or may not have it" in unescape(page)
        checked = unescape(client.post("/ui/jobs/k1/check", data={}, headers=AUTH).text)
        assert "Found only in the sender's trash" in checked
        assert 'data-label="Found in">trash<' in checked
        answer = client.post("/v1/review/k1/check", headers=AUTH).json()
        assert answer["only_in_trash"] is True and answer["copies"][0]["in_trash"] is True


def test_a_resend_is_refused_while_the_copy_is_in_the_trash_and_goes_once_it_is_deleted(
    rig: EngineRig,
) -> None:
    trashed = _in_review(rig, "k1")
    s = services(rig)
    with pytest.raises(ServiceError) as refused:
        s.resolve("k1", Resolution.RESEND, note="", by="ann")
    assert refused.value.message.startswith(f"job 'k1' was not resent: {TRASH_SAYS}: open it")
    assert rig.provider.sends == 1 and rig.job("k1").state is JobState.REVIEW
    # The person opened it: received from elsewhere, deleted for good; the resend goes.
    rig.provider.copies[:] = [c for c in rig.provider.copies if c.provider_message_id != trashed]
    assert s.resolve("k1", Resolution.RESEND, note="", by="ann").state is JobState.REQUESTED
    rig.tick()
    assert rig.provider.sends == 2 and rig.job("k1").state is JobState.CONFIRMED


def test_the_page_recommends_nothing_on_a_check_that_found_a_copy_only_in_the_trash() -> None:
    """A job in review for another reason (its searches missed: unknown-outcome), then a
    person's check finds one copy, only in the trash. The check's own advice says to open
    it; the job's page and `review show`, which read the recorded check, said "the
    customer has it. Resolve as sent" with Sent recommended, and a person following
    them lost a notification never sent. The check records such a copy marked
    (`SearchResult.recorded_copies`), and the guidance reads the mark."""
    with EngineRig(policy("alerts")) as rig:
        message_id = rig.submit("alerts", "k1")
        rig.provider.script(Scripted.lost_request())
        assert rig.tick().unknown == 1
        for _ in range(10):
            rig.advance_and_tick(3600)
        assert (rig.job("k1").state, rig.job("k1").reason) == (
            JobState.REVIEW,
            EscalationReason.UNKNOWN_OUTCOME,
        )
        trashed = rig.provider.store_copy(message_id, in_trash=True)
        s = services(rig)
        assert s.check("k1", by="ann").only_in_trash
        checked = rig.ledger.history("k1")[-1]
        assert isinstance(checked, SendJob.Checked)
        assert checked.provider_message_ids == [f"trash:{trashed}"]
        view = s.job_view("k1")
        assert view.guidance is not None and view.guidance.in_trash
        assert view.guidance.next_action.startswith("Open the copy")
        assert not any(choice.recommended for choice in view.guidance.choices)
        # "sent" needs the person's word that this mailbox sent it.
        with pytest.raises(ServiceError, match=r"only in the sender's trash.*say in the note"):
            resolve_as_a_person(s, "k1", Resolution.SENT, note="", by="ann")
        with TestClient(create_app(api_context(rig))) as client:
            page = unescape(client.get("/ui/jobs/k1", headers=AUTH).text)
        assert "1 copy only in the sender's trash" in page and "The customer has" not in page
        # The same copy checked again repeats nothing new; moved to the sent folder, it is
        # new evidence, and then the customer has it.
        kept = [c for c in rig.provider.copies if c.provider_message_id != trashed]
        rig.provider.copies[:] = kept
        rig.provider.store_copy(message_id)
        assert not s.check("k1", by="ann").only_in_trash
        view = s.job_view("k1")
        assert view.guidance is not None and view.guidance.next_action.startswith("The last check")
        assert [c.decision for c in view.guidance.choices if c.recommended] == [Resolution.SENT]
