"""The handle read inside a save's transaction (`ProviderHealth.unmarked_at_commit`, the
guard of `Ledger.save_job`) on the real stores: another daemon's mark, written after this
daemon read the job and decided on an unmarked handle, withdraws the save on SQLite and
PostgreSQL as it does in memory (docs/how-it-works.md "The read-back of the Message-ID";
tests/unit/test_races_readback.py drives the two engines)."""

from __future__ import annotations

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
