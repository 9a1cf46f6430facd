"""Where each webhook has got to in the event log: one row per webhook beside the events
(docs/http-api.md "Webhooks", docs/architecture.md "Webhooks").

A row says: every notification id up to `position` is handled for this webhook (delivered,
or not one of its events); the next event is retried no sooner than `next_at` after
`failures` failed attempts. Several daemons on one store share the rows: a daemon works on
a webhook only while it holds the row's lease (`owner`, `lease_until`), and every change is
a compare-and-set on `position`, so a daemon whose lease ran out can at worst deliver an
event again, never move the position past one that was not delivered.

`horizon` answers the one question the notification log alone cannot: up to which id is
the log final? SQLite has one writer at a time and the memory store one lock, so every id
below the highest visible one is committed or gone for good. PostgreSQL hands out ids
from a sequence to concurrent transactions (sendledger's insert function takes no table
lock), so id 11 can be visible while 10 is still being written: a gap below the highest
id is waited out with a SHARE lock on the events table, which is granted once every
transaction that was inserting has ended (docs/http-api.md "Webhooks" says what that costs).
It looks a bounded number of ids ahead; `final_end` asks it until it stops moving or
reaches the end visible when it began (a busy store is read up to where it was, not chased).
`events_up_to` counts what a walk to an id should have read: a save in flight while the
walk passed its id commits below it (`admin copy-store` asks before its mark).
`settled_end` is the log's end once no save is in flight, on SQLite too: a save holds its
id (PostgreSQL) or the write lock (SQLite) before it commits, and commits past the end a
plain read sees (`admin copy-store` asks after its mark).

`reader_start` is where a reader of what is recorded from now on starts (the recorded
metrics, `daemon/api/recorded_metrics.py`). The highest visible id is not it on
PostgreSQL: a save in flight may hold a lower id and commit later, and a reader from there
never reads it. It starts below the first gap of the newest ids instead, and passes over
the ids after it that were committed already.

Creating the table is left to the first daemon that has a webhook (`ensure`), so stores
without webhooks never carry it and opening a store runs no new DDL.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, replace
from typing import Any, Protocol

from ledger.stores.causes import locked
from ledger.stores.recorder_kind import ByBackend, postgres_table

POSITIONS_TABLE = "sendledger_webhook_positions"
COLUMNS = (
    "name",
    "position",
    "failures",
    "next_at",
    "last_error",
    "last_error_at",
    "delivered",
    "failed",
    "owner",
    "lease_until",
    "updated_at",
)
CREATE = (
    "CREATE TABLE IF NOT EXISTS {t} (name TEXT PRIMARY KEY, position BIGINT NOT NULL, "
    "failures INTEGER NOT NULL, next_at {real}, last_error TEXT, last_error_at {real}, "
    "delivered BIGINT NOT NULL, failed BIGINT NOT NULL, owner TEXT NOT NULL, "
    "lease_until {real} NOT NULL, updated_at {real} NOT NULL)"
)
#: Ids scanned at once when PostgreSQL looks for a gap (`PostgresPositions.horizon`,
#: `PostgresPositions.reader_start`).
GAP_SCAN = 1000
#: How long PostgreSQL's gap check waits for inserts in flight (milliseconds).
LOCK_WAIT_MS = 250
_MAX_ID = "SELECT COALESCE(MAX({id}), 0) FROM {events}"

#: Seconds one try for SQLite's write lock waits in C: the busy timeout is waited out in
#: such tries, so a Ctrl-C's handler, which runs between two, is not held for all of it.
LOCK_TRY = 0.1


@dataclass(frozen=True)
class Position:
    name: str
    position: int  # every notification id <= position is handled
    failures: int  # failed attempts of the event after `position`, since it last moved
    next_at: float | None  # epoch seconds: no attempt before
    last_error: str | None
    last_error_at: float | None
    delivered: int  # deliveries that got a 2xx, ever
    failed: int  # attempts that did not, ever
    owner: str  # the daemon holding the lease ("" before anyone took it)
    lease_until: float
    updated_at: float

    def as_dict(self) -> dict[str, Any]:
        return {c: getattr(self, c) for c in COLUMNS}


@dataclass(frozen=True)
class LogStart:
    """Where a reader of the events recorded from now on starts: every id up to
    `position` was committed before now or never will be; of the ids after it, those in
    `committed` were committed before now (passed over as they are read), any other is
    committed after now, if ever."""

    position: int
    committed: frozenset[int] = frozenset()


def _fresh(name: str, now: float) -> Position:
    return Position(name, 0, 0, None, None, None, 0, 0, "", 0.0, now)


class PositionStore(Protocol):
    """The position rows of one store. Times are epoch seconds from the caller's clock."""

    def ensure(self) -> None:
        """Create the table if the store lacks it (safe to race other daemons)."""
        ...

    def read_all(self) -> list[Position]:
        """Every row, by name; none when the table does not exist (nothing is created)."""
        ...

    def claim(self, name: str, owner: str, now: float, lease: float) -> Position | None:
        """Take the lease on `name` until now + lease (renewed once half of it is gone)
        and return the row; None while another owner's lease runs. A webhook seen for the
        first time starts at the beginning of the log."""
        ...

    def advance(
        self,
        name: str,
        owner: str,
        expected: int,
        new: int,
        delivered: int,
        now: float,
        lease: float,
    ) -> bool:
        """Move from `expected` to `new` (failures and the last error cleared: the
        position moved, so nothing is failing now; `delivered` added, the lease
        renewed); False when the row is no longer ours at `expected` (nothing changed)."""
        ...

    def fail(
        self,
        name: str,
        owner: str,
        expected: int,
        error: str,
        next_at: float,
        now: float,
        lease: float,
    ) -> bool:
        """Record a failed attempt of the event after `expected`; False as for `advance`."""
        ...

    def scrub_error(self, name: str, error: str, scrubbed: str) -> bool:
        """A purge's rewrite of the last error (`error`, as read) to `scrubbed`: a
        receiver's answer may quote the payload, and with it what the purge removes.
        Nothing else changes; False when the row's last error is another by now."""
        ...

    def force(self, name: str, position: int, now: float, *, expected: int) -> bool:
        """An operator's move (`sendledger webhooks skip`): the position set to
        `position` whoever holds the lease, failures and the last error cleared (the
        event they were about is skipped; the receiver's words may quote its payload),
        when it is still `expected` (the one the operator's skip was worked out from: a
        daemon that delivered meanwhile must not be moved back, or those events go out
        again); False, nothing changed, otherwise. A daemon delivering meanwhile finds
        the position moved and starts again from it."""
        ...

    def release(self, name: str, owner: str) -> None:
        """Give the lease up (a stopping daemon), so that another takes over at once."""
        ...

    def horizon(self, after: int) -> int:
        """An id up to which the log is final: every id <= it is committed or never will
        be. At least `after` (the caller's position)."""
        ...

    def reader_start(self) -> LogStart:
        """Where a reader of the events recorded from now on starts (see the module)."""
        ...

    def visible_end(self) -> int:
        """The highest id visible now (PostgreSQL: committed, with gaps maybe below)."""
        ...

    def events_up_to(self, last: int) -> int | None:
        """How many events the log holds with ids <= `last`, once no save is in flight:
        a walk up to `last` that read fewer passed a save then in flight (PostgreSQL).
        None when a save still in flight outlasted `[store] lock_timeout`: it may yet
        commit below `last`."""
        ...

    def settled_end(self) -> int | None:
        """The highest id once no save is in flight: every save that began before the
        ask is in it, or gone for good. None when one still in flight outlasted the
        store's wait for a writer (PostgreSQL: `[store] lock_timeout`; SQLite: its busy
        timeout): it may yet commit past the end read."""
        ...


