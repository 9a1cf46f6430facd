"""Issue 16's findings, one test each (the example given and the class around it), and
the proof (`ledger/wire_check.py`) catching every way the bytes could differ from the job.
"""

from __future__ import annotations

import base64
import email
import email.policy
import time
import unicodedata
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.attachments import parse_attachment
from ledger.characters import BIDI_CONTROLS, unsafe_character
from ledger.content import (
    MAX_ADDRESS_TEXT,
    MAX_EXTRA_HEADERS,
    MAX_HEADER_VALUE,
    MAX_REFERENCES,
    MAX_SUBJECT,
    JobInputError,
    parse_job,
)
from ledger.header_encoding import client_view, encoded_words
from ledger.message import Envelope
from ledger.message_id import message_id_for
from ledger.mime import MessageFields, boundary, render_message
from ledger.wire_check import (
    RenderMismatch,
    _Bad,
    _split_top_level,
    _walk_top_level,
    carries_message_id,
    checked_message,
    find_mismatch,
)
from testkit.mime_reader import decoded

MID = message_id_for("order-42", "mail.example.com")
DATE = datetime(2026, 1, 1, 12, tzinfo=UTC)
RECEIPT_BCC = "=?utf-8?q?Your_receipt=0D=0ABcc:_evil@attacker.example?="
END_OF_HEADERS = "=?utf-8?q?Hi=0D=0A=0D=0AMessage-ID:_<evil@attacker.example>?="
FIELDS = MessageFields(
    from_addr="Support <support@example.com>",
    to=("alice@example.com",),
    subject="Your receipt",
    body="Thanks.\n",
    message_id=MID,
    date=DATE,
)


def job(**fields: Any) -> dict[str, Any]:
    return {
        "channel": "receipts",
        "key": "order-42",
        "to": "alice@example.com",
        "subject": "Your receipt",
        "body": "Thanks.\n",
        **fields,
    }


def message(raw: bytes) -> email.message.Message:
    return email.message_from_bytes(raw, policy=email.policy.compat32)


def head(raw: bytes) -> bytes:
    return raw.split(b"\r\n\r\n", 1)[0]


# -- finding 1: encoded words are not decoded on the way out -------------------------------


@pytest.mark.parametrize("subject", [RECEIPT_BCC, RECEIPT_BCC.upper(), RECEIPT_BCC.lower()])
def test_a_typed_encoded_word_subject_reaches_the_reader_as_typed(subject: str) -> None:
    raw = checked_message(replace(FIELDS, subject=parse_job(job(subject=subject)).subject))
    assert b"Bcc" not in head(raw) and b"evil@attacker.example" not in raw
    assert decoded(message(raw)["Subject"]) == subject  # shown literally, not decoded
    assert Envelope(raw).recipients == ["alice@example.com"]


def test_the_same_through_an_x_header_and_a_file_name_and_a_display_name() -> None:
    pdf = base64.b64encode(b"%PDF").decode()
    content = parse_job(job(headers={"X-Campaign": "Grüße " + RECEIPT_BCC}))
    raw = checked_message(replace(FIELDS, headers=content.headers))
    assert b"Bcc" not in head(raw)
    assert decoded(message(raw)["X-Campaign"]) == "Grüße " + RECEIPT_BCC
    assert Envelope(raw).recipients == ["alice@example.com"]
    # A file name that holds an encoded word is refused: clients decode them there.
    attachment = {"filename": RECEIPT_BCC + ".pdf", "content_type": "application/pdf"}
    with pytest.raises(JobInputError) as info:
        parse_job(job(attachments=[{**attachment, "content_base64": pdf}]))
    assert info.value.field == "attachments[0].filename"
    # So is a display name (the address validator reads it back as a client would).
    with pytest.raises(JobInputError) as info:
        parse_job(job(cc=[f'"{RECEIPT_BCC}" <alice@example.com>']))
    assert info.value.field == "cc[0]" and "'=?'" in info.value.reason


def test_list_unsubscribe_which_is_written_as_typed_refuses_an_encoded_word() -> None:
    with pytest.raises(JobInputError) as info:
        parse_job(job(headers={"List-Unsubscribe": f"<https://x.example/u?{RECEIPT_BCC}>"}))
    assert info.value.field == "headers.List-Unsubscribe"


