"""Two people, one job (docs/review.md "Two people, one job"): a human's decision holds
only for the version it was made on. Each race here is driven deterministically: the
provider's search (or draft step) runs the other actor in the middle of the first one's
decision, as a second door or the daemon would at that instant."""

from __future__ import annotations

import re
import shlex
import threading
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from html import unescape

import pytest
from fastapi.testclient import TestClient
from tests.unit.engine_rig import EngineRig, policy
from tests.unit.test_api_routes import AUTH, api_context

from daemon.api.app import create_app
from daemon.cli import build_parser
from daemon.doubles.fake_drafts import FakeDraftsProvider
from daemon.doubles.fake_provider import FakeProvider, Scripted
from daemon.providers.base import SendOutcome
from daemon.service_layer.services import (
    ChannelPolicies,
    JobView,
    Refusal,
    ServiceError,
    Services,
    resolve_as_a_person,
)
from ledger.job import DRAFTS_CLAIM_LOST, SendJob
from ledger.vocabulary import JobState, Resolution

LEGAL = policy("legal", on_unknown="review", search_after="60s")


@pytest.fixture
def rig() -> Iterator[EngineRig]:
    rig = EngineRig(LEGAL)
    yield rig
    rig.close()


def door(rig: EngineRig, drafts: frozenset[str] = frozenset()) -> Services:
    """One door (the CLI, the API, the page): its own services over the shared store."""
    return Services(
        rig.ledger,
        lambda: ChannelPolicies(rig.policies),
        providers=lambda name: nullcontext(rig.provider),
        draft_providers=drafts,
    )


def in_review(rig: EngineRig, key: str, copy: bool = False) -> None:
    """Sent once with no answer: in review, its index caught up. No copy was stored (the
    request was lost), or with `copy` one was (the response was)."""
    rig.submit("legal", key)
    rig.provider.script(Scripted.dropped_response() if copy else Scripted.lost_request())
    rig.tick()
    assert rig.job(key).state is JobState.REVIEW
    rig.clock.advance(61)


def meanwhile(provider: FakeProvider, action: Callable[[], object]) -> None:
    """`action` runs once, while the next search is out at the provider."""

    def hook() -> None:
        provider.during_search = None
        action()

    provider.during_search = hook


def refused(call: Callable[[], object]) -> str:
    with pytest.raises(ServiceError) as caught:
        call()
    assert caught.value.kind is Refusal.CONFLICT, caught.value.message
    return caught.value.message


def resolutions(rig: EngineRig, key: str) -> list[str]:
    return [e.decision for e in rig.ledger.history(key) if isinstance(e, SendJob.Resolved)]


def test_two_doors_resending_at_once_send_once() -> None:
    """The issue's case: one resend goes out and its answer is dropped (review again);
    the other door's search, on the same version, missed that copy (the index lags) and
    it resent the job once more."""
    rig = EngineRig(LEGAL, index_lag=30.0)
    in_review(rig, "k1")
    cli, http = door(rig), door(rig)

    def the_other_door_and_the_daemon() -> None:
        http.resolve("k1", Resolution.RESEND, note="", by="bob")
        rig.provider.script(Scripted.dropped_response())
        rig.tick()  # attempt 2: sent, answer lost: Unknown, review

    meanwhile(rig.provider, the_other_door_and_the_daemon)
    message = refused(lambda: cli.resolve("k1", Resolution.RESEND, note="", by="alice"))
    assert "resolved as resend by bob" in message and "attempt 2" in message
    assert "it was not resent" in message and "now review" in message
    assert resolutions(rig, "k1") == ["resend"]
    assert rig.provider.sends_by_message_id[rig.job("k1").message_id] == 2
    assert rig.copies("k1") == 1
    rig.close()


@pytest.mark.parametrize("other", [Resolution.SENT, Resolution.ABANDON, Resolution.RESEND])
def test_a_resend_loses_to_any_decision_made_while_it_searched(
    rig: EngineRig, other: Resolution
) -> None:
    in_review(rig, "k1")
    first, second = door(rig), door(rig)
    meanwhile(rig.provider, lambda: second.resolve("k1", other, note="", by="bob"))
    refused(lambda: first.resolve("k1", Resolution.RESEND, note="", by="alice"))
    assert resolutions(rig, "k1") == [other.value]
    rig.tick()
    assert rig.copies("k1") == (1 if other is Resolution.RESEND else 0)


