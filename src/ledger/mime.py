"""The raw message, built with the standard library's email package.

The same job always renders to the same bytes (the Date comes from the job's creation,
not from a clock), so a resend is the same message with the same Message-ID.
"""

from __future__ import annotations

import email.policy
import hashlib
from datetime import datetime
from email.message import EmailMessage
from email.utils import format_datetime

from ledger.content import reject_line_breaks, validate_address

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
    validate_address("from", from_addr)
    for index, address in enumerate(to):
        validate_address(f"to[{index}]", address)
    for index, address in enumerate(cc):
        validate_address(f"cc[{index}]", address)
    if reply_to is not None:
        validate_address("reply_to", reply_to)
    reject_line_breaks("subject", subject)
    reject_line_breaks("message_id", message_id)

    message = EmailMessage(policy=_POLICY)
    message["From"] = from_addr
    message["To"] = ", ".join(to)
    if cc:
        message["Cc"] = ", ".join(cc)
    if reply_to:
        message["Reply-To"] = reply_to
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
