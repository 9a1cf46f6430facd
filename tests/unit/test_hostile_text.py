"""Hostile text in every header-bearing field (issue 16): a job is refused naming a field,
or its rendered bytes pass the proof (`ledger/wire_check.py`) and a second, independent
reader (the standard library's parser, as the Gmail emulator reads a message) sees
exactly the job: its recipients, its one Message-ID, its subject, names, header values,
file names and bodies.

Pure: runs on any Python >= 3.11 (`make test-py313` runs this file on 3.13 when it is
installed). On 3.11.7 the standard library's own writer is vulnerable (CVE-2024-6923);
ours must not be, whatever the version.
"""

from __future__ import annotations

import base64
import email
import email.policy
import quopri
import re
from datetime import UTC, datetime
from email.message import Message
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ledger.addresses import parse_mailbox
from ledger.content import JobContent, JobInputError, parse_job
from ledger.message import Envelope
from ledger.message_id import message_id_for
from ledger.mime import MessageFields, boundary
from ledger.wire_check import checked_message, find_mismatch
from testkit.mime_reader import decoded

DOMAIN = "mail.example.com"
KEY = "order-42"
MID = message_id_for(KEY, DOMAIN)
DATE = datetime(2026, 1, 1, 12, tzinfo=UTC)
SENDER = "Support <support@example.com>"

# What an attacker wants a client to decode into the message.
PAYLOADS = [
    "\r\nBcc: evil@attacker.example",
    "\r\n\r\nMessage-ID: <evil@attacker.example>",
    "\u202efdp.exe",
    "../../.bashrc",
    "..\\..\\boot.ini",
    "\x00",
    "\u2028",
    "--" + boundary(MID, "mixed"),
    "\r\n--" + boundary(MID, "") + "\r\nContent-Type: text/html",
]


def _q(text: str) -> str:
    return quopri.encodestring(text.encode("utf-8"), header=True).decode("ascii")


@st.composite
def encoded_word(draw: st.DrawFn) -> str:
    payload = draw(st.sampled_from(PAYLOADS)) + draw(st.text(max_size=10))
    charset = draw(st.sampled_from(["utf-8", "UTF-8", "Utf-8", "iso-8859-1"]))
    form = draw(st.sampled_from("qQbB"))
    data = payload.encode("utf-8", "surrogatepass")
    text = base64.b64encode(data).decode() if form in "bB" else _q(payload)
    return f"=?{charset}?{form}?{text}?="


piece = st.one_of(
    encoded_word(),
    st.sampled_from(PAYLOADS),
    st.sampled_from(["\r", "\n", "\r\n", "\x00", "\t", "\u202e", "/", "\\", "=?", "?=", " "]),
    st.text(max_size=20),
    st.text(alphabet="abc =?", max_size=20),
    st.integers(1, 3000).map(lambda n: "x" * n),
    st.sampled_from(["Your receipt", "Grüße", "订单已发货", "🎉", '"Doe, John"', "J. Smith"]),
)
hostile = st.lists(piece, min_size=1, max_size=4).map("".join)
plain_name = st.sampled_from(["", "Alice", "Støre Ølé", "Doe, John"])


def mailbox(name: str, local: str) -> str:
    quoted = name.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{quoted}" <{local}@example.com>' if name else f"{local}@example.com"


@st.composite
def jobs(draw: st.DrawFn) -> dict[str, Any]:
    """A job whose one hostile field is drawn; the others are ordinary."""
    field = draw(
        st.sampled_from(
            ["subject", "from", "to", "cc", "bcc", "reply_to", "x", "unsubscribe", "file", "body"]
        )
    )
    text = draw(hostile)
    job: dict[str, Any] = {
        "channel": "receipts",
        "key": KEY,
        "to": [mailbox(draw(plain_name), "alice")],
        "subject": "Your receipt",
        "body": "Thanks.\n",
    }
    if field == "subject":
        job["subject"] = text
    elif field in ("to", "cc", "bcc"):
        job[field] = [mailbox(text, "bob")]
    elif field in ("from", "reply_to"):
        job[field] = mailbox(text, "carol")
    elif field == "x":
        job["headers"] = {"X-Campaign": text}
    elif field == "unsubscribe":
        job["headers"] = {"List-Unsubscribe": text}
    elif field == "file":
        job["attachments"] = [
            {"filename": text, "content_type": "text/plain", "content_base64": "aGk="}
        ]
    else:
        job["body"] = text
        job["html"] = draw(st.sampled_from([None, text]))
        job["attachments"] = [
            {"filename": "a.txt", "content_type": "text/plain", "content_base64": "aGk="}
        ]
    return job