def test_a_decision_on_the_version_a_person_saw_is_refused_once_it_moved(
    rig: EngineRig,
) -> None:
    in_review(rig, "k1")
    seen = rig.job("k1").version
    door(rig).check("k1", by="bob")  # another person's check moves it on
    message = refused(
        lambda: door(rig).resolve(
            "k1", Resolution.ABANDON, note="", by="alice", expected_version=seen
        )
    )
    assert f"after version {seen}" in message and "checked by bob" in message
    assert rig.job("k1").state is JobState.REVIEW
    abandoned = door(rig).resolve(
        "k1", Resolution.ABANDON, note="", by="alice", expected_version=rig.job("k1").version
    )
    assert abandoned.state is JobState.ABANDONED


def test_a_cancel_on_a_stale_version_is_refused_after_the_claim(rig: EngineRig) -> None:
    rig.submit("legal", "k1")
    seen = rig.job("k1").version
    rig.tick()
    message = refused(lambda: door(rig).cancel("k1", note="", by="alice", expected_version=seen))
    assert "attempt 1" in message


def test_triage_resolves_only_the_version_it_searched(rig: EngineRig) -> None:
    in_review(rig, "k1", copy=True)
    other = door(rig)
    meanwhile(rig.provider, lambda: other.resolve("k1", Resolution.ABANDON, note="", by="bob"))
    [item] = door(rig).triage(by="triage")
    assert (item.count, item.action) == (1, "left")
    assert "changed after version" in item.detail
    assert rig.job("k1").state is JobState.ABANDONED
    assert resolutions(rig, "k1") == ["abandon"]


def test_a_check_on_a_settled_job_is_recorded_once(rig: EngineRig) -> None:
    rig.submit("legal", "k1")
    rig.tick()
    assert rig.job("k1").state is JobState.CONFIRMED
    s = door(rig)
    assert s.check("k1", by="alice").recorded
    assert not s.check("k1", by="alice").recorded  # the same answer: nothing new
    assert [type(e).__name__ for e in rig.ledger.history("k1")].count("Checked") == 1
    rig.provider.store_copy(rig.job("k1").message_id)  # a second copy appears
    assert s.check("k1", by="alice").recorded  # a different answer is recorded


def drafts_rig() -> EngineRig:
    rig = EngineRig(LEGAL)
    rig.engine.close()
    rig.provider = FakeDraftsProvider("fake", clock=rig.clock)
    rig.engine = rig.new_engine()
    return rig


def test_a_cancel_during_the_draft_step_deletes_the_draft_and_says_so() -> None:
    rig = drafts_rig()
    provider = rig.provider
    assert isinstance(provider, FakeDraftsProvider)
    try:
        rig.submit("legal", "k1")

        def cancel() -> None:
            provider.during_create = None
            door(rig, frozenset({"fake"})).cancel("k1", note="changed my mind", by="alice")

        provider.during_create = cancel
        rig.tick()
        job = rig.job("k1")
        assert job.state is JobState.CANCELLED and rig.copies("k1") == 0
        assert provider.unsent_drafts(job.message_id) == 0
        [deleted] = [e for e in rig.ledger.history("k1") if isinstance(e, SendJob.DraftsDeleted)]
        assert deleted.why == DRAFTS_CLAIM_LOST and len(deleted.draft_ids) == 1
        assert job.tidy_at is not None  # and once the lag has passed, any other is looked for
        rig.clock.advance(61)
        rig.tick()
        assert rig.job("k1").tidy_at is None and rig.job("k1").purgeable
    finally:
        rig.close()


def unknown_behind_a_lagging_index(key: str) -> EngineRig:
    """A job sent once whose answer was lost (one copy at the provider), its outcome
    unknown, its search due in 60 s; the mailbox's index shows a copy 30 s late."""
    rig = EngineRig(policy("orders", search_after="60s"), index_lag=30.0)
    rig.submit("orders", key)
    rig.provider.script(Scripted.dropped_response())
    rig.tick()
    assert rig.job(key).state is JobState.UNKNOWN
    return rig


