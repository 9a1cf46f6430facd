"""The SQLite backend: eventsourcing's SQLite recorder, writing the job index row in the
same transaction as the events, and SQLite's own notion of a transient lock error."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import sqlite3
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from uuid import UUID

from eventsourcing.sqlite import SQLiteApplicationRecorder, SQLiteCursor, SQLiteFactory
from eventsourcing.utils import EnvType, get_topic

from ledger.file_kinds import file_kind
from ledger.stores.causes import StoreUnavailable, access_denied, exception_chain
from ledger.stores.file_access import access_problem, repair_wal_modes
from ledger.stores.identity import FileIdentityLock, file_names_held
from ledger.stores.index import (
    ADDED_COLUMNS,
    ATTEMPT_PROVIDER_BACKFILL,
    CREATE_STATEMENTS,
    INDEX_TABLE,
    SqlJobIndex,
    missing_indexes,
)
from ledger.stores.keycheck import KEY_TABLE, SqlKeyChecks
from ledger.stores.private_api import CachingConnectionPool, SQLiteInsertHook
from ledger.stores.purge import rewrites_from
from ledger.stores.unchanged import hold_unchanged
from ledger.stores.url import SqliteStore, StoreFolderNotThere, StoreUrlError

log = logging.getLogger("sendledger.store")

#: Seconds the sqlite3 busy handler of the store's connections waits for another writer
#: before SQLITE_BUSY; the ledger tries again within its `store_wait`.
BUSY_TIMEOUT = 30

# Primary result codes; extended codes (e.g. SQLITE_BUSY_SNAPSHOT, 517) keep them in
# their low byte.
_LOCK_CODES = frozenset({sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED})


class SQLiteJobIndexRecorder(
    SQLiteInsertHook, SQLiteApplicationRecorder, SqlJobIndex, SqlKeyChecks
):
    _p = "?"

    def construct_create_table_statements(self) -> list[str]:
        statements = super().construct_create_table_statements()
        # WITHOUT ROWID: the table is its primary key's b-tree, one less b-tree per write.
        statements.extend(
            self._sql(s.replace("{real}", "REAL").replace("{options}", " WITHOUT ROWID"))
            for s in CREATE_STATEMENTS
        )
        return statements

    def beside_events(self, c: SQLiteCursor, kwargs: Mapping[str, Any]) -> None:
        # In the events' transaction (ledger/stores/private_api.py: SQLiteInsertHook).
        if rewrites_from(kwargs):
            # What the rewrite frees is overwritten with zeros, not left in free space.
            c.execute("PRAGMA secure_delete = ON")
            self._rewrite_events(c, kwargs)
        self._write_rows(c, kwargs)
        # On this transaction's connection, which holds the file's one write lock: no
        # other writer commits before this one does (a second pooled connection, asked
        # for here, would wait on the pool that this write holds a seat of).
        hold_unchanged(kwargs, lambda originator_id: self._last_version(c, originator_id))

    def _last_version(self, c: SQLiteCursor, originator_id: UUID) -> int:
        c.execute(
            f"SELECT MAX(originator_version) FROM {self.events_table_name} WHERE originator_id = ?",
            [originator_id.hex],
        )
        row = c.fetchone()
        return 0 if row is None or row[0] is None else int(row[0])

    def _rewrite_sql(self) -> tuple[str, Callable[[Any], Any]]:
        sql = (
            f"UPDATE {self.events_table_name} SET state = ? "
            "WHERE originator_id = ? AND originator_version = ?"
        )
        return sql, _stored_id

    def _changed(self, cursor: Any) -> int:
        return int(cursor.sqlite_cursor.rowcount)

    def _transaction(self, *, commit: bool) -> AbstractContextManager[Any]:
        return self.datastore.transaction(commit=commit)

    def _tuples(self, cursor: Any) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in cursor.fetchall()]

    def _events_of_query(self, job_ids: Sequence[str]) -> tuple[str, list[Any]]:
        # The library stores a UUID originator id as its 32 hex digits.
        marks = ", ".join("?" * len(job_ids))
        sql = (
            f"SELECT originator_id, originator_version, topic, state FROM "
            f"{self.events_table_name} WHERE originator_id IN ({marks}) "
            "ORDER BY originator_id, originator_version"
        )
        return sql, [UUID(job_id).hex for job_id in job_ids]

    def _has_events_sql(self) -> tuple[str, Callable[[str], Any]]:
        sql = f"SELECT 1 FROM {self.events_table_name} WHERE originator_id = ? LIMIT 1"
        return sql, _stored_id

    def _key_table_exists(self, cursor: Any) -> bool:
        cursor.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (KEY_TABLE,)
        )
        return cursor.fetchone() is not None


def _stored_id(originator_id: object) -> str:
    # eventsourcing's SQLite recorder stores a UUID originator id as 32 hex digits.
    return UUID(str(originator_id)).hex


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


#: The first bytes of every SQLite database file (https://sqlite.org/fileformat.html).
_SQLITE_HEADER = b"SQLite format 3\x00"


def refuse_what_is_no_store(path: Path) -> None:
    """StoreUrlError (bad input naming store.url) when `path` cannot be a store: a
    folder, a path under a file, a file that is not SQLite's (the config itself, a note),
    a named pipe or a device (or a symlink to one). Left to SQLite, each was
    "unable to open database file", "Not a directory" or "file is not a database", exit
    1, as if the store had failed rather than the setting; a named pipe waited in
    `open()` for a writer, for good. An empty file is a new store, as SQLite takes it."""
    where = f"store.url: sqlite:{path}"
    if path.is_dir():
        raise StoreUrlError(f"{where} is a directory, not a SQLite file")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise StoreUrlError(f"{where}: {parent} is not a directory")
            break
    try:
        # Not blocking: a named pipe opened so is told by its type, not waited on.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except (FileNotFoundError, NotADirectoryError):
        return  # created next
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # a socket opens not at all: told by its type too
            _refuse_kind(where, os.stat(path).st_mode)
        return  # SQLite says what it is (a file that cannot be read)
    with open(fd, "rb") as file:
        _refuse_kind(where, os.fstat(fd).st_mode)
        head = file.read(len(_SQLITE_HEADER))
    if head and head != _SQLITE_HEADER:
        raise StoreUrlError(f"{where} is not a SQLite database (not SQLite's first bytes)")


def _refuse_kind(where: str, mode: int) -> None:
    kind = file_kind(mode)
    if kind is not None:
        raise StoreUrlError(f"{where} is {kind}, not a SQLite file")


def _link_to_nothing(path: Path) -> Path | None:
    """The first folder on `path` that is a symbolic link to nothing, or None. (A link
    of the file itself has its target made, folders and all: `create_private`.)"""
    for part in reversed(path.parents):
        if part.is_symlink() and not part.exists():
            return part
    return None


def create_private(path: Path, *, new: bool = False) -> None:
    """Create the store's missing folders 0700 and the file 0600, whatever the umask:
    the file holds bodies and addresses. SQLite gives its -wal and -shm files the main
    file's mode. What exists already is left as it is; a symlink to a file not there yet
    has it made at its target so; with `new`, a file already there (or a symlink,
    dangling too) is FileExistsError, asked in the one call that creates."""
    missing = [p for p in [path.parent, *path.parent.parents] if not p.exists()]
    for folder in reversed(missing):
        with contextlib.suppress(FileExistsError):  # another process made it meanwhile
            folder.mkdir(mode=0o700)
            os.chmod(folder, 0o700)  # a umask can only remove bits; make them exact
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        if new:
            raise
        target = Path(os.path.realpath(path))
        if not os.path.lexists(target):
            # A symlink to a file not made yet (a store put on another disk): SQLite
            # would make it with the umask's mode, readable by all; made here, private.
            create_private(target)
        return
    try:
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)


def upgrade_index(store: SqliteStore) -> None:
    """What a store from an earlier release lacks in its job index, added on one
    connection: DDL only when something is missing."""
    with contextlib.closing(sqlite3.connect(store.path, timeout=BUSY_TIMEOUT)) as conn:
        _add_missing_columns(conn)
        _add_missing_indexes(conn)


def _add_missing_columns(conn: sqlite3.Connection) -> None:
    """`ADDED_COLUMNS`."""
    present = {row[1] for row in conn.execute(f"PRAGMA table_info({INDEX_TABLE})")}
    for name, kind in ADDED_COLUMNS:
        if name in present:
            continue
        try:
            conn.execute(f"ALTER TABLE {INDEX_TABLE} ADD COLUMN {name} {kind.format(real='REAL')}")
            if name == "written_at":  # the listing pages by it: every row has one
                conn.execute(f"UPDATE {INDEX_TABLE} SET written_at = updated_at")
            if name == "attempt_provider":
                conn.execute(ATTEMPT_PROVIDER_BACKFILL.replace("{t}", INDEX_TABLE))
            conn.commit()
        except sqlite3.OperationalError as exc:
            if "duplicate column" not in str(exc):  # another process added it first
                raise


def _add_missing_indexes(conn: sqlite3.Connection) -> None:
    """`ADDED_INDEXES`: once, a pass over the table."""
    present = [
        row[0]
        for row in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = ?",
            (INDEX_TABLE,),
        )
    ]
    for statement in missing_indexes(present):
        # IF NOT EXISTS: another process may have created it meanwhile.
        conn.execute(statement.replace("{t}", INDEX_TABLE).replace("{n}", INDEX_TABLE))
        conn.commit()


#: How many short tries a purge's checkpoint makes while a reader holds the WAL (about
#: 0.2 s each) before it reports `"scrubbed": false`; a test may lower it.
CHECKPOINT_ATTEMPTS = 50


def checkpoint(store: SqliteStore) -> bool:
    """Copy the WAL into the file and truncate it to nothing, so that the page images a
    purge replaced are gone from both; a reader holding an old snapshot can delay it.
    True when the WAL is empty. Each attempt waits briefly: a TRUNCATE checkpoint calls the
    busy handler while a reader holds a snapshot, and with the usual 30 s timeout the 50
    attempts held a purge for 25 minutes before it could say `"scrubbed": false`."""
    with contextlib.closing(sqlite3.connect(store.path, timeout=0.1)) as conn:
        conn.execute("PRAGMA secure_delete = ON")
        for _ in range(CHECKPOINT_ATTEMPTS):
            busy, _log, _done = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            if not busy:
                return True
            time.sleep(0.1)
        return False


@contextlib.contextmanager
def _permission_named(store: SqliteStore) -> Iterator[None]:
    """A PermissionError as StoreUnavailable naming the file or folder whose mode caused
    it (`file_access.access_problem`), in the one line of every store refusal; so is the
    error of a file made on a read-only mount (EROFS), which names the mount."""
    try:
        yield
    except OSError as exc:
        if not isinstance(exc, PermissionError) and exc.errno != errno.EROFS:
            raise
        problem = access_problem(store.path) or "permission denied"
        raise StoreUnavailable(store.describe(), problem, exc) from exc


def repair_modes(store: SqliteStore) -> None:
    """`file_access.repair_wal_modes`, in one log line naming what it changed."""
    changed = repair_wal_modes(store.path)
    if changed:
        files = ", ".join(f"{path} (was {before:04o})" for path, before, _after in changed)
        log.warning(
            "store %s: SQLite's %s set to the store file's mode %04o: this user owns but "
            "could not write it (made while the store file was read-only)",
            store.describe(),
            files,
            changed[0][2],
        )


def schema_exists(store: SqliteStore) -> bool:
    """True when the job index table (created last) is already in the file.
    StoreUnavailable when a file's or folder's mode keeps it from being read. Every open
    passes here first: a -wal or -shm of this user's that it may not write is given the
    store file's mode (`repair_modes`)."""
    with _permission_named(store):
        if not store.path.exists():
            return False
    repair_modes(store)
    try:
        with contextlib.closing(sqlite3.connect(store.path, timeout=BUSY_TIMEOUT)) as conn:
            row = conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type='table' AND name=?", (INDEX_TABLE,)
            ).fetchone()
            return row is not None
    except sqlite3.Error as exc:
        # A file this user may not read is there all the same: not "no store at".
        problem = access_problem(store.path) if access_denied(exc) else None
        if problem is not None:
            raise StoreUnavailable(store.describe(), problem, exc) from exc
        # Unknown: let the normal set-up (with its retries) find out.
        return False


