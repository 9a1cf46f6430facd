"""eventsourcing's private API: every use the store makes of it is here, each named with why
(docs/architecture.md "Stores").

The library's public API saves aggregates and reads events. The store needs three things
it does not offer: a save tried again on a lock error without collecting the events again;
the job's index row (and a purge's rewritten events) written in the very transaction of
the events; and the memory store's index under the same lock as its events. For them it
reaches into the library where nothing public does it:

- `Application._record(processing)` and `Application._notify(recordings)`: `record` and
  `notify`. `save()` collects the pending events and records them in one go: tried again
  after a lock error it would find nothing left to collect (and the caller would send
  with no claim stored). The Ledger collects once, records (trying `record` again
  itself) and notifies.
- `ProcessingEvent.saved_kwargs`, which `_record` passes to the recorder's
  `insert_events(**kwargs)` and on to `_insert_events` or `_update_table`:
  `pass_to_recorder`. The index rows (`index.INDEX_ROWS_KWARG`) and a purge's rewrites
  (`purge.REWRITES_KWARG`) reach the recorder beside the events, so they commit or roll
  back with them.
- `_insert_events(cursor, stored_events, **kwargs)` of the SQLite and PostgreSQL
  recorders: `InsertHook`. The one method called inside the library's insert
  transaction, after the events' rows: where the index rows are upserted and events
  rewritten.
- The SQLite aggregate recorder's `_insert_events`, its events' INSERT in one
  `executemany`: `SQLiteInsertHook`. The application recorder the store's SQLite
  recorder derives from inserts them one `execute` at a time, to read each row's
  `lastrowid` as the event's notification id, which only the `Recording`s handed to
  `Application._notify` carry. The Ledger has no follower to notify (its `_notify` is
  the library's, which does nothing), so its saves say they want no ids
  (`UNNUMBERED_KWARG`): one statement for a commit's events and no recordings built,
  about 5% of the CPU of a commit of four claims (docs/performance.md "Commits per
  job"). The rows and their rowids are the same, in the same order; an insert that
  does not say so returns the ids as the library promises.
- The PostgreSQL recorder's insert function (`construct_pg_stored_event`,
  `sql_invoke_pg_function_insert_events`, `pg_function_name_insert_events`):
  `insert_by_function`. With `POSTGRES_ENABLE_DB_FUNCTIONS` the library's
  `insert_events` calls its function and skips `_insert_events`; the store calls the same
  function in its own transaction, then writes the rows. A write that wants no ids
  (`UNNUMBERED_KWARG`, as on SQLite) leaves the ids the function returns unread and
  returns none: no rows made of them, no recordings built.
- The POPO recorder's `_update_table(stored_events, **kwargs)`, `_database_lock`,
  `_stored_events_index` and `_stored_events`: `MemoryHook`. The memory store's insert,
  under the recorder's lock after its uniqueness check: the index and a purge's rewrites
  change with the events or not at all.
- The SQLite connection pool's `_create_connection`, its one template method for a new
  connection: `CachingConnectionPool`. The library opens each connection with
  `cached_statements=True`, which sqlite3 reads as a cache of one statement, so every
  transaction prepared each of its statements again (BEGIN, the events' INSERT, the index
  row's UPSERT, COMMIT): about 50 us for the UPSERT alone, 0.09 CPU-ms a message in
  bench/smtp_senders.py (docs/performance.md "The SMTP path"). The override opens the
  connection as the library does, with a cache of `STATEMENT_CACHE` statements, and
  checkpoints its WAL past `WAL_CHECKPOINT_PAGES` pages instead of SQLite's 1,000, its
  `-wal` cut back to `WAL_SIZE_LIMIT` when SQLite starts it over.
- The same pool's `_pool`, the idle connections its `_get_connection` takes with
  `popleft()` and `put_connection` gives back with `append()`: `CachingConnectionPool`
  makes it `LastReturnedFirst`, whose `popleft()` takes the connection returned last.
  In turn, every save of a daemon with several threads ran on the connection idle
  longest, which another connection's commits had made drop its page cache (SQLite in
  WAL mode drops it when the log changed since the connection's last transaction), so
  it read each page of its b-trees back: 10.7-12.9 file reads a job in
  bench/pipeline.py (a), 1.7-1.9 with the connection returned last (docs/performance.md
  "Commits per job").
- `Aggregate._create`, in `ledger/job.py` and `ledger/provider_handle.py`: documented by
  the library for an aggregate's own creation method; the domain imports no store
  module, so the two calls stay where they are.

Each use breaks loudly when the library changes it (an AttributeError, a test of
`tests/integration/test_private_api.py`); `make test` runs that file against the newest
eventsourcing release too (`make test-eventsourcing`, docs/development.md).
"""

from __future__ import annotations

import sqlite3
from collections import deque
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any
from uuid import UUID

