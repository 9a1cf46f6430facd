"""A save that holds to the provider's handle as its decision read it (`Ledger.save_job`'s
`unchanged`, ledger/stores/unchanged.py) on the real stores: another daemon's mark
committed after that read withdraws the save on SQLite and PostgreSQL, nothing stored,
as in memory (tests/unit/test_handle_guard.py drives two engines); a handle unmarked
at the commit lets it land. The handle is read again on the save's own connection (a
second pooled one, taken while the save holds the writer's, ran the pool dry at a
concurrency of 8), and a mark started meanwhile waits for the save's commit, neither
deadlocking (docs/how-it-works.md "The read-back of the Message-ID")."""

from __future__ import annotations

import threading
from typing import Any
from uuid import UUID

import pytest
from tests.integration.test_ledger_store import POLICY, SENDER, content

from daemon.doubles.fake_time import FakeClock
from ledger.application import Ledger
from ledger.decision_types import Review
from ledger.job import JobState, SendJob
from ledger.provider_handle import ProviderHandle
from ledger.stores.unchanged import Changed
from ledger.vocabulary import EscalationReason


def mark(ledger: Ledger, clock: FakeClock, provider: str = "fake") -> None:
    """Another daemon's read-back finds `provider` replacing Message-IDs."""

    def replaced(handle: ProviderHandle) -> None:
        handle.mark_unreliable(expected="<a@x>", observed="<b@x>", provider_message_id="p1",
                               job_key="k9", at=clock.now)  # fmt: skip

    ledger.mark_handle(provider, replaced)


def to_review(ledger: Ledger, key: str, clock: FakeClock) -> SendJob:
    job = ledger.get_job(key)
    job.escalate(Review(POLICY, EscalationReason.UNKNOWN_OUTCOME), detail="d", at=clock.now)
    return job


def in_use(ledger: Ledger) -> int:
    """The connections of the ledger's pool handed out now."""
    pool: Any = ledger.recorder.datastore.pool  # type: ignore[attr-defined]
    if hasattr(pool, "num_in_use"):  # eventsourcing's (SQLite)
        return int(pool.num_in_use)
    stats = pool.get_stats()  # psycopg_pool's (PostgreSQL)
    return int(stats.get("pool_size", 0) - stats.get("pool_available", 0))


def test_a_mark_committed_after_the_decision_s_read_withdraws_its_save(
    store_url: str, clock: FakeClock
) -> None:
    with Ledger(store_url, clock=clock) as daemon, Ledger(store_url, clock=clock) as other:
        daemon.submit(content("k1"), SENDER)
        daemon.submit(content("k2"), SENDER)
        read = daemon.handle_unmarked("fake")  # the decision's read: unmarked
        assert read is not None
        job = to_review(daemon, "k1", clock)
        mark(other, clock)  # the other daemon's read-back, before this one saves
        with pytest.raises(Changed):
            daemon.save_job(job, unchanged=read)
        assert daemon.get_job("k1").state is JobState.REQUESTED  # nothing stored
        assert daemon.handle_unmarked("fake") is None
        # A handle unmarked at the commit (another provider's): the save lands.
        unmarked = daemon.handle_unmarked("other")
        assert unmarked is not None
        daemon.save_job(to_review(daemon, "k2", clock), unchanged=unmarked)
        assert daemon.get_job("k2").state is JobState.REVIEW


def test_the_read_is_on_the_save_s_own_connection_and_a_mark_waits_for_its_commit(
    store_url: str, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The other daemon's mark starts inside the save, once it holds its turn: it is
    still waiting 0.3 s later (the save's commit comes first, so the save stood on a
    handle unmarked at its commit), then lands. The save's read of the handle took no
    second connection from its pool."""
    with Ledger(store_url, clock=clock) as daemon, Ledger(store_url, clock=clock) as other:
        daemon.submit(content("k1"), SENDER)
        read = daemon.handle_unmarked("fake")
        assert read is not None
        marking = threading.Thread(target=mark, args=(other, clock))
        held: list[bool] = []
        seen_in_use: list[int] = []
        recorder: Any = daemon.recorder
        last_version = recorder._last_version

        def read_in_the_save(cursor: Any, originator_id: UUID) -> int:
            seen_in_use.append(in_use(daemon))
            found = int(last_version(cursor, originator_id))
            marking.start()
            marking.join(0.3)
            held.append(marking.is_alive())  # waiting for this save's commit
            return found

        monkeypatch.setattr(recorder, "_last_version", read_in_the_save)
        daemon.save_job(to_review(daemon, "k1", clock), unchanged=read)
        marking.join(10)
        assert not marking.is_alive()
        assert held == [True]
        assert seen_in_use == [1]
        assert daemon.get_job("k1").state is JobState.REVIEW
        assert daemon.handle_unmarked("fake") is None  # the mark landed, after the save