class SQLiteJobIndexFactory(SQLiteFactory):
    """The library's SQLite factory, its datastore's pool one whose connections keep their
    prepared statements (`private_api.CachingConnectionPool`)."""

    def __init__(self, env: EnvType | None) -> None:
        super().__init__(env)
        made = self.datastore.pool  # no connection opened yet: replaced as it was made
        self.datastore.pool = CachingConnectionPool(
            db_name=made.db_name,
            lock_timeout=made.lock_timeout,
            pool_size=made.pool_size,
            max_overflow=made.max_overflow,
            pool_timeout=made.pool_timeout,
            max_age=made.max_age,
            pre_ping=made.pre_ping,
        )


@dataclass(frozen=True)
class SQLiteBackend:
    spec: SqliteStore

    @property
    def env(self) -> dict[str, str]:
        return {
            "PERSISTENCE_MODULE": get_topic(SQLiteJobIndexFactory),
            "SQLITE_DBNAME": str(self.spec.path),
            # Seconds the sqlite3 busy handler waits for a writer: several processes
            # share the file, and "database is locked" must never reach a caller.
            "SQLITE_LOCK_TIMEOUT": str(BUSY_TIMEOUT),
            "APPLICATION_RECORDER_TOPIC": get_topic(SQLiteJobIndexRecorder),
        }

    def prepare(self) -> bool:
        # Before anything is made: a folder made, or a store opened, on the folder beneath
        # a disk not mounted would be a new store that knows no job.
        self.spec.refuse_unmounted()
        with _permission_named(self.spec):  # a folder this user may not enter or write
            refuse_what_is_no_store(self.spec.path)
            try:
                create_private(self.spec.path)
            except OSError as exc:
                if isinstance(exc, PermissionError) or exc.errno == errno.EROFS:
                    raise  # said with the folder, or the mount, to change
                link = _link_to_nothing(self.spec.path)
                if exc.errno == errno.ENOENT and link is not None:
                    # The folders made, the file still has no folder: a link on the way
                    # points at nothing, a disk not mounted yet (`StoreFolderNotThere`).
                    raise StoreFolderNotThere(
                        f"store.url: sqlite:{self.spec.path}: cannot make {exc.filename}: "
                        f"{link} is a symbolic link to {os.readlink(link)}, which is not "
                        "there (a file system not mounted yet?)"
                    ) from exc
                # A file system where no file can be made (/proc), at the path or at
                # its symlink's target: the setting's fault, said as such.
                raise StoreUrlError(
                    f"store.url: sqlite:{self.spec.path}: cannot make {exc.filename}: "
                    f"{exc.strerror or exc}"
                ) from exc
        return schema_exists(self.spec)

    def access_problem(self) -> str | None:
        return access_problem(self.spec.path)

    def upgrade(self) -> None:
        upgrade_index(self.spec)

    def scrub(self) -> bool:
        return checkpoint(self.spec)

    def identity_lock(self, name: str) -> FileIdentityLock:
        return FileIdentityLock(self.spec.path, name)

    def names_held(self, names: Collection[str]) -> set[str] | None:
        return file_names_held(self.spec.path, names)

    def is_retryable(self, exc: BaseException) -> bool:
        return is_lock_error(exc)

    def is_setup_race(self, exc: BaseException) -> bool:
        # Several processes creating the tables at once only ever wait on each other.
        return is_lock_error(exc)


__all__ = [
    "SQLiteBackend",
    "SQLiteJobIndexFactory",
    "SQLiteJobIndexRecorder",
    "create_private",
    "is_lock_error",
    "schema_exists",
]