from eventsourcing.persistence import InterfaceError
from eventsourcing.sqlite import (
    SQLITE3_DEFAULT_LOCK_TIMEOUT,
    SQLiteAggregateRecorder,
    SQLiteConnection,
    SQLiteConnectionPool,
)

if TYPE_CHECKING:
    from eventsourcing.application import Application, ProcessingEvent
    from eventsourcing.persistence import Recording, StoredEvent
    from eventsourcing.postgres import PostgresApplicationRecorder


def record(app: Application[UUID], processing: ProcessingEvent[UUID]) -> list[Recording[UUID]]:
    """Record the events `processing` holds (and what `pass_to_recorder` put beside them):
    one try, which the caller may make again; then `notify` as `save()` does."""
    return app._record(processing)


def notify(app: Application[UUID], recordings: list[Recording[UUID]]) -> None:
    """Tell the application's followers of what `record` recorded, as `save()` does."""
    app._notify(recordings)


def pass_to_recorder(processing: ProcessingEvent[UUID], **kwargs: Any) -> None:
    """Hand `kwargs` to the recorder's insert with the events (read there from `kwargs`)."""
    processing.saved_kwargs.update(kwargs)


class InsertHook:
    """Mixed into a SQL recorder (before the library's class): `beside_events` runs in the
    insert's transaction, after the events were written, with the keyword arguments
    `pass_to_recorder` gave; what it writes commits or rolls back with them."""

    def _insert_events(self, *args: Any, **kwargs: Any) -> Any:
        # (cursor, stored_events, **kwargs), as each library recorder names them; SQLite's
        # returns the notification ids, PostgreSQL's None: passed on as they are.
        ids = super()._insert_events(*args, **kwargs)  # type: ignore[misc]
        self.beside_events(args[0], kwargs)
        return ids

    def beside_events(self, cursor: Any, kwargs: Mapping[str, Any]) -> None:
        raise NotImplementedError


#: The keyword argument (`pass_to_recorder`) of a write whose caller wants no notification
#: ids back: on SQLite its events are inserted in one statement (`SQLiteInsertHook`).
UNNUMBERED_KWARG = "sendledger_unnumbered"


class SQLiteInsertHook(InsertHook):
    """`InsertHook` for the SQLite recorder: a write that wants no notification ids
    (`UNNUMBERED_KWARG`) has its events inserted in one statement, as the library's
    aggregate recorder writes them, and returns none, so the library builds no
    recordings (see the module); any other as the application recorder does."""

    def _insert_events(self, *args: Any, **kwargs: Any) -> Any:
        # (cursor, stored_events, **kwargs), as the library's recorders name them.
        if not kwargs.get(UNNUMBERED_KWARG):
            return super()._insert_events(*args, **kwargs)
        SQLiteAggregateRecorder._insert_events(self, *args, **kwargs)  # type: ignore[arg-type]
        self.beside_events(args[0], kwargs)
        return None


def insert_by_function(
    recorder: PostgresApplicationRecorder,
    cursor: Any,
    stored_events: Sequence[StoredEvent],
    kwargs: Mapping[str, Any],
) -> list[int] | None:
    """The events inserted by the library's PostgreSQL function, on `cursor` (in the
    caller's transaction): their notification ids, or None for a write that wants none
    (`UNNUMBERED_KWARG` in `kwargs`), whose rows the function returns are left unread."""
    rows = [
        recorder.construct_pg_stored_event(e.originator_id, e.originator_version, e.topic, e.state)
        for e in stored_events
    ]
    cursor.execute(recorder.sql_invoke_pg_function_insert_events, (rows,), prepare=True)
    if kwargs.get(UNNUMBERED_KWARG):
        return None
    return [int(r[recorder.pg_function_name_insert_events]) for r in cursor.fetchall()]


class MemoryHook:
    """Mixed into the POPO recorder (before the library's class). `check_beside` runs
    under the recorder's lock after the events' uniqueness check and may refuse the whole
    insert; `write_beside` after the events were added. The index and the stored events
    are reached through the methods below, under `database_lock`."""

    #: The lock the library holds around every read and write of its events: read from
    #: its private name once, when the recorder is made, then a plain attribute that
    #: the store's every read takes.
    database_lock: AbstractContextManager[Any]

    def __init__(self) -> None:
        super().__init__()
        self.database_lock = self._database_lock  # type: ignore[attr-defined]

    def _update_table(
        self, stored_events: Sequence[StoredEvent], **kwargs: Any
    ) -> Sequence[int] | None:
        self.check_beside(kwargs)
        ids: Sequence[int] | None = super()._update_table(  # type: ignore[misc]
            stored_events, **kwargs
        )
        self.write_beside(kwargs)
        return ids

    def check_beside(self, kwargs: Mapping[str, Any]) -> None:
        raise NotImplementedError

    def write_beside(self, kwargs: Mapping[str, Any]) -> None:
        raise NotImplementedError

    def stored_position(self, originator_id: UUID | str, version: int) -> int | None:
        """Where the event (`originator_id`, `version`) is in the stored list, if stored."""
        index: Mapping[str, Mapping[int, int]] = self._stored_events_index  # type: ignore[attr-defined]
        return index.get(str(originator_id), {}).get(version)

    def last_version(self, originator_id: UUID) -> int:
        """The version of the last event of `originator_id` stored (0: none)."""
        index: Mapping[str, Mapping[int, int]] = self._stored_events_index  # type: ignore[attr-defined]
        return max(index.get(str(originator_id), {}), default=0)

    def replace_stored(self, position: int, event: StoredEvent) -> None:
        """Put `event` in place of the stored event at `position`."""
        self._stored_events[position] = event  # type: ignore[attr-defined]