def test_a_check_the_engine_s_later_search_overtook_is_not_the_page_s_evidence() -> None:
    """A person checks a job whose outcome is unknown before the index shows its copy
    (none found); the daemon's own search then finds two: a duplicate, in review. The
    page must say what that search found, not the check it overtook: two copies, "sent"
    needing no note, and "abandon" not claiming that nothing was sent."""
    rig = unknown_behind_a_lagging_index("k1")
    try:
        s = door(rig)
        assert s.check("k1", by="alice").count == 0  # the index lags: none yet
        rig.provider.store_copy(rig.job("k1").message_id)  # a second copy lands
        rig.clock.advance(120)
        rig.tick()
        job = rig.job("k1")
        assert job.state is JobState.REVIEW and job.duplicate
        view = s.job_view("k1")
        assert view.guidance is not None
        assert view.guidance.copies == 2
        sent, abandon = view.guidance.choices
        assert not sent.needs_note and sent.recommended
        assert "keeps the 2 copies" in abandon.effect and "not be sent" not in abandon.effect
        done = resolve_as_a_person(s, "k1", Resolution.SENT, note="", by="alice")
        assert done.state is JobState.CONFIRMED
    finally:
        rig.close()


def test_a_resend_s_own_search_is_not_the_evidence_for_its_attempt(rig: EngineRig) -> None:
    """The search a resend made before its attempt found no copy; that attempt's answer
    was then lost (review again, one copy at the provider). The page must not say the
    customer has no copy and recommend another resend on that earlier search's word."""
    in_review(rig, "k1")
    door(rig).resolve("k1", Resolution.RESEND, note="", by="alice")
    rig.provider.script(Scripted.dropped_response())
    rig.tick()
    assert rig.job("k1").state is JobState.REVIEW and rig.copies("k1") == 1
    view = door(rig).job_view("k1")
    assert view.guidance is not None
    assert view.guidance.copies is None  # no search since it went to review
    assert not any(c.recommended for c in view.guidance.choices)
    assert "The last check found no copy" not in view.guidance.next_action


class ReadThenMeanwhile(Services):
    """A door whose page read (`job_view`) is followed, once, by another actor's move:
    what happens between `review resolve` reading the job to judge its evidence and
    the resolve itself."""

    def __init__(self, rig: EngineRig, action: Callable[[], object]) -> None:
        super().__init__(
            rig.ledger,
            lambda: ChannelPolicies(rig.policies),
            providers=lambda name: nullcontext(rig.provider),
        )
        self._action: Callable[[], object] | None = action

    def job_view(self, key: str) -> JobView:
        view = super().job_view(key)
        action, self._action = self._action, None
        if action is not None:
            action()
        return view


def test_sent_without_a_note_holds_only_for_the_version_whose_check_found_the_copy() -> None:
    """`review resolve --as sent` without a note is taken because the latest check found
    a copy; if, before it is written, another check finds none (the copy deleted from the
    mailbox), the job is no longer the one judged: refused, nothing recorded."""
    rig = EngineRig(LEGAL)
    try:
        in_review(rig, "k1", copy=True)
        assert door(rig).check("k1", by="alice").count == 1

        def bob_checks_after_the_copy_is_gone() -> None:
            rig.provider.copies.clear()
            assert door(rig).check("k1", by="bob").count == 0

        alice = ReadThenMeanwhile(rig, bob_checks_after_the_copy_is_gone)
        message = refused(
            lambda: resolve_as_a_person(alice, "k1", Resolution.SENT, note="", by="alice")
        )
        assert "checked by bob" in message
        assert rig.job("k1").state is JobState.REVIEW and resolutions(rig, "k1") == []
    finally:
        rig.close()


def test_a_page_read_while_another_writes_shows_one_version(rig: EngineRig) -> None:
    """The job page (`review show`, GET of the page) reads the job and its history: a
    check recorded between the two reads made the status one version and the history
    another, so the page showed a state its own timeline had left."""
    in_review(rig, "k1")
    s = door(rig)
    real_get_job = rig.ledger.get_job

    def get_job_then_another_writes(key: str) -> SendJob:
        job = real_get_job(key)
        rig.ledger.get_job = real_get_job  # type: ignore[method-assign]
        door(rig).check(key, by="bob")  # between this read and the next
        return job

    rig.ledger.get_job = get_job_then_another_writes  # type: ignore[method-assign]
    view = s.job_view("k1")
    rig.ledger.get_job = real_get_job  # type: ignore[method-assign]
    assert view.status["version"] == view.history[-1]["version"] == view.job.version
    assert view.last_check is None or view.last_check["version"] <= view.job.version


