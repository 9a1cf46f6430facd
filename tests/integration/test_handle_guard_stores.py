"""The handle read inside a save's transaction (`ProviderHealth.unmarked_at_commit`, the
guard of `Ledger.save_job`) on the real stores: another daemon's mark, written after this
daemon read the job and decided on an unmarked handle, withdraws the save on SQLite and
PostgreSQL as it does in memory (docs/how-it-works.md "The read-back of the Message-ID";
tests/unit/test_races_readback.py drives the two engines)."""

from __future__ import annotations

import threading

import pytest
from tests.integration.test_ledger_store import POLICY, SENDER, content

from daemon.doubles.fake_time import FakeClock
from daemon.engine.readback import ProviderHealth
from ledger.application import Ledger
from ledger.decision_types import Review
from ledger.job import JobState
from ledger.stores.index import Withdrawn
from ledger.vocabulary import EscalationReason


def test_a_mark_written_after_the_decision_withdraws_its_save(
    store_url: str, clock: FakeClock
) -> None:
    with Ledger(store_url, clock=clock) as daemon, Ledger(store_url, clock=clock) as other:
        daemon.submit(content("k1"), SENDER)
        daemon.submit(content("k2"), SENDER)
        health = ProviderHealth(daemon, clock)
        assert health.still_reliable("fake")  # the decision's read: unmarked
        job = daemon.get_job("k1")
        job.escalate(Review(POLICY, EscalationReason.UNKNOWN_OUTCOME), detail="d", at=clock.now)
        # The other daemon's read-back marks the handle before this one saves.
        other.mark_handle(
            "fake",
            lambda handle: handle.mark_unreliable(
                expected="<a@x>", observed="<b@x>", provider_message_id="p1", job_key="k9",
                at=clock.now,
            ),
        )  # fmt: skip
        with pytest.raises(Withdrawn):
            daemon.save_job(job, guard=health.unmarked_at_commit("fake"))
        assert daemon.get_job("k1").state is JobState.REQUESTED  # nothing stored
        assert not health.reliable("fake")  # and this daemon knows it from now on
        # Another provider's handle, unmarked at the commit: the save lands.
        job = daemon.get_job("k2")
        job.escalate(Review(POLICY, EscalationReason.UNKNOWN_OUTCOME), detail="d", at=clock.now)
        daemon.save_job(job, guard=health.unmarked_at_commit("other"))
        assert daemon.get_job("k2").state is JobState.REVIEW


def test_a_mark_cannot_commit_between_the_guards_read_and_the_save_s_commit(
    store_url: str, clock: FakeClock
) -> None:
    """The other daemon's mark starts right after the guard read the handle unmarked:
    it waits for the save's commit (one writer's turn at a time), so the save's decision
    and "unmarked at the commit" stay one fact. On PostgreSQL the guard's read sees only
    what was committed: the mark, a write of no job, committed beside it."""
    with Ledger(store_url, clock=clock) as daemon, Ledger(store_url, clock=clock) as other:
        daemon.submit(content("k1"), SENDER)
        health = ProviderHealth(daemon, clock)
        unmarked = health.unmarked_at_commit("fake")
        marking = threading.Thread(
            target=lambda: other.mark_handle(
                "fake",
                lambda handle: handle.mark_unreliable(
                    expected="<a@x>", observed="<b@x>", provider_message_id="p1",
                    job_key="k9", at=clock.now,
                ),
            )
        )  # fmt: skip
        held: list[bool] = []

        def guard() -> bool:
            answer = unmarked()
            marking.start()
            marking.join(0.3)
            held.append(marking.is_alive())  # waiting for this save's commit
            return answer

        job = daemon.get_job("k1")
        job.escalate(Review(POLICY, EscalationReason.UNKNOWN_OUTCOME), detail="d", at=clock.now)
        daemon.save_job(job, guard=guard)
        marking.join(10)
        assert held == [True]
        assert not daemon.handle_reliable("fake")  # the mark landed, after the save
