"""Delivery status notifications as mail systems write them, for the emulators and tests.

Three shapes, each a `multipart/report; report-type=delivery-status` (RFC 6522, RFC 3464)
with the original message's headers, as the sender's mailbox receives it:

* `rfc3464_report`: the plain standard form (a text part, the status part, the original
  headers as `text/rfc822-headers`), as Postfix and most MTAs write it;
* `gmail_report`: Gmail's own bounce ("Delivery Status Notification (Failure)" from
  mailer-daemon@googlemail.com, `X-Failed-Recipients`, a `multipart/related` human part,
  `X-Original-Message-ID` in the status part, the original message whole as
  `message/rfc822`);
* `exchange_report`: Microsoft 365's non-delivery report ("Undeliverable: ..." from the
  tenant's Microsoft Exchange sender, `X-MS-Exchange-Message-Is-Ndr`, a
  `multipart/alternative` human part, the original headers as `text/rfc822-headers`).

Plain bytes built by hand, CR LF line ends: nothing here imports the daemon, and nothing
depends on the standard library's generator. A test forges reports from the same pieces.
"""

from __future__ import annotations

import secrets
from datetime import UTC, datetime
from email.utils import format_datetime

__all__ = [
    "exchange_report",
    "gmail_report",
    "original_headers",
    "report",
    "rfc3464_report",
]

CRLF = b"\r\n"


def original_headers(raw: bytes) -> bytes:
    """The header block of a message (up to its first empty line), CR LF line ends."""
    text = raw.replace(b"\r\n", b"\n")
    head = text.split(b"\n\n", 1)[0]
    return head.replace(b"\n", CRLF) + CRLF


def _lines(*lines: str) -> bytes:
    return "".join(line + "\r\n" for line in lines).encode("utf-8")


def _status(
    recipient: str,
    status: str,
    diagnostic: str,
    reporter: str,
    extra: tuple[str, ...] = (),
    action: str = "failed",
) -> tuple[list[str], bytes]:
    """The message/delivery-status part: per-message fields, then one recipient's."""
    return ["Content-Type: message/delivery-status"], _lines(
        f"Reporting-MTA: dns; {reporter}",
        *extra,
        f"Arrival-Date: {format_datetime(datetime.now(UTC))}",
        "",
        f"Final-Recipient: rfc822; {recipient}",
        f"Original-Recipient: rfc822;{recipient}",
        f"Action: {action}",
        f"Status: {status}",
        f"Diagnostic-Code: smtp; {diagnostic}",
    )


def report(
    *,
    sender: str,
    to: str,
    subject: str,
    parts: list[tuple[list[str], bytes]],
    headers: list[str] | None = None,
    boundary: str | None = None,
    report_type: str = "delivery-status",
) -> bytes:
    """A multipart/report of the given parts ((header lines, body bytes) each)."""
    mark = boundary or f"=_report_{secrets.token_hex(8)}"
    head = _lines(
        f"From: {sender}",
        f"To: {to}",
        f"Subject: {subject}",
        f"Date: {format_datetime(datetime.now(UTC))}",
        f"Message-ID: <{secrets.token_hex(12)}@reports.example.invalid>",
        *(headers or []),
        "MIME-Version: 1.0",
        f'Content-Type: multipart/report; report-type={report_type}; boundary="{mark}"',
        "",
        "This is a MIME-encapsulated message.",
        "",
    )
    body = b"".join(_lines(f"--{mark}", *lines, "") + data + CRLF for lines, data in parts)
    return head + body + _lines(f"--{mark}--")


def rfc3464_report(
    original: bytes,
    *,
    mailbox: str,
    recipient: str,
    status: str = "5.1.1",
    action: str = "failed",
    diagnostic: str = "550 5.1.1 user unknown",
    reporter: str = "mx.example.invalid",
) -> bytes:
    """The standard report, the original's headers only (`text/rfc822-headers`)."""
    return report(
        sender="MAILER-DAEMON@mx.example.invalid (Mail Delivery System)",
        to=mailbox,
        subject="Undelivered Mail Returned to Sender",
        parts=[
            (["Content-Type: text/plain; charset=us-ascii"], _lines(f"{recipient}: {diagnostic}")),
            _status(recipient, status, diagnostic, reporter, action=action),
            (["Content-Type: text/rfc822-headers"], original_headers(original)),
        ],
    )


def gmail_report(
    original: bytes,
    *,
    mailbox: str,
    recipient: str,
    message_id: str,
    status: str = "5.1.1",
    diagnostic: str = "550-5.1.1 The email account that you tried to reach does not exist.",
) -> bytes:
    """Gmail's own bounce, the original message whole (`message/rfc822`)."""
    inner = f"=_related_{secrets.token_hex(6)}"
    human = _lines(
        f"--{inner}",
        "Content-Type: text/html; charset=UTF-8",
        "",
        "<html><body><h2>Address not found</h2>",
        f"<p>Your message wasn't delivered to <b>{recipient}</b> because the address"
        " couldn't be found, or is unable to receive mail.</p></body></html>",
        f"--{inner}--",
    )
    return report(
        sender="Mail Delivery Subsystem <mailer-daemon@googlemail.com>",
        to=mailbox,
        subject="Delivery Status Notification (Failure)",
        headers=[f"X-Failed-Recipients: {recipient}", "Auto-Submitted: auto-replied"],
        parts=[
            ([f'Content-Type: multipart/related; boundary="{inner}"'], human),
            _status(
                recipient,
                status,
                diagnostic,
                "googlemail.com",
                (f"Received-From-MTA: dns; {mailbox}", f"X-Original-Message-ID: {message_id}"),
            ),
            (
                ["Content-Type: message/rfc822"],
                original.replace(b"\r\n", b"\n").replace(b"\n", CRLF),
            ),
        ],
    )


def exchange_report(
    original: bytes,
    *,
    mailbox: str,
    recipient: str,
    subject: str,
    status: str = "5.1.10",
    diagnostic: str = (
        "550 5.1.10 RESOLVER.ADR.RecipientNotFound; Recipient not found by SMTP address lookup"
    ),
) -> bytes:
    """Microsoft 365's non-delivery report, the original's headers only."""
    inner = f"=_alt_{secrets.token_hex(6)}"
    domain = mailbox.rpartition("@")[2] or "example.invalid"
    human = _lines(
        f"--{inner}",
        "Content-Type: text/plain; charset=us-ascii",
        "",
        "Your message to " + recipient + " couldn't be delivered.",
        f"--{inner}--",
    )
    return report(
        sender=f"Microsoft Outlook <MicrosoftExchange329e71ec88ae4615bbc36ab6ce41109e@{domain}>",
        to=mailbox,
        subject=f"Undeliverable: {subject}",
        headers=["X-MS-Exchange-Message-Is-Ndr:", "Auto-Submitted: auto-replied"],
        parts=[
            ([f'Content-Type: multipart/alternative; boundary="{inner}"'], human),
            _status(recipient, status, diagnostic, "AM0PR01MB0001.eurprd01.prod.outlook.com"),
            (["Content-Type: text/rfc822-headers"], original_headers(original)),
        ],
    )
