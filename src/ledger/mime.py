"""The raw message, written by sendledger's own code (docs/cli.md "Message fields and
validation", docs/architecture.md "The message").

One writer for every message: headers through `ledger/header_encoding.py` (the caller's
text as typed when it is plain ASCII, else RFC 2047 encoded words; file names in RFC 2231
form), bodies as 7bit or base64, multipart boundaries that occur in no part. Nothing is
handed to the standard library's ``email`` package, so no encoded word a caller typed is
decoded on the way out, the bytes are the same on every Python version, and the time is
linear in the message's size.

The same job always renders to the same bytes (the Date comes from the job's creation,
not from a clock, and the boundaries from its Message-ID), so a resend is the same message
with the same Message-ID. `ledger/wire_check.py` proves the bytes say what the job says.
"""

from __future__ import annotations

import base64
import functools
import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import format_datetime

from ledger.addresses import Mailbox
from ledger.attachments import Attachment, filename_problem
from ledger.content import JobContent, JobInputError, mailbox_of, reject_unsafe_header_text
from ledger.extra_headers import ASCII_ONLY, canonical_message_id, header_name_problem
from ledger.header_encoding import LINE, fold, parameter, phrase, plain, unstructured

_CRLF = "\r\n"


@dataclass(frozen=True)
class MessageFields:
    """What one message says: the job's fields as the writer and the proof take them."""

    from_addr: str
    to: tuple[str, ...]
    subject: str
    body: str
    message_id: str
    date: datetime
    cc: tuple[str, ...] = ()
    reply_to: str | None = None
    html: str | None = None
    bcc: tuple[str, ...] = ()
    headers: tuple[tuple[str, str], ...] = ()
    in_reply_to: str | None = None
    references: tuple[str, ...] = ()
    attachments: tuple[Attachment, ...] = ()

    @classmethod
    def of(
        cls, content: JobContent, *, from_addr: str, message_id: str, date: datetime
    ) -> MessageFields:
        """A job's message: its content, sent as `from_addr` with its Message-ID and Date."""
        return cls(
            from_addr=from_addr,
            to=content.to,
            cc=content.cc,
            reply_to=content.reply_to,
            subject=content.subject,
            body=content.body,
            html=content.html,
            bcc=content.bcc,
            headers=content.headers,
            in_reply_to=content.in_reply_to,
            references=content.references,
            attachments=content.attachments,
            message_id=message_id,
            date=date,
        )


def build_message(
    *,
    from_addr: str,
    to: list[str] | tuple[str, ...],
    subject: str,
    body: str,
    message_id: str,
    date: datetime,
    cc: list[str] | tuple[str, ...] = (),
    reply_to: str | None = None,
    html: str | None = None,
    bcc: list[str] | tuple[str, ...] = (),
    headers: tuple[tuple[str, str], ...] = (),
    in_reply_to: str | None = None,
    references: list[str] | tuple[str, ...] = (),
    attachments: tuple[Attachment, ...] = (),
) -> bytes:
    """The raw message (see :func:`render_message`)."""
    return render_message(
        MessageFields(
            from_addr=from_addr,
            to=tuple(to),
            subject=subject,
            body=body,
            message_id=message_id,
            date=date,
            cc=tuple(cc),
            reply_to=reply_to,
            html=html,
            bcc=tuple(bcc),
            headers=tuple(headers),
            in_reply_to=in_reply_to,
            references=tuple(references),
            attachments=tuple(attachments),
        )
    )


def render_message(fields: MessageFields) -> bytes:
    """The raw message: CRLF line ends, ASCII headers, no line over 998 octets. `bcc`
    becomes a Bcc header: the Gmail API takes its recipients from it and strips it on
    delivery; the SMTP provider takes it into the envelope and removes it from the data
    (`daemon/providers/smtp_imap.py: Envelope`). With `html` the text is
    multipart/alternative; with `attachments` the message is multipart/mixed.

    Raises JobInputError naming the field for what cannot be written as it says (a
    control character, a message id that is not one, ...); parse_job refuses all of it
    first, so only a job stored before a rule existed meets it here."""
    lines = _header_lines(fields)
    entity = _content(fields)
    head = _CRLF.join([*lines, "MIME-Version: 1.0", *entity[0]])
    return b"".join((head.encode("ascii"), b"\r\n\r\n", entity[1]))


def mailboxes(field: str, addresses: Iterable[str]) -> list[Mailbox]:
    """Each address as its Mailbox, `field[i]` naming a bad one."""
    return [mailbox_of(f"{field}[{i}]", address) for i, address in enumerate(addresses)]


def message_id(field: str, value: str) -> str:
    """`value` when it is one canonical ``<left@right>`` message id; JobInputError else."""
    if canonical_message_id(value) != value:
        raise JobInputError(field, f"not a message id like <local@domain>: {value!r}")
    return value