# One lock for the rows of every memory store: their writes are dictionary updates.
_memory_lock = threading.Lock()


class _FinalAsVisible:
    """A log written one insert at a time (memory: one lock around them; SQLite: one
    writer): what is visible is final, with no gap to wait out. PostgreSQL's overrides."""

    _recorder: Any

    def horizon(self, after: int) -> int:
        return max(after, _log_end(self._recorder))

    def reader_start(self) -> LogStart:
        return LogStart(_log_end(self._recorder))

    def visible_end(self) -> int:
        return _log_end(self._recorder)

    def settled_end(self) -> int | None:
        # Memory: each insert is whole under one lock, nothing in flight to wait for.
        return _log_end(self._recorder)


class MemoryPositions(_FinalAsVisible):
    """The memory store's rows, shared by every Ledger on the same recorder."""

    def __init__(self, recorder: Any) -> None:
        self._recorder = recorder
        self._lock = _memory_lock
        with _memory_lock:
            rows: dict[str, Position] | None = getattr(recorder, "_sendledger_positions", None)
            if rows is None:
                rows = {}
                recorder._sendledger_positions = rows
        self._rows = rows

    def ensure(self) -> None:
        pass

    def read_all(self) -> list[Position]:
        with self._lock:
            return [self._rows[name] for name in sorted(self._rows)]

    def claim(self, name: str, owner: str, now: float, lease: float) -> Position | None:
        with self._lock:
            row = self._rows.get(name) or _fresh(name, now)
            if row.owner not in ("", owner) and row.lease_until >= now:
                self._rows[name] = row
                return None
            if row.owner != owner or row.lease_until < now + lease / 2:
                row = replace(row, owner=owner, lease_until=now + lease)
            self._rows[name] = row
            return row

    def advance(
        self,
        name: str,
        owner: str,
        expected: int,
        new: int,
        delivered: int,
        now: float,
        lease: float,
    ) -> bool:
        return self._change(
            name,
            owner,
            expected,
            lambda row: replace(
                row,
                position=new,
                failures=0,
                next_at=None,
                last_error=None,
                last_error_at=None,
                delivered=row.delivered + delivered,
                lease_until=now + lease,
                updated_at=now,
            ),
        )

    def fail(
        self,
        name: str,
        owner: str,
        expected: int,
        error: str,
        next_at: float,
        now: float,
        lease: float,
    ) -> bool:
        return self._change(
            name,
            owner,
            expected,
            lambda row: replace(
                row,
                failures=row.failures + 1,
                next_at=next_at,
                last_error=error,
                last_error_at=now,
                failed=row.failed + 1,
                lease_until=now + lease,
                updated_at=now,
            ),
        )

    def _change(self, name: str, owner: str, expected: int, change: Any) -> bool:
        with self._lock:
            row = self._rows.get(name)
            if row is None or row.owner != owner or row.position != expected:
                return False
            self._rows[name] = change(row)
            return True

    def scrub_error(self, name: str, error: str, scrubbed: str) -> bool:
        with self._lock:
            row = self._rows.get(name)
            if row is None or row.last_error != error:
                return False
            self._rows[name] = replace(row, last_error=scrubbed)
            return True

    def force(self, name: str, position: int, now: float, *, expected: int) -> bool:
        with self._lock:
            row = self._rows.get(name) or _fresh(name, now)
            if row.position != expected:
                return False
            self._rows[name] = replace(
                row,
                position=position,
                failures=0,
                next_at=None,
                last_error=None,
                last_error_at=None,
                updated_at=now,
            )
            return True

    def release(self, name: str, owner: str) -> None:
        with self._lock:
            row = self._rows.get(name)
            if row is not None and row.owner == owner:
                self._rows[name] = replace(row, lease_until=0.0)

    def events_up_to(self, last: int) -> int | None:
        # A test store's: every event in memory.
        return len(self._recorder.select_notifications(start=1, limit=last, stop=last))