def test_a_check_whose_search_an_attempt_overtook_is_not_the_evidence_for_it(
    rig: EngineRig,
) -> None:
    """Alice checks a job in review; while her search's answer (no copy) is on its way,
    Bob resends it and that attempt's answer is lost (review again, one copy at the
    provider). Her search read the mailbox before that copy existed: recorded after the
    job went back to review, the page would take it for the evidence of the new review,
    say the customer has no copy and offer (recommend) another resend: a second copy."""
    in_review(rig, "k1")

    def bob_resends_and_the_answer_is_lost() -> None:
        door(rig).resolve("k1", Resolution.RESEND, note="", by="bob")
        rig.provider.script(Scripted.dropped_response())
        rig.tick()

    meanwhile(rig.provider, bob_resends_and_the_answer_is_lost)
    answer = door(rig).check("k1", by="alice")
    assert answer.count == 0 and not answer.recorded
    assert "changed while it searched" in answer.why_unrecorded
    assert "attempt 2" in answer.why_unrecorded
    assert answer.state == "review" and "check again" in answer.why_unrecorded
    # Nor does its advice recommend a resend of the new review on that old search's word.
    assert "review resolve" not in answer.as_dict()["advice"]
    assert rig.job("k1").state is JobState.REVIEW and rig.copies("k1") == 1
    view = door(rig).job_view("k1")
    assert view.guidance is not None
    assert view.guidance.copies is None  # no search since it went back to review
    assert not any(c.recommended for c in view.guidance.choices)


@pytest.mark.parametrize("ahead", [1, 10**40])
def test_an_expected_version_the_job_never_had_is_bad_input_naming_it(
    rig: EngineRig, ahead: int
) -> None:
    """A version past the job's own was never shown to anyone (a typo, another job's
    status): bad input naming `expected_version`, not a conflict saying the job "changed
    after version 10000...0 ()", and nothing recorded."""
    in_review(rig, "k1")
    rig.submit("legal", "k2")
    now = {key: rig.job(key).version for key in ("k1", "k2")}
    attempts: list[tuple[str, Callable[[], object]]] = [
        ("k1", lambda: door(rig).resolve(
            "k1", Resolution.ABANDON, note="", by="alice", expected_version=now["k1"] + ahead
        )),
        ("k1", lambda: resolve_as_a_person(
            door(rig), "k1", Resolution.ABANDON, note="", by="alice",
            expected_version=now["k1"] + ahead,
        )),
        ("k2", lambda: door(rig).cancel(
            "k2", note="", by="alice", expected_version=now["k2"] + ahead
        )),
    ]  # fmt: skip
    for key, attempt in attempts:
        with pytest.raises(ServiceError) as caught:
            attempt()
        assert caught.value.kind is Refusal.BAD_INPUT, caught.value.message
        assert [p.field for p in caught.value.problems] == ["expected_version"]
        assert f"at version {now[key]}" in caught.value.message
    assert {key: rig.job(key).version for key in ("k1", "k2")} == now


def test_a_check_read_while_a_send_was_in_flight_is_not_the_evidence_for_its_outcome(
    rig: EngineRig,
) -> None:
    """Bob resends a job in review; the daemon's claim is durable and its call is on its
    way to the provider when Alice checks: her door reads the job (attempted, the attempt
    already counted), her search reads the mailbox before the copy is filed, then the
    call files it and its answer is lost (review again). Her answer must not be recorded
    as the evidence of that new review: it says "no copy" of a job that has one."""
    in_review(rig, "k1")
    door(rig).resolve("k1", Resolution.RESEND, note="", by="bob")
    calling, go = threading.Event(), threading.Event()
    real_send = rig.provider.send_raw

    def send_raw_once_let_through(raw: bytes) -> SendOutcome:
        calling.set()
        assert go.wait(10)
        return real_send(raw)

    rig.provider.send_raw = send_raw_once_let_through  # type: ignore[method-assign]
    rig.provider.script(Scripted.dropped_response())
    rig.engine.hand_out()
    assert calling.wait(10)
    assert rig.job("k1").state is JobState.ATTEMPTED  # the claim, durable before the call

    def the_call_files_its_copy_and_its_answer_is_lost() -> None:
        go.set()
        assert rig.engine.settle(timeout=10)

    meanwhile(rig.provider, the_call_files_its_copy_and_its_answer_is_lost)
    answer = door(rig).check("k1", by="alice")
    assert answer.count == 0  # what her search saw
    assert rig.job("k1").state is JobState.REVIEW and rig.copies("k1") == 1
    assert not answer.recorded and answer.state == "attempted"
    assert "in flight" in answer.why_unrecorded
    view = door(rig).job_view("k1")
    assert view.guidance is not None
    assert view.guidance.copies is None  # no search since it went back to review
    assert not any(c.recommended for c in view.guidance.choices)


