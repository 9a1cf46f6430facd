"""Retention on the memory store: what a purge keeps and what it makes unreadable, which
jobs it may take, and that a purged job can never be sent again (docs/configuration.md
"Retention")."""

from __future__ import annotations

import html
import json
import urllib.parse
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.unit.engine_rig import EngineRig, policy

from daemon.doubles.fake_provider import Scripted
from daemon.service_layer.read_models import job_status
from daemon.webhooks.delivery import Outcome
from daemon.webhooks.worker import Deliverer, Hook
from ledger.application import ConcurrentUpdate, KeyConflict
from ledger.content import JobContent, parse_job
from ledger.job import SendJob, TransitionError
from ledger.redaction import (
    MIN_QUOTED_LENGTH,
    REDACTED,
    TRAIL_FIELDS,
    quoted_texts,
    redact_events,
    scrubber,
)
from ledger.stores.index import index_row
from ledger.vocabulary import JobState, Resolution

DAY = 86400.0


def rich_job(key: str) -> dict[str, Any]:
    return {
        "channel": "receipts",
        "key": key,
        "to": ["Zoe Quartz <zoe.quartz@example.net>"],
        "cc": "carl.cc@example.net",
        "bcc": ["bea.hidden@example.net"],
        "reply_to": "reply.here@example.net",
        "subject": "Invoice 7731 for Zoe",
        "body": "Dear Zoe, your balance is 12.40 EUR.",
        "html": "<p>Dear Zoe</p>",
        "headers": {"List-Unsubscribe": "<mailto:unsub-zoe@example.net>"},
        "in_reply_to": "<thread-1@example.net>",
        "references": ["<thread-0@example.net>", "<thread-1@example.net>"],
        "attachments": [
            {
                "filename": "invoice-zoe.pdf",
                "content_type": "application/pdf",
                "content_base64": "JVBERi0xLjQKWm9lIFF1YXJ0eg==",
            }
        ],
    }


@pytest.fixture
def rig() -> Any:
    rig = EngineRig(policy("receipts", on_unknown="retry"), policy("legal", on_unknown="review"))
    yield rig
    rig.close()


def submit(rig: EngineRig, data: dict[str, Any]) -> JobContent:
    content = parse_job(data)
    rig.ledger.submit(content, rig.policies[content.channel].sender)
    return content


def all_text(rig: EngineRig, key: str) -> str:
    """Every field of every event of the job, as text."""
    return repr([vars(event) for event in rig.ledger.history(key)])


def test_a_purge_keeps_the_trail_and_empties_the_content(rig: EngineRig) -> None:
    content = submit(rig, rich_job("inv-1"))
    rig.tick()
    before = rig.job("inv-1")
    assert before.state is JobState.CONFIRMED
    assert "zoe.quartz@example.net" in all_text(rig, "inv-1")

    rig.clock.advance(31 * DAY)
    result = rig.ledger.purge_settled(rig.clock() - timedelta(days=30), by="ops", rule="r")
    assert (result.purged, result.skipped, result.scrubbed) == (1, 0, True)

    job = rig.job("inv-1")
    text = all_text(rig, "inv-1")
    for secret in ("zoe", "carl.cc", "bea.hidden", "reply.here", "Invoice 7731", "12.40", "JVBER"):
        assert secret.lower() not in text.lower(), secret
    # The trail: key, channel, Message-ID, content hash, every event and who.
    assert (job.key, job.channel, job.message_id) == (before.key, before.channel, before.message_id)
    assert job.content_hash == before.content_hash == content.content_hash
    assert rig.events("inv-1") == ["Requested", "Attempted", "Confirmed", "Purged"]
    purged = rig.ledger.history("inv-1")[-1]
    assert (purged.by, purged.rule, purged.timestamp) == ("ops", "r", rig.clock())
    assert job.state is JobState.CONFIRMED and job.purged_by == "ops"
    status = job_status(job)
    assert status["purged"] == {"at": "2026-12-02T09:00:00.000Z", "by": "ops"}
    assert "to" not in status and "subject" not in status
    # The index says so, and is still what the events say.
    row = rig.ledger.row("inv-1")
    assert row is not None and row.purged_at == rig.clock().timestamp()
    assert row == index_row(job)


def test_the_same_key_and_content_is_still_known_after_a_purge(rig: EngineRig) -> None:
    submit(rig, rich_job("inv-2"))
    rig.tick()
    rig.ledger.purge("inv-2", by="ops", rule="r")
    again = rig.ledger.submit(parse_job(rich_job("inv-2")), rig.policies["receipts"].sender)
    assert again.created is False
    with pytest.raises(KeyConflict):
        rig.ledger.submit(
            parse_job({**rich_job("inv-2"), "body": "other"}), rig.policies["receipts"].sender
        )


def test_a_purged_job_is_never_sent_resolved_or_purged_again(rig: EngineRig) -> None:
    rig.submit("legal", "l-1")
    rig.provider.script(Scripted.dropped_response())
    rig.tick()
    assert rig.job("l-1").state is JobState.REVIEW
    with pytest.raises(TransitionError, match="Purged"):
        rig.ledger.purge("l-1", by="ops", rule="r")  # in review: a human decides first
    rig.ledger.update(
        "l-1", lambda j: j.resolve(Resolution.ABANDON, note="", by="op", at=rig.clock())
    )
    rig.ledger.purge("l-1", by="ops", rule="r")
    for command in (
        lambda j: j.resolve(Resolution.RESEND, note="", by="op", at=rig.clock()),
        lambda j: j.purge(by="ops", rule="r", at=rig.clock()),
    ):
        with pytest.raises(TransitionError, match="purged"):
            rig.ledger.update("l-1", command)
    rig.clock.advance(DAY)
    rig.tick()
    assert rig.copies("l-1") == 1 and rig.events("l-1")[-1] == "Purged"


def test_only_jobs_settled_for_good_and_old_enough_are_purged(rig: EngineRig) -> None:
    rig.submit("receipts", "old")
    rig.tick()
    rig.clock.advance(10 * DAY)
    rig.submit("receipts", "young")
    rig.tick()
    rig.submit("legal", "review")
    rig.provider.script(Scripted.dropped_response())
    rig.tick()
    rig.submit("receipts", "open")
    rig.clock.advance(DAY)
    assert [r.key for r in rig.ledger.purgeable(rig.clock() - timedelta(days=5))] == ["old"]
    rig.ledger.purge_settled(rig.clock() - timedelta(days=5), by="ops", rule="r")
    assert [k for k in ("old", "young", "review", "open") if rig.job(k).purged] == ["old"]
    assert list(rig.ledger.purgeable(rig.clock())) == [rig.ledger.row("young")]