_CLAIM_INSERT = (
    "INSERT INTO {t} ("
    + ", ".join(COLUMNS)
    + ") VALUES ("
    + ", ".join(["{p}"] * len(COLUMNS))
    + ") ON CONFLICT (name) DO NOTHING"
)
_CLAIM_UPDATE = (
    "UPDATE {t} SET owner = {p}, lease_until = {p} "
    "WHERE name = {p} AND (owner = {p} OR owner = '' OR lease_until < {p})"
)
_SELECT = "SELECT " + ", ".join(COLUMNS) + " FROM {t}"
_ADVANCE = (
    "UPDATE {t} SET position = {p}, failures = 0, next_at = NULL, last_error = NULL, "
    "last_error_at = NULL, delivered = delivered + {p}, lease_until = {p}, updated_at = {p} "
    "WHERE name = {p} AND owner = {p} AND position = {p} RETURNING position"
)
_FAIL = (
    "UPDATE {t} SET failures = failures + 1, next_at = {p}, last_error = {p}, "
    "last_error_at = {p}, failed = failed + 1, lease_until = {p}, updated_at = {p} "
    "WHERE name = {p} AND owner = {p} AND position = {p} RETURNING position"
)
_RELEASE = "UPDATE {t} SET lease_until = 0 WHERE name = {p} AND owner = {p}"
_SCRUB_ERROR = (
    "UPDATE {t} SET last_error = {p} WHERE name = {p} AND last_error = {p} RETURNING name"
)
_FORCE = (
    "UPDATE {t} SET position = {p}, failures = 0, next_at = NULL, last_error = NULL, "
    "last_error_at = NULL, updated_at = {p} "
    "WHERE name = {p} AND position = {p} RETURNING position"
)


