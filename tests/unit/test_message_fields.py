"""The later message fields (bcc, headers, in_reply_to, references): validation naming
the field, the content hash, and where each lands in the raw message."""

from __future__ import annotations

import base64
import email
import email.policy
from datetime import UTC, datetime, timedelta
from email.message import EmailMessage
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.unit.engine_rig import EngineRig, policy

from ledger.content import JobContent, JobInputError, parse_job
from ledger.extra_headers import OWNED_HEADERS
from ledger.header_encoding import fold
from ledger.message import Envelope
from ledger.message_id import message_id_for
from ledger.mime import MessageLimits, build_message, check_recipients, check_size

MID = message_id_for("order-42", "mail.example.com")
FIRST_RELEASE_FIELDS = {"channel", "key", "to", "cc", "reply_to", "subject", "body", "html"}


def job(**extra: Any) -> dict[str, Any]:
    return {
        "channel": "receipts",
        "key": "order-42",
        "to": "bob@example.com",
        "subject": "Your receipt",
        "body": "Thanks.",
        **extra,
    }


def refused(data: dict[str, Any], field: str, reason: str = "") -> None:
    with pytest.raises(JobInputError) as info:
        parse_job(data)
    assert info.value.field == field, info.value
    assert reason in info.value.reason


def build(content: JobContent) -> bytes:
    return build_message(
        from_addr="Support <support@example.com>",
        to=content.to,
        cc=content.cc,
        subject=content.subject,
        body=content.body,
        message_id=MID,
        date=datetime(2026, 1, 1, tzinfo=UTC),
        bcc=content.bcc,
        headers=content.headers,
        in_reply_to=content.in_reply_to,
        references=content.references,
        html=content.html,
        attachments=content.attachments,
    )


def parse(raw: bytes) -> EmailMessage:
    message = email.message_from_bytes(raw, policy=email.policy.default)
    assert isinstance(message, EmailMessage)
    return message


# -- the content hash ---------------------------------------------------------------------


def test_a_job_without_the_new_fields_hashes_as_before() -> None:
    plain = parse_job(job())
    assert set(plain.canonical()) == FIRST_RELEASE_FIELDS
    empty = parse_job(job(bcc=[], headers={}, in_reply_to=None, references=[]))
    assert empty.content_hash == plain.content_hash
    # What the store keeps has every field, and loads back to the same content.
    assert JobContent.from_canonical(plain.stored()) == plain


@pytest.mark.parametrize(
    "extra",
    [
        {"bcc": "eve@example.com"},
        {"headers": {"X-Campaign": "spring"}},
        {"in_reply_to": "<a@b.example>"},
        {"references": ["<a@b.example>"]},
    ],
)
def test_each_new_field_changes_the_hash(extra: dict[str, Any]) -> None:
    content = parse_job(job(**extra))
    assert content.content_hash != parse_job(job()).content_hash
    assert JobContent.from_canonical(content.stored()) == content
    assert JobContent.from_canonical(content.canonical()) == content


def test_message_ids_are_canonical_with_angle_brackets() -> None:
    bare = parse_job(job(in_reply_to="a@b.example", references=["x@y.example"]))
    braced = parse_job(job(in_reply_to="<a@b.example>", references=["<x@y.example>"]))
    assert bare == braced and bare.in_reply_to == "<a@b.example>"


# -- refusals name the field ---------------------------------------------------------------


@pytest.mark.parametrize("name", [*sorted(OWNED_HEADERS), "Content-Type", "content-disposition"])
def test_owned_headers_are_refused(name: str) -> None:
    refused(job(headers={name: "x"}), f"headers.{name}", "written by sendledger")