def test_a_confirmed_job_still_to_be_verified_is_not_purged(rig: EngineRig) -> None:
    # A resend after believed misses is verified later: not settled for good until then.
    rig.submit("receipts", "v-1")
    rig.provider.script(Scripted.lost_request())
    rig.tick()
    for _ in range(6):
        rig.advance_and_tick(60)
    job = rig.job("v-1")
    assert job.state is JobState.CONFIRMED and job.verifying
    assert list(rig.ledger.purgeable(rig.clock() + timedelta(days=1))) == []
    with pytest.raises(TransitionError, match="verification"):
        rig.ledger.purge("v-1", by="ops", rule="r")


def test_a_purge_that_meets_another_writer_writes_nothing(rig: EngineRig) -> None:
    submit(rig, rich_job("inv-3"))
    rig.tick()
    real_save = rig.ledger._save_collected

    def racing_save(*objs: Any, **kwargs: Any) -> Any:
        # Another writer appends first (here: a purge of its own).
        rig.ledger._save_collected = real_save  # type: ignore[method-assign]
        rig.ledger.purge("inv-3", by="other", rule="r")
        return real_save(*objs, **kwargs)

    rig.ledger._save_collected = racing_save  # type: ignore[method-assign]
    with pytest.raises(ConcurrentUpdate):
        rig.ledger.purge("inv-3", by="ops", rule="r")
    assert [e.by for e in rig.ledger.history("inv-3") if isinstance(e, SendJob.Purged)] == ["other"]


def test_text_quoting_the_content_in_other_events_is_scrubbed(rig: EngineRig) -> None:
    content = _rejected_then_abandoned(
        rig,
        rich_job("inv-4"),
        "550 5.1.1 <ZOE.QUARTZ@example.net> unknown",
        "Zoe Quartz moved; Invoice 7731 for Zoe",
    )
    events = {type(e).__name__: e for e in rig.ledger.history("inv-4")}
    assert events["Rejected"].reason == f"550 5.1.1 <{REDACTED}> unknown"
    assert events["Resolved"].note == f"{REDACTED} moved; {REDACTED}"
    assert events["Requested"].content_hash == content.content_hash
    assert rig.ledger.row("inv-4").reason == rig.job("inv-4").reason  # type: ignore[union-attr]


# -- the redaction itself, for any content ------------------------------------------------

local = st.text("abcdefghijklmnopqrstuvwxyz0123456789.", min_size=1, max_size=12).filter(
    lambda s: not s.startswith(".") and not s.endswith(".") and ".." not in s
)
address = st.builds(lambda name, box: f"{name}@{box}.example.org", local, local)
subject = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), min_size=0, max_size=40)


@settings(max_examples=60, deadline=None)
@given(
    to=st.lists(address, min_size=1, max_size=3),
    bcc=st.lists(address, max_size=2),
    subject=subject,
    body=st.text(max_size=80),
    key=st.text("abcdefghij-0123456789", min_size=1, max_size=20),
)
def test_no_quoted_text_survives_outside_the_trail(
    to: list[str], bcc: list[str], subject: str, body: str, key: str
) -> None:
    rig = EngineRig(policy("receipts"))
    try:
        data = {"channel": "receipts", "key": key, "to": to, "bcc": bcc, "subject": subject}
        try:
            content = parse_job({**data, "body": body})
        except ValueError:
            return  # input the intake refuses never reaches a store
        rig.ledger.submit(content, rig.policies["receipts"].sender)
        quoted = " and ".join(content.to)
        rig.provider.script(Scripted.rejected(transient=False, reason=f"refused: {quoted}"))
        rig.tick()
        events = rig.ledger.history(key)
        redacted = redact_events(events, content)
        texts = quoted_texts(content)
        for original, event in zip(events, redacted, strict=True):
            assert type(event) is type(original)
            for name, value in vars(event).items():
                if name in TRAIL_FIELDS:
                    assert value == vars(original)[name], name
                elif name not in ("body", "html") and isinstance(value, str):
                    for text in texts:
                        assert text.lower() not in value.lower(), (name, text)
        requested = redacted[0]
        assert (requested.to, requested.bcc, requested.subject, requested.body) == ([], [], "", "")
        assert vars(events[0])["to"] == list(content.to)  # the original is untouched
    finally:
        rig.close()


def test_a_check_on_a_purged_job_answers_but_records_nothing(rig: EngineRig) -> None:
    # A person's check (or one whose search was out when the purge ran) still shows what
    # the mailbox holds, but nothing is appended after Purged: the trail ends there.
    from daemon.service_layer.services import ChannelPolicies, Services

    submit(rig, rich_job("inv-9"))
    rig.tick()
    rig.ledger.purge("inv-9", by="ops", rule="r")
    door = Services(rig.ledger, lambda: ChannelPolicies(rig.policies), providers=_fake(rig))
    answer = door.check("inv-9", by="alice")
    assert answer.count == 1 and not answer.recorded
    assert rig.events("inv-9")[-1] == "Purged"
    with pytest.raises(TransitionError, match="purged"):
        rig.ledger.update(
            "inv-9",
            lambda j: j.record_check(
                by="bob", purpose="check", query="q", copies=[], at=rig.clock()
            ),
        )


def _fake(rig: EngineRig) -> Any:
    from contextlib import nullcontext

    return lambda name: nullcontext(rig.provider)


def test_admin_purge_of_a_watched_job_names_the_bounce_watch() -> None:
    # `admin purge --key` said "with a verification due" for whatever was due; a tired
    # operator then looks for a verification that does not exist. It names what is due.
    import argparse

    from daemon.cli.admin_purge import _purge_keys
    from daemon.exit_codes import EXIT_CONFLICT, CliError

    rig = EngineRig(policy("receipts", watch_bounces="1h"))
    try:
        rig.submit("receipts", "w-1")
        rig.tick()
        args = argparse.Namespace(key=["w-1"], dry_run=False, json=False)
        with pytest.raises(CliError) as refused:
            _purge_keys(rig.ledger, args, "ops")
        assert refused.value.code == EXIT_CONFLICT
        assert "bounce watch" in str(refused.value) and "verification" not in str(refused.value)
        assert rig.events("w-1")[-1] == "WatchingBounces"  # nothing written
    finally:
        rig.close()