class SqlPositions(_FinalAsVisible):
    """The rows in SQL, on the recorder's own datastore (its pool, its transactions).
    Subclasses give the placeholder, the qualified table name, the REAL type and how a
    cursor's rows read."""

    _p = "?"
    _real = "REAL"
    _id = "rowid"  # the notification id: eventsourcing's SQLite events table has no column

    def __init__(self, recorder: Any) -> None:
        self._recorder = recorder
        self._ensured = False

    # -- what a backend supplies ---------------------------------------------------

    def _table(self) -> str:
        return POSITIONS_TABLE

    def _exists(self) -> bool:
        raise NotImplementedError

    def _rows(self, cursor: Any) -> list[tuple[Any, ...]]:
        raise NotImplementedError

    def _transaction(self, *, commit: bool) -> AbstractContextManager[Any]:
        result: AbstractContextManager[Any] = self._recorder.datastore.transaction(commit=commit)
        return result

    # -- the queries ----------------------------------------------------------------

    def _sql(self, template: str) -> str:
        return template.replace("{t}", self._table()).replace("{p}", self._p)

    def ensure(self) -> None:
        if self._ensured:
            return
        with self._transaction(commit=True) as cursor:
            cursor.execute(self._sql(CREATE).replace("{real}", self._real))
        self._ensured = True

    def read_all(self) -> list[Position]:
        if not self._ensured and not self._exists():
            return []
        with self._transaction(commit=False) as cursor:
            cursor.execute(self._sql(_SELECT + " ORDER BY name"))
            return [Position(*row) for row in self._rows(cursor)]

    def claim(self, name: str, owner: str, now: float, lease: float) -> Position | None:
        self.ensure()
        # Most passes find their own lease still fresh, or another daemon's running:
        # a read, no write.
        with self._transaction(commit=False) as cursor:
            cursor.execute(self._sql(_SELECT + " WHERE name = {p}"), [name])
            rows = self._rows(cursor)
        if rows:
            row = Position(*rows[0])
            if row.owner == owner and row.lease_until >= now + lease / 2:
                return row
            if row.owner not in ("", owner) and row.lease_until >= now:
                return None
        with self._transaction(commit=True) as cursor:
            cursor.execute(self._sql(_CLAIM_INSERT), list(_fresh(name, now).as_dict().values()))
            cursor.execute(self._sql(_CLAIM_UPDATE), [owner, now + lease, name, owner, now])
            cursor.execute(self._sql(_SELECT + " WHERE name = {p}"), [name])
            rows = self._rows(cursor)
        claimed = Position(*rows[0]) if rows else None
        return claimed if claimed is not None and claimed.owner == owner else None

    def advance(
        self,
        name: str,
        owner: str,
        expected: int,
        new: int,
        delivered: int,
        now: float,
        lease: float,
    ) -> bool:
        params = [new, delivered, now + lease, now, name, owner, expected]
        return self._changed(_ADVANCE, params)

    def fail(
        self,
        name: str,
        owner: str,
        expected: int,
        error: str,
        next_at: float,
        now: float,
        lease: float,
    ) -> bool:
        params = [next_at, error, now, now + lease, now, name, owner, expected]
        return self._changed(_FAIL, params)

    def _changed(self, template: str, params: list[Any]) -> bool:
        with self._transaction(commit=True) as cursor:
            cursor.execute(self._sql(template), params)
            return bool(self._rows(cursor))

    def scrub_error(self, name: str, error: str, scrubbed: str) -> bool:
        with self._transaction(commit=True) as cursor:
            self._erasing(cursor)
            cursor.execute(self._sql(_SCRUB_ERROR), [scrubbed, name, error])
            return bool(self._rows(cursor))

    def _erasing(self, cursor: Any) -> None:
        """Before a scrub's write: make the backend overwrite what it frees."""

    def force(self, name: str, position: int, now: float, *, expected: int) -> bool:
        self.ensure()
        with self._transaction(commit=True) as cursor:
            cursor.execute(self._sql(_CLAIM_INSERT), list(_fresh(name, now).as_dict().values()))
            cursor.execute(self._sql(_FORCE), [position, now, name, expected])
            return bool(self._rows(cursor))

    def release(self, name: str, owner: str) -> None:
        with self._transaction(commit=True) as cursor:
            cursor.execute(self._sql(_RELEASE), [name, owner])

    def events_up_to(self, last: int) -> int | None:
        with self._transaction(commit=False) as cursor:
            cursor.execute(
                f"SELECT COUNT(*) FROM {self._events()} WHERE {self._id} <= {self._p}",
                [last],
            )
            return int(self._rows(cursor)[0][0])

    def _events(self) -> str:
        return str(self._recorder.events_table_name)


