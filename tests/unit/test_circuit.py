"""The circuit per provider scope (daemon/engine/circuit.py) and what the engine does with
it: an outage is waited out, not escalated (docs/operations.md, "Outages and quotas")."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.unit.engine_rig import EngineRig, policy

from daemon.doubles.fake_provider import Scripted
from daemon.engine.circuit import Admit, Circuits, CircuitSettings
from daemon.providers.base import SendKind, SendOutcome
from ledger.job import SendJob
from ledger.vocabulary import JobState

T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_opens_after_the_failures_in_a_row_and_lets_one_probe_through() -> None:
    circuits = Circuits(CircuitSettings(failures=3, probe_after=1.0, probe_max=4.0))
    for n in range(2):
        circuits.unavailable("gmail", at(n))
        assert circuits.admit("gmail", at(n)) is Admit.GO
    circuits.unavailable("gmail", at(2))
    [opened] = circuits.open()
    assert (opened.scope, opened.since, opened.failures) == ("gmail", at(2), 3)
    assert circuits.admit("gmail", at(2.5)) is Admit.HOLD
    assert circuits.admit("other", at(2.5)) is Admit.GO  # scopes are independent
    assert circuits.admit("gmail", at(3)) is Admit.PROBE
    assert circuits.admit("gmail", at(3)) is Admit.HOLD  # one probe at a time
    circuits.unavailable("gmail", at(3))  # the probe failed: twice the wait
    assert circuits.next_probe("gmail") == at(5)
    assert circuits.admit("gmail", at(5)) is Admit.PROBE
    circuits.unavailable("gmail", at(5))
    assert circuits.next_probe("gmail") == at(9)  # 4 s: capped at probe_max
    assert circuits.admit("gmail", at(9)) is Admit.PROBE
    circuits.unavailable("gmail", at(9))
    assert circuits.next_probe("gmail") == at(13)
    assert circuits.admit("gmail", at(13)) is Admit.PROBE
    circuits.answered("gmail")  # the provider answered: closed
    assert circuits.open() == [] and circuits.admit("gmail", at(13)) is Admit.GO


def test_an_answer_in_between_resets_the_count() -> None:
    circuits = Circuits(CircuitSettings(failures=2))
    circuits.unavailable("s", at(0))
    circuits.answered("s")
    circuits.unavailable("s", at(1))
    assert circuits.open() == []


def test_retry_after_is_a_floor_for_the_probe_and_a_returned_probe_frees_the_slot() -> None:
    circuits = Circuits(CircuitSettings(failures=1, probe_after=1.0))
    circuits.unavailable("s", at(0), retry_after=30.0)
    assert circuits.next_probe("s") == at(30)
    assert circuits.admit("s", at(30)) is Admit.PROBE
    circuits.probe_returned("s")  # no call was made (its claim lost a race)
    assert circuits.admit("s", at(30)) is Admit.PROBE


def test_a_failure_of_a_call_started_before_the_circuit_opened_changes_nothing() -> None:
    circuits = Circuits(CircuitSettings(failures=1, probe_after=1.0))
    circuits.unavailable("s", at(0))
    circuits.unavailable("s", at(0.5))  # in flight before it opened; not the probe
    assert circuits.next_probe("s") == at(1)


@pytest.mark.parametrize(
    "fields", [{"failures": 0}, {"probe_after": 0.0}, {"probe_after": 5.0, "probe_max": 1.0}]
)
def test_bad_settings_are_refused(fields: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        CircuitSettings(**fields)  # type: ignore[arg-type]


@settings(max_examples=200, deadline=None)
@given(steps=st.lists(st.sampled_from(["fail", "ok", "admit", "returned"]), max_size=40))
def test_never_more_than_one_probe_out(steps: list[str]) -> None:
    circuits = Circuits(CircuitSettings(failures=2, probe_after=1.0, probe_max=8.0))
    probes = 0
    for n, step in enumerate(steps):
        now = at(n * 3)
        if step == "fail":
            circuits.unavailable("s", now)
            probes = 0
        elif step == "ok":
            circuits.answered("s")
            probes = 0
        elif step == "returned":
            circuits.probe_returned("s")
            probes = 0
        elif circuits.admit("s", now) is Admit.PROBE:
            probes += 1
        assert probes <= 1
        for circuit in circuits.open():
            assert circuit.next_probe >= circuit.since


# -- the engine ---------------------------------------------------------------------------


def sent_after(rig: EngineRig, fates: list[Scripted]) -> tuple[SendJob, int]:
    """Job "k" submitted, its sends meeting `fates` and then confirmed: the job once it
    left `requested` (ticks 30 s apart, at most 40), and after how many of those ticks
    its scope's circuit was open."""
    rig.submit("receipts", "k")
    rig.provider.script(*fates)
    held = 0
    for _ in range(40):
        rig.advance_and_tick(30)
        held += bool(rig.engine.open_circuits())
        if rig.job("k").state is not JobState.REQUESTED:
            break
    return rig.job("k"), held