def _header_lines(fields: MessageFields) -> list[str]:
    lines = [
        _sender_line("From", "from", fields.from_addr),
        _address_line("To", mailboxes("to", fields.to)),
    ]
    if fields.cc:
        lines.append(_address_line("Cc", mailboxes("cc", fields.cc)))
    if fields.reply_to is not None:
        lines.append(_sender_line("Reply-To", "reply_to", fields.reply_to))
    reject_unsafe_header_text("subject", fields.subject)
    lines.append(unstructured("Subject", fields.subject))
    lines.append(f"Date: {date_value(fields.date)}")
    lines.append(f"Message-ID: {message_id('message_id', fields.message_id)}")
    if fields.in_reply_to is not None:
        lines.append(fold("In-Reply-To", [message_id("in_reply_to", fields.in_reply_to)]))
    if fields.references:
        ids = [message_id(f"references[{i}]", ref) for i, ref in enumerate(fields.references)]
        lines.append(fold("References", ids))
    if fields.bcc:
        lines.append(_address_line("Bcc", mailboxes("bcc", fields.bcc)))
    for name, value in fields.headers:
        lines.append(_extra_header(name, value))
    return lines


# A sender's From (and Reply-To) is the same text on every job of its channel, and its
# line a pure function of that text (the header's name and the job field a refusal names
# are part of the key): written once per text and shared, as `addresses._parse_text`
# shares the parse. A refusal is not cached (lru_cache keeps no exceptions). The
# recipients' lines, different on almost every job, are written each time.
@functools.lru_cache(maxsize=4096)
def _sender_line(name: str, field: str, address: str) -> str:
    """The `name` header line of the one mailbox `address` (`field` naming it when it is
    none), folded as every address line is."""
    return _address_line(name, [mailbox_of(field, address)])


_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def date_value(date: datetime) -> str:
    """The Date header's value, exactly as `email.utils.format_datetime` writes it. Every
    job's Date is its creation in UTC, written here directly: the library's strftime("%z")
    cost about a fifth of the writer's time. Any other zone goes to the library. The proof
    (`ledger/wire_check.py`) still compares the header with the library's own output."""
    if date.tzinfo is not UTC:
        return format_datetime(date)
    return (
        f"{_DAYS[date.weekday()]}, {date.day:02d} {_MONTHS[date.month - 1]} {date.year:04d} "
        f"{date.hour:02d}:{date.minute:02d}:{date.second:02d} +0000"
    )


def _address_line(name: str, boxes: list[Mailbox]) -> str:
    tokens: list[str] = []
    room = LINE - len(name) - 2
    for index, box in enumerate(boxes):
        words = [*phrase(box.display_name, room), f"<{box.addr_spec}>"]
        if not box.display_name:
            words = [box.addr_spec]
        if index < len(boxes) - 1:
            words[-1] += ","
        whole = " ".join(words)
        # One mailbox to a line where it fits: folded between mailboxes, not inside one.
        tokens.extend([whole] if len(whole) < LINE else words)
    return fold(name, tokens)


def _extra_header(name: str, value: str) -> str:
    field = f"headers.{name}"
    problem = header_name_problem(name)
    if problem:
        raise JobInputError(field, problem)
    reject_unsafe_header_text(field, value)
    if name.lower() in ASCII_ONLY:
        if not plain(value):
            raise JobInputError(
                field, "must be printable ASCII without '=?' (percent-encode a URL)"
            )
        return fold(name, value.split(" "))
    return unstructured(name, value)


# -- bodies -------------------------------------------------------------------------------

Entity = tuple[list[str], bytes]  # header lines, and the body (ending in CRLF, or empty)


def _content(fields: MessageFields) -> Entity:
    text = _text_part(fields.body, "plain", "body")
    if fields.html is not None:
        html = _text_part(fields.html, "html", "html")
        text = _multipart("alternative", [text, html], fields.message_id, "")
    if not fields.attachments:
        return text
    parts = [text]
    for index, attachment in enumerate(fields.attachments):
        parts.append(_attachment_part(attachment, f"attachments[{index}]"))
    return _multipart("mixed", parts, fields.message_id, "mixed")


def wire_text(text: str, field: str = "body") -> tuple[str, bytes]:
    """`text` as a text part carries it, and its transfer encoding: UTF-8, every line
    ending (CR, LF or CR LF) a CR LF, a final one (an empty text is one empty line); 7bit
    when that is ASCII with no line over SMTP's 998 octets, else base64 (8bit would need
    an 8BITMIME path end to end; base64 survives any relay). Lines end at CR and LF only
    (str.splitlines would also split on \x0b, \x0c, ...). One pass over the bytes each
    step, no Python loop per line or character: a text may be 25 MB."""
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError:
        raise JobInputError(field, "must not contain a lone surrogate (invalid Unicode)") from None
    data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    if not data.endswith(b"\n"):
        data += b"\n"
    seven_bit = data.isascii() and max(map(len, data.split(b"\n"))) <= 998
    return ("7bit" if seven_bit else "base64"), data.replace(b"\n", b"\r\n")


