"""Each use the store makes of eventsourcing's private API (ledger/stores/private_api.py), once
per backend: memory, SQLite, and PostgreSQL on both of the library's insert paths.

Lean on purpose: `make test` runs this file a second time against the newest eventsourcing
release (`make test-eventsourcing`, docs/development.md "Development"), which names the
version it ran on.
"""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from eventsourcing.sqlite import SQLiteApplicationRecorder, SQLiteCursor
from tests.integration.test_ledger_store import SENDER, attempt_args, content
from tests.integration.test_retention_stores import settle

from daemon.doubles.fake_time import FakeClock
from ledger.application import ConcurrentUpdate, Ledger
from ledger.job import SendJob
from ledger.stores.memory import discard_memory_store
from ledger.stores.private_api import UNNUMBERED_KWARG, WAL_CHECKPOINT_PAGES, WAL_SIZE_LIMIT
from ledger.vocabulary import JobState


@pytest.fixture(
    params=[
        "memory",
        "sqlite",
        pytest.param("postgresql", marks=pytest.mark.postgres),
        pytest.param("postgresql-no-functions", marks=pytest.mark.postgres),
    ]
)
def ledger(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Ledger]:
    if request.param == "memory":
        name = f"private-{uuid.uuid4().hex[:12]}"
        url = f"memory://{name}"
    elif request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    else:
        # The library's insert function (its default here) or its plain INSERT path.
        functions = "n" if request.param.endswith("no-functions") else "y"
        monkeypatch.setenv("POSTGRES_ENABLE_DB_FUNCTIONS", functions)
        url = str(request.getfixturevalue("pg_url"))
    with Ledger(url, clock=clock) as app:
        yield app
    if request.param == "memory":
        discard_memory_store(name)


def test_a_save_writes_the_index_row_with_its_events(ledger: Ledger, clock: FakeClock) -> None:
    # record + pass_to_recorder + the insert hook: the row is written with the events.
    ledger.submit(content("p-1"), SENDER)
    row = ledger.row("p-1")
    assert row is not None and row.state == JobState.REQUESTED.value and row.version == 1
    ledger.update("p-1", lambda job: job.claim(**attempt_args(clock)))
    row = ledger.row("p-1")
    assert row is not None and row.state == JobState.ATTEMPTED.value and row.version == 2


def test_a_conflicting_save_writes_neither_events_nor_row(ledger: Ledger, clock: FakeClock) -> None:
    ledger.submit(content("p-2"), SENDER)
    first, second = ledger.get_job("p-2"), ledger.get_job("p-2")
    first.claim(**attempt_args(clock))
    second.claim(**attempt_args(clock))
    ledger.save_job(first)
    with pytest.raises(ConcurrentUpdate):
        ledger.save_job(second)
    assert len(ledger.history("p-2")) == 2
    row = ledger.row("p-2")
    assert row is not None and row.version == 2


def test_a_purge_rewrites_stored_events_in_the_same_write(ledger: Ledger, clock: FakeClock) -> None:
    # The rewrites ride beside the Purged event: the stored Requested loses its content
    # and the row says purged, together.
    ledger.submit(content("p-3", subject="Private subject", body="Private body"), SENDER)
    settle(ledger, clock, "p-3")
    ledger.purge("p-3", by="ops", rule="test")
    requested = ledger.history("p-3")[0]
    assert (requested.subject, requested.body) == ("", "")
    row = ledger.row("p-3")
    assert row is not None and row.purged_at == clock().timestamp()


