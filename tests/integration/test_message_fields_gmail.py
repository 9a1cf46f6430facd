"""Message fields from the job JSON through the engine to the GmailEmulator (on SQLite and
PostgreSQL): a job with a PDF attachment, Bcc, List-Unsubscribe and threading headers
arrives as one copy with every part intact; a job with send_at is not sent before it."""

from __future__ import annotations

import base64
import email
import email.policy
import hashlib
from datetime import timedelta
from email.message import EmailMessage

from tests.integration.test_engine import (  # noqa: F401  (fixtures used by name)
    BASE_POLICY,
    RigFactory,
    emulator,
    make_rig,
)

from daemon.doubles.fake_time import FakeClock
from ledger.content import parse_job
from ledger.job import JobState
from ledger.message import render
from testkit.gmail_emulator import GmailEmulator

UNSUBSCRIBE = "<https://example.com/unsubscribe/" + "t" * 120 + ">, <mailto:unsub@example.com>"
PARENT = "<ticket-4711-reply-3@support.example.com>"
THREAD = ["<ticket-4711@support.example.com>", PARENT]
PDF = (
    b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n1 0 obj << /Type /Catalog >> endobj\ntrailer << >>\n%%EOF\n" * 40
)
PDF_NAME = "Rechnung März 2026 \u2013 Ticket 4711.pdf"  # an en dash


def test_bcc_unsubscribe_and_threading_arrive_as_one_intact_copy(
    make_rig: RigFactory,  # noqa: F811
    emulator: GmailEmulator,  # noqa: F811
    clock: FakeClock,
) -> None:
    rig = make_rig({"support": dict(BASE_POLICY)})
    job = parse_job(
        {
            "channel": "support",
            "key": "ticket-4711-reply-4",
            "to": "customer@example.net",
            "bcc": ["audit@example.com", "Archive <archive@example.org>"],
            "subject": "Re: your ticket",
            "body": "We fixed it.\n",
            "headers": {
                "List-Unsubscribe": UNSUBSCRIBE,
                "List-Unsubscribe-Post": "List-Unsubscribe=One-Click",
                "X-Ticket": "4711",
            },
            "in_reply_to": PARENT,
            "references": THREAD,
            "attachments": [
                {
                    "filename": PDF_NAME,
                    "content_type": "application/pdf",
                    "content_base64": base64.b64encode(PDF).decode(),
                }
            ],
        }
    )
    result = rig.ledger.submit(job, rig.holder.current["support"].sender)
    rig.tick()
    assert rig.state(job.key) is JobState.CONFIRMED
    assert emulator.copies(result.message_id) == 1
    [entry] = emulator.accepted()
    raw = render(rig.ledger.get_job(job.key))
    assert entry["raw_sha256"] == hashlib.sha256(raw).hexdigest()  # the very bytes built

    message = email.message_from_bytes(raw, policy=email.policy.default)
    assert isinstance(message, EmailMessage)
    assert message["To"] == "customer@example.net"
    # Gmail takes Bcc recipients from the raw message and strips the header on delivery.
    assert message["Bcc"] == "audit@example.com, Archive <archive@example.org>"
    assert message["List-Unsubscribe"] == UNSUBSCRIBE
    assert message["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
    assert message["X-Ticket"] == "4711"
    assert message["In-Reply-To"] == PARENT
    assert message["References"] == " ".join(THREAD)
    assert message["Message-ID"] == result.message_id
    assert message.get_content_type() == "multipart/mixed"
    body = message.get_body(("plain",))
    assert body is not None
    assert body.get_content().replace("\r\n", "\n") == "We fixed it.\n"
    [pdf] = message.iter_attachments()
    assert pdf.get_content_type() == "application/pdf"
    assert pdf.get_filename() == PDF_NAME  # RFC 2231: filename*=utf-8''...
    assert pdf.get_content() == PDF
    assert b"filename*" in raw
    assert b"=?" not in raw  # no header turned into encoded words


def test_a_job_with_send_at_is_not_sent_before_it_and_is_sent_after(
    make_rig: RigFactory,  # noqa: F811
    emulator: GmailEmulator,  # noqa: F811
    clock: FakeClock,
) -> None:
    rig = make_rig({"support": dict(BASE_POLICY)})
    send_at = clock() + timedelta(hours=15)
    job = parse_job(
        {
            "channel": "support",
            "key": "reminder-1",
            "to": "customer@example.net",
            "subject": "Your appointment",
            "body": "See you tomorrow at 09:00.\n",
            "send_at": send_at.isoformat(),
        }
    )
    result = rig.ledger.submit(job, rig.holder.current["support"].sender)
    rig.tick()
    rig.advance_and_tick(15 * 3600 - 1)
    assert emulator.copies(result.message_id) == 0
    assert rig.state(job.key) is JobState.REQUESTED
    rig.advance_and_tick(1)
    assert emulator.copies(result.message_id) == 1
    assert rig.state(job.key) is JobState.CONFIRMED