def test_outages_never_use_up_max_attempts_and_the_job_is_sent_once() -> None:
    rig = EngineRig(policy("receipts", max_attempts=2))
    try:
        job, _ = sent_after(rig, [Scripted.unavailable() for _ in range(7)])
        assert job.state is JobState.CONFIRMED, (job.state, job.reason)
        assert job.attempts == 8 and rig.provider.sends == 8
        assert rig.provider.copies_of(job.message_id) == 1
        assert rig.engine.open_circuits() == []
    finally:
        rig.close()


def test_a_send_stopped_before_its_call_by_a_scope_move_is_no_attempt() -> None:
    """Graph's send tidies an earlier attempt's draft before it creates the next one, and
    asks before each of those calls whether the scope is still the daemon's: gone, it
    stops there, nothing made or sent (`stopped_before_send`). That is no attempt, as the
    dispatch's own "not ours" is none: with `max_attempts = 1` three such stops leave the
    job due, not in review, and its one attempt then confirms it; nor is any of them a
    failure for the scope's circuit."""
    rig = EngineRig(policy("receipts", max_attempts=1))
    try:
        job, held = sent_after(rig, [Scripted.stopped_before_send() for _ in range(3)])
        events = rig.events("k")
        assert job.state is JobState.CONFIRMED, events
        assert events.count("Rejected") == 3 and "Escalated" not in events, events
        assert job.attempts == 4 and rig.provider.copies_of(job.message_id) == 1
        assert held == 0
    finally:
        rig.close()


def test_an_open_circuit_holds_the_scopes_other_jobs_without_calls() -> None:
    rig = EngineRig(policy("receipts"))
    try:
        rig.provider.script(*[Scripted.unavailable() for _ in range(3)])
        for n in range(3):
            rig.submit("receipts", f"first-{n}")
            rig.tick()
        assert [c.failures for c in rig.engine.open_circuits()] == [3]
        for n in range(10):
            rig.submit("receipts", f"later-{n}")
        sends = rig.provider.sends
        report = rig.tick()  # nothing due for the probe yet (the clock stood still)
        assert rig.provider.sends == sends and report.sent == 0
        assert all(rig.job(f"later-{n}").state is JobState.REQUESTED for n in range(10))
        rig.advance_and_tick(1)  # the probe: answered, the circuit closes, all go
        assert rig.provider.sends == sends + 13 and rig.engine.open_circuits() == []
        for key in [*(f"first-{n}" for n in range(3)), *(f"later-{n}" for n in range(10))]:
            assert rig.job(key).state is JobState.CONFIRMED, key
    finally:
        rig.close()


def test_give_up_after_sends_a_waiting_job_to_review() -> None:
    rig = EngineRig(policy("receipts", give_up_after="2m"))
    # One refusal opens the circuit, and no probe comes within the test.
    rig.engine.circuits.settings = CircuitSettings(failures=1, probe_after=3000, probe_max=3000)
    try:
        rig.provider.script(*[Scripted.unavailable() for _ in range(100)])
        rig.submit("receipts", "refused")
        rig.tick()
        rig.submit("receipts", "never-tried")
        for _ in range(20):
            rig.advance_and_tick(10)
        assert rig.job("refused").state is JobState.REVIEW
        assert rig.job("refused").reason == "provider-unavailable"
        assert rig.job("never-tried").state is JobState.REVIEW
        assert "Attempted" not in rig.events("never-tried")  # held, never claimed
        assert rig.provider.sends == 1 and rig.provider.copies == []
    finally:
        rig.close()


def test_without_give_up_after_a_job_waits_as_long_as_it_takes() -> None:
    rig = EngineRig(policy("receipts"))
    try:
        rig.provider.script(*[Scripted.unavailable() for _ in range(30)])
        rig.submit("receipts", "patient")
        for _ in range(30):
            rig.advance_and_tick(3600)
        assert rig.job("patient").state in (JobState.REQUESTED, JobState.CONFIRMED)
        assert "Escalated" not in rig.events("patient")
    finally:
        rig.close()


def test_sends_answered_503_stay_unknown_and_hold_the_scopes_other_jobs() -> None:
    """A 503 may follow a send that went out: Unknown for its job, as before; for the
    circuit the provider is down, so the other jobs wait instead of each becoming Unknown."""
    rig = EngineRig(policy("receipts", on_unknown="retry"))
    down = Scripted(SendOutcome(SendKind.UNKNOWN, "HTTP 503", status=503), stored=False)
    try:
        rig.provider.script(down, down, down)
        for n in range(3):
            rig.submit("receipts", f"first-{n}")
            rig.tick()
            assert rig.job(f"first-{n}").state is JobState.UNKNOWN
        assert [c.failures for c in rig.engine.open_circuits()] == [3]
        rig.submit("receipts", "held")
        rig.tick()
        assert rig.job("held").state is JobState.REQUESTED and rig.provider.sends == 3
    finally:
        rig.close()