def test_a_sqlite_connection_prepares_each_statement_once(tmp_path: Path, clock: FakeClock) -> None:
    # CachingConnectionPool: sqlite3 calls a connection's authorizer only while it prepares
    # a statement. With the library's cache of one, the second job's submit and claim
    # prepared every statement again; kept, they prepare none (but the COMMIT that
    # sqlite3's own `commit()` prepares each time: a transaction action).
    with Ledger(f"sqlite:///{tmp_path / 'ledger.sqlite'}", clock=clock) as ledger:
        prepared: list[int] = []

        def count(action: int, *_: object) -> int:
            prepared.append(action)
            return sqlite3.SQLITE_OK

        assert isinstance(ledger.recorder, SQLiteApplicationRecorder)
        with ledger.recorder.datastore.get_connection(commit=True) as connection:
            connection._sqlite_conn.set_authorizer(count)  # the one connection a thread uses
        for key in ("s-1", "s-2"):
            prepared.clear()
            ledger.submit(content(key), SENDER)
            ledger.update(key, lambda job: job.claim(**attempt_args(clock)))
            assert ledger.get_jobs([key]).keys() == {key}
            if key == "s-1":
                assert prepared, "the ledger did not use the connection the test watches"
        assert set(prepared) == {sqlite3.SQLITE_TRANSACTION}


def test_a_sqlite_store_writes_on_the_connection_it_wrote_on_last(
    tmp_path: Path, clock: FakeClock
) -> None:
    # CachingConnectionPool: a connection drops its page cache when another one has
    # committed since its last transaction, and reads each page it needs back. Handed
    # out in turn, the pool's connections did that at nearly every save of a daemon with
    # several threads; the one returned last first, the saves stay on a warm connection.
    with Ledger(f"sqlite:///{tmp_path / 'ledger.sqlite'}", clock=clock) as ledger:
        assert isinstance(ledger.recorder, SQLiteApplicationRecorder)
        pool = ledger.recorder.datastore.pool
        held = [pool.get_connection() for _ in range(3)]  # as three threads at once
        for connection in held:
            pool.put_connection(connection)
        statements: list[str] = []
        held[-1]._sqlite_conn.set_trace_callback(statements.append)
        for key in ("w-1", "w-2", "w-3"):
            statements.clear()
            ledger.submit(content(key), SENDER)
            assert any(s.startswith("INSERT") for s in statements), key


