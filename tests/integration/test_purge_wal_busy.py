"""A purge whose WAL a reader keeps busy says so (docs/configuration.md "Retention", gone from
the files): `scrubbed` is False while an old snapshot is held, and the next purge, once the
reader is gone, empties the WAL."""

from __future__ import annotations

import contextlib
import sqlite3
import time
from datetime import timedelta
from pathlib import Path

import pytest
from tests.integration.test_ledger_store import SENDER, content
from tests.integration.test_retention_stores import settle

from daemon.doubles.fake_time import FakeClock
from ledger.application import Ledger
from ledger.stores import sqlite as sqlite_store


def test_a_reader_holding_the_wal_leaves_the_purge_unscrubbed_until_the_next(
    tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 5 tries instead of 50: the same short tries, 1 s of waiting instead of 10.
    monkeypatch.setattr(sqlite_store, "CHECKPOINT_ATTEMPTS", 5)
    path = tmp_path / "ledger.sqlite"
    with Ledger(f"sqlite:///{path}", clock=clock) as ledger:
        for key in ("old-1", "old-2"):
            ledger.submit(content(key), SENDER)
            settle(ledger, clock, key)
        clock.advance(10 * 86400)
        with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as reader:
            reader.execute("BEGIN")
            reader.execute("SELECT COUNT(*) FROM stored_events").fetchone()  # a snapshot
            started = time.monotonic()
            first = ledger.purge_settled(clock() - timedelta(days=1), by="t", rule="test")
            waited = time.monotonic() - started
            assert (first.purged, first.scrubbed) == (2, False)
            # It says so in about a second (5 short tries), not after 5 busy timeouts (the
            # usual 30 s each).
            assert waited < 2.5, waited
            reader.execute("COMMIT")
        assert ledger.scrub() is True
    assert not Path(f"{path}-wal").exists() or Path(f"{path}-wal").stat().st_size == 0


def test_a_later_run_with_nothing_to_purge_still_scrubs_what_an_earlier_left(
    tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The scrub ran only after a run that purged a job: the daemon's next run, or the
    # `admin purge` an operator is told to run again later, found nothing new to purge,
    # said `"scrubbed": true` and left the purged text in the WAL.
    monkeypatch.setattr(sqlite_store, "CHECKPOINT_ATTEMPTS", 5)
    path = tmp_path / "ledger.sqlite"
    wal = Path(f"{path}-wal")
    with Ledger(f"sqlite:///{path}", clock=clock) as ledger:
        ledger.submit(content("old-1"), SENDER)
        settle(ledger, clock, "old-1")
        clock.advance(10 * 86400)
        with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as reader:
            reader.execute("BEGIN")
            reader.execute("SELECT COUNT(*) FROM stored_events").fetchone()
            first = ledger.purge_settled(clock() - timedelta(days=1), by="t", rule="test")
            assert (first.purged, first.scrubbed) == (1, False)
            reader.execute("COMMIT")
        assert wal.exists() and wal.stat().st_size > 0
        again = ledger.purge_settled(clock() - timedelta(days=1), by="t", rule="test")
        assert (again.purged, again.scrubbed) == (0, True)
        assert not wal.exists() or wal.stat().st_size == 0
