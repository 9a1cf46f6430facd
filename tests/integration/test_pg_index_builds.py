"""Opening a PostgreSQL store of an earlier release builds the job index's new indexes
(`ADDED_INDEXES`) CONCURRENTLY (docs/performance.md "Performance and scaling"): the
daemons' writes go on during the build, a build that was stopped (an INVALID index) is
dropped and built again, and processes opening at once build each index once."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from tests.conftest import PG_URL
from tests.integration.test_store_unavailable import SENDER, job, pg_spec

from ledger.application import Ledger
from ledger.stores.index import INDEX_TABLE
from ledger.stores.postgres import index_build_key
from ledger.stores.url import PostgresStore

pytestmark = pytest.mark.postgres

ADDED = f"{INDEX_TABLE}_written_key"


@pytest.fixture
def old_store(pg_url: str) -> Iterator[PostgresStore]:
    """A store with two jobs whose index lacks `ADDED` (as one of an earlier release)."""
    spec = pg_spec(pg_url, lock_timeout=20)
    with Ledger(spec) as ledger:
        ledger.submit(job("k-1"), SENDER)
        ledger.submit(job("k-2"), SENDER)
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'DROP INDEX "{spec.schema}".{ADDED}')
    yield spec


def _table(spec: PostgresStore) -> str:
    return f'"{spec.schema}".{INDEX_TABLE}'


def _valid(spec: PostgresStore) -> bool | None:
    """Whether `ADDED` is valid; None when it is not there."""
    with psycopg.connect(PG_URL) as conn:
        row = conn.execute(
            "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relname = %s",
            (spec.schema, ADDED),
        ).fetchone()
        return None if row is None else bool(row[0])


def _in_background(action: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(action())
        except Exception as exc:  # what it ends with
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def _wait_for_a_build_waiting(spec: PostgresStore) -> int:
    """The pid of a CREATE INDEX on the store waiting for a lock."""
    deadline = time.monotonic() + 15
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE query LIKE 'CREATE INDEX%%' "
                "AND query LIKE %s AND wait_event_type = 'Lock'",
                (f"%{spec.schema}%",),
            ).fetchone()
            if row is not None:
                return int(row[0])
            time.sleep(0.05)
    raise AssertionError("no index build began")


def test_writes_go_on_while_an_added_index_is_built(old_store: PostgresStore) -> None:
    """A plain CREATE INDEX takes a SHARE lock: queued behind a transaction that writes
    (here one held open, in production any write in flight at the start), it held
    every other writer of the table until it had waited and built: on a large store
    the daemons stopped writing for the whole build. CONCURRENTLY, the write goes on."""
    spec = old_store
    with psycopg.connect(PG_URL) as holder:
        holder.execute(f"UPDATE {_table(spec)} SET updated_at = updated_at WHERE key = 'k-1'")
        opener, opened = _in_background(lambda: Ledger(spec).close())
        _wait_for_a_build_waiting(spec)
        with psycopg.connect(PG_URL) as writer:  # another daemon's write meanwhile
            writer.execute("SET lock_timeout = '2s'")
            writer.execute(f"UPDATE {_table(spec)} SET updated_at = updated_at WHERE key = 'k-2'")
            writer.commit()
        holder.commit()
    opener.join(timeout=30)
    assert opened == [None], opened
    assert _valid(spec) is True


def test_a_build_that_was_stopped_is_dropped_and_built_again(old_store: PostgresStore) -> None:
    """A build CONCURRENTLY that stops half-way (its process killed, its wait past
    lock_timeout) leaves an INVALID index, kept up by every write and used by no read,
    and `IF NOT EXISTS` would keep it so for good."""
    spec = old_store
    statement = f"CREATE INDEX CONCURRENTLY {ADDED} ON {_table(spec)} (written_at, key)"
    with psycopg.connect(PG_URL) as holder:
        holder.execute(f"UPDATE {_table(spec)} SET updated_at = updated_at WHERE key = 'k-1'")
        builder = psycopg.connect(PG_URL, autocommit=True)
        try:
            building, built = _in_background(lambda: builder.execute(statement))
            pid = _wait_for_a_build_waiting(spec)
            with psycopg.connect(PG_URL, autocommit=True) as admin:
                admin.execute("SELECT pg_cancel_backend(%s)", (pid,))
            building.join(timeout=10)
            assert len(built) == 1 and isinstance(built[0], psycopg.errors.QueryCanceled), built
        finally:
            builder.close()
        holder.rollback()
    assert _valid(spec) is False
    Ledger(spec).close()
    assert _valid(spec) is True


def test_a_build_under_way_in_another_process_is_not_waited_for(
    old_store: PostgresStore,
) -> None:
    """Several daemons start at once: one builds, the others open without the index
    (reads are right without it, only slower) instead of each building it, or waiting
    behind the build; a later open builds what is still missing."""
    spec = old_store
    with psycopg.connect(PG_URL, autocommit=True) as other:
        other.execute("SELECT pg_advisory_lock(%s)", (index_build_key(spec.schema),))
        started = time.monotonic()
        with Ledger(spec) as ledger:
            assert ledger.get_job("k-1").key == "k-1"
        assert time.monotonic() - started < 10
        assert _valid(spec) is None
    openers = [_in_background(lambda: Ledger(spec).close()) for _ in range(4)]
    for thread, _outcome in openers:
        thread.join(timeout=60)
    assert [outcome for _thread, outcome in openers] == [[None]] * 4
    assert _valid(spec) is True
