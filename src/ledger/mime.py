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

from ledger.content import (
    JobInputError,
    reject_line_breaks,
    reject_unsafe_header_text,
    validate_address,
)

# SMTP policy: CRLF line endings and RFC 2047 encoded words for non-ASCII headers.
_POLICY = email.policy.SMTP.clone(max_line_length=78)


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
) -> bytes:
    # Headers carry the validator's canonical forms (an internationalized domain as its
    # A-label), never the text as typed.
    sender = validate_address("from", from_addr)
    recipients = [validate_address(f"to[{i}]", address) for i, address in enumerate(to)]
    copies = [validate_address(f"cc[{i}]", address) for i, address in enumerate(cc)]
    answer_to = None if reply_to is None else validate_address("reply_to", reply_to)
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
    message["MIME-Version"] = "1.0"
    message.set_content(body, subtype="plain", charset="utf-8", cte=_cte(body))
    if html is not None:
        message.add_alternative(html, subtype="html", charset="utf-8", cte=_cte(html))
        # The default boundary is random; a resend must be the same bytes.
        digest = hashlib.sha256(message_id.encode("utf-8")).hexdigest()[:32]
        message.set_boundary(f"=_sendledger_{digest}")
    return message.as_bytes(policy=_POLICY)


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


def check_recipients(to: tuple[str, ...], cc: tuple[str, ...], limits: MessageLimits) -> None:
    """Refuse at intake a job with more recipients than the provider sends to at once (it
    would refuse the send, and the job would only land in review)."""
    recipients = len(to) + len(cc)
    if recipients > limits.max_recipients:
        raise JobInputError(
            "to",
            f"{recipients} recipients (to and cc), more than {limits.where}.max_recipients "
            f"({limits.max_recipients})",
        )


def check_size(raw: bytes, limits: MessageLimits) -> None:
    """Refuse at intake a message larger, once encoded, than the provider accepts."""
    if len(raw) > limits.max_bytes:
        raise JobInputError(
            "body",
            f"the message is {len(raw)} bytes once encoded, more than "
            f"{limits.where}.max_message_bytes ({limits.max_bytes})",
        )
