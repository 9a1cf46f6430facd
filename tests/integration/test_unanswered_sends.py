"""A front end that takes every send and closes the connection with no response, on the
real stack: the Google client, the Gmail emulator behind the fault relay's
`drop-response`, SQLite and PostgreSQL stores. Sends are counted at the relay, copies at
the emulator (docs/operations.md "Outages and quotas": sends closed unanswered in a
row pause the scope's sends; its searches go on)."""

from __future__ import annotations

from tests.integration.test_engine import (  # noqa: F401  (fixtures used by name)
    Rig,
    RigFactory,
    emulator,
    make_rig,
)

from ledger.job import JobState
from testkit.gmail_emulator import GmailEmulator
from testkit.relay import FaultPlan, FaultRelay

JOBS = 12
PAUSE_AFTER = 3
CONCURRENCY = 4  # the rig's (tests/integration/test_engine.py)


def settled(rig: Rig, keys: list[str]) -> None:
    """Ticks 0.1 s apart (less than any probe's wait) until every job is confirmed."""
    for _ in range(10):
        rig.tick()
        if all(rig.state(key) is JobState.CONFIRMED for key in keys):
            break
        rig.clock.advance(0.1)
    for key in keys:
        assert rig.state(key) is JobState.CONFIRMED, rig.names(key)


def test_sends_closed_unanswered_pause_at_the_relay_and_searches_settle_them(
    make_rig: RigFactory,  # noqa: F811
    relay: FaultRelay,
    emulator: GmailEmulator,  # noqa: F811
) -> None:
    """Before: all twelve due jobs went through the relay into the close (twelve Unknowns,
    twelve searches, twelve reviews had the searches missed). Now the third unanswered
    send pauses the scope: at most the sends already in flight beside it follow. The
    searches of those sent are made while the pause lasts and confirm them (the front end
    had passed them on), a probe into the close doubles the wait, and once the front end
    answers the probe ends the pause and the rest go, each job one copy."""
    rig = make_rig({"receipts": {"pause_after_unanswered": PAUSE_AFTER}})
    relay.set_plan(FaultPlan(send="drop-response"))
    keys = [f"unanswered-{n}" for n in range(JOBS)]
    message_ids = dict(zip(keys, (rig.submit("receipts", key) for key in keys), strict=True))
    rig.tick()
    first = rig.sends()
    assert PAUSE_AFTER <= first <= PAUSE_AFTER + CONCURRENCY - 1, first
    [paused] = rig.engine.open_circuits()
    assert paused.sends_only and paused.failures == 0 and paused.unanswered >= PAUSE_AFTER
    sent = [key for key in keys if rig.state(key) is JobState.UNKNOWN]
    assert len(sent) == first
    assert all(rig.state(key) is JobState.REQUESTED for key in keys if key not in sent)

    rig.clock.advance(300)  # search_after: the searches go; so does one probe, unanswered
    settled(rig, sent)
    for key in sent:
        assert rig.of(key, "Confirmed")[0].via == "search"
    assert rig.sends() == first + 1  # the probe, and nothing else
    assert [c.sends_only for c in rig.engine.open_circuits()] == [True]

    relay.set_plan(FaultPlan())  # the front end answers again
    rig.clock.advance(2)
    rig.tick()  # the probe's time: answered, the pause ends, the rest go
    assert rig.engine.open_circuits() == []
    rig.clock.advance(300)  # the unanswered probe's own search
    settled(rig, keys)
    assert all(emulator.copies(message_ids[key]) == 1 for key in keys)
    assert rig.sends() == JOBS  # each job sent once, the unanswered probe's job too
