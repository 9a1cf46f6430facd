"""A flood of delivery reports about one job on the real stores (docs/how-it-works.md
"Bounces: what a report proves"): two daemons, each with its own connection to one SQLite
file or PostgreSQL schema, read the one mailbox at once while it holds thirty reports
about one recipient, each with its own id. The store ends with one Bounced per recipient
and kind (the job's version decides between the daemons: the loser reads the job again
and finds its report adds nothing), and after a restart, the job read back from the
store, more reports add none. The events are counted in the store; the engine's time is
injected, the provider is the fake's inbox."""

from __future__ import annotations

from tests.unit.engine_rig import EngineRig, policy
from tests.unit.test_bounces import bounce_of

from daemon.engine import Engine
from ledger.application import Ledger
from ledger.job import SendJob

INTERVAL = 60.0
TO = "customer@example.net"


def stored_bounces(store_url: str, key: str) -> list[SendJob.Bounced]:
    """The job's Bounced events as a fresh connection to the store reads them."""
    ledger = Ledger(store_url)
    try:
        return [e for e in ledger.history(key) if isinstance(e, SendJob.Bounced)]
    finally:
        ledger.close()


def test_a_flood_read_by_two_daemons_leaves_one_bounced_per_recipient_and_kind(
    store_url: str,
) -> None:
    with EngineRig(policy("receipts", watch_bounces="1h"), store=store_url) as rig:
        second = Ledger(store_url, clock=rig.clock)
        other = rig.own(
            Engine(
                second,
                rig.holder,
                {"fake": rig.provider},
                provider_timeouts={"fake": 10.0},
                clock=rig.clock,
                elapsed=rig.clock.elapsed,
                daemon_name="other",
            )
        )
        try:
            mid = rig.submit("receipts", "r-1")
            rig.tick()
            for n in range(30):
                delayed = {"status": "4.4.7", "action": "delayed"} if n % 3 == 0 else {}
                rig.provider.deliver(bounce_of(mid, **delayed))
            rig.clock.advance(INTERVAL)
            first, then = rig.engine.hand_out(), other.hand_out()
            rig.engine.settle(timeout=60)
            other.settle(timeout=60)
            assert first.errors == then.errors == 0
            bounces = stored_bounces(store_url, "r-1")
            assert sorted(e.permanent for e in bounces) == [False, True]
            rig.restart()  # what was read is forgotten: the job, read back, refuses them
            rig.provider.deliver(bounce_of(mid))
            rig.advance_and_tick(INTERVAL)
            assert len(stored_bounces(store_url, "r-1")) == 2
        finally:
            other.close()
            second.close()
