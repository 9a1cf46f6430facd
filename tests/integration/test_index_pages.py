"""What a job's save writes to SQLite's index b-trees (docs/performance.md "Commits per job").

Every page a transaction changes is written whole to the WAL and synced with the commit,
so a page written for nothing is CPU and I/O in every commit. The pages are read from the
WAL's frames and named by SQLite's `dbstat` (which b-tree holds each), as
bench/profile_pipeline.py `--pages` does.
"""

from __future__ import annotations

import sqlite3
import struct
from pathlib import Path

from tests.integration.test_ledger_store import SENDER, attempt_args, content

from daemon.doubles.fake_time import FakeClock
from ledger.application import Ledger
from ledger.stores.index import INDEX_TABLE


def wal_pages(database: Path, side: sqlite3.Connection) -> set[str]:
    """The b-trees whose pages the WAL holds (`side`: a connection kept open meanwhile)."""
    names = dict(side.execute("SELECT pageno, name FROM dbstat"))
    size = int(side.execute("PRAGMA page_size").fetchone()[0])
    data = Path(f"{database}-wal").read_bytes()
    frames = range(32, len(data) - size - 23, 24 + size)  # a 32-byte header, then frames
    return {str(names.get(struct.unpack(">I", data[at : at + 4])[0], "?")) for at in frames}


def test_a_save_after_the_first_writes_no_page_of_the_message_id_index(
    tmp_path: Path, clock: FakeClock
) -> None:
    # A job's Message-ID is fixed by its first event; each later save (a claim, an
    # outcome) upserts the job's row. SQLite rewrites the entry of each index on a column
    # the upsert assigns, equal value or not: assigning `message_id` again wrote a page of
    # its index (a random one, the ids being digests) into each commit.
    database = tmp_path / "ledger.sqlite"
    with Ledger(f"sqlite:///{database}", clock=clock) as ledger:
        for i in range(300):  # the index on more pages than one
            ledger.submit(content(f"pages-{i}"), SENDER)
        jobs = ledger.get_jobs([f"pages-{i}" for i in (7, 150, 290)])
        for job in jobs.values():
            job.claim(**attempt_args(clock))
        side = sqlite3.connect(database)
        try:
            side.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            assert not Path(f"{database}-wal").read_bytes(), "the WAL emptied first"
            ledger.save_jobs(list(jobs.values()))
            written = wal_pages(database, side)
        finally:
            side.close()
        # The row itself and the indexes on what changed (its state) were written...
        assert {INDEX_TABLE, f"{INDEX_TABLE}_state_due"} <= written, written
        # ... and nothing of the Message-IDs' index.
        assert f"{INDEX_TABLE}_message_id" not in written, written
        row = ledger.row_by_message_id(jobs["pages-150"].message_id)
        assert row is not None and (row.key, row.state) == ("pages-150", "attempted")