@pytest.mark.parametrize("field", ["in_reply_to", "references"])
def test_a_message_id_which_is_written_as_typed_refuses_an_encoded_word(field: str) -> None:
    value = "<=?utf-8?q?=0D=0A?=@example.com>"
    with pytest.raises(JobInputError) as info:
        parse_job(job(**{field: value if field == "in_reply_to" else [value]}))
    assert info.value.field in (field, f"{field}[0]") and "'=?'" in info.value.reason


# -- finding 2: the header block cannot end early -------------------------------------------


@pytest.mark.parametrize("where", ["subject", "x"])
def test_text_decoding_to_crlf_crlf_cannot_end_the_header_block(where: str) -> None:
    fields = {
        "subject": replace(FIELDS, subject=END_OF_HEADERS),
        "x": replace(FIELDS, headers=(("X-Tag", "é " + END_OF_HEADERS),)),
    }[where]
    raw = checked_message(fields)
    assert carries_message_id(raw, MID)
    assert message(raw).get_all("Message-ID") == [MID]
    assert b"evil@attacker.example" not in head(raw)


# -- finding 3: the display rules hold for what the client shows ----------------------------


@pytest.mark.parametrize(
    "word",
    [
        "=?utf-8?q?invoice=E2=80=AEfdp.exe?=",
        "=?UTF-8?B?" + base64.b64encode("invoice\u202efdp.exe".encode()).decode() + "?=",
    ],
)
def test_an_encoded_bidi_control_is_shown_as_the_characters_typed(word: str) -> None:
    raw = checked_message(replace(FIELDS, subject=word))
    shown = decoded(message(raw)["Subject"])
    assert shown == word and "\u202e" not in shown


@pytest.mark.parametrize(
    "name",
    [
        "=?utf-8?q?invoice=E2=80=AEfdp.exe?=",
        "=?utf-8?q?=2E=2E=2F=2E=2E=2F.bashrc?=",
        "=?utf-8?b?Li4vLi4vLmJhc2hyYw==?=",
        "../../.bashrc",
        "..\\..\\.bashrc",
        "..",
        "invoice\u202efdp.exe",
    ],
)
def test_a_file_name_a_client_would_show_as_a_path_or_reversed_is_refused(name: str) -> None:
    item = {"filename": name, "content_type": "text/plain", "content_base64": "aGk="}
    with pytest.raises(JobInputError) as info:
        parse_job(job(attachments=[item]))
    assert info.value.field == "attachments[0].filename"


def test_the_proof_applies_the_display_rules_to_the_decoded_name() -> None:
    # A writer that put an encoded word into the file name would be caught by the proof.
    attachment = parse_attachment(
        {"filename": "invoice.pdf", "content_type": "application/pdf", "content_base64": "aGk="}
    )
    fields = replace(FIELDS, attachments=(attachment,))
    raw = render_message(fields).replace(
        b'filename="invoice.pdf"', b'filename="=?utf-8?q?..=2F..=2F.bashrc?="'
    )
    found = find_mismatch(raw, fields)
    assert found is not None and found.field == "attachments[0].filename"


# -- finding 4: rendering is linear ---------------------------------------------------------


def best_of(runs: int, action: Callable[[], object]) -> float:
    """The least CPU time of this thread over `runs` runs: not the wall clock, which on a
    busy machine stretches a run longer than the scheduler's slice by the number of
    processes waiting (CI measured 37-61 for a linear 8, with the cores shared)."""
    times = []
    for _ in range(runs):
        start = time.thread_time()
        action()
        times.append(time.thread_time() - start)
    return min(times)


@pytest.mark.parametrize("subject", ["a" * 9 + " ", "é" * 9 + " ", "x" * 10])
def test_rendering_a_long_subject_is_linear(subject: str) -> None:
    """A 1 MB subject once took 40 s (quadratic). Eight times the text must take about
    eight times as long (under 20: quadratic would be 64), whatever the machine's speed.
    With four times the text and a bound of 8 (quadratic 16), a clean-clone run beside two
    busy loops measured 8.01-8.26: too little room between the two."""

    def render(n: int) -> Callable[[], object]:
        fields = replace(FIELDS, subject=(subject * n).strip())
        return lambda: checked_message(fields)

    # Measured up to three times: a loaded machine can slow one run; quadratic stays ~64.
    ratios = []
    for _ in range(3):
        small, large = best_of(3, render(4_000)), best_of(3, render(32_000))
        ratios.append(large / small)
        if ratios[-1] < 20:
            break
    assert min(ratios) < 20, ratios


