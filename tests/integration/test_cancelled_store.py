"""A cancelled job on the real stores: its index row is out of due work, it is settled for
good (a purge takes it), and the new events reload and rebuild the same index row."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.integration.test_ledger_store import SENDER, content

from daemon.doubles.fake_time import FakeClock
from ledger.application import Ledger
from ledger.stores.index import index_row
from ledger.vocabulary import JobState


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    else:
        yield str(request.getfixturevalue("pg_url"))


def test_a_cancelled_job_is_never_due_and_is_purged_as_settled(url: str) -> None:
    clock = FakeClock()
    with Ledger(url, clock=clock) as ledger:
        ledger.submit(content("c1"), SENDER)
        ledger.submit(content("c2"), SENDER)
        ledger.update("c1", lambda j: j.cancel(by="ops", note="withdrawn", at=clock()))
        ledger.update(
            "c1",
            lambda j: j.record_check(by="ops", purpose="check", query="q", copies=[], at=clock()),
        )
        clock.advance(86400)
        due = [row.key for row in ledger.due(JobState.REQUESTED, clock(), 10)]
        assert due == ["c2"]
        assert ledger.counts()["cancelled"] == 1
        assert ledger.next_due([JobState.REQUESTED]) is not None
        job = ledger.get_job("c1")
        assert job.state is JobState.CANCELLED and ledger.row("c1") == index_row(job)
        assert ledger.rebuild_index() == 2 and ledger.row("c1") == index_row(job)
        purged = ledger.purge_settled(clock(), by="dpo", rule="test")
        assert purged.purged == 1 and ledger.get_job("c1").purged
        assert [type(e).__name__ for e in ledger.history("c1")] == [
            "Requested",
            "Cancelled",
            "Checked",
            "Purged",
        ]
