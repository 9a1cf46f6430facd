"""The raw message, built with the standard library's email package.

The same job always renders to the same bytes (the Date comes from the job's creation,
not from a clock), so a resend is the same message with the same Message-ID.
"""

from __future__ import annotations

import email.policy
import hashlib
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
) -> bytes:
    """The raw message. `bcc` becomes a Bcc header: the Gmail API takes its recipients
    from it and strips it on delivery; the SMTP provider takes it into the envelope and
    removes it from the data (`daemon/providers/smtp_imap.py: Envelope`). `headers` are
    the caller's extra headers (already checked by `ledger.content.parse_job`); with
    `attachments` the message is multipart/mixed, each file name in RFC 2231 form when it
    needs one."""
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
