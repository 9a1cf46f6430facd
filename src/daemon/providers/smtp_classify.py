"""Outcome classification of one SMTP submission ("Outcome classification" in
docs/architecture.md, the SMTP rows in the docs/providers.md's "Providers" section).

Pure: the provider records how far the dialogue got (`Stage`) and the reply it ended on
(a code and text, or none when the connection failed or timed out), and this module says
what that proves. The one ambiguous point is RFC 1047's: after the final `.` of DATA and
before the server's reply, the client cannot know whether the message was queued.
"""

from __future__ import annotations

import re
from enum import StrEnum

from daemon.providers.base import SendKind, SendOutcome

__all__ = ["Stage", "classify_smtp", "queue_id_from_reply"]


class Stage(StrEnum):
    """Where the dialogue ended. Every stage before END_OF_DATA is before the server
    could have a complete message, so nothing can have been queued."""

    CONNECT = "connect"  # TCP, implicit TLS, greeting
    HELLO = "hello"  # EHLO/HELO and STARTTLS
    AUTH = "auth"
    # A kept connection's check before its next transaction (RSET, NOOP): only a timeout
    # ends a send here, any other failure is tried again on a fresh connection
    # (`smtp_submit.py`).
    RESET = "reset"
    MAIL = "mail"  # MAIL FROM
    RCPT = "rcpt"  # RCPT TO (any refused recipient stops the send)
    DATA = "data"  # the DATA command, before 354
    CONTENT = "content"  # writing the message; the final "." not yet fully written
    END_OF_DATA = "end-of-data"  # the final "." written, waiting for the reply


# Postfix "2.0.0 Ok: queued as 4Xk2Lz0VhYz9sGq", Exim "OK id=1qZ9-000abc-XY",
# Sendmail "2.0.0 3AT9ABCD012345 Message accepted for delivery".
_QUEUE_ID = (
    re.compile(r"queued as ([A-Za-z0-9][A-Za-z0-9._-]{3,})"),
    re.compile(r"\bid=([A-Za-z0-9][A-Za-z0-9._-]{3,})"),
    re.compile(r"^(?:\d\.\d\.\d+\s+)?([A-Za-z0-9]{8,}) Message accepted"),
)


def queue_id_from_reply(text: str) -> str | None:
    """The submission server's queue id in a 250 reply, when it names one."""
    for pattern in _QUEUE_ID:
        match = pattern.search(text)
        if match:
            return match.group(1)
    return None


def _reply(code: int, text: str) -> str:
    return f"{code} {text}".strip()[:300]


def classify_smtp(
    stage: Stage,
    code: int | None,
    text: str = "",
    *,
    message_id: str,
    timed_out: bool = False,
    closed: bool = False,
) -> SendOutcome:
    """What the end of one submission proves.

    `code` is None when no reply ended the stage (refused, reset, closed, timed out);
    `text` is then the error; `timed_out`, when that was the socket's timeout (for the
    circuit, a hang); `closed`, when the server closed or reset the connection instead
    of a reply (for the circuit, no answer: `SendOutcome.unanswered`). `message_id` is
    ours: the provider id of a 250 that names no queue id.

    | stage | reply | outcome |
    |---|---|---|
    | connect or hello (TCP, TLS, greeting, STARTTLS) | none | Rejected, unavailable |
    | before the final `.` | 421 | Rejected, unavailable |
    | before the final `.` | none | Rejected, transient: not sent |
    | before the final `.` | 4xx | Rejected, transient |
    | before the final `.` | 5xx | Rejected, permanent |
    | before the final `.` | not SMTP (smtplib: -1) | Rejected, transient; unavailable at hello |
    | writing the content | anything but 4xx, 5xx (an early 2xx or 3xx; not SMTP) | Unknown |
    | after the final `.` | none (lost, closed, timeout) | Unknown |
    | after the final `.` | 2xx | Confirmed via response |
    | after the final `.` | 4xx | Rejected, transient |
    | after the final `.` | 5xx | Rejected, permanent |
    | after the final `.` | anything else | Unknown |
    """
    if stage is not Stage.END_OF_DATA:
        # The server never held a complete message: whatever happened, it was not sent.
        if code is None:
            return SendOutcome(
                SendKind.REJECTED,
                f"not sent ({stage}): {text or 'no reply'}",
                transient=True,
                # No session was ever established: the server is down or unreachable.
                unavailable=stage in (Stage.CONNECT, Stage.HELLO),
                timed_out=timed_out,
                unanswered=closed and not timed_out,
            )
        if stage is Stage.CONTENT and not 400 <= code < 600:
            # Anything but a refusal for content the server never had whole (a success,
            # a garbled line): no conforming server says it, and a broken one may have
            # queued what it read. Read after the final '.' before the early reading, it
            # was Confirmed or Unknown. The search decides, not a resend (as HTTP's
            # success or garbled status before the body's end, transport.py).
            return SendOutcome(
                SendKind.UNKNOWN,
                f"answered before the final '.': {_reply(code, text)}",
                status=code,
            )
        where = f"refused at {stage}: {_reply(code, text)}"
        if code == 421:
            # "Service not available, closing transmission channel" (RFC 5321 4.2.3).
            return SendOutcome(
                SendKind.REJECTED, where, transient=True, status=code, unavailable=True
            )
        if 400 <= code < 500:
            return SendOutcome(SendKind.REJECTED, where, transient=True, status=code)
        if 500 <= code < 600:
            return SendOutcome(SendKind.REJECTED, where, status=code)
        # A reply that is no SMTP answer (smtplib reads an unparsable line as -1) refuses
        # nothing for good: a broken or impostor server, tried again like a lost
        # connection, not a refusal a person must review.
        return SendOutcome(
            SendKind.REJECTED,
            where,
            transient=True,
            status=code,
            unavailable=stage in (Stage.CONNECT, Stage.HELLO),
        )
    if code is None:
        return SendOutcome(
            SendKind.UNKNOWN,
            f"no reply after the end of data: {text or 'connection closed'}",
            timed_out=timed_out,
            unanswered=closed and not timed_out,
        )
    if 200 <= code < 300:
        return SendOutcome(
            SendKind.CONFIRMED,
            _reply(code, text),
            provider_message_id=queue_id_from_reply(text) or message_id,
            status=code,
        )
    if 400 <= code < 500:
        return SendOutcome(
            SendKind.REJECTED,
            f"refused after data: {_reply(code, text)}",
            transient=True,
            status=code,
        )
    if 500 <= code < 600:
        return SendOutcome(
            SendKind.REJECTED, f"refused after data: {_reply(code, text)}", status=code
        )
    # 1xx/3xx where a final answer belongs: no proof either way.
    return SendOutcome(
        SendKind.UNKNOWN, f"unexpected reply after data: {_reply(code, text)}", status=code
    )