#: Prepared statements each SQLite connection keeps (sqlite3's own default): the store's
#: statements are a few dozen, `events_of` one per number of keys asked for.
STATEMENT_CACHE = 128
#: The WAL's length, in pages, past which a commit copies it into the database file
#: (SQLite's `wal_autocheckpoint`, 1,000 by default). The commit that passes it pays the
#: checkpoint: it reads each frame back and writes each page once, however often the WAL
#: holds it, then syncs the file. A job's commits write the same few pages again and again
#: (the events' last page, the stamps' index, the b-trees' inner pages), so a longer WAL
#: copies fewer pages a commit: 5-15% of a claim's commit's CPU (docs/performance.md
#: "Commits per job"), for a WAL file of up to 16 MB instead of 4 MB while the store is
#: open, and a checkpoint four times as long in the commit that makes it.
WAL_CHECKPOINT_PAGES = 4000
#: The `-wal`'s size, in bytes, it is cut back to when SQLite starts it over after a
#: checkpoint (`journal_size_limit`; SQLite's default keeps it at the largest it grew to,
#: for as long as the store is open). A reader that holds one snapshot (a backup, a long
#: `admin copy-store`) keeps a checkpoint from copying what was written since, so the log
#: grows past `WAL_CHECKPOINT_PAGES` while it reads, as does a transaction larger than
#: that; without a limit a daemon kept that size until its stop. 20 MiB is above what
#: 4,000 pages of 4 KiB and the commit that passes them take, so an ordinary log is never
#: cut.
WAL_SIZE_LIMIT = 20 * 2**20


class LastReturnedFirst(deque[SQLiteConnection]):
    """A pool's idle connections, the one returned last handed out first: of them the
    one that missed the fewest commits of the others since its last transaction, and
    most often none, so that it keeps its page cache (see the module)."""

    def popleft(self) -> SQLiteConnection:
        return self.pop()


class CachingConnectionPool(SQLiteConnectionPool):
    """The library's SQLite pool, its connections keeping `STATEMENT_CACHE` prepared
    statements instead of one, and handed out the one returned last first
    (`LastReturnedFirst`). `_create_connection` is the library's, but for the cache and
    the WAL's checkpoint (`WAL_CHECKPOINT_PAGES`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._pool = LastReturnedFirst(self._pool)

    def _create_connection(self) -> SQLiteConnection:
        try:
            c = sqlite3.connect(
                database=self.db_name,
                uri=True,
                check_same_thread=False,
                isolation_level=None,  # autocommit: the library begins its own transactions
                cached_statements=STATEMENT_CACHE,
                timeout=self.lock_timeout or SQLITE3_DEFAULT_LOCK_TIMEOUT,
            )
        except (sqlite3.Error, TypeError) as e:
            raise InterfaceError(e) from e
        if not self.is_sqlite_memory_mode and not self.is_journal_mode_wal:
            mode = c.execute("PRAGMA journal_mode;").fetchone()[0]
            if mode.lower() != "wal":
                c.execute("PRAGMA journal_mode=WAL;")
                self.journal_mode_was_changed_to_wal = True
            self.is_journal_mode_wal = True
        if not self.is_sqlite_memory_mode:
            c.execute(f"PRAGMA wal_autocheckpoint = {WAL_CHECKPOINT_PAGES}")
            c.execute(f"PRAGMA journal_size_limit = {WAL_SIZE_LIMIT}")
        c.row_factory = sqlite3.Row
        return SQLiteConnection(sqlite_conn=c, max_age=self.max_age)


__all__ = [
    "STATEMENT_CACHE",
    "UNNUMBERED_KWARG",
    "WAL_CHECKPOINT_PAGES",
    "WAL_SIZE_LIMIT",
    "CachingConnectionPool",
    "InsertHook",
    "LastReturnedFirst",
    "MemoryHook",
    "SQLiteInsertHook",
    "insert_by_function",
    "notify",
    "pass_to_recorder",
    "record",
]