def _base64_lines(data: bytes) -> bytes:
    # 57 bytes (76 characters) a line, as binascii.b2a_base64 per line would write them.
    return base64.encodebytes(data).replace(b"\n", b"\r\n")


def wrapped_base64(canonical: str) -> bytes:
    """An attachment's part body from its stored canonical base64 (`ledger/attachments.py`:
    the standard alphabet, padded, unwrapped; made once per job, at intake): its 76-character
    lines, each ending CR LF. The bytes `_base64_lines` would write from the decoded data,
    without decoding and encoding again at every attempt (docs/performance.md "The SMTP
    path")."""
    text = canonical.encode("ascii")
    if not text:
        return b""
    return b"\r\n".join([text[i : i + 76] for i in range(0, len(text), 76)]) + b"\r\n"


def _text_part(text: str, subtype: str, field: str) -> Entity:
    cte, data = wire_text(text, field)
    body = data if cte == "7bit" else _base64_lines(data)
    headers = [
        f'Content-Type: text/{subtype}; charset="utf-8"',
        f"Content-Transfer-Encoding: {cte}",
    ]
    return headers, body


def _attachment_part(attachment: Attachment, field: str) -> Entity:
    problem = filename_problem(attachment.filename)
    if problem:
        raise JobInputError(f"{field}.filename", problem)
    params = parameter("filename", attachment.filename)
    tokens = ["attachment;", *[p + ";" for p in params[:-1]], params[-1]]
    headers = [
        f"Content-Type: {attachment.content_type}",
        "Content-Transfer-Encoding: base64",
        fold("Content-Disposition", tokens),
    ]
    return headers, wrapped_base64(attachment.content_base64)


def entity_bytes(entity: Entity) -> bytes:
    return _CRLF.join(entity[0]).encode("ascii") + b"\r\n\r\n" + entity[1]


def boundary(message_id: str, kind: str, attempt: int = 0) -> str:
    """The `attempt`-th boundary candidate of a multipart `kind`: derived from the
    Message-ID (a resend must be the same bytes, so nothing random), another for the
    multipart/alternative nested in multipart/mixed."""
    seed = message_id + kind + (f"#{attempt}" if attempt else "")
    digest = hashlib.sha256(seed.encode("utf-8")).hexdigest()[:32]
    return f"=_sendledger_{kind}{digest}"


def _multipart(subtype: str, parts: list[Entity], message_id: str, kind: str) -> Entity:
    encoded = [entity_bytes(part) for part in parts]
    attempt = 0
    # A text part may hold any line, and the Message-ID (so the boundary) is derived from
    # the key: a caller can compute it. The first candidate that occurs in no part is used.
    while True:
        mark = boundary(message_id, kind, attempt)
        delimiter = b"--" + mark.encode("ascii")
        if not any(delimiter in part for part in encoded):
            break
        attempt += 1
    body = b"".join(delimiter + b"\r\n" + part + b"\r\n" for part in encoded)
    headers = [fold("Content-Type", [f"multipart/{subtype};", f'boundary="{mark}"'])]
    return headers, body + delimiter + b"--\r\n"


@dataclass(frozen=True)
class MessageLimits:
    """What one provider accepts per message; `where` names the settings they come from
    (``providers.support``), so a refusal says which setting to change."""

    max_bytes: int
    max_recipients: int
    where: str


def check_recipients(
    to: tuple[str, ...], cc: tuple[str, ...], limits: MessageLimits, bcc: tuple[str, ...] = ()
) -> None:
    """Refuse at intake a job with more recipients than the provider sends to at once (it
    would refuse the send, and the job would only land in review)."""
    recipients = len(to) + len(cc) + len(bcc)
    if recipients > limits.max_recipients:
        raise JobInputError(
            "to",
            f"{recipients} recipients (to, cc and bcc), more than {limits.where}.max_recipients "
            f"({limits.max_recipients})",
        )


def check_size(raw: bytes, limits: MessageLimits, field: str = "body") -> None:
    """Refuse at intake a message larger, once encoded, than the provider accepts."""
    if len(raw) > limits.max_bytes:
        raise JobInputError(
            field,
            f"the message is {len(raw)} bytes once encoded, more than "
            f"{limits.where}.max_message_bytes ({limits.max_bytes})",
        )


__all__ = [
    "MessageFields",
    "MessageLimits",
    "boundary",
    "build_message",
    "check_recipients",
    "check_size",
    "date_value",
    "render_message",
]
