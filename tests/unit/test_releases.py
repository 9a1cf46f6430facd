"""Claims released with no provider call made, by the daemon's own doing (a stop, its
scope gone to another daemon, its circuit's hold, its store's lost answer): each is a
Rejected that spends no attempt, sends no `rejected` webhook and counts no refusal
(`SendJob.Rejected.released`, docs/architecture.md "Ambiguous commits"). Before, all but the
last set the job's `unavailable_since` (a later outage's `give_up_after` counted from it)
and a `rejected` webhook said `unavailable`: the provider was down, when it was the daemon.
The circuit's hold alone is a wait for the provider (`SendJob.Rejected.waits_for_provider`):
its job's `give_up_after` counts from the first, or a circuit opening at each of its claims
put the review off for ever."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta
from typing import Any

import pytest
from tests.unit.engine_rig import GRACE, TIMEOUT, EngineRig, policy

from daemon.doubles.fake_provider import Scripted
from daemon.webhooks.events import WEBHOOK_TYPES, type_of
from ledger.application import Ledger
from ledger.job import NOT_OURS, STOPPED, WITHHELD, SendJob
from ledger.vocabulary import JobState

GIVE_UP = 600.0
LEGAL = policy("legal", give_up_after=GIVE_UP)
LEASE = TIMEOUT + GRACE
#: The flapping circuit's tests' step: past a probe time, never past the longest.
STEP = 30.0


@pytest.fixture
def rig() -> Iterator[EngineRig]:
    with EngineRig(LEGAL, concurrency=1) as engines:
        yield engines


def after_the_claim_is_saved(
    rig: EngineRig, key: str, then: Callable[[], None], *, every: bool = False
) -> None:
    """`then` runs once (`every`: after each claim), right after the claim of `key` is
    stored, before its call."""
    ledger: Ledger = rig.ledger
    save = ledger._save_retrying
    done: list[bool] = []

    def save_then(jobs: Sequence[SendJob], *args: Any, **kwargs: Any) -> None:
        claims = any(j.key == key and j.state is JobState.ATTEMPTED for j in jobs)
        save(jobs, *args, **kwargs)
        if claims and (every or not done):
            done.append(True)
            then()

    ledger._save_retrying = save_then  # type: ignore[method-assign]


def stopping(rig: EngineRig) -> None:
    rig.engine.stop()


def lease_run_short(rig: EngineRig) -> None:
    rig.clock.advance(LEASE)  # a slow commit: too little of the claim's lease is left


def circuit_opened(rig: EngineRig) -> None:
    for _ in range(rig.settings.daemon.circuit_failures):
        rig.engine.circuits.unavailable("fake", rig.clock())


RELEASES = {STOPPED: stopping, NOT_OURS: lease_run_short, WITHHELD: circuit_opened}


def the_release(rig: EngineRig, key: str) -> SendJob.Rejected:
    """The job's last Rejected."""
    return [e for e in rig.ledger.history(key) if isinstance(e, SendJob.Rejected)][-1]


@pytest.mark.parametrize("reason", list(RELEASES), ids=["stopped", "not-ours", "withheld"])
def test_a_claim_released_unsent_says_nothing_of_the_provider(rig: EngineRig, reason: str) -> None:
    rig.submit("legal", "k1")
    after_the_claim_is_saved(rig, "k1", lambda: RELEASES[reason](rig))
    report = rig.tick()
    assert rig.provider.sends == 0
    released = the_release(rig, "k1")
    assert released.reason == reason and released.released
    job = rig.job("k1")
    # Its circuit's hold is a wait for the provider: the give-up counts from here (the
    # flapping test below); the others waited for none (before: set, counted from here).
    assert job.unavailable_since == (released.timestamp if reason == WITHHELD else None)
    assert type_of(released, WEBHOOK_TYPES) is None  # before: `rejected`, `unavailable`
    assert (job.state, job.round_attempts) == (JobState.REQUESTED, 0)  # no attempt spent
    assert (report.rejected, report.unavailable) == (0, 0), report  # no provider refusal


