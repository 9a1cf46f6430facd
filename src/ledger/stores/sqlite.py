"""The SQLite backend: eventsourcing's SQLite recorder, writing the job index row in the
same transaction as the events, and SQLite's own notion of a transient lock error."""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from uuid import UUID

from eventsourcing.persistence import StoredEvent
from eventsourcing.sqlite import SQLiteApplicationRecorder, SQLiteCursor
from eventsourcing.utils import get_topic

from ledger.stores import exception_chain
from ledger.stores.identity import FileIdentityLock
from ledger.stores.index import CREATE_STATEMENTS, INDEX_TABLE, UPSERT, SqlJobIndex, rows_from
from ledger.stores.url import SqliteStore

# Primary result codes; extended codes (e.g. SQLITE_BUSY_SNAPSHOT, 517) keep them in
# their low byte.
_LOCK_CODES = frozenset({sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED})


class SQLiteJobIndexRecorder(SQLiteApplicationRecorder, SqlJobIndex):
    _p = "?"

    def construct_create_table_statements(self) -> list[str]:
        statements = super().construct_create_table_statements()
        # WITHOUT ROWID: the table is its primary key's b-tree, one less b-tree per write.
        statements.extend(
            self._sql(s.replace("{real}", "REAL").replace("{options}", " WITHOUT ROWID"))
            for s in CREATE_STATEMENTS
        )
        return statements

    def _insert_events(
        self, c: SQLiteCursor, stored_events: Sequence[StoredEvent], **kwargs: Any
    ) -> Sequence[int] | None:
        notification_ids = super()._insert_events(c, stored_events, **kwargs)
        rows = rows_from(kwargs)
        if rows:
            c.executemany(self._sql(UPSERT), [r.as_tuple() for r in rows])
        return notification_ids

    def _transaction(self, *, commit: bool) -> AbstractContextManager[Any]:
        return self.datastore.transaction(commit=commit)

    def _tuples(self, cursor: Any) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in cursor.fetchall()]

    def _has_events_sql(self) -> tuple[str, Callable[[str], Any]]:
        sql = f"SELECT 1 FROM {self.events_table_name} WHERE originator_id = ? LIMIT 1"
        return sql, lambda job_id: str(UUID(job_id))


def is_lock_error(exc: BaseException) -> bool:
    """SQLITE_BUSY or SQLITE_LOCKED, by result code, wherever it is in the chain.

    The busy handler (SQLITE_LOCK_TIMEOUT) already waits for a writer; what still
    arrives at once is e.g. a WAL snapshot that went stale (SQLITE_BUSY_SNAPSHOT)."""
    for error in exception_chain(exc):
        if isinstance(error, sqlite3.Error):
            code = getattr(error, "sqlite_errorcode", None)  # errors from the library
            if isinstance(code, int) and code & 0xFF in _LOCK_CODES:
                return True
    return False


def create_private(path: Path) -> None:
    """Create the store's missing folders 0700 and the file 0600, whatever the umask:
    the file holds bodies and addresses. SQLite gives its -wal and -shm files the main
    file's mode. What exists already is left as it is."""
    missing = [p for p in [path.parent, *path.parent.parents] if not p.exists()]
    for folder in reversed(missing):
        with contextlib.suppress(FileExistsError):  # another process made it meanwhile
            folder.mkdir(mode=0o700)
            os.chmod(folder, 0o700)  # a umask can only remove bits; make them exact
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    try:
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)


def schema_exists(store: SqliteStore) -> bool:
    """True when the job index table (created last) is already in the file."""
    if not store.path.exists():
        return False
    try:
        with contextlib.closing(sqlite3.connect(store.path, timeout=30)) as conn:
            row = conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type='table' AND name=?", (INDEX_TABLE,)
            ).fetchone()
            return row is not None
    except sqlite3.Error:
        # Unknown: let the normal set-up (with its retries) find out.
        return False


@dataclass(frozen=True)
class SQLiteBackend:
    spec: SqliteStore

    @property
    def env(self) -> dict[str, str]:
        return {
            "PERSISTENCE_MODULE": "eventsourcing.sqlite",
            "SQLITE_DBNAME": str(self.spec.path),
            # Seconds the sqlite3 busy handler waits for a writer: several processes
            # share the file, and "database is locked" must never reach a caller.
            "SQLITE_LOCK_TIMEOUT": "30",
            "APPLICATION_RECORDER_TOPIC": get_topic(SQLiteJobIndexRecorder),
        }

    def prepare(self) -> bool:
        create_private(self.spec.path)
        return schema_exists(self.spec)

    def identity_lock(self, name: str) -> FileIdentityLock:
        return FileIdentityLock(self.spec.path, name)

    def is_retryable(self, exc: BaseException) -> bool:
        return is_lock_error(exc)

    def is_setup_race(self, exc: BaseException) -> bool:
        # Several processes creating the tables at once only ever wait on each other.
        return is_lock_error(exc)


__all__ = [
    "SQLiteBackend",
    "SQLiteJobIndexRecorder",
    "create_private",
    "is_lock_error",
    "schema_exists",
]
