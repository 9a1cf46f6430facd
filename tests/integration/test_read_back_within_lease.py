"""The read-back after a confirmed send ends with the claim's lease, on the real stack:
the real Google client, the Gmail emulator behind the fault relay, SQLite and PostgreSQL
stores (docs/architecture.md "Leases"). The relay holds the answer to the read-back's
`messages.get`; the daemon's renewals do not land (a store it lost), so its lease as last
written is the claim's: the call's bound (tests/integration/test_engine.py's `TIMEOUT`, on
the rig's injected clock) ends once the test moves the clock past it while the read-back
waits, long before the client's own 5 s timeout or the relay's hang."""

from __future__ import annotations

import logging
import time

import pytest
from tests.integration.test_engine import (  # noqa: F401  (fixtures used by name)
    CLIENT_TIMEOUT,
    TIMEOUT,
    RigFactory,
    emulator,
    make_rig,
)

from ledger.job import JobState
from sendledger.connecting import LEASE_ENDS
from testkit.gmail_emulator import GmailEmulator
from testkit.relay import FaultPlan, FaultRelay

HANG = 4.0  # the relay holds the read-back's answer this long (real time)


def test_a_read_back_hanging_past_its_lease_ends_with_it(
    make_rig: RigFactory,  # noqa: F811
    relay: FaultRelay,
    emulator: GmailEmulator,  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Before: the read-back waited for the relay's close, 4 s, while the claim's lease
    had ended and another daemon could recover the claim, searching and marking while
    this one still read. Now it ends with the lease, in the send's words; the send it
    followed stays confirmed, and one copy is sent."""
    relay.hang_seconds = HANG
    relay.set_plan(FaultPlan(search=["hang"]))
    rig = make_rig({"receipts": {"on_unknown": "review"}})
    message_id = rig.submit("receipts", "read-back-1")
    rig.engine.leases.renew_due = lambda: 0  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING, logger="sendledger.engine"):
        rig.engine.hand_out()
        for _ in range(1000):  # the read-back reaches the relay, which holds its answer
            if any(entry["kind"] == "search" for entry in relay.log):
                break
            time.sleep(0.01)
        started = time.monotonic()
        rig.clock.advance(TIMEOUT)  # the call's bound passes: the lease as last written ends
        assert rig.engine.settle(timeout=30)
    took = time.monotonic() - started
    assert took < min(HANG, CLIENT_TIMEOUT) / 2, f"{took:.2f}s: the read-back outlived its lease"
    read_backs = [entry for entry in relay.log if entry["kind"] == "search"]
    assert [entry["mode"] for entry in read_backs] == ["hang"]
    failed = [r.getMessage() for r in caplog.records if "read-back failed" in r.getMessage()]
    assert len(failed) == 1 and LEASE_ENDS in failed[0], failed
    assert rig.state("read-back-1") is JobState.CONFIRMED
    assert rig.sends() == 1 and emulator.copies(message_id) == 1