def test_a_send_stopped_before_its_call_is_recorded_as_not_ours(rig: EngineRig) -> None:
    # A send of several calls stopped before any that could send it (Graph's tidy, its
    # scope gone to another daemon): the same release, in words the store reads so.
    rig.submit("legal", "k1")
    rig.provider.script(Scripted.stopped_before_send())
    report = rig.tick()
    released = the_release(rig, "k1")
    assert released.reason == NOT_OURS and released.released
    assert rig.job("k1").unavailable_since is None
    assert type_of(released, WEBHOOK_TYPES) is None
    assert (report.rejected, report.unavailable) == (0, 0), report


def test_a_release_leaves_an_outage_s_wait_as_it_was(rig: EngineRig) -> None:
    # Neither set nor cleared: a job the provider refused as unavailable still counts
    # its `give_up_after` from that refusal after a release in between.
    rig.submit("legal", "k1")
    rig.provider.script(Scripted.unavailable())
    rig.tick()
    since = rig.job("k1").unavailable_since
    assert since is not None
    rig.clock.advance(5)
    after_the_claim_is_saved(rig, "k1", lambda: stopping(rig))
    rig.tick()
    assert the_release(rig, "k1").reason == STOPPED
    assert rig.job("k1").unavailable_since == since


@pytest.mark.parametrize("probe_answers", [True, False], ids=["flapping", "open"])
def test_a_job_its_circuit_keeps_withholding_goes_to_review_on_time(
    rig: EngineRig, probe_answers: bool
) -> None:
    # Each claim of k1 is met by its scope's circuit opening while it is saved (another
    # call of the scope failing then): withheld, due again after the probe time. Flapping,
    # a probe (another call) answers in between and k1 is taken at once; open, k1 is each
    # probe. Its wait for the provider counts from the first withhold, as a refused job's
    # from its first refusal: `give_up_after` later it is in review, never sent. Before,
    # each release moved the wait's start to its next due time: k1 waited for ever.
    rig.submit("legal", "k1")
    after_the_claim_is_saved(rig, "k1", lambda: circuit_opened(rig), every=True)
    rig.tick()
    first = the_release(rig, "k1").timestamp  # its first claim withheld
    late = timedelta(seconds=GIVE_UP + STEP)  # by the first tick after its give-up
    while rig.job("k1").state is JobState.REQUESTED and rig.clock() - first < 2 * late:
        if probe_answers:
            rig.engine.circuits.answered("fake", rig.clock())
        rig.advance_and_tick(STEP)
    job = rig.job("k1")
    assert (job.state, job.reason) == (JobState.REVIEW, "provider-unavailable"), job.reason
    assert job.escalated_at is not None and job.escalated_at - first <= late
    assert rig.provider.sends == 0
    withheld = [e for e in rig.ledger.history("k1") if isinstance(e, SendJob.Rejected)]
    assert len(withheld) > 3 and all(e.reason == WITHHELD for e in withheld)


@pytest.mark.parametrize("answers", [True, False], ids=["answered", "refused"])
def test_a_job_withheld_before_a_long_stop_waits_from_then_and_decides_at_its_next_call(
    rig: EngineRig, answers: bool
) -> None:
    # One withheld claim, then nothing for longer than its `give_up_after` (the daemon
    # stopped, or upgraded: events stored before read the same way, docs/changes.md).
    # Its wait counts from that withhold, and is decided at its next wait for the
    # provider, not at the start: answered, it is sent as before; refused as unavailable,
    # to review then, once (before, the refusal started its wait: due again, no review).
    rig.submit("legal", "k1")
    after_the_claim_is_saved(rig, "k1", lambda: circuit_opened(rig))
    rig.tick()
    assert the_release(rig, "k1").reason == WITHHELD
    rig.clock.advance(GIVE_UP + STEP)
    if not answers:
        rig.provider.script(Scripted.unavailable())
    rig.tick()
    job = rig.job("k1")
    if answers:
        assert (job.state, job.unavailable_since) == (JobState.CONFIRMED, None)
        assert rig.provider.sends == 1
        return
    assert (job.state, job.reason) == (JobState.REVIEW, "provider-unavailable"), job.reason
    escalated = [e for e in rig.ledger.history("k1") if isinstance(e, SendJob.Escalated)]
    assert len(escalated) == 1