class SqlitePositions(SqlPositions):
    def _erasing(self, cursor: Any) -> None:
        # As for a purge's rewrite of events: the old text is zeroed, not left in the
        # page's free space (the WAL is checkpointed and truncated after the purge).
        cursor.execute("PRAGMA secure_delete = ON")

    def _exists(self) -> bool:
        with self._transaction(commit=False) as cursor:
            cursor.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", [POSITIONS_TABLE]
            )
            return bool(cursor.fetchall())

    def _rows(self, cursor: Any) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in cursor.fetchall()]

    def settled_end(self) -> int | None:
        # A save holds the write lock from its insert to its commit, and its id is past
        # the end a read sees meanwhile: the end is read under the write lock, granted
        # once the save has ended (waited the store's busy timeout, as any write waits).
        try:
            with self._recorder.datastore.get_connection(commit=True) as connection:
                cursor = connection.cursor().sqlite_cursor
                _begin_immediate(cursor)
                try:
                    cursor.execute(_MAX_ID.format(id=self._id, events=self._events()))
                    return int(cursor.fetchone()[0])
                finally:
                    connection.rollback()
        except sqlite3.OperationalError as exc:
            if locked(exc):
                return None
            raise


def _begin_immediate(cursor: Any) -> None:
    """BEGIN IMMEDIATE, waiting for the write lock the connection's busy timeout in tries
    of :data:`LOCK_TRY`. One C call waiting all of it (30 s) held `admin copy-store`'s
    second Ctrl-C, which interrupts at once, until it ended (docs/operations.md "Moving
    to PostgreSQL")."""
    cursor.execute("PRAGMA busy_timeout")
    wait_ms = int(cursor.fetchone()[0])
    deadline = time.monotonic() + wait_ms / 1000
    cursor.execute(f"PRAGMA busy_timeout = {min(wait_ms, int(LOCK_TRY * 1000))}")
    try:
        while True:
            try:
                cursor.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                if not locked(exc) or time.monotonic() >= deadline:
                    raise
    finally:
        cursor.execute(f"PRAGMA busy_timeout = {wait_ms}")


