"""A late answer to a call that began before a hang does not close the circuit the hang
opened (daemon/engine/circuit.py `Circuits.answered`, docs/architecture.md "Outages:
waited out, not escalated"): a daemon paused while its provider began to hang its sends
read a send's answer, given before the hang, after the timeouts of the sends begun in
it, and sent its next jobs into the known hang unprobed (tests/e2e/test_races.py)."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

from tests.unit.engine_rig import EngineRig, policy
from tests.unit.test_circuit_hangs import wait_until

from daemon.doubles.fake_provider import Scripted
from daemon.engine.circuit import SEND, Admit, Circuits, CircuitSettings
from ledger.vocabulary import JobState

T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_an_answer_to_a_call_begun_before_the_failure_leaves_the_circuit_open() -> None:
    circuits = Circuits(CircuitSettings(failures=1, probe_after=1.0, probe_max=8.0))
    with circuits.calling("s") as early:
        with circuits.calling("s") as hung:
            circuits.called("s", at(10), unavailable=True, timed_out=True, ticket=hung)
        circuits.answered("s", at(10.5), SEND, ticket=early)  # answered before the hang
        assert circuits.open() != [] and circuits.admit("s", at(10.5)) is Admit.HOLD
    # The probe begins after the failure: its answer closes as before.
    assert circuits.admit("s", at(11)) is Admit.PING
    with circuits.calling("s") as probe:
        pass
    circuits.answered("s", at(11.1), SEND, ticket=probe)
    assert circuits.open() == [] and circuits.admit("s", at(11.1)) is Admit.GO


def test_an_answer_to_a_call_begun_after_the_timed_out_one_still_clears_the_hold() -> None:
    # The deliberate rule: calls in flight beside a timeout may hang too, and one of them
    # begun after the timed-out call answering says the provider answers.
    circuits = Circuits(CircuitSettings(failures=3))
    with circuits.calling("s") as hung, circuits.calling("s") as other:
        circuits.called("s", at(0), unavailable=True, timed_out=True, ticket=hung)
        assert circuits.admit("s", at(0)) is Admit.HOLD
        circuits.called("s", at(0.1), unavailable=False, ticket=other)
        assert circuits.admit("s", at(0.1)) is Admit.GO


def test_a_send_answered_late_after_the_hang_opened_the_circuit_sends_nothing_unprobed() -> None:
    rig = EngineRig(policy("legal", on_unknown="review"), concurrency=4)
    answer, hang = threading.Event(), threading.Event()
    try:
        rig.provider.script(Scripted.slow(answer), *[Scripted.timed_out(hang) for _ in range(3)])
        rig.submit("legal", "early")  # begins before the hang, its answer read late
        rig.engine.hand_out()
        assert rig.engine.settle(busy=lambda: rig.provider.hanging, timeout=10)
        assert rig.provider.hanging == 1
        for n in range(3):
            rig.submit("legal", f"hung-{n}")
        rig.engine.hand_out()
        assert rig.engine.settle(busy=lambda: rig.provider.hanging, timeout=10)
        assert rig.provider.hanging == 4
        hang.set()  # the three begun in the hang time out: the circuit opens
        wait_until(lambda: rig.provider.hanging == 1 and rig.engine.open_circuits() != [])
        for n in range(3):
            rig.submit("legal", f"after-{n}")
        answer.set()  # the early send's answer, read now
        assert rig.engine.settle(timeout=10)
        assert rig.job("early").state is JobState.CONFIRMED
        rig.engine.hand_out()  # the probe not due yet: nothing goes
        assert rig.engine.settle(timeout=10)
        assert rig.engine.open_circuits() != []
        assert rig.provider.sends == 4 and rig.provider.pings == 0
        # The hang is over: the probe (a send: the early send's read-back answered after
        # the hang, so reads work) answers, then the rest go.
        for _ in range(6):
            rig.clock.advance(60)
            rig.tick()
        assert rig.engine.open_circuits() == []
        assert all(rig.job(f"after-{n}").state is JobState.CONFIRMED for n in range(3))
        assert rig.provider.sends == 7
    finally:
        answer.set()
        hang.set()
        rig.close()