def test_a_one_megabyte_subject_renders_fast_but_is_refused_at_intake() -> None:
    fields = replace(FIELDS, subject="x " * 500_000)
    assert best_of(1, lambda: checked_message(replace(fields, subject="x " * 500_000 + "y"))) < 5
    with pytest.raises(JobInputError) as info:
        parse_job(job(subject="x" * (MAX_SUBJECT + 1)))
    assert info.value.field == "subject"


# -- limits ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"subject": "s" * (MAX_SUBJECT + 1)}, "subject"),
        ({"headers": {"X-A": "v" * (MAX_HEADER_VALUE + 1)}}, "headers.X-A"),
        ({"headers": {f"X-{i}": "v" for i in range(MAX_EXTRA_HEADERS + 1)}}, "headers"),
        ({"headers": {"X-" + "n" * 80: "v"}}, "headers.X-" + "n" * 80),
        ({"references": ["<a@b.example>"] * (MAX_REFERENCES + 1)}, "references"),
        ({"to": '"' + "n" * MAX_ADDRESS_TEXT + '" <a@example.com>'}, "to"),
        ({"cc": ["n" * MAX_ADDRESS_TEXT + " <a@example.com>"]}, "cc[0]"),
    ],
)
def test_limits_are_refused_naming_the_field(fields: dict[str, Any], field: str) -> None:
    with pytest.raises(JobInputError) as info:
        parse_job(job(**fields))
    assert info.value.field == field


