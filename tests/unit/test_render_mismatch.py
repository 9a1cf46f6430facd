"""A rendered message that does not say what its job says is never sent: refused at intake
naming the field, sent to review (`render-mismatch`) before the claim at dispatch; and a
read-back marks the provider's handle unreliable only for bytes proved to carry our
Message-ID (docs/cli.md "Message fields and validation", docs/architecture.md "The message")."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from tests.unit.engine_rig import EngineRig, policy, receipt

import ledger.wire_check as wire_check
from daemon.engine.readback import ProviderHealth
from daemon.service_layer.intake import IntakeError, check_messages
from ledger.message import render
from ledger.mime import MessageFields, render_message
from ledger.vocabulary import EscalationReason, JobState
from policies.loader import PolicySet


@pytest.fixture
def rig() -> Iterator[EngineRig]:
    rig = EngineRig(policy("receipts"))
    yield rig
    rig.close()


@pytest.fixture
def injecting_writer(monkeypatch: pytest.MonkeyPatch) -> None:
    """A writer with a bug: it adds a Bcc recipient the job does not have."""

    def writer(fields: MessageFields) -> bytes:
        raw = render_message(fields)
        return raw.replace(b"\r\nSubject:", b"\r\nBcc: evil@attacker.example\r\nSubject:", 1)

    monkeypatch.setattr(wire_check, "render_message", writer)


def test_a_mismatch_at_dispatch_is_review_and_nothing_is_sent(
    rig: EngineRig, injecting_writer: None
) -> None:
    rig.submit("receipts", "k1")
    rig.tick()
    job = rig.job("k1")
    assert (job.state, job.reason) == (JobState.REVIEW, EscalationReason.RENDER_MISMATCH)
    assert job.reason == "render-mismatch"
    assert rig.provider.sends == 0
    assert rig.events("k1") == ["Requested", "Escalated"]  # never claimed


def test_a_mismatch_at_intake_is_a_refusal_naming_the_field(injecting_writer: None) -> None:
    channel = policy("receipts")
    with pytest.raises(IntakeError) as info:
        check_messages(
            PolicySet({"receipts": channel}),
            [receipt("receipts", "k1")],
            [channel.sender],
            {},
            batch=False,
            at=datetime(2026, 11, 1, tzinfo=UTC),
        )
    [problem] = info.value.problems
    assert problem.field == "bcc" and "rendered message differs" in problem.reason


def test_a_read_back_marks_the_handle_only_for_bytes_that_carry_our_message_id(
    rig: EngineRig,
) -> None:
    rig.provider.replaces_message_id = True
    health = ProviderHealth(rig.ledger, rig.clock)
    rig.submit("receipts", "k1")
    job = rig.job("k1")
    proved = render(job)
    # The Message-ID pushed into the body by a header block that ended early: the
    # provider assigning its own says nothing about how it treats ours.
    lost = proved.replace(b"\r\nMessage-ID:", b"\r\n\r\nMessage-ID:", 1)
    sent = rig.provider.send_raw(lost)
    assert sent.provider_message_id is not None
    health.read_back(job, "fake", rig.provider, sent.provider_message_id, raw=lost)
    handle = rig.ledger.handle("fake")
    assert handle is None or handle.reliable
    sent = rig.provider.send_raw(proved)
    assert sent.provider_message_id is not None
    health.read_back(job, "fake", rig.provider, sent.provider_message_id, raw=proved)
    handle = rig.ledger.handle("fake")
    assert handle is not None and not handle.reliable
