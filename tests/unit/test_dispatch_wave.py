"""Dispatch with group commit (daemon/engine/wave.py): claims and outcomes of several jobs
in one transaction, and per job exactly what a save of its own would have done.

Another writer is made to act at the worst moment - after the wave loaded its jobs and
before its claims (or outcomes) are saved - by wrapping `Ledger.save_jobs`; copies are
counted in the fake provider's mailbox.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.unit.engine_rig import EngineRig, claimed_by, policy

from ledger.application import ConcurrentUpdate, Ledger
from ledger.job import SendJob
from ledger.vocabulary import JobState

RETRY = policy("receipts", on_unknown="retry")


@pytest.fixture
def rig() -> Iterator[EngineRig]:
    rig = EngineRig(RETRY)
    yield rig
    rig.close()


def other_daemon_claims(ledger: Ledger, key: str) -> None:
    """What another daemon's dispatch writes: its claim, with no call of ours."""
    ledger.save_job(claimed_by(ledger, key, "other"))


class SaveHook:
    """Wraps `ledger.save_jobs`: counts the calls and, before call number `at`, lets
    `act` write as another writer would."""

    def __init__(self, ledger: Ledger, at: int, act: Callable[[list[SendJob]], None]) -> None:
        self.calls: list[int] = []
        self._save = ledger.save_jobs
        self._at = at
        self._act = act
        ledger.save_jobs = self  # type: ignore[method-assign]

    def __call__(self, jobs: list[SendJob]) -> None:
        self.calls.append(len(jobs))
        if len(self.calls) == self._at:
            self._act(jobs)
        self._save(jobs)


def test_claims_and_outcomes_share_transactions(rig: EngineRig) -> None:
    for n in range(5):
        rig.submit("receipts", f"k{n}")
    hook = SaveHook(rig.ledger, 0, lambda jobs: None)
    report = rig.tick()
    # concurrency 2: the first save claims one job per worker; after that each save holds
    # the outcomes of the calls that returned and the claims that refill their workers.
    # 5 claims and 5 outcomes in all, never more than 2 claims + 2 outcomes at once.
    assert hook.calls[0] == 2 and sum(hook.calls) == 10
    assert max(hook.calls) <= 4 and len(hook.calls) < 10
    assert report.sent == report.confirmed == 5 == rig.provider.sends
    assert all(rig.job(f"k{n}").state is JobState.CONFIRMED for n in range(5))


def test_a_claim_wave_that_meets_another_writer_sends_none_of_its_jobs(rig: EngineRig) -> None:
    rig.submit("receipts", "k0")
    rig.submit("receipts", "k1")
    hook = SaveHook(rig.ledger, 1, lambda jobs: other_daemon_claims(rig.ledger, "k1"))
    report = rig.tick()
    assert hook.calls[0] == 2  # the wave's claim save failed whole, then each alone
    assert rig.provider.sends == 1 and rig.copies("k0") == 1 and rig.copies("k1") == 0
    assert report.sent == 1 and report.skipped == 1
    taken = rig.job("k1")
    assert (taken.state, taken.claimed_by, taken.attempts) == (JobState.ATTEMPTED, "other", 1)
    assert rig.job("k0").state is JobState.CONFIRMED


def test_an_outcome_wave_that_meets_another_writer_keeps_the_others_outcomes(
    rig: EngineRig,
) -> None:
    rig.submit("receipts", "k0")
    rig.submit("receipts", "k1")

    def recovered_elsewhere(jobs: list[SendJob]) -> None:
        # Another daemon's recovery (its deadline passed, say) records Unknown first.
        job = rig.ledger.get_job("k1")
        job.record_unknown(
            reason="recovered elsewhere",
            decision=retry_search(rig),
            at=rig.clock(),
        )
        rig.ledger.save_job(job)

    SaveHook(rig.ledger, 2, recovered_elsewhere)
    report = rig.tick()
    assert rig.provider.sends == 2 and report.sent == 2
    assert rig.job("k0").state is JobState.CONFIRMED
    # k1's response lost to the other writer: its Unknown stands, a search will count
    # the one copy our call made.
    assert rig.job("k1").state is JobState.UNKNOWN and report.skipped == 1
    assert rig.copies("k1") == 1


def retry_search(rig: EngineRig) -> Any:
    from policies import decisions

    return decisions.after_unknown(RETRY, now=rig.clock(), handle_reliable=True)


def test_a_store_failure_on_the_claim_save_sends_nothing(rig: EngineRig) -> None:
    rig.submit("receipts", "k0")
    rig.submit("receipts", "k1")

    def fail(jobs: list[SendJob]) -> None:
        raise OSError("disk full")

    SaveHook(rig.ledger, 1, fail)
    report = rig.tick(errors=2)
    assert rig.provider.sends == 0 and report.sent == 0
    assert all(rig.job(k).state is JobState.REQUESTED for k in ("k0", "k1"))
    # The next tick sends them (the failure wrote nothing).
    assert rig.tick().confirmed == 2 and rig.provider.sends == 2


@settings(max_examples=40, deadline=None)
@given(
    jobs=st.integers(1, 9),
    concurrency=st.integers(1, 4),
    taken=st.sets(st.integers(0, 8)),
    wave=st.integers(1, 3),
)
def test_jobs_another_writer_claims_before_a_wave_saves_are_never_sent_by_it(
    jobs: int, concurrency: int, taken: set[int], wave: int
) -> None:
    """Whichever jobs another writer claims just before the claim save of wave `wave`
    (those of the wave and others): none of them is sent by this engine, every other
    job is sent exactly once, and each job has as many Attempted events as calls were
    made for it plus the other writer's claims."""
    rig = EngineRig(RETRY)
    rig.engine.close()
    rig.engine = rig.new_engine()
    rig.engine._waves._size = concurrency  # the wave size under test
    try:
        keys = [f"k{n}" for n in range(jobs)]
        for key in keys:
            rig.submit("receipts", key)
        wanted = sorted(keys[n] for n in taken if n < jobs)
        stolen: set[str] = set()
        claims_save = wave  # save n: wave n's claims (and wave n-1's outcomes)

        def steal(wave_jobs: list[SendJob]) -> None:
            for key in wanted:
                if rig.ledger.get_job(key).state is JobState.REQUESTED:  # not ours already
                    other_daemon_claims(rig.ledger, key)
                    stolen.add(key)

        SaveHook(rig.ledger, claims_save, steal)
        rig.tick()
        for key in keys:
            attempted = rig.events(key).count("Attempted")
            ours = rig.provider.sends_by_message_id[rig.job(key).message_id]
            if key in stolen:
                assert ours == 0 and attempted == 1 and rig.job(key).claimed_by == "other"
            else:
                assert ours == 1 == attempted and rig.job(key).state is JobState.CONFIRMED
    finally:
        rig.close()


def test_save_jobs_is_all_or_nothing_and_keeps_pending_events(rig: EngineRig) -> None:
    rig.submit("receipts", "k0")
    rig.submit("receipts", "k1")
    mine = [claimed_by(rig.ledger, "k0", "me"), claimed_by(rig.ledger, "k1", "me")]
    other_daemon_claims(rig.ledger, "k1")
    with pytest.raises(ConcurrentUpdate):
        rig.ledger.save_jobs(mine)
    assert rig.job("k0").state is JobState.REQUESTED  # nothing of the batch was written
    assert [len(job.pending_events) for job in mine] == [1, 1]
    rig.ledger.save_job(mine[0])  # alone, the one nobody else touched is written
    assert rig.job("k0").claimed_by == "me" and mine[0].pending_events == []