def checks_by(rig: EngineRig, key: str, by: str) -> list[SendJob.Checked]:
    return [e for e in rig.ledger.history(key) if isinstance(e, SendJob.Checked) and e.by == by]


@pytest.mark.parametrize("other", [Resolution.SENT, Resolution.ABANDON, Resolution.RESEND])
def test_a_check_is_not_recorded_for_a_decision_made_while_it_searched(
    rig: EngineRig, other: Resolution
) -> None:
    """Alice checks a job in review; while her search is out Bob resolves it. Her answer
    was read on the job in review: recorded after his decision it would stand in the
    trail as the evidence of a state she never saw (a confirmed job "checked: no copy",
    a resend on its way "checked"), and her advice must not tell her to resolve a job
    that is no longer in review."""
    in_review(rig, "k1")
    meanwhile(rig.provider, lambda: door(rig).resolve("k1", other, note="", by="bob"))
    answer = door(rig).check("k1", by="alice")
    assert answer.count == 0 and not answer.recorded and answer.overtaken
    assert f"resolved as {other.value} by bob" in answer.why_unrecorded
    assert "check again" in answer.why_unrecorded
    assert answer.state == rig.job("k1").state.value != "review"
    advice = answer.as_dict()["advice"]  # what `review check` and the API print
    assert "review resolve" not in advice and "check again" in advice
    assert checks_by(rig, "k1", "alice") == []


def test_a_check_is_recorded_beside_another_person_s_check() -> None:
    """A check made meanwhile changes no state: two people checking at once both leave
    what they saw in the trail."""
    rig = EngineRig(LEGAL)
    try:
        in_review(rig, "k1")
        meanwhile(rig.provider, lambda: door(rig).check("k1", by="bob"))
        answer = door(rig).check("k1", by="alice")
        assert answer.recorded and not answer.overtaken
        assert len(checks_by(rig, "k1", "bob")) == len(checks_by(rig, "k1", "alice")) == 1
    finally:
        rig.close()


def test_a_check_the_daemon_s_search_overtook_is_not_the_evidence_of_its_review() -> None:
    """Alice checks a job whose outcome is unknown; her search reads a lagging index (no
    copy), and before her answer is written the daemon's own search finds two: a
    duplicate, in review. Recorded after that escalation, her "no copy" would be the
    page's evidence for the review ("the customer has 0 copies") over the daemon's two."""
    rig = unknown_behind_a_lagging_index("k1")
    try:

        def a_second_copy_lands_and_the_daemon_searches() -> None:
            rig.provider.store_copy(rig.job("k1").message_id)
            rig.clock.advance(120)
            rig.tick()

        meanwhile(rig.provider, a_second_copy_lands_and_the_daemon_searches)
        answer = door(rig).check("k1", by="alice")
        assert answer.count == 0 and not answer.recorded and answer.overtaken
        assert "Escalated" in answer.why_unrecorded
        assert "review resolve" not in answer.as_dict()["advice"]
        job = rig.job("k1")
        assert job.state is JobState.REVIEW and job.duplicate
        view = door(rig).job_view("k1")
        assert view.guidance is not None and view.guidance.copies == 2
    finally:
        rig.close()