@pytest.mark.parametrize(
    ("extra", "field", "reason"),
    [
        ({"bcc": "not an address"}, "bcc", "not a valid email address"),
        ({"bcc": ["a@example.com", 3]}, "bcc[1]", "must be a string"),
        ({"headers": ["X-A"]}, "headers", "must be an object"),
        ({"headers": {"Received": "x"}}, "headers.Received", "not allowed"),
        ({"headers": {"X-": "x"}}, "headers.X-", "not allowed"),
        ({"headers": {"X Bad": "x"}}, "headers.X Bad", "not a header name"),
        ({"headers": {"X-A": "a\r\nBcc: eve@example.com"}}, "headers.X-A", "CR or LF"),
        ({"headers": {"X-A": "a\tb"}}, "headers.X-A", "control character"),
        ({"headers": {"X-A": 3}}, "headers.X-A", "must be a string"),
        ({"headers": {"X-A": " "}}, "headers.X-A", "must not be empty"),
        ({"headers": {"X-A": " a"}}, "headers.X-A", "start or end with a space"),
        # Written as typed, so folded only at a space (an X-* value is encoded instead).
        (
            {"headers": {"List-Unsubscribe": "a" * 901}},
            "headers.List-Unsubscribe",
            "without a space",
        ),
        ({"headers": {"X-A": "1", "x-a": "2"}}, "headers.x-a", "given twice"),
        (
            {"headers": {"List-Unsubscribe": "<https://ä.example/>"}},
            "headers.List-Unsubscribe",
            "ASCII",
        ),
        ({"in_reply_to": "no id here"}, "in_reply_to", "not a message id"),
        ({"in_reply_to": ["<a@b.example>"]}, "in_reply_to", "must be a message id"),
        ({"references": "<a@b.example>"}, "references", "must be a list"),
        ({"references": ["<a@b.example>", "<bad>"]}, "references[1]", "not a message id"),
    ],
)
def test_bad_values_name_their_field(extra: dict[str, Any], field: str, reason: str) -> None:
    refused(job(**extra), field, reason)


def test_bcc_counts_against_the_recipient_limit() -> None:
    content = parse_job(job(bcc=["a@example.com", "b@example.com"]))
    limits = MessageLimits(max_bytes=10**6, max_recipients=2, where="providers.gmail")
    with pytest.raises(JobInputError, match="3 recipients"):
        check_recipients(content.to, content.cc, limits, content.bcc)


# -- hypothesis: every input surface -------------------------------------------------------

_value = st.text(st.characters(codec="utf-8"), max_size=60)
_name = st.text(st.characters(min_codepoint=32, max_codepoint=126), min_size=1, max_size=20)


@given(headers=st.dictionaries(_name, _value, max_size=4))
def test_headers_are_accepted_whole_or_refused_by_name(headers: dict[str, str]) -> None:
    """Any {name: value}: either refused naming `headers.<name>`, or every header arrives
    in the message with exactly its value."""
    try:
        content = parse_job(job(headers=headers))
    except JobInputError as exc:
        assert exc.field.startswith("headers.")
        assert exc.field[len("headers.") :] in headers
        return
    message = parse(build(content))
    for name, value in headers.items():
        assert message.get_all(name) == [value]


_atom = st.text(st.sampled_from("abcXYZ019!#$%&'*+/=?^_`{|}~-"), min_size=1, max_size=12)
# "=?" is refused in a message id (docs/cli.md "Message fields and validation"): it is written as
# typed, and a reader could take it for an encoded word.
_message_id = st.builds(lambda a, b, c: f"<{a}.{b}@{c}.example>", _atom, _atom, _atom).filter(
    lambda value: "=?" not in value
)


@given(in_reply_to=_message_id, references=st.lists(_message_id, max_size=8))
def test_threading_headers_round_trip(in_reply_to: str, references: list[str]) -> None:
    content = parse_job(job(in_reply_to=in_reply_to, references=references))
    message = parse(build(content))
    assert message["In-Reply-To"] == in_reply_to
    assert message.get_all("References") == ([" ".join(references)] if references else None)


@given(st.text(max_size=40))
def test_any_text_as_a_message_id_is_a_message_id_or_refused(value: str) -> None:
    try:
        content = parse_job(job(in_reply_to=value))
    except JobInputError as exc:
        assert exc.field == "in_reply_to"
        return
    assert parse(build(content))["In-Reply-To"] == content.in_reply_to


@given(st.lists(st.text(st.sampled_from("ab <>@.x"), max_size=30), max_size=6))
def test_fold_unfolds_to_the_value_and_never_splits_a_word(words: list[str]) -> None:
    value = " ".join(words)
    folded = fold("References", value.split(" "))
    assert folded.replace("\r\n", "") == f"References: {value}"
    for line in folded.split("\r\n")[1:]:
        assert line.startswith(" ") and line.strip()


# -- the raw message -----------------------------------------------------------------------