def test_a_sqlite_commit_makes_as_many_statements_for_four_jobs_as_for_one(
    tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # SQLiteInsertHook: the library's application recorder inserted a commit's events one
    # `execute` each, to read each one's rowid for recordings nobody is notified of; a
    # claim a job, so a group commit of four claims made three statements more than one
    # claim saved alone. Its events now go in one `executemany`, as its index rows do.
    calls: list[str] = []
    for method in ("execute", "executemany"):
        real = getattr(SQLiteCursor, method)

        def called(cursor: SQLiteCursor, *args: Any, _real: Any = real, _m: str = method) -> Any:
            calls.append(_m)
            return _real(cursor, *args)

        monkeypatch.setattr(SQLiteCursor, method, called)
    with Ledger(f"sqlite:///{tmp_path / 'ledger.sqlite'}", clock=clock) as ledger:
        keys = [f"c-{n}" for n in range(5)]
        jobs = _claimed(ledger, clock, keys)
        made = []
        for batch in ([jobs["c-0"]], [jobs[key] for key in keys[1:]]):
            calls.clear()
            ledger.save_jobs(batch)
            made.append(len(calls))
        assert made[0] == made[1], made
        assert all(row.state == JobState.ATTEMPTED.value for row in ledger.jobs())


def test_a_sqlite_store_checkpoints_its_wal_past_its_own_length_not_sqlites(
    tmp_path: Path,
) -> None:
    # CachingConnectionPool: SQLite's commit that took the WAL past 1,000 pages copied it
    # into the file, so the WAL never held much more; past WAL_CHECKPOINT_PAGES now, which
    # copies a page written by many commits once. About 2,000 pages of jobs are written
    # here: the WAL holds them all.
    path = tmp_path / "ledger.sqlite"
    with Ledger(f"sqlite:///{path}") as ledger:
        for n in range(150):
            ledger.submit(content(f"w-{n}", body=f"{n} " + "x" * 40_000), SENDER)
        # Read while the store is open: the last connection's close empties the WAL.
        with closing(sqlite3.connect(path)) as conn:
            (page_size,) = conn.execute("PRAGMA page_size").fetchone()
        frames = (path.with_name(path.name + "-wal").stat().st_size - 32) // (page_size + 24)
    assert 1_500 < frames < WAL_CHECKPOINT_PAGES, frames


def test_a_sqlite_stores_wal_grown_past_its_checkpoint_by_a_long_read_is_cut_back(
    tmp_path: Path,
) -> None:
    # CachingConnectionPool: a reader holding one snapshot (a backup, a long copy-store)
    # keeps the checkpoint from copying what is written meanwhile, so the WAL grows past
    # WAL_CHECKPOINT_PAGES; SQLite then kept the -wal that size for as long as the store
    # stayed open (a daemon's life). It is cut back to WAL_SIZE_LIMIT once the log starts
    # over after the read.
    path = tmp_path / "ledger.sqlite"
    wal = path.with_name(path.name + "-wal")
    with Ledger(f"sqlite:///{path}") as ledger:
        with closing(sqlite3.connect(path, isolation_level=None)) as reader:
            reader.execute("BEGIN")
            reader.execute("SELECT count(*) FROM sqlite_master").fetchone()
            for n in range(260):
                ledger.submit(content(f"r-{n}", body=f"{n} " + "x" * 40_000), SENDER)
            grown = wal.stat().st_size
            reader.execute("COMMIT")
        for n in range(5):
            ledger.submit(content(f"a-{n}", body=f"{n} " + "x" * 40_000), SENDER)
        after = wal.stat().st_size
    assert grown > WAL_SIZE_LIMIT, grown
    assert after <= WAL_SIZE_LIMIT, (grown, after)


@pytest.mark.postgres
def test_a_postgresql_write_that_wants_no_ids_reads_none_back(
    pg_url: str, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # insert_by_function: the library's insert function returns each event's notification
    # id, which every save read into rows for recordings nobody is notified of. A write
    # that says it wants none (UNNUMBERED_KWARG, as every save of the Ledger does) leaves
    # them unread; the events are numbered in the table all the same, in order.
    monkeypatch.setenv("POSTGRES_ENABLE_DB_FUNCTIONS", "y")
    with Ledger(pg_url, clock=clock) as ledger:
        jobs = _claimed(ledger, clock, ["u-0", "u-1"])
        stored = {
            key: [ledger.mapper.to_stored_event(e) for e in job.pending_events]
            for key, job in jobs.items()
        }
        last = int(ledger.recorder.max_notification_id() or 0)
        assert ledger.recorder.insert_events(stored["u-0"], **{UNNUMBERED_KWARG: True}) is None
        assert ledger.recorder.insert_events(stored["u-1"]) == [last + 2]
        after = ledger.recorder.select_notifications(start=last + 1, limit=10)
        assert [(n.id, n.originator_id) for n in after] == [
            (last + 1, jobs["u-0"].id),
            (last + 2, jobs["u-1"].id),
        ]


def test_a_group_commits_events_keep_their_rowids_and_order(
    tmp_path: Path, clock: FakeClock
) -> None:
    # SQLiteInsertHook's one `executemany` (UNNUMBERED_KWARG) numbers the events as the
    # library's `execute` each did: in the order of the save, one after the last stored,
    # no gap. The audit, `history`, `copy-store`, the retention purge and the webhooks
    # read the store by rowid (notification id). Passes on the per-event inserts too.
    with Ledger(f"sqlite:///{tmp_path / 'ledger.sqlite'}", clock=clock) as ledger:
        jobs = _claimed(ledger, clock, [f"o-{n}" for n in range(4)])
        batch = [jobs[key] for key in ("o-2", "o-0", "o-3", "o-1")]
        last = int(ledger.recorder.max_notification_id() or 0)
        ledger.save_jobs(batch)
        after = ledger.recorder.select_notifications(start=last + 1, limit=10)
        assert [n.id for n in after] == list(range(last + 1, last + 5))
        assert [n.originator_id for n in after] == [job.id for job in batch]


def _claimed(ledger: Ledger, clock: FakeClock, keys: list[str]) -> dict[str, SendJob]:
    """The jobs of `keys`, submitted and claimed, their claims not saved yet."""
    for key in keys:
        ledger.submit(content(key), SENDER)
    jobs = ledger.get_jobs(keys)
    for job in jobs.values():
        job.claim(**attempt_args(clock))
    return jobs
