"""A state machine over webhook delivery (docs/http-api.md "Webhooks"): jobs confirmed, a receiver
that is up, down or refusing, two daemons passing, time moving, a daemon killed (its
deliverer replaced without giving its lease up), an operator's release. After every step
the events the receiver took, in the order it first saw each, are a prefix of the log's:
never out of order, never one skipped. At the end, with the receiver up, all arrive."""

from __future__ import annotations

from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from tests.unit.test_webhooks import Receiver, Rig, drain

from daemon.webhooks.events import event_id_for
from daemon.webhooks.worker import Deliverer

OWNERS = ("a", "b")


class DeliveryMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.rig = Rig()
        self.receiver = Receiver()
        self.deliverers: dict[str, Deliverer] = {
            owner: self.rig.deliverer(self.receiver, owner=owner, page=3) for owner in OWNERS
        }
        self.jobs = 0

    def expected(self) -> list[str]:
        topics = self.deliverers["a"].hook.topics
        notes: list[Any] = self.rig.ledger.log_after(0, 1 << 40, 10_000, topics)
        return [event_id_for(n.originator_id, n.originator_version) for n in notes]

    def first_seen(self) -> list[str]:
        return list(dict.fromkeys(p["event_id"] for p in self.receiver.got))

    @rule(count=st.integers(1, 3))
    def confirm_jobs(self, count: int) -> None:
        keys = [f"m-{self.jobs + n}" for n in range(count)]
        self.jobs += count
        self.rig.confirmed(*keys)

    @rule(owner=st.sampled_from(OWNERS))
    def pass_once(self, owner: str) -> None:
        self.deliverers[owner].pass_once()

    @rule(seconds=st.sampled_from([0.5, 3.0, 30.0, 61.0]))
    def time_passes(self, seconds: float) -> None:
        self.rig.clock.advance(seconds)

    @rule(mode=st.sampled_from(["up", "down", "refuse"]))
    def receiver_changes(self, mode: str) -> None:
        self.receiver.down = mode == "down"
        self.receiver.refuse = 2 if mode == "refuse" else 0

    @rule(owner=st.sampled_from(OWNERS))
    def killed_and_restarted(self, owner: str) -> None:
        self.deliverers[owner] = self.rig.deliverer(self.receiver, owner=owner, page=3)

    @rule(owner=st.sampled_from(OWNERS))
    def stops(self, owner: str) -> None:
        self.deliverers[owner].release()

    @invariant()
    def delivered_in_log_order_and_none_skipped(self) -> None:
        seen = self.first_seen()
        assert seen == self.expected()[: len(seen)]
        topics = self.deliverers["a"].hook.topics
        for row in self.rig.ledger.positions().read_all():
            passed = [
                event_id_for(n.originator_id, n.originator_version)
                for n in self.rig.ledger.log_after(0, row.position, 10_000, topics)
            ]
            assert passed == seen[: len(passed)]  # the position never passes one not taken

    def teardown(self) -> None:
        try:
            self.receiver.down, self.receiver.refuse = False, 0
            self.rig.clock.advance(300)
            for owner in OWNERS:
                drain(self.deliverers[owner])
            self.rig.clock.advance(61)
            for owner in OWNERS:
                drain(self.deliverers[owner])
            assert self.first_seen() == self.expected()
        finally:
            self.rig.close()


DeliveryMachine.TestCase.settings = settings(max_examples=40, stateful_step_count=30, deadline=None)
TestDeliveryMachine = DeliveryMachine.TestCase