FULL = job(
    bcc=["audit@example.com", "Archive <archive@example.org>"],
    headers={
        "List-Unsubscribe": "<https://example.com/u/" + "t" * 100 + ">, <mailto:u@example.com>",
        "List-Unsubscribe-Post": "List-Unsubscribe=One-Click",
        "X-Note": "grüße",
    },
    in_reply_to="<parent@example.com>",
    references=["<root@example.com>", "<parent@example.com>"],
)


def test_bcc_is_in_the_raw_message_for_gmail() -> None:
    message = parse(build(parse_job(FULL)))
    assert message["Bcc"] == "audit@example.com, Archive <archive@example.org>"
    assert message["To"] == "bob@example.com"


def test_smtp_sends_bcc_in_the_envelope_only() -> None:
    envelope = Envelope(build(parse_job(FULL)))
    assert envelope.recipients == ["bob@example.com", "audit@example.com", "archive@example.org"]
    assert b"\nbcc:" not in envelope.data.lower()
    assert parse(envelope.data)["Bcc"] is None
    assert b"audit@example.com" not in envelope.data


def test_extra_and_threading_headers_are_present_and_intact() -> None:
    raw = build(parse_job(FULL))
    message = parse(raw)
    for name, value in FULL["headers"].items():
        assert message[name] == value
    assert message["In-Reply-To"] == "<parent@example.com>"
    assert message["References"] == "<root@example.com> <parent@example.com>"
    # The long URL is one token on one line, never encoded words; lines stay legal.
    assert b"List-Unsubscribe: <https://example.com/u/" + b"t" * 100 + b">," in raw
    assert all(len(line) <= 998 for line in raw.split(b"\r\n"))


def test_no_new_headers_when_the_fields_are_absent() -> None:
    message = parse(build(parse_job(job())))
    for name in ("Bcc", "In-Reply-To", "References", "List-Unsubscribe"):
        assert message[name] is None


# -- send_at -------------------------------------------------------------------------------


def test_send_at_is_one_spelling_per_instant() -> None:
    a = parse_job(job(send_at="2026-12-01T10:00:00+01:00"))
    b = parse_job(job(send_at="2026-12-01T09:00Z"))
    assert a == b and a.send_at == "2026-12-01T09:00:00+00:00"
    assert a.content_hash != parse_job(job()).content_hash


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("tomorrow at nine", "not an ISO 8601 time"),
        ("2026-12-01T09:00:00", "needs a time zone"),
        ("2026-12-01", "needs a time zone"),
        ("0001-01-01T00:00:00+01:00", "out of range"),
        (1764579600, "must be an ISO 8601 time string"),
    ],
)
def test_send_at_that_is_not_a_time_is_refused(value: object, reason: str) -> None:
    refused(job(send_at=value), "send_at", reason)


@given(st.datetimes(timezones=st.timezones()) | st.datetimes())
def test_any_datetime_is_its_instant_or_refused_for_its_zone(moment: datetime) -> None:
    try:
        content = parse_job(job(send_at=moment.isoformat()))
    except JobInputError as exc:
        assert exc.field == "send_at"
        assert moment.utcoffset() is None or moment.year in (1, 9999)
        return
    # Compared as written (with its offset): a zone's ambiguous local times never compare
    # equal across zones in Python, though the instant is the same.
    assert content.send_at_time == datetime.fromisoformat(moment.isoformat())


@given(st.text(max_size=30))
def test_any_text_as_send_at_is_a_time_or_refused(value: str) -> None:
    try:
        content = parse_job(job(send_at=value))
    except JobInputError as exc:
        assert exc.field == "send_at"
        return
    assert content.send_at_time is not None and content.send_at_time.tzinfo is not None


def test_a_job_is_not_dispatched_before_its_send_at() -> None:
    with EngineRig(policy("receipts")) as rig:
        start = rig.clock()
        content = parse_job(
            job(to="customer@example.net", send_at=(start + timedelta(hours=1)).isoformat())
        )
        rig.ledger.submit(content, rig.policies["receipts"].sender)
        assert rig.job("order-42").due_at == start + timedelta(hours=1)
        rig.tick()
        rig.advance_and_tick(3599)
        assert rig.copies("order-42") == 0
        assert rig.events("order-42") == ["Requested"]
        rig.advance_and_tick(1)
        assert rig.copies("order-42") == 1


