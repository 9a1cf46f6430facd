"""Every message the hostile-text tests render, read back by three parsers that share no
code with sendledger's writer or its proof (issue 28): Python's email package
(`policy.default`, the modern header parser; `compat32` is read in
`tests/unit/test_hostile_text.py`), mail-parser (SpamScope's, on the email package's
compat32 API with its own decoding) and fast-mail-parser (Rust: the mail-parser crate of
the Stalwart mail server, which decodes each RFC 2231 segment alone). Each must read every
address (From, To, Cc, Bcc, Reply-To: display name and addr-spec), the subject, the
Message-ID, every extra header and every file name exactly as the job says them.

Habits of these readers that the comparison allows, each written down here and in
docs/cli.md "Message fields and validation" (everything else must be equal, code point
for code point; no reader normalizes Unicode, and the job's domains, stored in their
A-label form, are shown in that form by every reader):

* email.policy.default keeps the space between two adjacent encoded words of a display
  name (RFC 2047 6.2 says it is not part of the text; the writer needs several words for a
  name of more than 45 bytes): the name read must be the raw header's words, each decoded
  alone by `email.header.decode_header`, joined by one space.
* mail-parser strips the subject's leading and trailing white space, and gives other
  headers back folded (CR LF kept): compared stripped, and unfolded.
"""

from __future__ import annotations

import email
import email.header
import email.policy
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import fast_mail_parser
import mailparser  # type: ignore[import-untyped]  # mail-parser ships no type hints
from hypothesis import HealthCheck, example, given, settings
from tests.unit.test_hostile_text import KEY, MID, SENDER, fields_of, jobs

from ledger.addresses import parse_mailbox
from ledger.content import JobContent, JobInputError, parse_job
from ledger.wire_check import checked_message

Pairs = list[tuple[str, str]]


@dataclass
class Reading:
    """What one reader shows of a message: the fields compared, by name."""

    fields: dict[str, object] = field(default_factory=dict)


def _pairs(boxes: tuple[str, ...]) -> Pairs:
    return [(box.display_name, box.addr_spec) for box in map(parse_mailbox, boxes)]


def the_job(content: JobContent) -> dict[str, object]:
    """The fields as the job says them."""
    found: dict[str, object] = {
        "from": _pairs((content.sender or SENDER,)),
        "to": _pairs(content.to),
        "cc": _pairs(content.cc),
        "bcc": _pairs(content.bcc),
        "reply_to": _pairs((content.reply_to,) if content.reply_to else ()),
        "subject": content.subject,
        "message_id": MID,
        "filenames": [attachment.filename for attachment in content.attachments],
    }
    found.update({f"headers.{name}": value for name, value in content.headers})
    return found


def by_email_package(raw: bytes, content: JobContent) -> dict[str, object]:
    message = email.message_from_bytes(raw, policy=email.policy.default)

    def boxes(name: str) -> Pairs:
        header: Any = message[name]
        if header is None:
            return []
        return [(a.display_name, a.addr_spec) for a in header.addresses]

    found: dict[str, object] = {
        "from": boxes("From"),
        "to": boxes("To"),
        "cc": boxes("Cc"),
        "bcc": boxes("Bcc"),
        "reply_to": boxes("Reply-To"),
        "subject": str(message["Subject"]),
        "message_id": str(message["Message-ID"]),
        "filenames": [part.get_filename() for part in message.iter_attachments()],
    }
    found.update({f"headers.{name}": str(message[name]) for name, _ in content.headers})
    return found


_ADDRESS_FIELDS = ("from", "to", "cc", "bcc", "reply_to")


def _read(
    mail: Any,
    boxes: Callable[[Any], Pairs],
    message_id: object,
    header: Callable[[str], object],
    filenames: Sequence[object],
    content: JobContent,
) -> dict[str, object]:
    # The two libraries name their fields alike (`from_`, `to`, ...); each reads its own.
    found: dict[str, object] = {
        name: boxes(getattr(mail, "from_" if name == "from" else name)) for name in _ADDRESS_FIELDS
    }
    found.update({"subject": mail.subject, "message_id": message_id})
    found["filenames"] = filenames
    found.update({f"headers.{name}": header(name) for name, _ in content.headers})
    return found


def by_mail_parser(raw: bytes, content: JobContent) -> dict[str, object]:
    mail = mailparser.parse_from_bytes(raw)

    def boxes(value: Any) -> Pairs:
        return [(name, spec) for name, spec in value or []]

    names = [attachment["filename"] for attachment in mail.attachments]
    return _read(mail, boxes, mail.message_id, mail.headers.get, names, content)