def at_limits(share: int) -> MessageFields:
    """Every field of a message at its limit divided by `share` (parsed, so accepted)."""
    content = parse_job(
        job(
            subject="é" * (MAX_SUBJECT // share),
            headers={f"X-{i}": "ü" * (MAX_HEADER_VALUE // share) for i in range(MAX_EXTRA_HEADERS)},
            to='"' + "名" * ((MAX_ADDRESS_TEXT - 30) // share) + '" <alice@example.com>',
        )
    )
    return replace(FIELDS, subject=content.subject, headers=content.headers, to=content.to)


def test_the_limits_themselves_are_accepted_and_render_in_linear_time() -> None:
    """Every field at its limit is accepted and renders in time linear in its text: four
    times the text of a quarter of the limits takes about four times as long (under 8:
    quadratic would be 16), measured in the same run, so a loaded machine fails nothing.
    The absolute bound only catches an explosion (a 1 MB subject once took 40 s)."""
    full, quarter = at_limits(1), at_limits(4)
    ratios = []
    for _ in range(3):
        small = best_of(3, lambda: checked_message(quarter))
        large = best_of(3, lambda: checked_message(full))
        ratios.append(large / small)
        if ratios[-1] < 8:
            break
    assert min(ratios) < 8, ratios
    assert large < 5


def test_unsafe_character_is_the_category_rule_for_every_code_point() -> None:
    def by_category(char: str) -> bool:
        category = unicodedata.category(char)
        return category in ("Cc", "Zl", "Zp", "Cs") or char in BIDI_CONTROLS

    assert all(
        (unsafe_character(chr(code)) is not None) == by_category(chr(code))
        for code in range(0x110000)
    )


# -- the proof catches every difference ------------------------------------------------------


def full() -> MessageFields:
    attachment = parse_attachment(
        {"filename": "Grüße.pdf", "content_type": "application/pdf", "content_base64": "aGk="}
    )
    return replace(
        FIELDS,
        to=("Alice <alice@example.com>", "bob@example.com"),
        cc=("carol@example.com",),
        bcc=("audit@example.com",),
        reply_to="help@example.com",
        html="<p>Thanks.</p>\n",
        headers=(("X-Campaign", "spring"),),
        in_reply_to="<parent@example.com>",
        references=("<root@example.com>", "<parent@example.com>"),
        attachments=(attachment,),
    )


def swap(old: bytes, new: bytes) -> Callable[[bytes], bytes]:
    def change(raw: bytes) -> bytes:
        assert old in raw
        return raw.replace(old, new, 1)

    return change


TAMPERED = [
    (swap(b"\r\nSubject:", b"\r\nBcc: evil@attacker.example\r\nSubject:"), "bcc"),
    (swap(b"\r\nBcc: audit@example.com", b"\r\nBcc: evil@attacker.example"), "bcc"),
    (swap(b"bob@example.com", b"bob@example.com, evil@attacker.example"), "to"),
    (swap(b"bob@example.com", b"bob@example.com (evil@attacker.example)"), "to"),
    (swap(b"Alice <alice", b"Alice\xe2\x80\xae <alice"), "body"),
    (swap(b"Alice <alice", b"=?utf-8?q?=E2=80=AE?= <alice"), "to"),
    (swap(b"Alice <alice", b"Al=?utf-8?b?aWNl?= <alice"), "to"),
    (swap(b"Alice <alice", b'"=?utf-8?b?QWxpY2U=?=" <alice'), "to"),
    (swap(b"X-Campaign: spring", b"X-Campaign: =?utf-8?b?c3ByaW5n?=x"), "headers.X-Campaign"),
    (
        swap(b"\r\nMessage-ID: " + MID.encode(), b"\r\nMessage-ID: <other@example.com>"),
        "message_id",
    ),
    (swap(b"\r\nMessage-ID:", b"\r\n\r\nMessage-ID:"), "message_id"),
    (swap(b"\r\nMessage-ID:", b"\nMessage-ID:"), "body"),
    (swap(b"\r\nDate:", b"\r\nX-Null: \x00\r\nDate:"), "body"),
    (swap(b"Subject: Your receipt", b"Subject: =?utf-8?q?Your_receipt=0D=0Ax?="), "subject"),
    (swap(b"Subject: Your receipt", b"Subject: Your =?utf-8?b?4oCu?=receipt"), "subject"),
    (swap(b"Subject: Your receipt", b"Subject: Your receipt\r\nSubject: Other"), "subject"),
    (swap(b"X-Campaign: spring", b"X-Campaign: spring\r\nX-Other: 1"), "headers.X-Other"),
    (swap(b"Thanks.\r\n\r\n--", b"Thanks.\r\n--=_sendledger_x\r\n\r\n--"), "body"),
    (swap(b"Gr%C3%BC%C3%9Fe.pdf", b"Gr%C3%BC%C3%9Fe.exe"), "attachments[0].filename"),
    (swap(b"aGk=", b"aGo="), "attachments[0]"),
    (swap(b"text/html", b"text/plain"), "html"),
    (swap(b"<root@example.com>", b"<other@example.com>"), "references"),
]


@pytest.mark.parametrize(("change", "field"), TAMPERED)
def test_the_proof_names_the_field_that_differs(
    change: Callable[[bytes], bytes], field: str
) -> None:
    fields = full()
    raw = render_message(fields)
    assert find_mismatch(raw, fields) is None
    found = find_mismatch(change(raw), fields)
    assert found is not None and found.field == field, found


def test_a_body_line_that_is_the_boundary_gets_another_boundary() -> None:
    """The Message-ID comes from the key, so the boundary can be computed: a body holding
    it must not create a part."""
    lines = [f"--{boundary(MID, kind)}" for kind in ("", "mixed")]
    body = "\n".join([*lines, *(line + "--" for line in lines)]) + "\n"
    fields = replace(full(), body=body, html=body)
    raw = checked_message(fields)
    parsed = message(raw)
    leaves = [part for part in parsed.walk() if not part.is_multipart()]
    assert [leaf.get_content_type() for leaf in leaves] == [
        "text/plain",
        "text/html",
        "application/pdf",
    ]
    assert boundary(MID, "mixed") not in parsed.get_boundary("")


def test_a_mismatch_is_a_job_input_error_naming_the_field(monkeypatch: pytest.MonkeyPatch) -> None:
    import ledger.wire_check as wire_check

    def evil(fields: MessageFields) -> bytes:
        return render_message(fields).replace(b"\r\nSubject:", b"\r\nBcc: e@x.example\r\nSubject:")

    monkeypatch.setattr(wire_check, "render_message", evil)
    with pytest.raises(RenderMismatch) as info:
        checked_message(FIELDS)
    assert isinstance(info.value, JobInputError) and info.value.field == "bcc"
    assert info.value.mismatch == wire_check.Mismatch("bcc", "a Bcc header the job does not have")
    assert (
        str(info.value) == "bcc: the rendered message differs: a Bcc header the job does not have"
    )


def test_an_empty_subject_is_written_as_before_and_proved() -> None:
    raw = checked_message(replace(FIELDS, subject=""))
    assert b"\r\nSubject:\r\n" in raw


def test_a_stored_message_id_with_an_encoded_word_is_a_mismatch() -> None:
    fields = replace(FIELDS, in_reply_to="<=?utf-8?b?QQ==?=@example.com>")
    found = find_mismatch(render_message(fields), fields)
    assert found is not None and found.field == "in_reply_to"


def test_carries_message_id_needs_exactly_ours_in_the_header_block() -> None:
    raw = render_message(FIELDS)
    assert carries_message_id(raw, MID)
    assert not carries_message_id(raw, "<other@example.com>")
    assert not carries_message_id(raw.replace(b"\r\nMessage-ID:", b"\r\n\r\nMessage-ID:"), MID)


# -- the encoder and the client's view -------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("=?utf-8?q?a?= =?utf-8?q?b?=", "ab"),
        ("=?UTF-8?B?YQ==?=  =?utf-8?Q?b_c?=", "ab c"),
        ("x=?utf-8?q?=0D=0A?=y", "x\r\ny"),
        ("=?no-such-charset?q?a?=", "=?no-such-charset?q?a?="),
        ("plain", "plain"),
    ],
)
def test_the_client_view_decodes_as_lenient_clients_do(text: str, shown: str) -> None:
    assert client_view(text) == shown


@pytest.mark.parametrize("text", ["", "é", "🎉" * 40, "a" * 200, "订单 " * 50, " lead", "=?"])
def test_encoded_words_decode_to_the_text_and_fit_a_line(text: str) -> None:
    words = encoded_words(text, 60)
    assert client_view(" ".join(words)) == text
    assert all(len(word) <= 75 for word in words)


# -- every refusal of the proof, its field and its reason (issue 28, `make mutation`) -----

PDF = b"Content-Type: application/pdf\r\nContent-Transfer-Encoding: base64\r\n"
NAME = b"filename*=utf-8''Gr%C3%BC%C3%9Fe.pdf"
PLAIN = b'Content-Type: text/plain; charset="utf-8"\r\nContent-Transfer-Encoding: 7bit'
SUBJECT = b"Subject: Your receipt"
TEXT = b"\r\n\r\nThanks.\r\n"
CHARSET = b'charset="utf-8"\r\nContent'
INNER = b"--=_sendledger_79ba4c6cbf131de3909f0cd84e631746"
MIME = b"\r\nMIME-Version: 1.0"
A = "attachments[0]"
# (the bytes replaced, by what, the field named, how its reason starts)
REFUSALS: list[tuple[bytes, bytes, str, str]] = [
    (SUBJECT, b"Subject: Y\xc3\xa9", "body", "a header holds a byte that is not ASCII"),
    (SUBJECT, b"Subject: \x7f", "body", "a header line holds a control character"),
    (SUBJECT, b"Subject: " + b"x" * 999, "body", "a header line is longer than 998"),
    (b"From:", b" \r\nFrom:", "body", "a header line starts with a space"),
    (b"\r\nCc: ", b"\r\nC c: ", "body", "not a header line"),
    (b"\r\nCc: ", b"\r\nCc:", "body", "not a header line"),
    (b"\r\nX-Campaign: spring", b"", "headers.X-Campaign", "no X-Campaign header"),
    (MIME, b"", "body", "no MIME-Version header"),
    (MIME, MIME + MIME, "body", "more than one MIME-Version header"),
    (MIME, b"\r\nMIME-Version: 1.1", "body", "carries '1.1', the job '1.0'"),
    (b"\r\nCc: carol@example.com", b"", "cc", "no Cc header"),
    (b"Cc: carol@", b"Cc: dave@", "cc", "the recipients are ['dave@example.com']"),
    (b"Reply-To: help@", b"Reply-To: other@", "reply_to", "the recipients are"),
    (b"Date: Thu, 01", b"Date: Fri, 02", "date", "carries "),
    (b"In-Reply-To: <parent", b"In-Reply-To: <other", "in_reply_to", "carries "),
    (SUBJECT, b"Subject: Your =?utf-8?b?cmVjZWlwdA==?=", "subject", "encoded words mixed"),
    (SUBJECT, SUBJECT + b"s", "subject", "a client shows 'Your receipts'"),
    (SUBJECT, b"Subject: =?utf-8?b?WW91cgByZWNlaXB0?=", "subject", "a client shows"),
    (b"To: Alice <", b"To: Alicia <", "to", "a client shows the name 'Alicia'"),
    (b"To: Alice <", b"To: =?utf-8?b?QWxpY2UA?= <", "to", "a client shows the name"),
    (b"bob@example.com\r\n", b"bob@example\r\n", "to", "the recipients are"),
    (b"bob@example.com\r\n", b"bob@exa mple.com\r\n", "to", "not one address"),
    (b"<alice@example.com>", b"<alice@exa mple.com>", "to", "not one address"),
    (b"To: Alice", b"To: Al;ice", "to", "';' outside a quoted string"),
    (b"To: Alice", b'To: "Alice', "to", "an unterminated quoted string"),
    (b"To: Alice", b"To: Al@ice", "to", "a display name with a special character"),
    (b"To: Alice", b'To: "Al"i"ce"', "to", "a display name that is not one quoted"),
    (b"To: Alice", b'To: "=?utf-8?b?QWxpY2U=?="', "to", "an encoded word inside a quoted"),
    (CHARSET, b'charset="utf-8"; charset=x\r\nContent', "body", "a bad or repeated parameter"),
    (CHARSET, b'charset="utf-8\r\nContent', "body", "a bad quoted parameter"),
    (CHARSET, b"charset=utf/8\r\nContent", "body", "a bad parameter value"),
    (PDF, PDF + b"Content-ID: <x@y>\r\n", A, "an unexpected Content-ID header"),
    (PDF, PDF + b"Content-Type: application/pdf\r\n", A, "more than one content-type"),
    (PDF, b"Content-Transfer-Encoding: base64\r\n", A, "no Content-Type header"),
    (b"multipart/alternative", b"multipart/related", "body", "a multipart/related part"),
    (
        b"\r\n\r\n" + INNER,
        b"\r\nX-Other: 1\r\n\r\n" + INNER,
        "body",
        "a part with a header that is not Content-*",
    ),
    (PLAIN, PLAIN.replace(b"plain", b"enriched"), "body", "a text/enriched part where"),
    (PLAIN, PLAIN.replace(b"7bit", b"base64"), "body", "encoded as base64, not 7bit"),
    (PLAIN, PLAIN.replace(b"7bit", b"8bit"), "body", "encoded as 8bit, not 7bit"),
    (TEXT, b"\r\n\r\nThanks!\r\n", "body", "the text differs from the job's"),
    (b"<p>Thanks.</p>", b"<p>Thanks!</p>", "html", "the text differs from the job's"),
    (PDF, PDF.replace(b"pdf", b"zip"), A, "a application/zip part where the job has"),
    (b"\r\nContent-Disposition: attachment; " + NAME, b"", f"{A}.filename", "no Content-D"),
    (NAME, b'filename="=?utf-8?q?a?="', f"{A}.filename", "an encoded word in the file"),
    (b"attachment; filename", b"inline; filename", f"{A}.filename", "a client shows 'Grü"),
    (b"aGk=", b"aGo=", A, "the content differs from the job's"),
    (b"\r\nTo: ", b"\r\nX-To: ", "headers.X-To", "a X-To header the job does not have"),
    (b"From: Support <support@", b"From: Support <other@", "from", "the recipients"),
    (SUBJECT, b"Subject: " + b"x" * 989, "subject", "a client shows"),  # 998: not too long
    (b"\r\nCc:", b"\r\n \r\nCc:", "body", "a header line starts with a space"),
    (CHARSET, b"charset=utf-8X\r\nContent", "body", "a text/plain part where the job has"),
    (PLAIN, PLAIN.replace(b"text/plain", b"text/plainX"), "body", "a text/plainx part"),
    (CHARSET, b'charset="utf-8"; x\r\nContent', "body", "a bad or repeated parameter"),
    (CHARSET, b'charset=""utf-8"\r\nContent', "body", "a bad quoted parameter"),
    (CHARSET, b'charset=""\r\nContent', "body", "a text/plain part where the job has"),
    (b"attachment; filename*", b"attachment; x; filename*", f"{A}.filename", "a bad or rep"),
    (PDF, PDF + b"Content-Transfer-Encoding: base64\r\n", A, "more than one content-transfer"),
    (PDF, PDF + b"Nonsense\r\n", "body", "not a header line: 'Nonsense'"),
    (b"aGk=", b"aGk=\r\n" + b"A" * 77, A, "a base64 line longer than 76 characters"),
    (b"aGk=", b"aG\rk=", A, "a part with a bare CR or LF"),
    (TEXT, b"\r\n\r\nThank\xc3\xa9s.\r\n", "body", "a 7bit part with a byte that is not ASCII"),
    (TEXT, b"\r\n\r\nTha\rnks.\r\n", "body", "a part with a bare CR or LF"),
    (TEXT, b"\r\n\r\n" + b"x" * 999 + b"\r\n", "body", "a line longer than 998 octets"),
    (TEXT, TEXT + INNER + b"x\r\n", "body", "the boundary occurs 4 times, not 3"),
    (INNER + b"--", INNER + b"-", "body", "the multipart body does not start and end"),
]


@pytest.mark.parametrize(("old", "new", "field", "reason"), REFUSALS)
def test_every_refusal_names_its_field_and_says_why(
    old: bytes, new: bytes, field: str, reason: str
) -> None:
    fields = full()
    found = find_mismatch(swap(old, new)(render_message(fields)), fields)
    assert found is not None, (old, new)
    assert (found.field, found.reason[: len(reason)]) == (field, reason), found


def test_a_quoted_name_with_a_comma_or_an_escaped_quote_is_proved() -> None:
    # `_split_top_level` starting as if after a backslash refused the first of these, and
    # no fast test noticed (issue 28).
    for name in ('"Doe, Jane" <jane@example.com>', '"Say \\"hi\\"" <s@example.com>'):
        fields = replace(FIELDS, to=(name, "bob@example.com"), cc=(name,))
        assert find_mismatch(render_message(fields), fields) is None, name


def test_a_base64_text_part_that_does_not_decode_is_named() -> None:
    fields = replace(FIELDS, body="Grüße\n")
    raw = render_message(fields)
    encoded = base64.b64encode("Grüße\r\n".encode()).rstrip(b"=")
    [line] = [line for line in raw.split(b"\r\n") if line.startswith(encoded)]
    for broken, reason in [
        (raw.replace(encoded, encoded + b"!", 1), "a base64 part that does not decode"),
        (raw.replace(encoded, encoded[:-1], 1), "a base64 part that does not decode"),
        (raw.replace(line, b"A" * 77, 1), "a base64 line longer than 76 characters"),
        (
            raw.replace(b"Content-Transfer-Encoding: base64", b"Content-Transfer-Encoding: x"),
            "encoded as x, not base64",
        ),
    ]:
        found = find_mismatch(broken, fields)
        assert found is not None and (found.field, found.reason) == ("body", reason), found


@pytest.mark.parametrize(
    "header", ["From", "To", "Subject", "Date", "Bcc", "Reply-To", "In-Reply-To"]
)
def test_a_missing_header_is_named_as_it_is_written(header: str) -> None:
    fields = full()
    raw = render_message(fields)
    start = raw.index(f"\r\n{header}: ".encode()) if not raw.startswith(header.encode()) else -2
    end = raw.index(b"\r\n", start + 2)
    found = find_mismatch(raw[: max(start, 0)] + raw[end + (2 if start < 0 else 0) :], fields)
    assert found is not None and found.reason == f"no {header} header", found


def test_full_base64_lines_and_a_bare_angle_address_are_proved() -> None:
    # The writer's base64 lines are 76 characters; a reader takes <bob@example.com> too.
    attachment = parse_attachment(
        {"filename": "a.bin", "content_type": "application/octet-stream",
         "content_base64": base64.b64encode(bytes(range(200))).decode()}
    )  # fmt: skip
    fields = replace(FIELDS, body="é" * 100 + "\n", attachments=(attachment,))
    raw = render_message(fields)
    assert max(map(len, raw.split(b"\r\n\r\n", 1)[1].split(b"\r\n"))) == 76
    assert find_mismatch(raw, fields) is None
    longest = replace(FIELDS, body="x" * 998 + "\n")  # 7bit allows 998 octets a line
    assert find_mismatch(render_message(longest), longest) is None
    bare = replace(FIELDS, to=("bob@example.com",))
    raw = render_message(bare).replace(b"To: bob@example.com", b"To: <bob@example.com>")
    assert find_mismatch(raw, bare) is None


def test_bytes_without_a_header_block_carry_nothing() -> None:
    assert not carries_message_id(b"Message-ID: " + MID.encode(), MID)
    found = find_mismatch(b"Message-ID: " + MID.encode() + b"\r\n", FIELDS)
    assert found is not None and (found.field, found.reason) == (
        "body",
        "no end of the header block",
    )


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ('"' + "a" * 100 + '"b"c"', "a display name that is not one quoted string"),
        ('"=?utf-8?b?QQ==?=' + "a" * 100 + '"', "an encoded word inside a quoted display name"),
        ("Al@" + "i" * 100, "a display name with a special character"),
    ],
)
def test_a_long_display_name_is_quoted_in_the_reason_up_to_80_characters(
    name: str, reason: str
) -> None:
    raw = render_message(FIELDS).replace(b"To: alice@", b"To: " + name.encode() + b" <alice@", 1)
    raw = raw.replace(b"alice@example.com\r\n", b"alice@example.com>\r\n", 1)
    found = find_mismatch(raw, FIELDS)
    assert found is not None and found.reason == f"{reason}: {name[:80]!r}", found