def test_an_internationalized_address_is_scrubbed_as_a_person_writes_it(rig: EngineRig) -> None:
    # The job keeps `zoe@xn--bcher-kva.example` (the wire's form); the operator's note,
    # and a report in RFC 6533's utf-8 form, write the domain as people read it.
    data = {**rich_job("inv-idn"), "to": ["Zoë Quartz <zoe.quartz@bücher.example>"]}
    note = "wrote to ZOE.QUARTZ@Bücher.example and zoe.quartz@xn--bcher-kva.example"
    _rejected_then_abandoned(rig, data, "550 5.1.1 unknown", note)
    [resolved] = [e for e in rig.ledger.history("inv-idn") if isinstance(e, SendJob.Resolved)]
    assert resolved.note == f"wrote to {REDACTED} and {REDACTED}"


def test_a_job_another_purger_took_meanwhile_is_not_left_for_the_next_run(
    rig: EngineRig,
) -> None:
    # Two daemons' retention (or `admin purge` beside the daemon) list the same jobs: one
    # purged by the other meanwhile was counted "changed meanwhile: next run", which the
    # log and `admin purge` then reported, though nothing was left to do.
    for key in ("a", "b"):
        rig.submit("receipts", key)
    rig.tick()
    rig.clock.advance(2 * DAY)
    real = rig.ledger.purgeable

    def listed_then_other_purges(before: Any) -> Any:
        rows = list(real(before))
        rig.ledger.purge("b", by="daemon other", rule="r")  # after this run listed it
        return iter(rows)

    rig.ledger.purgeable = listed_then_other_purges  # type: ignore[method-assign]
    result = rig.ledger.purge_settled(rig.clock() - timedelta(days=1), by="ops", rule="r")
    assert (result.purged, result.skipped) == (1, 0)
    assert rig.job("a").purged and rig.job("b").purged_by == "daemon other"


