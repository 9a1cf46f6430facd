"""Webhook positions met by another actor at one exact point, while a POST is out
(tests/unit/meanwhile.py; docs/http-api.md "Webhooks", at least once): a second daemon
that took the lease once it ran out, and an operator's `webhooks skip`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import closing

from tests.unit.meanwhile import Meanwhile
from tests.unit.test_webhooks import Receiver, Rig, drain, log_order

from daemon.webhooks.delivery import Outcome


class Slow(Receiver):
    """A receiver whose first answer comes only after `meanwhile` ran (its POST out)."""

    meanwhile: Meanwhile = Meanwhile()

    def __call__(
        self, url: str, body: bytes, headers: Mapping[str, str], timeout: float
    ) -> Outcome:
        hook, self.meanwhile = self.meanwhile, Meanwhile()
        hook()
        return super().__call__(url, body, headers, timeout)


def out(receiver: Slow, then: Callable[[], None]) -> None:
    receiver.meanwhile = Meanwhile(then)


def test_a_pass_whose_lease_ran_out_during_its_post_moves_nothing_back() -> None:
    """Daemon a's POST of the first event outlives its lease (a receiver slow to answer,
    a's store slow to write); b takes the webhook and delivers both events; a's POST then
    answers 2xx. a writes nothing: the position stays where b put it, and the first event
    reached the receiver twice with one `webhook-id`, the second time after the event
    that follows it."""
    with closing(Rig()) as rig:
        rig.confirmed("s-1", "s-2")
        receiver = Slow()
        first, second = rig.deliverer(receiver, owner="a"), rig.deliverer(receiver, owner="b")

        def b_takes_over() -> None:
            rig.clock.advance(61)  # a's lease (60 s) ran out while its POST was out
            drain(second)

        out(receiver, b_takes_over)
        assert first.pass_once() is False  # the lease went to b: a stops there
        [row] = rig.ledger.positions().read_all()
        assert row.owner == "b" and row.delivered == 2
        # b's two deliveries, then a's late answer: the first event again, after the second
        # (docs/http-api.md "Webhooks": deduplicate on the id, and never take
        # the last payload received for the job's state).
        order = log_order(rig, "Confirmed")
        assert [p["key"] for p in receiver.got] == [*order, order[0]]
        assert receiver.attempts[2] == receiver.attempts[0]  # the same id: one event
        drain(first)
        drain(second)
        assert len(receiver.got) == 3  # nothing more, from either


def test_a_skip_while_the_event_s_post_is_out_is_not_undone() -> None:
    """`webhooks skip ops` lands while the event it skips is being POSTed; the POST then
    answers 2xx. The pass's write was worked out from the position before the skip: it
    writes nothing, and the skip stands."""
    with closing(Rig()) as rig:
        rig.confirmed("k-1", "k-2")
        receiver = Slow()
        deliverer = rig.deliverer(receiver)
        positions = rig.ledger.positions()
        notes = rig.ledger.log_after(0, 10_000, 100, deliverer.hook.topics)
        [first_note, second_note] = list(notes)
        skipped_to = second_note.id

        def skip() -> None:
            assert positions.force("ops", skipped_to, rig.now(), expected=0)

        out(receiver, skip)
        assert deliverer.pass_once() is False
        assert positions.read_all()[0].position == skipped_to
        drain(deliverer)
        assert positions.read_all()[0].position == skipped_to
        assert [p["key"] for p in receiver.got] == log_order(rig, "Confirmed")[:1]
        assert first_note.id < skipped_to
