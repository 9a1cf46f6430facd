"""The raw message, built with the standard library's email package.

The same job always renders to the same bytes (the Date comes from the job's creation,
not from a clock), so a resend is the same message with the same Message-ID.
"""

from __future__ import annotations

import binascii
import email.policy
import hashlib
import re
from dataclasses import dataclass
from datetime import datetime
from email.message import EmailMessage
from email.utils import format_datetime

from ledger.attachments import Attachment
from ledger.content import (
    JobInputError,
    reject_line_breaks,
    reject_unsafe_header_text,
    validate_address,
)
from ledger.extra_headers import fold

# SMTP policy: CRLF line endings and RFC 2047 encoded words for non-ASCII headers.
# refold_source="none": headers stored already folded (`_set_folded`) are written as they
# are; every other header is folded by the email package as before.
_POLICY = email.policy.SMTP.clone(max_line_length=78, refold_source="none")


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
    direct: bool = True,
) -> bytes:
    """The raw message. `bcc` becomes a Bcc header: the Gmail API takes its recipients
    from it and strips it on delivery; the SMTP provider takes it into the envelope and
    removes it from the data (`daemon/providers/smtp_imap.py: Envelope`). `headers` are
    the caller's extra headers (already checked by `ledger.content.parse_job`); with
    `attachments` the message is multipart/mixed, each file name in RFC 2231 form when it
    needs one.

    The common message (plain text, every header ASCII and one line) is written
    directly: the email package spends about a millisecond per message parsing back the
    headers it is given, once a third of the daemon's CPU per job. The direct path takes
    only what it can prove it writes byte for byte as the email package does
    (tests/unit/test_mime_direct.py compares the two, `direct=False` forcing the email
    package, on generated messages); anything else, and every input the email package
    would refuse, goes to the email package."""
    if direct and html is None and not attachments:
        raw = _direct_plain(
            from_addr, to, cc, reply_to, bcc, subject, body, message_id, date, headers,
            in_reply_to, references,
        )  # fmt: skip
        if raw is not None:
            return raw
    # Headers carry the validator's canonical forms (an internationalized domain as its
    # A-label), never the text as typed.
    sender = validate_address("from", from_addr)
    recipients = [validate_address(f"to[{i}]", address) for i, address in enumerate(to)]
    copies = [validate_address(f"cc[{i}]", address) for i, address in enumerate(cc)]
    answer_to = None if reply_to is None else validate_address("reply_to", reply_to)
    blind = [validate_address(f"bcc[{i}]", address) for i, address in enumerate(bcc)]
    reject_unsafe_header_text("subject", subject)
    reject_line_breaks("message_id", message_id)

    message = EmailMessage(policy=_POLICY)
    message["From"] = sender
    message["To"] = ", ".join(recipients)
    if copies:
        message["Cc"] = ", ".join(copies)
    if answer_to:
        message["Reply-To"] = answer_to
    message["Subject"] = subject
    message["Date"] = format_datetime(date)
    message["Message-ID"] = message_id
    if in_reply_to is not None:
        _set_folded(message, "In-Reply-To", in_reply_to)
    if references:
        _set_folded(message, "References", " ".join(references))
    if blind:
        message["Bcc"] = ", ".join(blind)
    for name, value in headers:
        reject_unsafe_header_text(f"headers.{name}", value)
        if value.isascii():
            _set_folded(message, name, value)
        else:
            message[name] = value  # RFC 2047 encoded words, as for the subject
    message["MIME-Version"] = "1.0"
    message.set_content(body, subtype="plain", charset="utf-8", cte=_cte(body))
    if html is not None:
        message.add_alternative(html, subtype="html", charset="utf-8", cte=_cte(html))
        # The default boundary is random; a resend must be the same bytes.
        message.set_boundary(_boundary(message_id))
    for attachment in attachments:
        message.add_attachment(
            attachment.data,
            maintype=attachment.maintype,
            subtype=attachment.subtype,
            filename=attachment.filename,
        )
    if attachments:
        message.set_boundary(_boundary(message_id, "mixed"))
    return message.as_bytes(policy=_POLICY)


# -- the direct path ----------------------------------------------------------------------

# A mailbox the strict validator (ledger/addresses.py) returns unchanged and the email
# package writes unchanged: a display name of plain words (no RFC 5322 specials, no "=?"
# that its parser would decode as an encoded word), an ASCII dot-atom local part and a
# host name. Lengths, all-digit top labels and A-labels ("xn--", which the validator
# checks with IDNA) are left to the email package.
_WORD = r"[A-Za-z0-9'_-]+"
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_SPEC = rf"[A-Za-z0-9_+-]+(?:\.[A-Za-z0-9_+-]+)*@{_LABEL}(?:\.{_LABEL})+"
_SIMPLE_MAILBOX = re.compile(rf"(?:{_WORD}(?: {_WORD})* <({_SPEC})>|({_SPEC}))")
_SIMPLE_MESSAGE_ID = re.compile(r"<[A-Za-z0-9._+-]+@[A-Za-z0-9.-]+>")
_SIMPLE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9-]*")  # a header name
_MAX_LINE = 78  # _POLICY.max_line_length: a longer header line would be folded
_CRLF = "\r\n"


