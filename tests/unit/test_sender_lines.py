"""A sender's From is written and proved once for every message that sends as it, and the
proof still reads each message's own bytes: a From header that differs by a character is
checked afresh (docs/architecture.md "The message"; docs/performance.md "Commits per job").
"""

from __future__ import annotations

import uuid
from collections import Counter
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest

import ledger.mime as mime
import ledger.wire_check as wire_check
from ledger.message_id import message_id_for
from ledger.mime import MessageFields, render_message
from ledger.wire_check import find_mismatch


def fields(sender: str, key: str) -> MessageFields:
    return MessageFields(
        from_addr=sender,
        to=(f"{key}@example.com",),
        subject=f"Your receipt {key}",
        body="Thanks.\n",
        message_id=message_id_for(key, "mail.example.com"),
        date=datetime(2026, 1, 1, 12, tzinfo=UTC),
        reply_to=sender,
    )


def a_new_sender() -> str:
    # One no other test wrote or proved: what is counted is this test's own work.
    return f"Support {uuid.uuid4().hex[:8]} <support@example.com>"


@pytest.fixture
def lines_written(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    written: Counter[str] = Counter()
    address_line = mime._address_line

    def counted(name: str, boxes: Any) -> str:
        written[name] += 1
        return address_line(name, boxes)

    monkeypatch.setattr(mime, "_address_line", counted)
    return written


@pytest.fixture
def lists_read(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    read: Counter[str] = Counter()
    address_list = wire_check._address_list

    def counted(field: str, value: str) -> list[tuple[str, str]]:
        read[field] += 1
        return address_list(field, value)

    monkeypatch.setattr(wire_check, "_address_list", counted)
    return read


def test_a_sender_s_lines_are_written_once_for_every_message_that_sends_as_it(
    lines_written: Counter[str],
) -> None:
    sender = a_new_sender()
    first, second = (render_message(fields(sender, key)) for key in ("k1", "k2"))
    assert (lines_written["From"], lines_written["Reply-To"]) == (1, 1)
    assert lines_written["To"] == 2  # the recipients' lines, each job's own
    line = f"From: {sender}\r\n".encode()
    assert line in first and line in second
    assert f"Reply-To: {sender}\r\n".encode() in second


def test_a_sender_s_header_is_proved_once_and_other_bytes_afresh(
    lists_read: Counter[str],
) -> None:
    sender = a_new_sender()
    for key in ("k1", "k2", "k3"):
        job = fields(sender, key)
        assert find_mismatch(render_message(job), job) is None
    assert (lists_read["from"], lists_read["reply_to"], lists_read["to"]) == (1, 1, 3)
    # The same job, its From header changed by one character in the bytes: another value,
    # read and refused, and refused again from what was kept.
    job = fields(sender, "k4")
    raw = render_message(job)
    forged = raw.replace(b"From: Support ", b"From: Suppor7 ", 1)
    for _ in range(2):
        found = find_mismatch(forged, job)
        assert found is not None and found.field == "from", found
    assert lists_read["from"] == 2
    # The same bytes proved against a job whose From is another sender's: refused.
    other = replace(job, from_addr="Support <billing@example.com>")
    found = find_mismatch(raw, other)
    assert found is not None and found.field == "from", found
    # A From folded differently in the bytes is read as every header is: its lines are
    # checked on each message's own bytes, whatever was kept for its value.
    folded = raw.replace(b"From: Support ", b"From: Support\r\n\x00", 1)
    found = find_mismatch(folded, job)
    assert found is not None and found.field == "body", found