class PostgresPositions(SqlPositions):
    _p = "%s"
    _real = "DOUBLE PRECISION"
    _id = "notification_id"

    def __init__(self, recorder: Any) -> None:
        super().__init__(recorder)
        self._final = 0  # every id up to it is committed or never will be

    def _schema(self) -> str:
        return str(self._recorder.datastore.schema).replace('"', '""')

    def _table(self) -> str:
        return postgres_table(self._recorder, POSITIONS_TABLE)

    def _events(self) -> str:
        table = str(self._recorder.events_table_name).replace('"', '""')
        return f'"{self._schema()}"."{table}"'

    def _exists(self) -> bool:
        with self._transaction(commit=False) as cursor:
            cursor.execute("SELECT to_regclass(%s) IS NOT NULL AS found", [self._table()])
            return bool(self._rows(cursor)[0][0])

    def _rows(self, cursor: Any) -> list[tuple[Any, ...]]:
        return [tuple(r.values()) for r in cursor.fetchall()]

    @contextmanager
    def _transaction(self, *, commit: bool) -> Iterator[Any]:
        # A row another session holds (an open psql that touched it) is waited for
        # `[store] lock_timeout`, not without limit: a pass stuck on it held its webhook,
        # a stop's release and `webhooks skip` as long (the gap check sets its own).
        with super()._transaction(commit=commit) as cursor:
            timeout = int(self._recorder.datastore.lock_timeout)
            cursor.execute(f"SET LOCAL lock_timeout = '{timeout}s'")
            yield cursor

    def ensure(self) -> None:
        # Two daemons creating the table at once: one of them meets the other's
        # catalog row (unique_violation); the table is then there.
        try:
            super().ensure()
        except Exception:
            if not self._exists():
                raise
            self._ensured = True

    def horizon(self, after: int) -> int:
        # Below `_final` the log was found final earlier (finality never ends): scan on
        # from there, so a gap once settled costs no second lock.
        start = max(after, self._final)
        with self._transaction(commit=False) as cursor:
            cursor.execute(
                f"SELECT notification_id FROM {self._events()} WHERE notification_id > %s "
                "ORDER BY notification_id LIMIT %s",
                [start, GAP_SCAN],
            )
            ids = [int(row[0]) for row in self._rows(cursor)]
        contiguous = start
        for notification_id in ids:
            if notification_id != contiguous + 1:
                break
            contiguous = notification_id
        if contiguous != (ids[-1] if ids else start):
            contiguous = max(contiguous, self._settled_max())  # a gap below newer ids
        self._final = contiguous
        return contiguous

    def reader_start(self) -> LogStart:
        # The newest GAP_SCAN ids, read at once: a missing one is a save still in flight
        # or one rolled back, which no read tells apart without waiting (`_settled_max`).
        # So the start is below the first missing one, and the ids above it are passed
        # over as read. A save in flight below the newest GAP_SCAN ids is taken for one
        # rolled back: it would have waited while a thousand later ones committed.
        with self._transaction(commit=False) as cursor:
            cursor.execute(
                f"SELECT notification_id FROM {self._events()} "
                "ORDER BY notification_id DESC LIMIT %s",
                [GAP_SCAN],
            )
            ids = sorted(int(row[0]) for row in self._rows(cursor))
        position = ids[0] - 1 if len(ids) == GAP_SCAN else 0
        for notification_id in ids:
            if notification_id != position + 1:
                break
            position = notification_id
        return LogStart(position, frozenset(i for i in ids if i > position))

    def events_up_to(self, last: int) -> int | None:
        # Counted once no save is in flight: one that took its id and has not committed
        # may commit below `last` after a count that did not wait for it (a fork, for
        # `admin copy-store`). Waited `[store] lock_timeout`, as any of its locks.
        return self._settled(
            f"SELECT COUNT(*) FROM {self._events()} WHERE notification_id <= %s", [last]
        )

    def settled_end(self) -> int | None:
        return self._settled(_MAX_ID.format(id=self._id, events=self._events()), [])

    def _settled_max(self) -> int:
        """The highest id once every inserting transaction has ended. Writers queue
        behind the request while it waits, so it waits briefly (LOCK_WAIT); 0 when that
        was not enough (a long transaction): the caller delivers up to the gap and asks
        again."""
        found = self._settled(
            _MAX_ID.format(id=self._id, events=self._events()), [], wait=f"{LOCK_WAIT_MS}ms"
        )
        return found or 0

    def _settled(self, query: str, args: list[Any], wait: str | None = None) -> int | None:
        """`query`'s number once every inserting transaction has ended: the SHARE lock
        waits for them (they hold ROW EXCLUSIVE until they commit or roll back) and lets
        none start until it is released, a moment later. None when one outlasted the
        wait (`wait`: a lock_timeout; None: the store's)."""
        try:
            with self._transaction(commit=False) as cursor:
                if wait is not None:
                    cursor.execute(f"SET LOCAL lock_timeout = '{wait}'")
                cursor.execute(f"LOCK TABLE {self._events()} IN SHARE MODE")
                cursor.execute(query, args)
                return int(self._rows(cursor)[0][0])
        except Exception as exc:
            if locked(exc):
                return None
            raise


def final_end(positions: PositionStore, after: int) -> int:
    """The end of the log as far as it is final, from `after`: `horizon` looks a bounded
    number of ids ahead (PostgreSQL: GAP_SCAN), so it is asked again until it stops
    moving (at a gap still in flight) or has reached the end visible when this began.
    Not beyond: on a store that keeps saving, a newer save in flight leaves a gap at
    each ask, and each gap costs a SHARE lock that holds every save up for as long as it
    waits; chasing them, a scrape or a skip went on as long as the saves did."""
    visible = positions.visible_end()
    end = positions.horizon(after)
    while end < visible and (further := positions.horizon(end)) > end:
        end = further
    return end


def _log_end(recorder: Any) -> int:
    return int(recorder.max_notification_id() or 0)


def positions_for(recorder: Any) -> PositionStore:
    """The position rows of the store `recorder` (a Ledger's) writes to."""
    return ByBackend[PositionStore](
        postgres=PostgresPositions, sqlite=SqlitePositions, memory=MemoryPositions
    )(recorder)


__all__ = [
    "POSITIONS_TABLE",
    "LogStart",
    "MemoryPositions",
    "Position",
    "PositionStore",
    "PostgresPositions",
    "SqlPositions",
    "SqlitePositions",
    "final_end",
    "positions_for",
]