def by_fast_mail_parser(raw: bytes, content: JobContent) -> dict[str, object]:
    mail = fast_mail_parser.parse_email(raw)

    def boxes(value: Any) -> Pairs:
        if value is None:
            return []
        items = value if isinstance(value, list) else [value]
        return [(box.display_name or "", box.address) for box in items]

    def header(name: str) -> object:
        values = mail.headers.get(name)
        return values[0] if values else None

    names = [attachment.filename for attachment in mail.attachments]
    return _read(mail, boxes, header("Message-ID"), header, names, content)


READERS: dict[str, Callable[[bytes, JobContent], dict[str, object]]] = {
    "email.policy.default": by_email_package,
    "mail-parser": by_mail_parser,
    "fast-mail-parser": by_fast_mail_parser,
}


_HEADERS = {"from": "From", "to": "To", "cc": "Cc", "bcc": "Bcc", "reply_to": "Reply-To"}
_ENCODED_NAME = re.compile(r"((?:=\?[^?\s]+\?[bBqQ]\?[^?\s]*\?=\s*)+)<([^>]+)>")
_WORD = re.compile(r"=\?[^?\s]+\?[bBqQ]\?[^?\s]*\?=")


def _word_alone(word: str) -> str:
    [(data, charset)] = email.header.decode_header(word)
    assert isinstance(data, bytes)
    return data.decode(charset or "ascii")


def _python_spaces_words(raw: bytes, name: str, seen: object, wanted: object) -> bool:
    # email.policy.default: the space between two encoded words of a display name stays.
    header = email.message_from_bytes(raw, policy=email.policy.compat32)[_HEADERS[name]]
    joined = {
        spec: " ".join(_word_alone(word) for word in _WORD.findall(words))
        for words, spec in _ENCODED_NAME.findall(str(header).replace("\r\n", ""))
    }
    assert isinstance(wanted, list)
    return seen == [(joined.get(spec, display), spec) for display, spec in wanted]


def habit(reader: str, name: str, seen: object, wanted: object, raw: bytes) -> bool:
    """Whether `seen` differs from `wanted` only by a documented habit of `reader`."""
    if reader == "email.policy.default" and name in _HEADERS:
        return _python_spaces_words(raw, name, seen, wanted)
    if reader == "mail-parser" and name == "subject" and isinstance(wanted, str):
        return seen == wanted.strip()
    if reader == "mail-parser" and name.startswith("headers.") and isinstance(seen, str):
        return seen.replace("\r\n", "") == wanted
    return False


@dataclass
class Tally:
    """The cross-check's counts, for the note of a run (see `cross_check`)."""

    messages: int = 0
    compared: int = 0
    disagreements: Counter[str] = field(default_factory=Counter)
    habits: Counter[str] = field(default_factory=Counter)


def cross_check(raw: bytes, content: JobContent, tally: Tally | None = None) -> list[str]:
    """Each reader's disagreement with the job, as `reader: field: read ..., job ...`."""
    wanted = the_job(content)
    found: list[str] = []
    for reader, read in READERS.items():
        seen = read(raw, content)
        assert set(seen) == set(wanted)
        for name, value in wanted.items():
            if seen[name] != value and habit(reader, name, seen[name], value, raw):
                if tally is not None:
                    tally.habits[f"{reader}: {name}"] += 1
            elif seen[name] != value:
                found.append(f"{reader}: {name}: read {seen[name]!r}, the job {value!r}")
                if tally is not None:
                    tally.disagreements[f"{reader}: {name}"] += 1
        if tally is not None:
            tally.compared += len(wanted)
    if tally is not None:
        tally.messages += 1
    return found


def rendered(job: dict[str, Any]) -> tuple[bytes, JobContent] | None:
    try:
        content = parse_job(job)
        return checked_message(fields_of(content)), content
    except JobInputError as exc:
        assert exc.field
        return None


def job_with(**fields: Any) -> dict[str, Any]:
    base = {"channel": "receipts", "key": KEY, "to": "alice@example.com", "subject": "s"}
    return {**base, "body": "Thanks.\n", **fields}


LONG_NAME = "a" + "é" * 20 + ".txt"  # 127b519 cut a segment inside an "é"


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(jobs())
@example(
    job_with(
        attachments=[
            {"filename": LONG_NAME, "content_type": "text/plain", "content_base64": "aGk="}
        ]
    )
)
@example(
    job_with(
        to=["Zoë <zoe@bücher.de>", '"Doe, Jane" <jane@example.com>'],
        cc="Ünï Cödé <u@example.com>",
        bcc="audit@example.com",
        reply_to="help@example.com",
        subject="Grüße =?utf-8?q?x?= 🎉 " + "é" * 80,
        headers={"X-Campaign": "Frühling 🌸", "List-Unsubscribe": "<https://example.com/u>"},
    )
)
def test_every_independent_reader_sees_exactly_the_job(job: dict[str, Any]) -> None:
    done = rendered(job)
    if done is None:
        return
    raw, content = done
    assert cross_check(raw, content) == []