def test_a_check_on_a_purged_job_says_why_it_was_not_recorded(
    rig: EngineRig, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # `review check` and the job page said "it repeats the job's last check" of any check
    # not recorded out of flight: for a purged job there was no such check.
    import argparse

    import daemon.cli.service as cli
    from daemon.service_layer.services import ChannelPolicies, Services

    submit(rig, rich_job("inv-10"))
    rig.tick()
    rig.ledger.purge("inv-10", by="ops", rule="r")
    door = Services(rig.ledger, lambda: ChannelPolicies(rig.policies), providers=_fake(rig))
    monkeypatch.setattr(cli, "served", lambda args, call: call(door))
    args = argparse.Namespace(key="inv-10", by="alice", json=False, config=None)
    assert cli.cmd_review_check(args) == 0
    out = capsys.readouterr().out
    assert "not recorded in the job's history: its content was purged" in out
    assert "repeats" not in out


def _rejected_then_abandoned(
    rig: EngineRig, data: dict[str, Any], reason: str, note: str = "", *, purge: bool = True
) -> JobContent:
    """The job submitted, refused for good with `reason`, abandoned with `note`, and
    (unless `purge` is False) purged; its content."""
    content = submit(rig, data)
    rig.provider.script(Scripted.rejected(transient=False, reason=reason))
    rig.tick()
    rig.ledger.update(
        data["key"],
        lambda j: j.resolve(Resolution.ABANDON, note=note, by="op", at=rig.clock()),
    )
    if purge:
        rig.ledger.purge(data["key"], by="ops", rule="r")
    return content


def test_another_unicode_spelling_of_the_subject_or_name_is_scrubbed(rig: EngineRig) -> None:
    # The job holds the text as typed (here decomposed, as macOS writes it); a provider, a
    # report or an operator writes it composed, or upper-cased ("ß" as "SS").
    data = {
        **rich_job("inv-nfd"),
        "to": ["Zoe\u0308 Quartz <zoe.quartz@example.net>"],
        "subject": "Gru\u0308ße aus der Straße",
    }
    reason = "550 refused: GRÜSSE AUS DER STRASSE for Zoë Quartz"
    _rejected_then_abandoned(rig, data, reason, note="Grüße aus der Straße / zoë quartz")
    events = {type(e).__name__: e for e in rig.ledger.history("inv-nfd")}
    assert events["Rejected"].reason == f"550 refused: {REDACTED} for {REDACTED}"
    assert events["Resolved"].note == f"{REDACTED} / {REDACTED}"


def test_attachment_names_and_extra_header_values_quoted_elsewhere_are_scrubbed(
    rig: EngineRig,
) -> None:
    # A content filter names the attachment it blocked; a receiver quotes an X- header.
    data = {**rich_job("inv-att"), "headers": {"X-Customer-Ref": "zq-88172-quartz"}}
    reason = "552 5.7.0 attachment invoice-zoe.pdf blocked (X-Customer-Ref: zq-88172-quartz)"
    _rejected_then_abandoned(rig, data, reason, note="filter ate INVOICE-ZOE.PDF")
    events = {type(e).__name__: e for e in rig.ledger.history("inv-att")}
    assert events["Rejected"].reason == (
        f"552 5.7.0 attachment {REDACTED} blocked (X-Customer-Ref: {REDACTED})"
    )
    assert events["Resolved"].note == f"filter ate {REDACTED}"


def test_a_subject_or_name_quoted_as_encoded_words_is_scrubbed(rig: EngineRig) -> None:
    # A provider's error or a delivery report quotes the header as it left: RFC 2047 words
    # (ours in base64, another MTA's re-encoding in Q, split anywhere). Decoded, they read
    # the subject and the name as plainly as the typed text.
    from ledger.header_encoding import client_view, encoded_words

    data = {**rich_job("inv-2047"), "to": ["Zoë Quartz <zoe.quartz@example.net>"]}
    data["subject"] = "Rechnung 7731 für Zoë Quartz, Mai"
    words = " ".join(encoded_words(data["subject"], first_room=20))
    assert len(words.split()) > 1  # folded: the subject spans encoded words
    reason = f"554 5.7.1 rejected Subject: {words} To: =?UTF-8?Q?Zo=C3=AB_Quartz?= <x@y.example>"
    # Another encoder splits a character between two words, or encodes one word only.
    note = "see =?utf-8?q?Zo=C3?= =?utf-8?q?=AB_Quartz?= ok, cc =?utf-8?q?Zo=C3=AB?= Quartz"
    note += " =?idna?b?/w==?="  # a word no codec reads as asked is left as it is
    _rejected_then_abandoned(rig, data, reason, note=note)
    events = {type(e).__name__: e for e in rig.ledger.history("inv-2047")}
    for text in (events["Rejected"].reason, events["Resolved"].note):
        shown = client_view(text)
        for secret in ("Rechnung", "Zoë", "Quartz"):
            assert secret.lower() not in shown.lower(), (secret, text)
    assert events["Rejected"].reason.startswith("554 5.7.1 rejected Subject: ")
    assert events["Resolved"].note == f"see {REDACTED} ok, cc {REDACTED} =?idna?b?/w==?="


#: A webhook of the `rejected` events, and a receiver that refuses each delivery and
#: echoes the payload's `detail` (the provider's text) in its answer, as many do.
HOOK = Hook("ops", "https://hooks.example.com/x", "whsec_" + "A" * 32, frozenset({"rejected"}))


def echoing(url: str, body: bytes, headers: Mapping[str, str], timeout: float) -> Outcome:
    return Outcome(False, 400, f"HTTP 400: bad detail: {json.loads(body)['detail']}")


def test_a_webhook_error_quoting_the_job_is_scrubbed_by_its_purge(rig: EngineRig) -> None:
    # A receiver that refuses a delivery often echoes what it could not take; the first
    # 200 bytes of its answer are kept as the webhook's last error (`webhooks status`)
    # until a delivery succeeds, which for a webhook left skipped or stuck is never.
    submit(rig, rich_job("inv-hook"))
    reason = "550 5.1.1 <zoe.quartz@example.net>: no such user"
    rig.provider.script(Scripted.rejected(transient=False, reason=reason))
    rig.tick()
    now = rig.clock().timestamp
    Deliverer(rig.ledger, HOOK, owner="a", poster=echoing, clock=now).pass_once()
    [row] = rig.ledger.positions().read_all()
    assert row.last_error is not None and "zoe.quartz@example.net" in row.last_error
    rig.ledger.update(
        "inv-hook", lambda j: j.resolve(Resolution.ABANDON, note="", by="op", at=rig.clock())
    )
    rig.ledger.purge("inv-hook", by="ops", rule="r")
    [row] = rig.ledger.positions().read_all()
    assert row.last_error == f"HTTP 400: bad detail: 550 5.1.1 <{REDACTED}>: no such user"
    assert (row.failures, row.position) == (1, 0)  # only the text changed


def test_a_webhook_error_from_a_delivery_the_purge_overtook_is_scrubbed(rig: EngineRig) -> None:
    # A delivery read the event before the purge committed and its POST (up to a timeout)
    # came back refused after the purge had scrubbed the webhooks' errors: the receiver's
    # echo of the unpurged payload was then kept, and no later purge would find it.
    def purged_while_posting(
        url: str, body: bytes, headers: Mapping[str, str], timeout: float
    ) -> Outcome:
        rig.ledger.purge("inv-race", by="ops", rule="r")
        return echoing(url, body, headers, timeout)

    reason = "550 5.1.1 <zoe.quartz@example.net>: no such user"
    _rejected_then_abandoned(rig, rich_job("inv-race"), reason, purge=False)
    now = rig.clock().timestamp
    Deliverer(rig.ledger, HOOK, owner="a", poster=purged_while_posting, clock=now).pass_once()
    assert rig.job("inv-race").purged
    [row] = rig.ledger.positions().read_all()
    assert row.failures == 1 and row.last_error is not None
    assert "zoe" not in row.last_error.lower() and row.last_error.startswith("HTTP 400")


def test_a_webhook_error_written_just_before_the_purge_committed_is_scrubbed(
    rig: EngineRig,
) -> None:
    # The purge scrubbed the webhooks' errors; before its events committed, a delivery
    # wrote the receiver's echo of the unpurged event and looked: not rewritten yet.
    reason = "550 5.1.1 <zoe.quartz@example.net>: no such user"
    _rejected_then_abandoned(rig, rich_job("inv-late"), reason, purge=False)
    deliverer = Deliverer(rig.ledger, HOOK, owner="a", poster=echoing, clock=rig.clock().timestamp)
    real_save = rig.ledger._save_collected

    def delivery_then_save(*objs: Any, **kwargs: Any) -> Any:
        rig.ledger._save_collected = real_save  # type: ignore[method-assign]
        deliverer.pass_once()
        [row] = rig.ledger.positions().read_all()
        assert row.last_error is not None and "zoe.quartz" in row.last_error
        return real_save(*objs, **kwargs)

    rig.ledger._save_collected = delivery_then_save  # type: ignore[method-assign]
    rig.ledger.purge("inv-late", by="ops", rule="r")
    [row] = rig.ledger.positions().read_all()
    assert row.last_error == f"HTTP 400: bad detail: 550 5.1.1 <{REDACTED}>: no such user"


def test_a_subject_quoted_as_a_folded_header_is_scrubbed(rig: EngineRig) -> None:
    # A long subject leaves folded (CRLF and a space before a word); a provider quoting
    # the header as it came, or with its line breaks turned into spaces, has other
    # whitespace between the words than the job.
    from ledger.header_encoding import unstructured

    subject = "Your invoice 7731 for the order of Zoe Quartz placed on 3 November, with details"
    data = {**rich_job("inv-fold"), "subject": subject}
    folded = unstructured("Subject", subject)
    assert "\r\n " in folded
    reason = f"554 5.7.1 header rejected: {folded}"
    note = "bounced: " + folded.removeprefix("Subject: ").replace("\r\n", " ")
    _rejected_then_abandoned(rig, data, reason, note=note)
    events = {type(e).__name__: e for e in rig.ledger.history("inv-fold")}
    assert events["Rejected"].reason == f"554 5.7.1 header rejected: Subject: {REDACTED}"
    assert events["Resolved"].note == f"bounced: {REDACTED}"


def test_a_job_changed_after_the_purge_listed_it_is_left_for_the_next_run(
    rig: EngineRig,
) -> None:
    # The purge lists a page of jobs last changed before the cut-off, then purges them one
    # by one; a person's check of one of them in between (here: two copies found, which
    # they will want to look into) made it a job changed today, yet it was purged.
    rig.submit("receipts", "c-1")
    rig.tick()
    rig.clock.advance(40 * DAY)
    real = rig.ledger.purgeable

    def listed_then_checked(before: Any) -> Any:
        rows = list(real(before))
        rig.ledger.update(
            "c-1",
            lambda j: j.record_check(
                by="alice", purpose="check", query="q", copies=["m1", "m2"], at=rig.clock()
            ),
        )
        return iter(rows)

    rig.ledger.purgeable = listed_then_checked  # type: ignore[method-assign]
    result = rig.ledger.purge_settled(rig.clock() - timedelta(days=30), by="ops", rule="r")
    assert (result.purged, result.skipped) == (0, 1)
    assert not rig.job("c-1").purged and rig.events("c-1")[-1] == "Checked"


def test_a_quote_cut_short_at_the_end_of_a_text_is_scrubbed(rig: EngineRig) -> None:
    # Provider texts are kept cut (an SMTP reply at 300 characters, a Graph error at 240,
    # a receiver's answer at 200 bytes): an address or subject the cut fell inside is
    # left as its first characters, which still name the person.
    filler = "policy text " * 22
    reason = f"550 5.7.1 {filler}for <Zoe.Quartz@exam"
    _rejected_then_abandoned(rig, rich_job("inv-cut"), reason, note="about: Invoice 7731 fo")
    events = {type(e).__name__: e for e in rig.ledger.history("inv-cut")}
    assert events["Rejected"].reason == f"550 5.7.1 {filler}for <{REDACTED}"
    assert events["Resolved"].note == f"about: {REDACTED}"


@pytest.mark.parametrize(
    ("subject", "headers"),
    [("Abandon", {}), ("Abandoned cart: 2 items", {}), ("Hi", {"X-Campaign": "abandon"})],
)
def test_a_subject_or_value_that_spells_a_decision_leaves_the_decision(
    rig: EngineRig, subject: str, headers: dict[str, str]
) -> None:
    # The scrub looked into every field outside the trail, codes too: a job whose subject
    # or header value was (or began with) "abandon" lost its Resolved decision, its
    # redacted copy then replayed to review, and the purge was refused as "changed
    # meanwhile" at every run.
    data = {**rich_job("inv-code"), "subject": subject, "headers": headers}
    _rejected_then_abandoned(rig, data, "550 no", note="")
    job = rig.job("inv-code")
    assert job.purged and job.state is JobState.ABANDONED
    [resolved] = [e for e in rig.ledger.history("inv-code") if isinstance(e, SendJob.Resolved)]
    assert resolved.decision == "abandon"
    assert rig.ledger.row("inv-code").reason == "resolved: abandon"  # type: ignore[union-attr]


def test_a_long_header_value_quoted_whole_is_scrubbed_and_the_purge_stays_quick(
    rig: EngineRig,
) -> None:
    # Texts over 300 characters are looked for as typed, not compiled into the pattern:
    # a job of 50 headers of 2,000 characters made each purge of it take seconds.
    long_value = " ".join(f"wörd{i:04d}é" for i in range(180))[:1990]
    headers = {f"X-Long-{i}": long_value[:-2] + f"{i:02d}" for i in range(50)}
    data = {**rich_job("inv-long"), "headers": headers}
    note = "pasted: " + headers["X-Long-7"].upper()
    pattern = scrubber(quoted_texts(parse_job(data)))
    # The pattern compiled per purged job holds the short texts only (it held 200,000
    # characters here: a second per job).
    assert pattern is not None and len(pattern.pattern) < 5000
    _rejected_then_abandoned(rig, data, "550 no", note=note)
    [resolved] = [e for e in rig.ledger.history("inv-long") if isinstance(e, SendJob.Resolved)]
    assert resolved.note == f"pasted: {REDACTED}"


def test_a_folded_subject_quoted_with_escaped_line_breaks_is_scrubbed(rig: EngineRig) -> None:
    # A receiver's answer is kept through `printable` (a CR LF written as the characters
    # "\r\n"), and a JSON echo escapes it the same way: the fold's break is then no
    # whitespace at all.
    import json

    from ledger.display import printable
    from ledger.header_encoding import unstructured

    subject = "Your invoice 7731 for the order of Zoe Quartz placed on 3 November, with details"
    data = {**rich_job("inv-esc"), "subject": subject}
    folded = unstructured("Subject", subject).removeprefix("Subject: ")
    reason = "HTTP 400: " + printable(folded)
    assert "\\x0d\\x0a " in reason
    note = "echoed: " + json.dumps(folded)[1:-1]
    assert "\\r\\n " in note
    _rejected_then_abandoned(rig, data, reason, note=note)
    events = {type(e).__name__: e for e in rig.ledger.history("inv-esc")}
    assert events["Rejected"].reason == f"HTTP 400: {REDACTED}"
    assert events["Resolved"].note == f"echoed: {REDACTED}"


# -- quotes in the forms a receiver decodes ------------------------------------------------

#: Letters a subject, a name or a file name is made of, most of them outside ASCII: the
#: forms below re-spell exactly those.
_LETTERS = st.characters(
    categories=("Lu", "Ll", "Nd"),
    exclude_characters="\u0130\u0131\u017f\u212a",
    max_codepoint=0x2FFF,
)
_WORDS = st.lists(st.text(_LETTERS, min_size=2, max_size=8), min_size=1, max_size=4).map(" ".join)


def _scrubbed(content: JobContent, text: str) -> str:
    """`text` as a purge of `content`'s job leaves it in one of its events."""
    texts = quoted_texts(content)
    [event] = redact_events([_Texted(text)], content, texts)
    return event.text


class _Texted:
    """An event with one text field (what `redact_event` scrubs, as a provider's reason)."""

    def __init__(self, text: str) -> None:
        self.text = text


@settings(max_examples=80, deadline=None)
@given(stem=_WORDS.filter(lambda s: len(s) >= 3))
def test_an_attachment_name_quoted_in_rfc2231_form_is_scrubbed(stem: str) -> None:
    # A content filter quotes the Content-Disposition it blocked as it left: our writer's
    # RFC 2231 form (`filename*=utf-8''%C3%A9t%C3%A9.pdf`, or `filename*0*=`, `*1*`, ...
    # continuations for a long name), which a mail reader decodes to the name.
    from ledger.attachments import filename_problem
    from ledger.header_encoding import parameter, parameter_value

    name = f"{stem} {stem}.pdf"
    if filename_problem(name):
        return
    data = {**rich_job("inv-2231")}
    data["attachments"] = [{**data["attachments"][0], "filename": name}]
    content = parse_job(data)
    params = parameter("filename", name)
    for sep in ("; ", ";\r\n "):
        reason = f"552 5.7.0 blocked: attachment; {sep.join(params)}; size=30"
        scrubbed = _scrubbed(content, reason)
        pairs = dict(p.strip().split("=", 1) for p in scrubbed.split(";")[1:] if "=" in p)
        assert parameter_value(pairs, "filename") != name, scrubbed
        assert name.lower() not in scrubbed.lower()
        assert scrubbed.startswith("552 5.7.0 blocked: attachment; ") and scrubbed.endswith(
            "; size=30"
        )


def test_a_purge_scrubs_an_rfc2231_file_name_and_its_continuations(rig: EngineRig) -> None:
    data = {**rich_job("inv-2231-e")}
    name = "été " * 20 + "Zoë.pdf"
    data["attachments"] = [{**data["attachments"][0], "filename": name}]
    reason = "552 blocked filename*=utf-8''%C3%A9t%C3%A9%20Zo%C3%AB.pdf (policy)"
    note = "filter: filename*0*=utf-8''%C3%A9t%C3%A9%20%C3%A9t%C3%A9%20; filename*1*=" + (
        "%C3%A9t%C3%A9%20" * 18 + "Zo%C3%AB.pdf"
    )
    # The first is not the job's name (a shorter one): left; the second is.
    _rejected_then_abandoned(rig, data, reason, note=note)
    events = {type(e).__name__: e for e in rig.ledger.history("inv-2231-e")}
    assert events["Rejected"].reason == reason
    assert events["Resolved"].note == f"filter: {REDACTED}"


@settings(max_examples=80, deadline=None)
@given(subject=_WORDS.filter(lambda s: len(s) >= MIN_QUOTED_LENGTH), name=_WORDS)
def test_a_json_echo_with_escaped_characters_is_scrubbed(subject: str, name: str) -> None:
    # A provider (or a webhook receiver) echoes the subject or the name in a JSON error
    # with non-ASCII escaped (`"Gr\u00fc\u00dfe"`, Python's and most encoders' default):
    # a JSON reader sees the subject whole.
    from ledger.display import printable

    data = {**rich_job("inv-json"), "subject": subject, "to": [f"{name} <zoe@example.net>"]}
    try:
        content = parse_job(data)
    except ValueError:
        return
    for quoted in (subject, name):
        if len(quoted) < MIN_QUOTED_LENGTH:
            continue
        echo = json.dumps({"error": f"bad value: {quoted}!", "code": 7})
        # As a provider's text keeps it, and as a webhook's error does (`printable`:
        # each backslash doubled, which its reader undoes).
        for kept, doubled in ((echo, False), (printable(echo), True)):
            body = _scrubbed(content, "HTTP 400: " + kept).removeprefix("HTTP 400: ")
            answer = json.loads(body.replace("\\\\", "\\") if doubled else body)
            assert quoted.lower() not in answer["error"].lower(), body
            assert answer["error"].startswith("bad value: ") and answer["code"] == 7


@settings(max_examples=80, deadline=None)
@given(subject=_WORDS, data=st.data())
def test_a_quote_cut_short_inside_a_text_is_scrubbed(subject: str, data: st.DataObject) -> None:
    # A provider cuts a long subject in the middle of its message ("... subject 'Rechnung
    # 77…' exceeds ..."): its first characters still name the person, and the text goes
    # on after them.
    if len(subject) <= MIN_QUOTED_LENGTH:
        return
    content = parse_job({**rich_job("inv-mid"), "subject": subject})
    cut = data.draw(st.integers(MIN_QUOTED_LENGTH, len(subject) - 1))
    quoted = subject[:cut]
    mark = data.draw(st.sampled_from(["…", "...", "'", ""]))
    if not mark and not (quoted[-1].isalnum() and subject[cut].isalnum()):
        return  # no mark, cut between words: nothing tells a cut from a word of the text
    text = f"554 5.7.1 subject '{quoted}{mark or ' '}' exceeds the policy of mx.example"
    scrubbed = _scrubbed(content, text)
    assert quoted.strip().lower() not in scrubbed.lower(), scrubbed
    assert scrubbed.startswith("554 5.7.1 subject '")
    assert scrubbed.endswith("' exceeds the policy of mx.example")


def test_a_subject_shorter_at_its_start_in_a_text_is_left(rig: EngineRig) -> None:
    # Words the subject begins with, in a text that goes on with other words, are no cut.
    data = {**rich_job("inv-word"), "subject": "Your order 7731 has shipped"}
    content = parse_job(data)
    for text in ("Your message was refused", "Your order, it says, is late"):
        assert _scrubbed(content, text) == text


def test_a_self_similar_note_beside_long_header_values_is_scrubbed_quickly() -> None:
    # The search for a quote cut inside a text compared each place the text's start is
    # found, one character at a time: a note of 10,000 "<" beside three header values of
    # 2,000 "<" took a minute per purge of the job.
    import time

    headers = {f"X-Ref-{i}": "<" * 1998 + f"x{i}" for i in range(3)}
    content = parse_job({**rich_job("inv-self"), "headers": headers})
    started = time.monotonic()
    scrubbed = _scrubbed(content, "<" * 10_000)
    assert time.monotonic() - started < 3.0
    assert len(scrubbed) <= 10_000


def test_a_receivers_json_echo_kept_as_a_webhooks_error_is_scrubbed(rig: EngineRig) -> None:
    # A receiver answers its refusal with the payload's detail in JSON, non-ASCII escaped
    # (`"Zo\u00eb Quartz"`); the webhook keeps its answer through `printable`, which
    # doubles each backslash (`Zo\\u00eb`): the escapes were then no JSON escapes to the
    # scrub, and the name stayed in `webhooks status` after the purge.
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from daemon.webhooks.delivery import post

    class Echo(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            answer = json.dumps({"error": f"bad detail: {json.loads(body)['detail']}"})
            self.send_response(400)
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer.encode())

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Echo)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/hook"
        hook = Hook("ops", url, "whsec_" + "A" * 32, frozenset({"rejected"}), timeout=5.0)
        data = {**rich_job("inv-echo"), "to": ["Zoë Quartz <zoe.quartz@example.net>"]}
        reason = "550 5.7.1 refused for Zoë Quartz by policy"
        _rejected_then_abandoned(rig, data, reason, purge=False)
        now = rig.clock().timestamp
        Deliverer(rig.ledger, hook, owner="a", poster=post, clock=now).pass_once()
        [row] = rig.ledger.positions().read_all()
        assert row.last_error is not None and "Zo\\\\u00eb Quartz" in row.last_error
        rig.ledger.purge("inv-echo", by="ops", rule="r")
        [row] = rig.ledger.positions().read_all()
        assert row.last_error is not None and row.last_error.startswith("HTTP 400: ")
        assert "quartz" not in row.last_error.lower() and "u00eb" not in row.last_error
    finally:
        server.shutdown()
        server.server_close()


