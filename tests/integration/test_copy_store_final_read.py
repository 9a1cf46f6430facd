"""`admin copy-store`'s last read of the source, after its finished mark, on real stores
(docs/operations.md "Moving to PostgreSQL"): it waits for the saves in flight, so a save
that began before it, and commits after it, is seen (its id past the last copied) or
still in flight past the store's wait for a writer; either way the mark is taken back
and the copy stays unfinished. The save is held open by a second connection as the mark
is written: on PostgreSQL a job's save waiting for its index row, which an operator's
psql holds (its id taken); on SQLite an INSERT left uncommitted (the write lock held)."""

from __future__ import annotations

import contextlib
import dataclasses
import sqlite3
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg
import pytest
from tests.integration.test_log_gaps import in_review, save_held
from tests.unit.test_copy_store import at_the_mark

import ledger.stores.sqlite as sqlite_store
from daemon.service_layer.copy_store import CopyMismatch, copy_store
from ledger.application import Ledger
from ledger.stores.keycheck import SqlKeyChecks, UnfinishedCopy
from ledger.stores.url import PostgresStore, SqliteStore, parse_store_url


def with_lock_timeout(pg_url: str, seconds: int) -> PostgresStore:
    spec = parse_store_url(pg_url)
    assert isinstance(spec, PostgresStore)
    return dataclasses.replace(spec, lock_timeout=seconds)


@pytest.mark.postgres
def test_a_save_begun_after_the_checks_and_in_flight_at_the_last_read_leaves_the_copy_unfinished(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A command's save takes its id (past the last copied) after the checks before the
    mark, and waits for a job's row an operator's psql holds, past the copy's end. The
    last read waits for it ([store] lock_timeout, 1 s here) and it outlasts the wait:
    the mark is taken back. Before, the last read saw the committed end only, the copy
    was reported finished, and the save then committed to the source alone (a fork)."""
    destination = SqliteStore(tmp_path / "copy.sqlite")
    with (
        Ledger(pg_url) as saver,
        Ledger(with_lock_timeout(pg_url, 1)) as source,
        contextlib.ExitStack() as held,
    ):
        in_review(saver, "held")
        last = int(source.recorder.max_notification_id() or 0)
        began = at_the_mark(
            monkeypatch, SqlKeyChecks, lambda: held.enter_context(save_held(saver, pg_url, "held"))
        )
        with pytest.raises(CopyMismatch, match=r"a save on .* was still in flight as the copy"):
            copy_store(source, destination)
        assert began
        monkeypatch.undo()
        held.close()  # the psql session ends: the save commits, past the last copied
        assert int(source.recorder.max_notification_id() or 0) > last
    with pytest.raises(UnfinishedCopy):
        Ledger(destination)


@pytest.mark.postgres
def test_a_save_that_commits_while_the_last_read_waits_is_seen(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same save, let go once the last read waits for it: it commits first, and the
    read sees its id past the last copied (every id handed out before the read is in
    it): the mark is taken back. Before, the read did not wait and the copy finished."""
    destination = SqliteStore(tmp_path / "copy.sqlite")
    with (
        Ledger(pg_url) as saver,
        Ledger(pg_url) as source,
        contextlib.ExitStack() as held,
        ThreadPoolExecutor(1) as watcher,
    ):
        in_review(saver, "held")
        last = int(source.recorder.max_notification_id() or 0)
        letting_go: list[Any] = []

        def hold_then_let_go_once_waited_for() -> None:
            release = held.enter_context(save_held(saver, pg_url, "held"))
            letting_go.append(watcher.submit(_release_once_a_share_lock_waits, pg_url, release))

        at_the_mark(monkeypatch, SqlKeyChecks, hold_then_let_go_once_waited_for)
        with pytest.raises(CopyMismatch, match=f"its last event is {last + 1}, the last copied"):
            copy_store(source, destination)
        assert letting_go[0].result(timeout=30) is None
    monkeypatch.undo()
    with pytest.raises(UnfinishedCopy):
        Ledger(destination)


def _release_once_a_share_lock_waits(pg_url: str, release: Any) -> None:
    deadline = time.monotonic() + 20
    with psycopg.connect(pg_url.split("?")[0], autocommit=True) as look:
        while not look.execute(
            "SELECT count(*) FROM pg_locks WHERE mode = 'ShareLock' AND NOT granted "
            "AND locktype = 'relation'"
        ).fetchone()[0]:  # type: ignore[index]
            assert time.monotonic() < deadline, "the last read never waited"
            time.sleep(0.02)
    release()


@contextlib.contextmanager
def insert_held(store: Path) -> Iterator[sqlite3.Connection]:
    """An event inserted into the SQLite store `store` by a second connection and not
    committed (the write lock held) until the block ends; committed then."""
    with contextlib.closing(sqlite3.connect(store, isolation_level=None)) as writer:
        writer.execute("BEGIN IMMEDIATE")
        writer.execute(
            "INSERT INTO stored_events (originator_id, originator_version, topic, state) "
            "VALUES (?, 1, 'test:Other', x'7b7d')",
            [uuid.uuid4().hex],
        )
        yield writer
        writer.execute("COMMIT")


def test_an_uncommitted_sqlite_insert_at_the_last_read_leaves_the_copy_unfinished(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On SQLite a save holds the write lock from its insert to its commit, and a plain
    read sees the end before it. The last read takes the write lock, waiting the store's
    busy timeout (1 s here) for the save in flight, which outlasts it: the mark is taken
    back. Before, the copy was reported finished and the insert then committed to the
    source alone."""
    monkeypatch.setattr(sqlite_store, "BUSY_TIMEOUT", 1)
    store = tmp_path / "ledger.sqlite"
    destination = SqliteStore(tmp_path / "copy.sqlite")
    with Ledger(SqliteStore(store)) as source, contextlib.ExitStack() as held:
        in_review(source, "one", "two")
        last = int(source.recorder.max_notification_id() or 0)
        began = at_the_mark(
            monkeypatch, SqlKeyChecks, lambda: held.enter_context(insert_held(store))
        )
        with pytest.raises(CopyMismatch, match=r"a save on .* was still in flight as the copy"):
            copy_store(source, destination)
        assert began
        held.close()
        assert int(source.recorder.max_notification_id() or 0) == last + 1
    monkeypatch.undo()
    with pytest.raises(UnfinishedCopy):
        Ledger(destination)