def test_a_send_at_in_the_past_is_due_at_once() -> None:
    with EngineRig(policy("receipts")) as rig:
        content = parse_job(job(send_at="2020-01-01T00:00:00Z"))
        rig.ledger.submit(content, rig.policies["receipts"].sender)
        assert rig.job("order-42").due_at == rig.clock()
        rig.tick()
        assert rig.copies("order-42") == 1


# -- attachments ---------------------------------------------------------------------------

PDF = b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n1 0 obj << >> endobj\ntrailer << >>\n%%EOF\n"


def attachment(**overrides: Any) -> dict[str, Any]:
    item: dict[str, Any] = {
        "filename": "Rechnung März 2026.pdf",
        "content_type": "application/pdf",
        "content_base64": base64.b64encode(PDF).decode(),
    }
    item.update(overrides)
    return {k: v for k, v in item.items() if v is not ...}


@pytest.mark.parametrize(
    ("item", "field", "reason"),
    [
        ("file.pdf", "attachments[0]", "must be an object"),
        (attachment(content_base64="not base64!"), "attachments[0].content_base64", "decode"),
        (attachment(content_base64="abc"), "attachments[0].content_base64", "decode"),
        (attachment(content_base64=...), "attachments[0].content_base64", "is required"),
        (attachment(content_type="pdf"), "attachments[0].content_type", "type/subtype"),
        (attachment(content_type="multipart/mixed"), "attachments[0].content_type", "cannot"),
        (attachment(filename="../etc/passwd"), "attachments[0].filename", "not a path"),
        (attachment(filename="a\r\nb.pdf"), "attachments[0].filename", "control"),
        (attachment(filename=""), "attachments[0].filename", "empty"),
        (attachment(filename="<>"), "attachments[0].filename", "wrapped"),
        (attachment(filename='"invoice.pdf"'), "attachments[0].filename", "wrapped"),
        (attachment(size=3), "attachments[0].size", "unknown field"),
    ],
)
def test_bad_attachments_name_their_field(item: object, field: str, reason: str) -> None:
    refused(job(attachments=[item]), field, reason)
    refused(job(attachments="x"), "attachments", "must be a list")


def test_wrapped_base64_is_the_same_job() -> None:
    encoded = base64.b64encode(PDF).decode()
    wrapped = "\r\n".join(encoded[i : i + 16] for i in range(0, len(encoded), 16))
    a = parse_job(job(attachments=[attachment()]))
    b = parse_job(
        job(attachments=[attachment(content_base64=wrapped, content_type="Application/PDF")])
    )
    assert a == b and a.content_hash == b.content_hash != parse_job(job()).content_hash
    assert JobContent.from_canonical(a.stored()) == a


@given(
    files=st.lists(
        st.tuples(
            st.text(st.characters(codec="utf-8"), min_size=1, max_size=80),
            st.binary(max_size=300),
        ),
        max_size=3,
    ),
    html=st.none() | st.just("<p>hi</p>"),
)
def test_attachments_round_trip_in_multipart_mixed(
    files: list[tuple[str, bytes]], html: str | None
) -> None:
    """Any file name is carried exactly (RFC 2231 when needed) or refused naming it; every
    file's bytes come back; the text parts stay readable."""
    items = [
        attachment(filename=name, content_base64=base64.b64encode(data).decode())
        for name, data in files
    ]
    try:
        content = parse_job(job(attachments=items, html=html))
    except JobInputError as exc:
        assert exc.field.startswith("attachments[") and exc.field.endswith("].filename")
        return
    raw = build(content)
    assert raw == build(content)  # deterministic boundaries
    message = parse(raw)
    if not files:
        assert not message.is_multipart() or message.get_content_type() != "multipart/mixed"
        return
    assert message.get_content_type() == "multipart/mixed"
    parts = list(message.iter_attachments())
    assert [(p.get_filename(), p.get_content()) for p in parts] == list(files)
    body = message.get_body(("plain",))
    assert body is not None and body.get_content().replace("\r\n", "\n") == "Thanks.\n"


def test_attachments_count_against_the_size_limit() -> None:
    content = parse_job(
        job(attachments=[attachment(content_base64=base64.b64encode(b"x" * 3000).decode())])
    )
    raw = build(content)
    assert len(raw) > 4000  # base64 makes 3000 bytes about 4000
    with pytest.raises(JobInputError, match="attachments: the message is"):
        check_size(
            raw,
            MessageLimits(max_bytes=4000, max_recipients=10, where="providers.gmail"),
            "attachments",
        )