def test_a_long_value_is_quoted_in_the_reason_up_to_80_characters() -> None:
    long = "x" * 100
    for old, new, reason, quoted in [
        (b"Subject: Your receipt", f"Subject: {long}".encode(), "a client shows", long),
        (b'charset="utf-8"', f'charset="utf-8"; {long}'.encode(), "a bad or repeated parameter in",
         f'text/plain; charset="utf-8"; {long}'),
        (b'charset="utf-8"', f'charset="utf-8{long}'.encode(), "a bad quoted parameter in",
         f'text/plain; charset="utf-8{long}'),
    ]:  # fmt: skip
        found = find_mismatch(render_message(FIELDS).replace(old, new, 1), FIELDS)
        assert found is not None and found.reason.startswith(reason), found
        assert f"{quoted[:80]!r}" in found.reason and f"{quoted[:81]!r}" not in found.reason


@settings(max_examples=500)
@given(st.text(alphabet=' a,"\\()[]:;<>@=?é', max_size=30))
def test_an_address_list_splits_as_the_walk_splits_it(value: str) -> None:
    # The split at commas taken without the walk gives what the walk gives (or refuses).
    results: list[object] = []
    for split in (_split_top_level, _walk_top_level):
        try:
            results.append(split("to", value))
        except _Bad as bad:
            results.append(bad.mismatch)
    assert results[0] == results[1]