def _simple_mailbox(value: str) -> bool:
    match = _SIMPLE_MAILBOX.fullmatch(value)
    if match is None:
        return False
    local, _, domain = (match.group(1) or match.group(2)).rpartition("@")
    labels = domain.lower().split(".")
    return (
        len(local) <= 64
        and len(domain) <= 253
        and len(local) + len(domain) < 254
        and not labels[-1].isdigit()
        and not any(label.startswith("xn--") for label in labels)
    )


def _simple_text(value: str) -> bool:
    # Printable ASCII (so no control character, CR or LF), words separated by single
    # spaces, nothing the email package would read as an encoded word.
    return (
        value.isascii()
        and value.isprintable()
        and value == value.strip(" ")
        and "  " not in value
        and "=?" not in value
        and value != ""
    )


def _address_line(name: str, addresses: list[str] | tuple[str, ...]) -> str | None:
    if not all(_simple_mailbox(address) for address in addresses):
        return None
    return _one_line(f"{name}: {', '.join(addresses)}")


def _one_line(line: str) -> str | None:
    return line if len(line) <= _MAX_LINE else None


def _direct_plain(
    from_addr: str,
    to: list[str] | tuple[str, ...],
    cc: list[str] | tuple[str, ...],
    reply_to: str | None,
    bcc: list[str] | tuple[str, ...],
    subject: str,
    body: str,
    message_id: str,
    date: datetime,
    headers: tuple[tuple[str, str], ...],
    in_reply_to: str | None,
    references: list[str] | tuple[str, ...],
) -> bytes | None:
    """The plain-text message written directly, in the email package's header order,
    or None when any part needs the email package."""
    lines: list[str | None] = [_address_line("From", [from_addr]), _address_line("To", to)]
    if cc:
        lines.append(_address_line("Cc", cc))
    if reply_to is not None:
        lines.append(_address_line("Reply-To", [reply_to]))
    lines.append(_one_line(f"Subject: {subject}") if _simple_text(subject) else None)
    lines.append(f"Date: {format_datetime(date)}")
    simple_id = _SIMPLE_MESSAGE_ID.fullmatch(message_id)
    lines.append(_one_line(f"Message-ID: {message_id}") if simple_id else None)
    if in_reply_to is not None:
        lines.append(_folded_line("In-Reply-To", in_reply_to))
    if references:
        lines.append(_folded_line("References", " ".join(references)))
    if bcc:
        lines.append(_address_line("Bcc", bcc))
    for name, value in headers:
        lines.append(_folded_line(name, value))
    if None in lines:
        return None
    if not body.isascii() and any("\ud800" <= char <= "\udfff" for char in body):
        return None  # a lone surrogate cannot be encoded: the email package says so
    cte = _cte(body)
    encoded = body.encode("utf-8").splitlines()
    if cte == "7bit":
        payload = _CRLF.join(line.decode("ascii") for line in encoded) + _CRLF
    else:
        data = b"\r\n".join(encoded) + b"\r\n"
        step = _MAX_LINE // 4 * 3
        payload = "".join(
            binascii.b2a_base64(data[i : i + step]).decode("ascii")
            for i in range(0, len(data), step)
        ).replace("\n", _CRLF)
    head = _CRLF.join(line for line in lines if line is not None)
    return (
        f"{head}{_CRLF}MIME-Version: 1.0{_CRLF}"
        f'Content-Type: text/plain; charset="utf-8"{_CRLF}'
        f"Content-Transfer-Encoding: {cte}{_CRLF}{_CRLF}{payload}"
    ).encode("ascii")


def _folded_line(name: str, value: str) -> str | None:
    # What `_set_folded` stores and the generator writes as it is (refold_source="none").
    if not _simple_text(value) or not _SIMPLE_NAME.fullmatch(name):
        return None
    return f"{name}: {fold(name, value)}"


def _boundary(message_id: str, kind: str = "") -> str:
    # Derived from the Message-ID: no boundary may be random (a resend is the same bytes),
    # and the multipart/alternative nested inside multipart/mixed needs another one.
    digest = hashlib.sha256((message_id + kind).encode("utf-8")).hexdigest()[:32]
    return f"=_sendledger_{kind}{digest}" if kind else f"=_sendledger_{digest}"


def _set_folded(message: EmailMessage, name: str, value: str) -> None:
    # A URL or message id longer than a line must stay one token: the email package
    # would fold it into encoded words, and it would no longer be a URL or message id.
    reject_line_breaks(name, value)
    message.set_raw(name, fold(name, value))


def _cte(text: str) -> str:
    # 8bit needs an 8BITMIME path end to end; base64 survives any relay. Lines are what
    # SMTP counts: CR and LF only (str.splitlines would also split on \x0b, \x0c, ...).
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    return "7bit" if text.isascii() and all(len(line) <= 998 for line in lines) else "base64"


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