def fields_of(content: JobContent) -> MessageFields:
    return MessageFields.of(content, from_addr=content.sender or SENDER, message_id=MID, date=DATE)


def addresses(message: Message, name: str) -> list[tuple[str, str]]:
    values = message.get_all(name) or []
    return [(decoded(name), spec) for name, spec in email.utils.getaddresses(values)]


def expected(boxes: tuple[str, ...]) -> list[tuple[str, str]]:
    return [(m.display_name, m.addr_spec) for m in map(parse_mailbox, boxes)]


def wire_text(text: str) -> str:
    # What a text part carries: every CR, LF or CR LF a CR LF, and a final one.
    lines = re.split("\r\n|\r|\n", text)
    if lines[-1] == "":
        lines.pop()
    return "".join(line + "\r\n" for line in lines) or "\r\n"


def assert_reads_as_the_job(raw: bytes, content: JobContent) -> None:
    """The standard library's parser (compat32, as the Gmail emulator reads a message,
    with decode_header as Gmail shows a header) sees exactly the job."""
    message = email.message_from_bytes(raw, policy=email.policy.compat32)
    assert message.get_all("Message-ID") == [MID]
    assert decoded(message["Subject"]) == content.subject
    for name, field in (("To", content.to), ("Cc", content.cc), ("Bcc", content.bcc)):
        assert addresses(message, name) == expected(field)
    if content.reply_to:
        assert addresses(message, "Reply-To") == expected((content.reply_to,))
    assert addresses(message, "From") == expected((content.sender or SENDER,))
    for name, value in content.headers:
        assert len(message.get_all(name) or []) == 1
        assert decoded(message[name]) == value
    leaves = [part for part in message.walk() if not part.is_multipart()]
    texts = [content.body] + ([content.html] if content.html is not None else [])
    assert len(leaves) == len(texts) + len(content.attachments)
    for leaf, text in zip(leaves, texts, strict=False):
        payload = leaf.get_payload(decode=True)
        assert isinstance(payload, bytes)
        assert payload.decode("utf-8") == wire_text(text)  # line ends as CR LF
    for leaf, attachment in zip(leaves[len(texts) :], content.attachments, strict=True):
        assert leaf.get_filename() == attachment.filename
        assert leaf.get_payload(decode=True) == attachment.data
    recipients = [spec for _, spec in expected(content.to + content.cc + content.bcc)]
    assert Envelope(raw).recipients == recipients
    head = raw.split(b"\r\n\r\n", 1)[0]
    assert b"evil@attacker.example" not in head and b"Bcc: evil" not in head


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(jobs())
@example({"channel": "receipts", "key": KEY, "to": "a@example.com", "subject": "", "body": ""})
@example(
    {
        "channel": "receipts",
        "key": KEY,
        "to": "alice@example.com",
        "subject": "=?utf-8?q?Your_receipt=0D=0ABcc:_evil@attacker.example?=",
        "body": "x",
    }
)
def test_hostile_text_is_refused_or_reaches_the_reader_as_typed(job: dict[str, Any]) -> None:
    try:
        content = parse_job(job)
        raw = checked_message(fields_of(content))
    except JobInputError as exc:
        assert exc.field  # refused, naming a field
        return
    assert find_mismatch(raw, fields_of(content)) is None
    assert_reads_as_the_job(raw, content)
