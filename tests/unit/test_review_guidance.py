"""The review page guides (docs/review.md "Review"): every reason has one sentence of
meaning and a next action, on the job page and in `review show`; "sent" needs a check that
found a copy, or a note saying how the person knows; a duplicate says how many copies the
customer has and what each action does; the queue repeats no word; the icon is served."""

from __future__ import annotations

import re
from collections.abc import Iterator
from html import unescape

import pytest
from fastapi.testclient import TestClient
from tests.unit.engine_rig import EngineRig, policy
from tests.unit.test_api_routes import AUTH, api_context
from tests.unit.test_services import in_review, refused, services

from daemon.api.app import create_app
from daemon.api.favicon import ICON
from daemon.doubles.fake_provider import Scripted
from daemon.service_layer.guidance import MEANING, NEXT, SENT_NEEDS_NOTE, guidance_for
from daemon.service_layer.services import Refusal, resolve_as_a_person
from ledger.vocabulary import EscalationReason, JobState, Resolution


@pytest.mark.parametrize("reason", list(EscalationReason))
def test_every_reason_has_one_sentence_of_meaning_and_a_next_action(
    reason: EscalationReason,
) -> None:
    meaning = MEANING[reason]
    assert meaning.endswith(".") and meaning[0].isupper()
    # One sentence: no full stop before the last, whatever follows it.
    assert not re.search(r"[.!?] ", meaning), meaning
    assert NEXT[reason].endswith(".") and NEXT[reason][0].isupper()


@pytest.fixture
def rig() -> Iterator[EngineRig]:
    rig = EngineRig(policy("legal", on_unknown="review"))
    yield rig
    rig.close()


def _page(client: TestClient, path: str) -> str:
    answer = client.get(path, headers=AUTH)
    assert answer.status_code == 200, answer.text
    return str(answer.text)


def _text(html: str, element_id: str) -> str:
    """The text of the element with that id (a p, section or form), tags dropped."""
    tag = re.search(rf'<(\w+)[^>]*id="{element_id}"', html)
    assert tag, element_id
    found = re.search(rf'id="{element_id}"[^>]*>(.*?)</{tag.group(1)}>', html, re.S)
    assert found, element_id
    return " ".join(unescape(re.sub(r"<[^>]+>", "", found.group(1))).split())


def test_an_unknown_outcome_says_what_it_means_and_asks_how_sent_is_known(
    rig: EngineRig,
) -> None:
    in_review(rig, "k1", copies=0)
    with TestClient(create_app(api_context(rig))) as client:
        page = _page(client, "/ui/jobs/k1")
        assert _text(page, "meaning") == MEANING[EscalationReason.UNKNOWN_OUTCOME]
        assert _text(page, "next").startswith("Next: Check the mailbox first")
        resolve = _text(page, "resolve")
        assert "sent: records that the customer has it, on your word" in resolve
        assert "No check has found a copy: the note must say how you know." in resolve
        # "sent" with no copy found and no note: refused, nothing recorded.
        form = {"as": "sent", "note": " "}
        answer = client.post("/ui/jobs/k1/resolve", data=form, headers=AUTH)
        assert answer.status_code == 422 and SENT_NEEDS_NOTE in unescape(answer.text)
        assert rig.job("k1").state is JobState.REVIEW
        form = {"as": "sent", "note": "the customer confirmed by phone"}
        answer = client.post("/ui/jobs/k1/resolve", data=form, headers=AUTH, follow_redirects=False)
        assert answer.status_code == 303
    assert rig.job("k1").state is JobState.CONFIRMED


def test_after_a_check_found_the_copy_sent_is_recommended_and_needs_no_note(
    rig: EngineRig,
) -> None:
    in_review(rig, "k1", copies=1)
    s = services(rig)
    assert s.check("k1", by="ann").count == 1
    view = s.job_view("k1")
    assert view.guidance is not None
    assert view.decisions == [Resolution.SENT, Resolution.ABANDON]
    sent = view.guidance.choices[0]
    assert sent.recommended and not sent.needs_note
    assert view.guidance.next_action.startswith("The last check found one copy")
    assert resolve_as_a_person(s, "k1", Resolution.SENT, note="", by="ann").state is (
        JobState.CONFIRMED
    )


