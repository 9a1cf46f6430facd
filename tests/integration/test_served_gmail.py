"""A hostile message in a Gmail mailbox, read through the real Gmail provider (the
emulator's metadata read, the client stack): a check answers its Date, To and Subject
bounded, as every door serves them (docs/review.md "Check"). The unit test
(tests/unit/test_served_text.py) measures each door; this one the provider's path."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import nullcontext
from datetime import UTC, datetime
from json.encoder import encode_basestring_ascii

import pytest
from tests.integration.conftest import MAILBOX, GmailProviderFactory
from tests.unit.engine_rig import EngineRig, policy

from daemon.service_layer.services import ChannelPolicies, Services
from ledger.characters import MAX_RECORDED
from ledger.decision_types import Review
from ledger.vocabulary import EscalationReason, PolicyRef
from testkit.gmail_emulator import GmailEmulator

#: About a megabyte of a header's words: a terminal's escape, a forged tag, `&`, a tab.
HOSTILE = "Re: invoice \x1b[2J\tX-Forged: 1 <img src=x onerror=alert(1)> & " * 20_000


@pytest.fixture
def rig() -> Iterator[EngineRig]:
    rig = EngineRig(policy("receipts", on_unknown="review"))
    yield rig
    rig.close()


def _json_length(text: str) -> int:
    return len(encode_basestring_ascii(text)) - 2


def test_a_hostile_gmail_copy_is_answered_bounded(
    rig: EngineRig, emulator: GmailEmulator, gmail_provider: GmailProviderFactory
) -> None:
    message_id = rig.submit("receipts", "k1")
    review = Review(PolicyRef("receipts", "f" * 16), EscalationReason.UNKNOWN_OUTCOME)
    at = datetime.now(UTC)
    rig.ledger.update("k1", lambda job: job.escalate(review, detail="test", at=at))
    raw = (
        f"From: <{MAILBOX}>\r\nTo: {HOSTILE}\r\nSubject: {HOSTILE}\r\n"
        f"Date: Tue, 01 Dec 2026 09:00:00 +0000\r\nMessage-ID: {message_id}\r\n\r\nHi.\r\n"
    ).encode()
    emulator.inject(raw, user=MAILBOX)
    gmail = gmail_provider(url=emulator.url, timeout=30.0)
    services = Services(
        rig.ledger,
        lambda: ChannelPolicies(rig.policies, {}),
        providers=lambda name: nullcontext(gmail),
    )
    answer = services.check("k1", by="op")
    assert answer.count == 1
    [copy] = answer.copies
    for words in (copy.subject, copy.to):
        assert _json_length(words) <= MAX_RECORDED, _json_length(words)
        assert words.startswith("Re: invoice ") and words.endswith(" more characters]")
    # Before: 2,640,540 bytes as the API writes it (now 4,542).
    served = json.dumps(answer.as_dict(), ensure_ascii=False).encode()
    assert len(served) <= 2_000 + 2 * MAX_RECORDED, len(served)
