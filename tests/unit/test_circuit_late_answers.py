"""A late answer to a call that began before a hang does not close the circuit the hang
opened (daemon/engine/circuit.py `Circuits.answered`, docs/architecture.md "Outages:
waited out, not escalated"): a daemon paused while its provider began to hang its sends
read a send's answer, given before the hang, after the timeouts of the sends begun in
it, and sent its next jobs into the known hang unprobed (tests/e2e/test_races.py)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

from tests.unit.engine_rig import EngineRig, policy
from tests.unit.test_circuit_hangs import wait_until

from daemon.doubles.fake_drafts import FakeDraftsProvider
from daemon.doubles.fake_provider import FakeProvider, Scripted
from daemon.doubles.fake_time import FakeClock
from daemon.engine.circuit import CHECK, SEND, Admit, Circuits, CircuitSettings
from daemon.engine.readback import ProviderHealth
from daemon.providers.base import ProviderError
from daemon.providers.draft_handle import Draft
from ledger.application import Ledger
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


# -- every call takes its ticket: the read-back and the draft step too -----------------------


class ReadBackAcrossAHang(FakeProvider):
    """A read-back's call in flight while something else happens (`meanwhile`: another
    call of the scope begins and ends), then answered or timed out (`fails`)."""

    def __init__(self, meanwhile: Callable[[], None], *, fails: bool = False) -> None:
        super().__init__("fake", clock=FakeClock(T0))
        self.meanwhile = meanwhile
        self.fails = fails

    def read_message_id(self, provider_message_id: str) -> str | None:
        self.meanwhile()
        if self.fails:
            raise ProviderError("get: timed out", timed_out=True)
        return "<k@mail.example.com>"


def read_back(circuits: Circuits, provider: FakeProvider) -> None:
    ledger = Ledger("memory://", clock=FakeClock(T0))
    try:
        health = ProviderHealth(ledger, lambda: at(10), circuits)
        job = SimpleNamespace(key="k", message_id="<k@mail.example.com>")
        health.read_back(job, "fake", provider, "provider-id", raw=b"")  # type: ignore[arg-type]
    finally:
        ledger.close()


def test_a_read_back_answered_before_a_hang_and_read_after_it_leaves_its_probe_a_ping() -> None:
    """The read-back took no ticket: its answer, given before the sends began to hang and
    read after they timed out, counted as a read begun after them and said reads work,
    so the hang's next probe was a send into it (one more Unknown), not a ping."""
    circuits = Circuits(CircuitSettings(failures=1, probe_after=1.0, probe_max=8.0))

    def sends_hang() -> None:
        with circuits.calling("fake") as hung:
            circuits.called("fake", at(10), unavailable=True, timed_out=True, ticket=hung)

    read_back(circuits, ReadBackAcrossAHang(sends_hang))
    assert circuits.open() != []
    assert circuits.admit("fake", at(11)) is Admit.PING


def test_an_answer_begun_after_a_read_back_that_timed_out_clears_the_circuit() -> None:
    """The rule kept for the read-back: a call begun after the failed one, in flight beside
    it, answers: the provider answers. Its failure, with no ticket, counted as begun when
    it ended, after that call, and the answer cleared nothing."""
    circuits = Circuits(CircuitSettings(failures=1, probe_after=1.0, probe_max=8.0))
    beside: list[int] = []

    def a_search_begins() -> None:
        search = circuits.calling("fake")
        beside.append(search.__enter__())
        search.__exit__(None, None, None)

    read_back(circuits, ReadBackAcrossAHang(a_search_begins, fails=True))
    assert circuits.open() != []
    circuits.answered("fake", at(10.1), CHECK, ticket=beside[0])
    assert circuits.open() == [] and circuits.admit("fake", at(10.1)) is Admit.GO


class HangingCreates(FakeDraftsProvider):
    """drafts.create times out `hangs` times, then answers."""

    def __init__(self, clock: FakeClock, hangs: int) -> None:
        super().__init__("fake", clock=clock)
        self.hangs = hangs

    def create_draft(self, raw: bytes) -> Draft:
        if self.hangs:
            self.hangs -= 1
            raise ProviderError("drafts.create: timed out", timed_out=True)
        return super().create_draft(raw)


def test_a_draft_step_that_timed_out_is_a_hang_whose_probe_is_a_ping() -> None:
    """The draft step's failure was fed to the circuit without its timeout (and with no
    ticket): a hang at the draft step was probed by the next job's draft step, a call
    into the hang, not by a ping."""
    rig = EngineRig(policy("receipts"))
    try:
        rig.engine.close()
        rig.provider = HangingCreates(rig.clock, hangs=3)
        rig.engine = rig.new_engine()
        for n in range(3):
            rig.submit("receipts", f"d-{n}")
        rig.tick()  # three draft steps time out: the circuit opens
        assert rig.engine.open_circuits() != []
        assert all(rig.job(f"d-{n}").state is JobState.REQUESTED for n in range(3))
        rig.clock.advance(60)
        rig.tick()  # the probe: a ping, then the jobs
        assert rig.provider.pings == 1
        for _ in range(3):
            rig.clock.advance(60)
            rig.tick()
        assert all(rig.job(f"d-{n}").state is JobState.CONFIRMED for n in range(3))
        assert rig.engine.open_circuits() == []
    finally:
        rig.close()


def test_a_draft_step_that_answers_neither_closes_nor_resets_a_circuit_its_sends_opened() -> None:
    """The draft step's answer was fed as a read's, and a read's answer closes a circuit
    that no hang opened: a provider whose drafts answer while its sends are refused as
    unavailable (a sending limit) had every send's failure count cleared by the next
    job's draft step, so the circuit never opened and every due job's send was refused;
    an open one was closed by its probe's draft step, letting every held job go."""
    rig = EngineRig(policy("receipts", max_attempts=99))
    try:
        rig.engine.close()
        rig.provider = FakeDraftsProvider("fake", clock=rig.clock)
        rig.engine = rig.new_engine()
        rig.provider.script(*[Scripted.unavailable() for _ in range(8)])
        for n in range(8):
            rig.submit("receipts", f"s-{n}")
        rig.tick()
        assert rig.engine.open_circuits() != []
        assert rig.provider.draft_sends <= 4  # the failures that open it, and the calls beside
        sent = rig.provider.draft_sends
        rig.clock.advance(1)
        rig.tick()  # the probe: its draft step answers, its send is refused
        assert rig.provider.draft_sends == sent + 1
        assert rig.engine.open_circuits() != []
    finally:
        rig.close()