def test_sent_without_a_copy_or_a_note_is_refused_for_the_cli_too(rig: EngineRig) -> None:
    in_review(rig, "k1", copies=0)
    s = services(rig)
    message = refused(
        lambda: resolve_as_a_person(s, "k1", Resolution.SENT, note="", by="b"), Refusal.BAD_INPUT
    )
    assert message == SENT_NEEDS_NOTE
    # resend and abandon need no note
    assert resolve_as_a_person(s, "k1", Resolution.ABANDON, note="", by="b").state is (
        JobState.ABANDONED
    )


def _duplicate(rig: EngineRig, key: str) -> None:
    rig.submit("legal", key)
    rig.provider.script(Scripted.dropped_response())
    rig.tick()
    rig.provider.store_copy(rig.job(key).message_id)
    rig.advance_and_tick(120)
    assert rig.job(key).duplicate and rig.job(key).state is JobState.REVIEW


def test_a_duplicate_says_how_many_copies_the_customer_has_and_what_each_action_does() -> None:
    rig = EngineRig(policy("legal", on_unknown="search-then-review"))
    try:
        _duplicate(rig, "dup-1")
        with TestClient(create_app(api_context(rig))) as client:
            page = _page(client, "/ui/jobs/dup-1")
            assert "received it 2 times" in _text(page, "meaning")
            assert _text(page, "customer-copies").startswith("The customer has 2 copies")
            resolve = _text(page, "resolve")
            assert "sent (recommended): records that the customer has it (2 copies)" in resolve
            assert "abandon: records that nothing more will be done; the customer keeps " in (
                resolve
            )
            assert "the 2 copies it has" in resolve
            assert 'value="resend"' not in page
            queue = _page(client, "/ui/")
            row = re.search(r"<tr>\s*<td data-label=\"Key\">.*?</tr>", queue, re.S)
            assert row is not None
            cells = [
                unescape(re.sub(r"<[^>]+>", "", c))
                for c in re.findall(r"<td[^>]*>(.*?)</td>", row.group(0), re.S)
            ]
            for cell in cells:
                words = re.findall(r"[\w-]+", cell.lower())
                assert len(words) == len(set(words)), cell  # once was "duplicate (duplicate)"
    finally:
        rig.close()


def test_out_of_review_there_is_no_guidance(rig: EngineRig) -> None:
    rig.submit("legal", "k1")
    rig.tick()
    assert guidance_for(rig.job("k1"), None, []) is None
    assert services(rig).job_view("k1").guidance is None


def test_the_icon_is_served_and_favicon_ico_leads_to_it(rig: EngineRig) -> None:
    with TestClient(create_app(api_context(rig))) as client:
        answer = client.get("/favicon.ico", follow_redirects=False)
        assert answer.status_code == 308 and answer.headers["location"] == "/favicon.svg"
        icon = client.get("/favicon.svg")
        assert icon.status_code == 200 and icon.headers["content-type"] == "image/svg+xml"
        assert icon.text == ICON
        assert '<link rel="icon" href="/favicon.svg"' in _page(client, "/ui/")


def test_a_check_not_recorded_on_a_settled_job_is_not_said_to_meet_a_send(
    rig: EngineRig,
) -> None:
    """A settled job checked twice with the same answer: the second check is not recorded
    because it repeats the first, and the page says so, not "a send is in flight"."""
    rig.submit("legal", "k1")
    rig.tick()
    assert rig.job("k1").state is JobState.CONFIRMED
    with TestClient(create_app(api_context(rig))) as client:
        first = client.post("/ui/jobs/k1/check", headers=AUTH)
        assert first.status_code == 200 and "not recorded" not in _text(first.text, "check-result")
        again = _text(client.post("/ui/jobs/k1/check", headers=AUTH).text, "check-result")
        assert "not recorded" in again and "a send is in flight" not in again
        assert "repeats the job's last check" in again