def test_a_resend_s_search_that_a_decision_overtook_advises_nothing_on_it(
    rig: EngineRig,
) -> None:
    """Alice's resend searches and finds the copy, while Bob abandons the job: she is
    told what changed (a conflict), not to resolve as sent a job that is abandoned, and
    her search is not recorded after his decision."""
    in_review(rig, "k1", copy=True)
    meanwhile(
        rig.provider,
        lambda: door(rig).resolve("k1", Resolution.ABANDON, note="", by="bob"),
    )
    message = refused(lambda: door(rig).resolve("k1", Resolution.RESEND, note="", by="alice"))
    assert "resolved as abandon by bob" in message and "it was not resent" in message
    assert "--as sent" not in message
    assert checks_by(rig, "k1", "alice") == []
    assert rig.job("k1").state is JobState.ABANDONED


def test_triage_says_a_job_it_leaves_moved_while_it_searched(rig: EngineRig) -> None:
    """Triage searches a job in review (no copy), and Bob abandons it meanwhile: the
    answer must not say "left in review" of an abandoned job, nor record its search."""
    in_review(rig, "k1")
    meanwhile(
        rig.provider,
        lambda: door(rig).resolve("k1", Resolution.ABANDON, note="", by="bob"),
    )
    [item] = door(rig).triage(by="triage")
    assert (item.count, item.action) == (0, "left")
    assert "left in review" not in item.detail
    assert "resolved as abandon by bob" in item.detail
    assert checks_by(rig, "k1", "triage") == []


def test_the_resolve_a_check_advises_holds_only_for_the_version_it_found_the_copy_on() -> None:
    """`review check` finds one copy and advises `review resolve --as sent`; before Alice
    runs it, a second copy lands and Bob's check finds both. The command she was shown
    is a decision on what she was shown: it carries the version her check was recorded
    at, so run as printed it is refused (look again) instead of deciding on a job she
    never saw."""
    rig = EngineRig(LEGAL)
    try:
        in_review(rig, "k1", copy=True)
        answer = door(rig).check("k1", by="alice").as_dict()
        checked = rig.job("k1").version
        command = answer["advice"].split("`")[1]
        rig.provider.store_copy(rig.job("k1").message_id)
        assert door(rig).check("k1", by="bob").count == 2
        args = build_parser().parse_args(shlex.split(command)[1:])
        message = refused(
            lambda: resolve_as_a_person(
                door(rig), args.key, Resolution(args.decision), note="", by="alice",
                expected_version=args.expected_version,
            )
        )  # fmt: skip
        assert "checked by bob" in message and resolutions(rig, "k1") == []
        assert answer["recorded"] and answer["version"] == checked == args.expected_version
    finally:
        rig.close()


def test_a_refused_resend_advises_sent_on_the_version_its_search_was_recorded_at(
    rig: EngineRig,
) -> None:
    in_review(rig, "k1", copy=True)
    message = refused(lambda: door(rig).resolve("k1", Resolution.RESEND, note="", by="alice"))
    assert f"--as sent --expected-version {rig.job('k1').version})" in message


def test_a_resend_clicked_on_a_page_shown_before_another_resend_is_refused(
    rig: EngineRig,
) -> None:
    """Alice opens the job page at 10:00 (resend offered); Bob resends it meanwhile, and
    that attempt's request is lost too: in review again, no copy. At 10:05 Alice clicks
    Resend on the page she was shown: the form carries the version it showed, so it is
    refused (409, naming Bob's resend), not a third send decided on a page that no
    longer describes the job."""
    in_review(rig, "k1")
    with TestClient(create_app(api_context(rig))) as client:
        page = client.get("/ui/jobs/k1", headers=AUTH).text
        form = re.search(r'<form[^>]*id="resolve".*?</form>', page, re.S)
        assert form is not None
        version = re.search(r'name="version" value="(\d+)"', form.group(0))
        assert version is not None and int(version.group(1)) == rig.job("k1").version
        door(rig).resolve("k1", Resolution.RESEND, note="", by="bob")
        rig.provider.script(Scripted.lost_request())
        rig.tick()
        assert rig.job("k1").state is JobState.REVIEW
        rig.clock.advance(61)
        clicked = client.post(
            "/ui/jobs/k1/resolve",
            data={"as": "resend", "version": version.group(1)},
            headers=AUTH,
        )
    assert clicked.status_code == 409
    assert "resolved as resend by bob" in unescape(clicked.text)
    assert rig.provider.sends == 2 and resolutions(rig, "k1") == ["resend"]