def test_a_folded_subject_in_a_json_echo_kept_through_printable_is_scrubbed(
    rig: EngineRig,
) -> None:
    # A receiver's JSON echo of a folded subject writes its line break `\r\n`; the
    # webhook's last error keeps the answer through `printable`, which doubles each
    # backslash (`\\r\\n`): the words were no longer one quote to the scrub.
    from ledger.display import printable
    from ledger.header_encoding import unstructured

    subject = "Your invoice 7731 for the order of Zoe Quartz placed on 3 November, with details"
    content = parse_job({**rich_job("inv-esc2"), "subject": subject})
    folded = unstructured("Subject", subject).removeprefix("Subject: ")
    kept = "HTTP 400: " + printable(json.dumps({"error": folded}))
    assert "\\\\r\\\\n " in kept
    assert _scrubbed(content, kept) == 'HTTP 400: {"error": "' + REDACTED + '"}'


def test_the_daemons_purge_says_when_the_store_could_not_be_scrubbed(
    rig: EngineRig, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `admin purge` says "could not be scrubbed now"; the daemon's periodic purge said
    # only "purged N jobs", though the purged text was still in the store's files.
    import logging

    from daemon.service_layer.retention import RetentionJob

    rig.submit("receipts", "s-1")
    rig.tick()
    rig.clock.advance(2 * DAY)
    monkeypatch.setattr(rig.ledger, "scrub", lambda: False)
    with caplog.at_level(logging.INFO, logger="sendledger.retention"):
        result = RetentionJob(rig.ledger, DAY, daemon_name="d").run()
    assert (result.purged, result.scrubbed) == (1, False)
    [warning] = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "could not be scrubbed" in warning.getMessage()


# -- quotes in an HTML page or a URL ---------------------------------------------------------


def _decimal_references(text: str) -> str:
    return "".join(f"&#{ord(c)};" for c in text)


def _hex_references(text: str) -> str:
    return "".join(f"&#x{ord(c):X};" for c in text)


def _every_byte_escaped(text: str) -> str:
    return "".join(f"%{b:02X}" for b in text.encode())


#: How an HTML error page or a provider's URL writes a quote, each undone by what reads it.
_HTML_FORMS = (
    html.escape,
    lambda t: html.escape(t).encode("ascii", "xmlcharrefreplace").decode(),
    _decimal_references,
    _hex_references,
)
_URL_FORMS = (
    lambda t: urllib.parse.quote(t, safe=""),
    lambda t: urllib.parse.quote(t, safe="@"),
    lambda t: urllib.parse.quote_plus(t, safe=""),
    lambda t: urllib.parse.quote_plus(t, safe="@"),
    _every_byte_escaped,
)
_LOCAL_PARTS = st.from_regex(r"[a-z][a-z0-9]{1,6}([.+_-][a-z0-9]{1,6}){0,2}", fullmatch=True)


def _decoded(text: str) -> str:
    """`text` as each reader of it shows it, lower case: a browser, a URL decoder (`+`
    as a space, and as itself)."""
    return "\n".join(
        (
            html.unescape(text),
            urllib.parse.unquote(text),
            urllib.parse.unquote_plus(text),
        )
    ).lower()


def _embedded(form: int, kind: str, quoted: str) -> str:
    """`quoted` in provider-like text: an HTML error page (`form` of `_HTML_FORMS`) or a
    provider's URL (of `_URL_FORMS`)."""
    if kind == "html":
        encoded = _HTML_FORMS[form % len(_HTML_FORMS)](quoted)
        return f"HTTP 400: <html><body><p>Refused: &quot;{encoded}&quot;.</p></body></html>"
    encoded = _URL_FORMS[form % len(_URL_FORMS)](quoted)
    return f"550 5.7.1 see https://mx.example/why?code=550&q={encoded}&lang=en"


def _content_with(subject: str, name: str, local: str) -> JobContent | None:
    data = {
        **rich_job("inv-enc"),
        "subject": subject,
        "to": [f"{name} <{local}@example.net>"],
    }
    try:
        return parse_job(data)
    except ValueError:
        return None


@settings(max_examples=150, deadline=None)
@given(
    subject=_WORDS.filter(lambda s: len(s) >= MIN_QUOTED_LENGTH),
    name=_WORDS,
    local=_LOCAL_PARTS,
    form=st.integers(0, 19),
    kind=st.sampled_from(["html", "url"]),
)
def test_a_quote_in_an_html_page_or_a_url_is_scrubbed(
    subject: str, name: str, local: str, form: int, kind: str
) -> None:
    # A provider's HTML error page quotes the recipient or the subject with character
    # references (`zoe&#64;example.net`, `&amp;`, `&lt;`), and a provider's URL in an
    # error with percent escapes (`%40`, `+` for a space): a browser or a URL decoder
    # read them whole after the purge.
    content = _content_with(subject, name, local)
    around = _embedded(form, kind, "").lower()
    if content is None or any(t.lower() in around for t in (subject, name, local)):
        return  # the provider's own words would be scrubbed as well (`body`, `550`)
    for quoted in (subject, name, f"{local}@example.net", f"{name} <{local}@example.net>"):
        if len(quoted) < MIN_QUOTED_LENGTH:
            continue
        text = _embedded(form, kind, quoted)
        scrubbed = _scrubbed(content, text)
        assert quoted.lower() not in _decoded(scrubbed), (text, scrubbed)
        # The provider's text around the quote is left.
        tail = "&quot;.</p></body></html>" if kind == "html" else "&lang=en"
        assert REDACTED in scrubbed and scrubbed.endswith(tail), scrubbed


@settings(max_examples=150, deadline=None)
@given(
    subject=_WORDS.filter(lambda s: len(s) > MIN_QUOTED_LENGTH),
    local=_LOCAL_PARTS,
    form=st.integers(0, 19),
    kind=st.sampled_from(["html", "url"]),
    between_words=st.booleans(),
    after=st.sampled_from(["", "…", "... (truncated)"]),
    data=st.data(),
)
def test_an_encoded_quote_cut_short_is_scrubbed(
    subject: str,
    local: str,
    form: int,
    kind: str,
    between_words: bool,
    after: str,
    data: st.DataObject,
) -> None:
    # A provider that cuts its text cuts the encoded quote too: the start of an address
    # or a subject in a URL or an HTML page, anywhere or between two of its words ("Zoe
    # Quartz" before its space, "zoe.quartz" before its "@"), where the text ends or
    # before an ellipsis.
    content = _content_with(subject, "Zoe Quartz", local)
    if content is None:
        return
    for whole in (subject, f"{local}@example.net"):
        cuts = [
            i
            for i in range(MIN_QUOTED_LENGTH, len(whole))
            if not between_words or not whole[i].isalnum()
        ]
        if not cuts:
            continue
        quoted = whole[: data.draw(st.sampled_from(cuts))]
        if kind == "html":
            encoded = _HTML_FORMS[form % len(_HTML_FORMS)](quoted)
            text = f"HTTP 400: <html><body><p>Refused: &quot;{encoded}{after}"
        else:
            encoded = _URL_FORMS[form % len(_URL_FORMS)](quoted)
            text = f"550 5.7.1 see https://mx.example/why?code=550&q={encoded}{after}"
        scrubbed = _scrubbed(content, text)
        assert quoted.strip().lower() not in _decoded(scrubbed), (text, scrubbed)
        # (A dot the quote ends with may stay before an ellipsis: it names no one.)
        assert REDACTED in scrubbed and scrubbed.endswith(after), scrubbed


@pytest.mark.parametrize(
    "text",
    [
        "550 5.1.1 <zoe.quartz refused: no such user",
        "550 5.1.1 zoe.quartz-billing.eu@ (cut) refused",
        "550 5.1.1 rcpt zoe.quartz-billing, refused",
        # The address goes on with a dot: the ellipsis's first dot read as the address's.
        "550 5.1.1 rcpt zoe.quartz-billing.eu@example... (truncated) refused",
    ],
)
def test_an_address_cut_between_its_words_inside_a_text_is_scrubbed(text: str) -> None:
    # A provider cut the address before one of its marks and went on: "zoe.quartz" still
    # names the person, though the cut is no cut inside a word.
    content = parse_job({**rich_job("inv-addr"), "to": ["zoe.quartz-billing.eu@example.net"]})
    scrubbed = _scrubbed(content, text)
    assert "quartz" not in scrubbed and REDACTED in scrubbed, scrubbed


def test_an_address_whose_first_word_is_a_word_of_the_text_leaves_the_word() -> None:
    # One word of an address, followed by a space, is no cut: "info" is a word too.
    content = parse_job({**rich_job("inv-info"), "to": ["info.desk@example.net"]})
    text = "550 see info at mx.example"
    assert _scrubbed(content, text) == text


def test_a_purge_scrubs_a_quote_in_an_html_page_and_a_url(rig: EngineRig) -> None:
    data = {**rich_job("inv-html"), "subject": "Grüße & <Rabatt> für Zoë"}
    page = (
        "HTTP 400: <p>To zoe.quartz&#64;example.net: &quot;Gr&uuml;&szlig;e &amp; "
        "&lt;Rabatt&gt; f&#252;r Zo&#xEB;&quot; refused</p>"
    )
    url = "see https://mx.example/e?to=zoe.quartz%40example.net&s=Gr%C3%BC%C3%9Fe+%26+%3CRab"
    _rejected_then_abandoned(rig, data, page, note=url)
    events = {type(e).__name__: e for e in rig.ledger.history("inv-html")}
    assert events["Rejected"].reason == (
        f"HTTP 400: <p>To {REDACTED}: &quot;{REDACTED}&quot; refused</p>"
    )
    assert events["Resolved"].note == f"see https://mx.example/e?to={REDACTED}&s={REDACTED}"


def test_the_log_lines_that_may_quote_a_provider_are_those_operations_names() -> None:
    # docs/operations.md "Logs and retention" names the lines a purge cannot reach: the
    # ones whose argument is a provider's or a receiver's text. A new such line must be
    # named there too.
    import re
    from pathlib import Path

    src = Path(__file__).resolve().parents[2] / "src" / "daemon"
    quoting = {
        "job %s rejected (%s)": "`job K rejected (REASON)`",
        "job %s outcome unknown (%s)": "`job K outcome unknown (REASON)`",
        "job %s: attempt %d: %s": "`job K: attempt N: REASON`",
        "job %s to review: %s": "`job K to review: REASON`",
        "webhook %s: %s": "`webhook NAME: ERROR`",
    }
    found = {
        m.group(1)
        for path in src.rglob("*.py")
        for m in re.finditer(r"log\.\w+\(\s*\"([^\"]*)\"", path.read_text(encoding="utf-8"))
    }
    assert set(quoting) <= found, set(quoting) - found
    page = (src.parents[1] / "docs" / "operations.md").read_text(encoding="utf-8")
    section = " ".join(page.split("### Logs and retention", 1)[1].split("\n## ", 1)[0].split())
    for written in quoting.values():
        assert written in section, written