# -- what intake accepts, the writer carries -------------------------------------------------


def proved(content: Any) -> bytes:
    return checked_message(
        replace(FIELDS, subject=content.subject, headers=content.headers, to=content.to)
    )


@pytest.mark.parametrize(
    "fields",
    [
        {"subject": "Your" + " " * 1000 + "receipt"},
        {"headers": {"X-Campaign": "spring" + " " * 1000 + "sale"}},
        {"subject": "x " + " " * 995 + "y"},
    ],
)
def test_a_text_with_a_long_run_of_spaces_is_carried_as_it_says(fields: dict[str, Any]) -> None:
    # Printable ASCII within the limits, so accepted at intake; written as typed it was
    # one line of more than 998 octets (a line is folded at a space, never at the second of
    # two), and the proof refused the job naming "body".
    content = parse_job(job(**fields))
    raw = proved(content)
    message = email.message_from_bytes(raw, policy=email.policy.default)
    assert str(message["Subject"]) == content.subject
    for name, value in content.headers:
        assert str(message[name]) == value


def test_a_list_unsubscribe_with_a_run_of_spaces_it_cannot_fold_is_refused_naming_it() -> None:
    # Written as typed (never encoded): a run of spaces that no fold can keep within a
    # line is refused at intake, naming the header, not by the proof naming "body".
    value = "<https://example.com/u>" + " " * 1000 + "<mailto:u@example.com>"
    with pytest.raises(JobInputError) as info:
        parse_job(job(headers={"List-Unsubscribe": value}))
    assert info.value.field == "headers.List-Unsubscribe"
    fine = "<https://example.com/u>,  <mailto:u@example.com>"
    proved(parse_job(job(headers={"List-Unsubscribe": fine})))


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"headers": {"X-Tag\n": "v"}}, "headers.X-Tag\n"),
        ({"in_reply_to": "<a@b.example>\n"}, "in_reply_to"),
        ({"references": ["<a@b.example>\n"]}, "references[0]"),
        (
            {
                "attachments": [
                    {"filename": "a.txt", "content_type": "text/plain\n", "content_base64": "aGk="}
                ]
            },
            "attachments[0].content_type",
        ),
    ],
)
def test_a_value_ending_in_a_line_feed_is_refused_at_intake_naming_its_field(
    fields: dict[str, Any], field: str
) -> None:
    # `$` in a pattern matches before a final "\n" too: the value passed the field's
    # check as typed and reached the writer, whose header line held the line feed; the
    # proof caught it, naming "body".
    with pytest.raises(JobInputError) as info:
        parse_job(job(**fields))
    assert info.value.field == field
