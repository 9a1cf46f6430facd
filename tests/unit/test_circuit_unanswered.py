"""Sends the provider closed with no response, in a row: the scope's sends pause
(`Circuits.sent`, the channel's `pause_after_unanswered`), its searches go on
(docs/operations.md "Outages and quotas")."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from tests.unit.engine_rig import EngineRig, policy

from daemon.doubles.fake_provider import Scripted
from daemon.engine.circuit import CHECK, Admit, Circuits, CircuitSettings
from daemon.providers.base import SendKind, SendOutcome
from ledger.vocabulary import JobState
from policies.loader import PolicyLoadError, load_policy_dir

T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
UNANSWERED = SendOutcome(SendKind.UNKNOWN, "connection closed without a response", unanswered=True)
ANSWERED = SendOutcome(SendKind.CONFIRMED, "200", provider_message_id="m")


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def unanswered_sends(circuits: Circuits, count: int, now: datetime, pause_after: int) -> None:
    for _ in range(count):
        with circuits.sending("s", now) as ticket:
            assert ticket is not None
            circuits.sent("s", now, UNANSWERED, ticket=ticket, pause_after=pause_after)


def test_every_send_unanswered_pauses_the_scopes_sends_and_its_searches_go_on() -> None:
    """A front end closing every send: before, all 30 due jobs were sent into it (30
    Unknowns, 30 searches, up to 30 reviews). Now the default's tenth pauses the sends;
    the searches of the ten are made while paused and confirm them (the front end had
    taken them), their answers end nothing, and the probe at its time, answered, lets
    the other twenty go, each sent once."""
    rig = EngineRig(policy("receipts"), concurrency=1)
    rig.engine.circuits.settings = CircuitSettings(probe_after=600, probe_max=600)
    try:
        # Ten closed unanswered, then answers: before, the twenty after them went too.
        rig.provider.script(*[Scripted.unanswered() for _ in range(10)])
        keys = [f"k{n}" for n in range(30)]
        for key in keys:
            rig.submit("receipts", key)
        rig.tick()
        assert rig.provider.sends == 10, rig.provider.sends
        [paused] = rig.engine.open_circuits()
        assert (paused.failures, paused.unanswered, paused.sends_only) == (0, 10, True)
        sent = [k for k in keys if rig.job(k).state is JobState.UNKNOWN]
        assert len(sent) == 10
        assert all(rig.job(k).state is JobState.REQUESTED for k in keys if k not in sent)
        rig.advance_and_tick(60)  # search_after: the ten are searched, not held
        for _ in range(20):
            if all(rig.job(k).state is JobState.CONFIRMED for k in sent):
                break
            rig.advance_and_tick(1)
        assert rig.provider.searches == 10
        assert all(rig.job(k).state is JobState.CONFIRMED for k in sent)
        assert rig.provider.sends == 10 and len(rig.engine.open_circuits()) == 1
        rig.clock.advance(600)
        rig.tick()  # the probe's time: one send, answered, all go
        assert rig.engine.open_circuits() == []
        for key in keys:
            job = rig.job(key)
            assert job.state is JobState.CONFIRMED, (key, rig.events(key))
            assert rig.provider.copies_of(job.message_id) == 1
        assert rig.provider.sends == 30
    finally:
        rig.close()


def test_dropped_responses_now_and_then_among_answers_never_pause() -> None:
    """Nine in a row, then an answer, four times over: no run reaches the default ten,
    so nothing pauses and every job is sent at once."""
    rig = EngineRig(policy("receipts"), concurrency=1)
    try:
        fates = [Scripted.unanswered() for _ in range(9)] + [Scripted.confirmed()]
        rig.provider.script(*(fates * 4))
        for n in range(40):
            rig.submit("receipts", f"k{n}")
        rig.tick()
        assert rig.provider.sends == 40 and rig.engine.open_circuits() == []
        assert sum(rig.job(f"k{n}").state is JobState.UNKNOWN for n in range(40)) == 36
    finally:
        rig.close()


def test_a_held_job_goes_to_review_at_give_up_after_never_claimed() -> None:
    rig = EngineRig(policy("receipts", give_up_after="2m", pause_after_unanswered=2))
    rig.engine.circuits.settings = CircuitSettings(probe_after=3000, probe_max=3000)
    try:
        rig.provider.script(*[Scripted.unanswered() for _ in range(2)])
        rig.submit("receipts", "a")
        rig.tick()
        rig.submit("receipts", "b")
        rig.tick()
        rig.submit("receipts", "held")
        for _ in range(13):
            rig.advance_and_tick(10)
        held = rig.job("held")
        assert (held.state, held.reason) == (JobState.REVIEW, "provider-unavailable")
        assert "Attempted" not in rig.events("held")
        assert rig.provider.sends == 2
    finally:
        rig.close()


def test_the_pause_holds_sends_only_and_ends_at_a_probe_answered() -> None:
    circuits = Circuits(CircuitSettings(failures=3, probe_after=1.0, probe_max=4.0))
    unanswered_sends(circuits, 2, at(0), pause_after=3)
    assert circuits.admit("s", at(0)) is Admit.GO
    unanswered_sends(circuits, 1, at(0), pause_after=3)
    assert circuits.admit("s", at(0.5)) is Admit.HOLD
    assert circuits.admit("s", at(0.5), CHECK) is Admit.GO  # searches are never held
    assert not circuits.holds("s", at(0.5), CHECK)
    with circuits.call("s", lambda: at(0.6)):  # a search answered: no send answered
        pass
    assert circuits.next_probe("s") == at(1)
    assert circuits.admit("s", at(1)) is Admit.PROBE
    assert circuits.admit("s", at(1)) is Admit.HOLD  # one probe at a time
    with circuits.sending("s", at(1), probe=True) as ticket:
        assert ticket is not None
        circuits.sent("s", at(1), UNANSWERED, ticket=ticket, pause_after=3)
    assert circuits.next_probe("s") == at(3)  # twice the wait
    assert circuits.admit("s", at(3)) is Admit.PROBE
    with circuits.sending("s", at(3), probe=True) as ticket:
        assert ticket is not None
        circuits.sent("s", at(3), ANSWERED, ticket=ticket, pause_after=3)
    assert circuits.open() == [] and circuits.admit("s", at(3)) is Admit.GO


def test_a_send_admitted_before_the_pause_is_withheld_and_a_late_answer_ends_nothing() -> None:
    circuits = Circuits(CircuitSettings(probe_after=1.0))
    with circuits.sending("s", at(0)) as early:  # begun before the run
        assert early is not None
        assert circuits.admit("s", at(0)) is Admit.GO  # a second job, its claim being saved
        unanswered_sends(circuits, 2, at(0), pause_after=2)
        with circuits.sending("s", at(0)) as late:
            assert late is None  # the pause came while its claim was saved: not sent
        circuits.sent("s", at(0), ANSWERED, ticket=early, pause_after=2)
    [paused] = circuits.open()  # the answer read late began before the run
    assert paused.sends_only and paused.unanswered == 2


@pytest.mark.parametrize(
    "outcome",
    [
        SendOutcome(SendKind.REJECTED, "refused", transient=True, unavailable=True),
        SendOutcome(SendKind.UNKNOWN, "timed out", timed_out=True),
    ],
)
def test_a_probe_refused_or_hung_leaves_a_next_probe(outcome: SendOutcome) -> None:
    """The pause's probe met a refused connection or a hang (the circuit counts those):
    before, its probe stayed out for ever and every send of the scope was held."""
    circuits = Circuits(CircuitSettings(failures=100, probe_after=1.0, probe_max=8.0))
    unanswered_sends(circuits, 2, at(0), pause_after=2)
    assert circuits.admit("s", at(1)) is Admit.PROBE
    with circuits.sending("s", at(1), probe=True) as ticket:
        assert ticket is not None
        circuits.sent("s", at(1), outcome, ticket=ticket, pause_after=2)
    assert circuits.next_probe("s") == at(3)
    assert circuits.admit("s", at(3)) is Admit.PROBE


def test_a_probe_withheld_hands_the_probe_to_the_next_send() -> None:
    circuits = Circuits(CircuitSettings(failures=1, probe_after=1.0))
    unanswered_sends(circuits, 2, at(0), pause_after=2)
    assert circuits.admit("s", at(1)) is Admit.PROBE
    circuits.unavailable("s", at(1), kind=CHECK)  # a search refused: the circuit opens
    with circuits.sending("s", at(1), probe=True) as ticket:
        assert ticket is None  # the circuit's probe it is not: withheld
    circuits.answered("s", at(2), CHECK)  # the circuit closes; the pause is still there
    assert circuits.admit("s", at(2)) is Admit.PROBE


def test_a_refusal_or_a_hang_neither_ends_nor_adds_to_a_run() -> None:
    circuits = Circuits(CircuitSettings(failures=100))
    refused = SendOutcome(SendKind.REJECTED, "refused", transient=True, unavailable=True)
    hung = SendOutcome(SendKind.UNKNOWN, "timed out", timed_out=True)
    unanswered_sends(circuits, 1, at(0), pause_after=2)
    for outcome in (refused, hung):
        with circuits.sending("s", at(0)) as ticket:
            assert ticket is not None
            circuits.sent("s", at(0), outcome, ticket=ticket, pause_after=2)
    unanswered_sends(circuits, 1, at(0), pause_after=2)
    assert [c.unanswered for c in circuits.open()] == [2]


@pytest.mark.parametrize(
    ("line", "said"),
    [
        (
            "pause_after_unanswered = 0",
            "pause_after_unanswered: Input should be greater than or equal to 1, got 0",
        ),
        (
            "pause_after_unanswered = 1001",
            "pause_after_unanswered: Input should be less than or equal to 1000, got 1001",
        ),
        (
            'pause_after_unanswered = "10"',
            "pause_after_unanswered: Input should be a valid integer, got '10'",
        ),
    ],
)
def test_a_bad_pause_after_unanswered_is_one_line_naming_it(
    tmp_path: Path, line: str, said: str
) -> None:
    path = tmp_path / "receipts.toml"
    path.write_text(
        'provider = "fake"\nfrom = "Support <support@example.com>"\n'
        f'message_id_domain = "mail.example.com"\n{line}\n',
        encoding="utf-8",
    )
    with pytest.raises(PolicyLoadError) as refused:
        load_policy_dir(tmp_path)
    assert [str(p) for p in refused.value.problems] == [f"{path}:{said}"]


def test_the_default_keeps_every_existing_fingerprint() -> None:
    default = policy("receipts")
    assert "pause_after_unanswered" not in default.normalized()
    assert policy("receipts", pause_after_unanswered=10).fingerprint == default.fingerprint
    assert policy("receipts", pause_after_unanswered=3).fingerprint != default.fingerprint


@pytest.mark.parametrize(
    "outcome",
    [
        UNANSWERED,
        SendOutcome(SendKind.UNKNOWN, "timed out", timed_out=True),
        SendOutcome(SendKind.REJECTED, "refused", transient=True, unavailable=True),
    ],
)
def test_a_send_begun_before_the_pause_ending_while_the_probe_is_out_is_not_the_probe(
    outcome: SendOutcome,
) -> None:
    """Four workers: a send begun before the pause ends (closed unanswered, hung or
    refused) while the pause's probe is still out. Before, it was taken for the probe's
    end: a second probe went out beside the first, into the same front end."""
    circuits = Circuits(CircuitSettings(failures=100, probe_after=1.0, probe_max=8.0))
    with circuits.sending("s", at(0)) as early:  # begun before the run
        assert early is not None
        unanswered_sends(circuits, 2, at(0), pause_after=2)
        assert circuits.admit("s", at(1)) is Admit.PROBE
        with circuits.sending("s", at(1), probe=True) as probe:
            assert probe is not None
            circuits.sent("s", at(1.5), outcome, ticket=early, pause_after=2)
            for seconds in (1.5, 3.5, 9.5):
                assert circuits.admit("s", at(seconds)) is Admit.HOLD  # the probe is out
            circuits.sent("s", at(10), UNANSWERED, ticket=probe, pause_after=2)
    assert circuits.next_probe("s") == at(12)  # the probe's own end: twice the wait
    assert circuits.admit("s", at(12)) is Admit.PROBE


def test_the_probe_answered_after_a_later_send_went_unanswered_leaves_a_next_probe() -> None:
    """The pause's probe is out when searches refused open the circuit, whose probe, a
    send begun after the pause's, is closed unanswered (an answer for the circuit, which
    closes); then the pause's probe is answered. Its answer ends no run (a later send got
    none), but the probe is over: the next send probes, never none."""
    circuits = Circuits(CircuitSettings(failures=1, probe_after=1.0, probe_max=8.0))
    unanswered_sends(circuits, 2, at(0), pause_after=2)
    assert circuits.admit("s", at(1)) is Admit.PROBE
    with circuits.sending("s", at(1), probe=True) as probe:
        assert probe is not None
        circuits.unavailable("s", at(1), kind=CHECK)  # a search refused: the circuit opens
        assert circuits.admit("s", at(2)) is Admit.PROBE  # the circuit's probe, a send
        with circuits.sending("s", at(2), probe=True) as later:
            assert later is not None
            circuits.sent("s", at(2), UNANSWERED, ticket=later, pause_after=2)
        circuits.sent("s", at(3), ANSWERED, ticket=probe, pause_after=2)
    assert circuits.admit("s", at(9)) is Admit.PROBE


def test_the_pauses_probe_is_not_sent_into_a_hang_found_while_its_claim_was_saved() -> None:
    """The probe handed out, then, while its claim was saved, a call of the scope timed
    out with another in flight (the scope may hang: no new send, `sending`). Before, the
    pause's probe went out anyway, one more Unknown into the hang, where every other send
    is withheld; now it is withheld too, and the next probe waits for the calls in flight."""
    circuits = Circuits(CircuitSettings(failures=100, probe_after=1.0))
    hung = SendOutcome(SendKind.UNKNOWN, "timed out", timed_out=True)
    with circuits.sending("s", at(0)) as early, circuits.call("s", lambda: at(0)):
        assert early is not None
        unanswered_sends(circuits, 2, at(0), pause_after=2)
        assert circuits.admit("s", at(1)) is Admit.PROBE
        circuits.sent("s", at(1), hung, ticket=early, pause_after=2)  # a search in flight
        with circuits.sending("s", at(1), probe=True) as probe:
            assert probe is None
        assert circuits.admit("s", at(2)) is Admit.HOLD  # the search is still in flight
    assert circuits.admit("s", at(2)) is Admit.PROBE
