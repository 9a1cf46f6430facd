"""Hangs open the circuit (daemon/engine/circuit.py, docs/operations.md "Outages and
quotas"): a call that timed out counts toward its scope's circuit (its job stays Unknown),
no further job is sent into the hang, and the circuit is probed with a ping that sends
nothing; `give_up_after` applies to every held job whatever its place in the queue."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta

import pytest
from tests.unit.engine_rig import EngineRig, policy

from daemon.doubles.fake_provider import Scripted
from daemon.engine.circuit import (
    CHECK,
    PING,
    SEND,
    Admit,
    Circuits,
    CircuitSettings,
    send_unavailable,
)
from daemon.providers.base import SendKind, SendOutcome
from ledger.job import WITHHELD, SendJob
from ledger.stores.unchanged import Unchanged
from ledger.vocabulary import JobState

T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_a_timed_out_send_counts_toward_the_circuit() -> None:
    assert send_unavailable(SendOutcome(SendKind.UNKNOWN, "timed out", timed_out=True))
    assert not send_unavailable(SendOutcome(SendKind.UNKNOWN, "response lost"))


def test_a_timeout_holds_sends_while_calls_started_before_it_are_in_flight() -> None:
    circuits = Circuits(CircuitSettings(failures=3, probe_after=1.0, probe_max=8.0))
    calls = [circuits.calling("s") for _ in range(4)]
    for call in calls:
        call.__enter__()
    circuits.called("s", at(10), unavailable=True, timed_out=True)  # the first times out
    calls[0].__exit__(None, None, None)
    assert circuits.admit("s", at(10)) is Admit.HOLD  # the other three may hang too
    assert circuits.admit("s", at(10), CHECK) is Admit.GO  # searches hold only a worker
    for call in calls[1:]:
        circuits.called("s", at(10.1), unavailable=True, timed_out=True)
        call.__exit__(None, None, None)
    [opened] = circuits.open()
    assert opened.failures == 4
    assert circuits.admit("s", at(10.5)) is Admit.HOLD
    assert circuits.admit("s", at(11.1)) is Admit.PING  # a hang: probed by a ping
    circuits.called("s", at(11.2), unavailable=True, timed_out=True, kind=PING)  # hangs
    assert circuits.next_probe("s") == at(13.2)  # the backoff doubles
    assert circuits.admit("s", at(13.2)) is Admit.PING
    circuits.answered("s", at(13.3), PING)  # the ping answered: one send may try
    assert circuits.open() != []
    assert circuits.admit("s", at(13.3)) is Admit.PROBE
    assert circuits.admit("s", at(13.3)) is Admit.HOLD
    circuits.answered("s", at(13.4), SEND)  # the send answered: closed
    assert circuits.open() == [] and circuits.admit("s", at(13.4)) is Admit.GO


def test_a_second_timeout_among_calls_in_flight_together_opens_the_circuit() -> None:
    """A loaded machine: two of four workers had a send in the hang when the first timed
    out. Once both had ended, the next send went into the hang (two failures of three):
    tests/e2e/test_races.py saw it as a send into a known hang with no probe."""
    circuits = Circuits(CircuitSettings(failures=3, probe_after=1.0, probe_max=8.0))
    with circuits.calling("s"):
        with circuits.calling("s"):
            circuits.called("s", at(10), unavailable=True, timed_out=True)
        circuits.called("s", at(10.1), unavailable=True, timed_out=True)
    assert circuits.admit("s", at(10.2)) is Admit.HOLD
    assert circuits.admit("s", at(11.1)) is Admit.PING


def test_a_search_answering_during_a_send_hang_sends_nothing_sooner() -> None:
    """Reads answer, sends hang: a search that answers says reads work, not that a send
    would; the next send still waits for its probe time (each one is an Unknown)."""
    circuits = Circuits(CircuitSettings(failures=1, probe_after=4.0, probe_max=64.0))
    circuits.called("s", at(0), unavailable=True, timed_out=True)  # a send timed out
    circuits.answered("s", at(1), CHECK)  # a due search answered meanwhile
    assert circuits.admit("s", at(1)) is Admit.HOLD
    assert circuits.admit("s", at(4)) is Admit.PROBE  # a send, not a ping: reads work
    circuits.called("s", at(5), unavailable=True, timed_out=True)  # it hung too
    assert circuits.next_probe("s") == at(13)  # twice the wait, as for refusals
    assert circuits.admit("s", at(13)) is Admit.PING


def test_however_many_reads_answer_only_a_send_closes_a_circuit_a_send_hang_opened() -> None:
    """Sends hang, reads answer (tests/e2e/test_races.py, under load): the first search
    probe's answer made the next probe a send, and a second search's answer closed the
    circuit, so four sends went into the hang at once."""
    circuits = Circuits(CircuitSettings(failures=1, probe_after=1.0, probe_max=8.0))
    circuits.called("s", at(0), unavailable=True, timed_out=True)  # a send hung: open
    for moment in (1.0, 1.1, 1.2):  # due searches take the probe, one after the other
        assert circuits.admit("s", at(moment), CHECK) is Admit.PROBE
        circuits.called("s", at(moment + 0.05), unavailable=False, kind=CHECK)
        assert circuits.open() != []
    assert circuits.admit("s", at(1.3)) is Admit.PROBE  # one send: the send itself
    assert circuits.admit("s", at(1.3)) is Admit.HOLD  # and no other beside it
    circuits.answered("s", at(1.4), SEND)  # it answered: sends work again
    assert circuits.open() == [] and circuits.admit("s", at(1.4)) is Admit.GO


def test_a_read_answering_neither_clears_the_hold_of_a_timeout_nor_its_count() -> None:
    circuits = Circuits(CircuitSettings(failures=2))
    with circuits.calling("s"), circuits.calling("s"):
        circuits.called("s", at(0), unavailable=True, timed_out=True)  # one of two hung
        circuits.called("s", at(0.1), unavailable=False, kind=CHECK)  # a search answered
        assert circuits.admit("s", at(0.1)) is Admit.HOLD  # the other send may hang too
    assert circuits.admit("s", at(0.2)) is Admit.GO  # it ended: not a hang after all
    with circuits.calling("s"):
        circuits.called("s", at(0.7), unavailable=True, timed_out=True)  # alone, the second
    assert circuits.open() != []  # two in a row: the search between them was no send


def test_a_read_that_hung_is_cleared_by_a_read_that_answers() -> None:
    circuits = Circuits(CircuitSettings(failures=1, probe_after=1.0, probe_max=8.0))
    circuits.called("s", at(0), unavailable=True, timed_out=True, kind=CHECK)
    assert circuits.admit("s", at(1), CHECK) is Admit.PROBE
    circuits.called("s", at(1.1), unavailable=False, kind=CHECK)
    assert circuits.open() == []  # no send hung: reads answering is all it needed


def test_an_answer_in_flight_clears_the_hold() -> None:
    circuits = Circuits(CircuitSettings(failures=3))
    with circuits.calling("s"), circuits.calling("s"):
        circuits.called("s", at(0), unavailable=True, timed_out=True)
        assert circuits.admit("s", at(0)) is Admit.HOLD
        circuits.called("s", at(0), unavailable=False)  # the other one answered
        assert circuits.admit("s", at(0)) is Admit.GO
    assert circuits.in_flight("s") == 0


@pytest.mark.parametrize("concurrency", [1, 4])
def test_a_hang_costs_at_most_the_calls_already_in_flight(concurrency: int) -> None:
    """The issue's case: requests held and never answered; sends time out. With the old
    circuit each freed worker took the next job into the hang."""
    rig = EngineRig(policy("legal", on_unknown="review"), concurrency=concurrency)
    try:
        release = threading.Event()
        held = max(concurrency, 3)  # the calls in flight, or one at a time until it opens
        # Only that many hang: a send beyond them would be answered, and counted.
        rig.provider.script(*[Scripted.timed_out(release) for _ in range(held)])
        for n in range(10):
            rig.submit("legal", f"k{n}")
        rig.engine.hand_out()
        assert rig.engine.settle(busy=lambda: rig.provider.hanging, timeout=10)
        assert rig.provider.hanging == concurrency
        release.set()  # they all time out
        assert rig.engine.settle(timeout=10)
        unknown = [k for k in (f"k{n}" for n in range(10)) if rig.job(k).state is JobState.REVIEW]
        assert len(unknown) == held and rig.provider.sends == held
        # The probe is a ping while the hang lasts; nothing more is sent into it.
        rig.provider.fail_pings(1000)
        for _ in range(6):
            rig.clock.advance(60)
            rig.engine.hand_out()
            assert rig.engine.settle(timeout=10)
        assert rig.provider.sends == held and rig.provider.pings >= 3
        # The hang ends: a ping answers, then one send, then everything.
        rig.provider.fail_pings(0)
        for _ in range(10):
            rig.clock.advance(60)
            rig.tick()
        states = {rig.job(f"k{n}").state for n in range(10)} - {JobState.REVIEW}
        assert states == {JobState.CONFIRMED}
        assert rig.provider.sends == 10
    finally:
        rig.close()


def test_a_slow_provider_that_answers_holds_nothing() -> None:
    rig = EngineRig(policy("legal", on_unknown="review"), concurrency=4)
    try:
        release = threading.Event()
        rig.provider.script(*[Scripted.slow(release) for _ in range(4)])
        for n in range(8):
            rig.submit("legal", f"k{n}")
        rig.engine.hand_out()
        assert rig.engine.settle(busy=lambda: rig.provider.hanging, timeout=10)
        release.set()
        assert rig.engine.settle(timeout=10)
        assert all(rig.job(f"k{n}").state is JobState.CONFIRMED for n in range(8))
        assert rig.engine.open_circuits() == []
    finally:
        rig.close()


@pytest.mark.parametrize("patient_first", [True, False])
def test_give_up_after_applies_to_every_held_job_whatever_the_order(patient_first: bool) -> None:
    """The issue's case: only the head of a scope's queue was looked at, so a job that
    waits without limit at the head kept every job behind it waiting too."""
    rig = EngineRig(policy("patient"), policy("urgent", give_up_after="10s"))
    rig.engine.circuits.settings = CircuitSettings(failures=1, probe_after=3000, probe_max=3000)
    try:
        rig.provider.script(*[Scripted.unavailable() for _ in range(100)])
        rig.submit("urgent", "opener")  # its refusal opens the circuit: the rest are held
        rig.tick()
        order = ["patient", *["urgent"] * 7] if patient_first else [*["urgent"] * 7, "patient"]
        for n, channel in enumerate(order):
            rig.submit(channel, f"{channel}-{n}")
            rig.clock.advance(0.01)  # the queue's order is the order they came in
        for _ in range(3):
            rig.clock.advance(5)
            rig.engine.hand_out()
            assert rig.engine.settle(timeout=10)
        urgent = [f"urgent-{n}" for n, c in enumerate(order) if c == "urgent"]
        assert [rig.job(k).reason for k in urgent] == ["provider-unavailable"] * 7
        patient = f"patient-{order.index('patient')}"
        assert rig.job(patient).state is JobState.REQUESTED
    finally:
        rig.close()


def test_a_send_taken_before_a_hang_was_known_is_not_made_once_it_is() -> None:
    """The CI case of tests/e2e/test_races.py: a worker took its job while the circuit was
    closed, and its claim's save was slow; meanwhile a call timed out with others in
    flight. The send is not made after that (it was, into the hang, as one more Unknown):
    its job is refused as unavailable, nothing sent, due again after the probe time."""
    rig = EngineRig(policy("legal", on_unknown="review"), concurrency=3)
    hangs = [threading.Event(), threading.Event()]
    saving, saved = threading.Event(), threading.Event()
    save = rig.ledger._save_retrying

    def slow_claim(
        jobs: Sequence[SendJob],
        guard: Callable[[], bool] | None = None,
        keep_trying: Callable[[], bool] | None = None,
        connect_while: Callable[[], bool] | None = None,
        unchanged: Unchanged | None = None,
    ) -> None:
        if any(j.key == "late" and j.state is JobState.ATTEMPTED for j in jobs):
            saving.set()
            assert saved.wait(10)
        save(jobs, guard, keep_trying, connect_while, unchanged)

    rig.ledger._save_retrying = slow_claim  # type: ignore[method-assign]
    try:
        rig.provider.script(*[Scripted.timed_out(release) for release in hangs])
        rig.submit("legal", "hung-1")
        rig.submit("legal", "hung-2")
        rig.engine.hand_out()
        assert rig.engine.settle(busy=lambda: rig.provider.hanging, timeout=10)
        assert rig.provider.hanging == 2
        rig.submit("legal", "late")  # taken by the third worker: nothing timed out yet
        rig.engine.hand_out()
        assert saving.wait(10)
        hangs[0].set()  # the first times out while the second is in flight: suspect
        wait_until(lambda: rig.engine.circuits.in_flight("fake") == 1)
        saved.set()  # the late claim is durable now, and its send known to go into a hang
        assert rig.engine.settle(busy=lambda: rig.provider.hanging, timeout=10)
        hangs[1].set()
        assert rig.engine.settle(timeout=10)
        assert rig.provider.sends == 2
        late = rig.job("late")
        assert late.state is JobState.REQUESTED and late.round_attempts == 0
        [rejected] = [e for e in rig.ledger.history("late") if type(e).__name__ == "Rejected"]
        assert rejected.unavailable and rejected.reason == WITHHELD
        # It counts as the third hang: the circuit opened, so the next send waits for a ping
        # (else it would go into the hang once the two in flight had ended).
        [opened] = rig.engine.open_circuits()
        assert opened.failures == 3
    finally:
        saved.set()
        for release in hangs:
            release.set()
        rig.close()


def wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "never happened"
        time.sleep(0.001)
