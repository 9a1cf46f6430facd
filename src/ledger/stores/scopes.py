"""Who owns each quota scope: one daemon at a time, by a lease in the store
(docs/performance.md "Several daemons", docs/architecture.md "Leases").

A quota scope is what one quota is spent from: a provider, or one mailbox of it where the
quota is per mailbox (`Provider.scope_of`). Two tables beside the events, created by the
first daemon that shares scopes (`ensure`), so a store that never ran one carries neither
and opening a store runs no new DDL:

- `sendledger_scopes`: a row per scope: `owner` (a `daemon.name`), `lease_until` (epoch
  seconds by the owner's clock) and `version` (one more at every write);
- `sendledger_daemons`: a row per daemon sharing them, `seen_until` (its heartbeat), so a
  daemon that owns nothing yet still counts when the others work out their share, and
  `process` (added in the fifteenth wave, `ensure` adds it to an earlier table): which
  process wrote the heartbeat (`Heartbeat.process`), as JSON beside the `seen_until` it
  was written with. A daemon of an earlier release writes `seen_until` alone: the two then
  differ, and the row says no process (a stale one must not be taken for the writer).

Every write is conditional, as the webhooks' positions are: a take succeeds only on the
version the taker read and only when, by the taker's clock, the lease has ended or is its
own; a renewal touches only the rows its owner holds; a release only its own rows. So the
store never names two owners for one scope. When an owner may *act* on a scope is the
engine's rule (`daemon/engine/owners.py`): it stops `daemon.deadline_grace` before its
lease ends, and another daemon takes the scope only after it has ended, by its own clock.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, replace
from typing import Any, Protocol

from ledger.stores.identity import NameSession, pg_session_holds
from ledger.stores.recorder_kind import ByBackend, postgres_table

log = logging.getLogger("sendledger.store")

SCOPES_TABLE = "sendledger_scopes"
DAEMONS_TABLE = "sendledger_daemons"
CREATE = (
    "CREATE TABLE IF NOT EXISTS {scopes} (scope TEXT PRIMARY KEY, owner TEXT NOT NULL, "
    "lease_until {real} NOT NULL, version BIGINT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS {daemons} (name TEXT PRIMARY KEY, seen_until {real} NOT NULL, "
    "process TEXT)",
)
#: The heartbeat's writer, added to a table an earlier release created (`ensure`).
PROCESS_COLUMN = "process"


@dataclass(frozen=True)
class ScopeLease:
    scope: str
    owner: str  # the daemon that holds or last held it
    lease_until: float  # epoch seconds, by the owner's clock
    version: int


@dataclass(frozen=True)
class Heartbeat:
    seen_until: float  # epoch seconds, by its daemon's clock
    #: The process that wrote it, as it gave it to `beat`; None when the row does not say
    #: (written without one, or by a daemon of an earlier release since).
    process: str | None


def process_text(until: float, process: str | None) -> str | None:
    """The `process` column of a heartbeat written until `until`."""
    return None if process is None else json.dumps({"until": until, "process": process})


def heartbeat_of(seen_until: float, text: str | None) -> Heartbeat:
    """A heartbeat row read: its process only while written with this `seen_until`."""
    process = None
    try:
        data = json.loads(text) if text is not None else None
    except ValueError:
        data = None
    if isinstance(data, dict) and isinstance(data.get("process"), str):
        until = data.get("until")
        # Written by one statement with the same float: a renewal later differs by
        # seconds, a third of a lease.
        if isinstance(until, float | int) and abs(float(until) - seen_until) < 1e-3:
            process = data["process"]
    return Heartbeat(seen_until, process)


class ScopeLeaseStore(Protocol):
    """The scope leases of one store. Times are epoch seconds from the caller's clock."""

    def ensure(self) -> None:
        """Create the tables if the store lacks them (safe to race other daemons)."""
        ...

    def leases(self) -> list[ScopeLease]:
        """Every scope's row."""
        ...

    def members(self, now: float) -> list[str]:
        """The daemons whose heartbeat runs past `now`, by name."""
        ...

    def beat(
        self,
        name: str,
        until: float,
        process: str | None = None,
        held_by: NameSession | None = None,
    ) -> None:
        """`name` shares the scopes until `until` (written again before then);
        `process`: which process writes it (`Heartbeat.process`); `held_by`: only while
        that session holds the name (as `renew`'s), so that a process which lost the name
        does not write its mark over the new holder's row."""
        ...

    def heartbeat(self, name: str) -> Heartbeat | None:
        """`name`'s heartbeat row, live or not, None when there is none."""
        ...

    def leave(self, name: str, held_by: NameSession | None = None) -> None:
        """`name` stops sharing (a daemon that stops); `held_by`: only while that session
        holds the name (as `renew`'s), so that a process which lost the name does not
        remove the new holder's heartbeat."""
        ...

    def take(self, owner: str, scopes: list[str], now: float, until: float) -> list[ScopeLease]:
        """`owner` holds each of `scopes` until `until` whose lease, at the moment of the
        write, has ended by `now` or is `owner`'s own (or that has no row yet): the rows
        taken (one missing was taken or renewed by another daemon first). One round
        trip, however many scopes: a dead daemon's are taken at once."""
        ...

    def renew(
        self, owner: str, scopes: list[str], until: float, held_by: NameSession | None = None
    ) -> list[ScopeLease]:
        """Extend `owner`'s leases on `scopes` to `until`: the rows that were still its
        own (a scope missing from the answer was taken or forgotten meanwhile).
        `held_by`: only while that session holds the name `owner` (PostgreSQL, where the
        name's lock can end under a live process): none renewed once it does not."""
        ...

    def release(
        self, owner: str, scopes: list[str], until: float, held_by: NameSession | None = None
    ) -> None:
        """End `owner`'s leases on `scopes` at `until` (its clock), when another daemon
        may take them; `owner` may take them back before that. `held_by`: only while that
        session holds the name `owner` (as `renew`'s): a process which lost the name
        would end the leases the new holder renewed as its own."""
        ...

    def forget(self, before: float) -> None:
        """Delete the scope rows whose lease ended before `before` and the daemons not
        seen since: a row that is gone is free, as one whose lease ended."""
        ...

    def store_time(self) -> float | None:
        """The store's own clock (epoch seconds) where daemons on other hosts share it,
        so that each can see its clock is off (`daemon/engine/owners.py`); None where
        every sharer runs on the store's host and clock (memory, SQLite)."""
        ...


def _free_for(row: ScopeLease, owner: str, now: float) -> bool:
    return row.owner == owner or row.lease_until <= now


# One lock for the rows of every memory store: their writes are dictionary updates.
_memory_lock = threading.Lock()


class MemoryScopeLeases:
    """The memory store's rows, shared by every Ledger on the same recorder."""

    def __init__(self, recorder: Any) -> None:
        self._lock = _memory_lock
        with _memory_lock:
            tables: tuple[dict[str, ScopeLease], dict[str, float], dict[str, str | None]] | None = (
                getattr(recorder, "_sendledger_scopes", None)
            )
            if tables is None:
                tables = ({}, {}, {})
                recorder._sendledger_scopes = tables
        self._rows, self._daemons, self._processes = tables

    def ensure(self) -> None:
        pass

    def leases(self) -> list[ScopeLease]:
        with self._lock:
            return [self._rows[scope] for scope in sorted(self._rows)]

    def members(self, now: float) -> list[str]:
        with self._lock:
            return sorted(name for name, until in self._daemons.items() if until > now)

    def beat(
        self,
        name: str,
        until: float,
        process: str | None = None,
        held_by: NameSession | None = None,
    ) -> None:
        with self._lock:
            self._daemons[name] = until
            self._processes[name] = process_text(until, process)

    def heartbeat(self, name: str) -> Heartbeat | None:
        with self._lock:
            until = self._daemons.get(name)
            return None if until is None else heartbeat_of(until, self._processes.get(name))

    def leave(self, name: str, held_by: NameSession | None = None) -> None:
        with self._lock:
            self._daemons.pop(name, None)
            self._processes.pop(name, None)

    def take(self, owner: str, scopes: list[str], now: float, until: float) -> list[ScopeLease]:
        taken = []
        with self._lock:
            for scope in scopes:
                row = self._rows.get(scope)
                if row is not None and not _free_for(row, owner, now):
                    continue
                version = 1 if row is None else row.version + 1
                taken.append(ScopeLease(scope, owner, until, version))
                self._rows[scope] = taken[-1]
        return taken

    def renew(
        self, owner: str, scopes: list[str], until: float, held_by: NameSession | None = None
    ) -> list[ScopeLease]:
        renewed = []
        with self._lock:
            for scope in scopes:
                row = self._rows.get(scope)
                if row is not None and row.owner == owner:
                    row = self._rows[scope] = replace(
                        row, lease_until=until, version=row.version + 1
                    )
                    renewed.append(row)
        return renewed

    def release(
        self, owner: str, scopes: list[str], until: float, held_by: NameSession | None = None
    ) -> None:
        with self._lock:
            for scope in scopes:
                row = self._rows.get(scope)
                if row is not None and row.owner == owner:
                    self._rows[scope] = replace(row, lease_until=until, version=row.version + 1)

    def forget(self, before: float) -> None:
        with self._lock:
            for scope in [s for s, row in self._rows.items() if row.lease_until < before]:
                del self._rows[scope]
            for name in [n for n, until in self._daemons.items() if until < before]:
                del self._daemons[name]
                self._processes.pop(name, None)

    def store_time(self) -> float | None:
        return None


_COLUMNS = "scope, owner, lease_until, version"
# A take: the rows whose lease has ended by the taker's clock (or are its own), checked
# at the moment of the write (PostgreSQL re-reads a row another writer changed meanwhile;
# SQLite has one writer), then the rows nobody has yet.
_TAKE = (
    "UPDATE {scopes} SET owner = {p}, lease_until = {p}, version = version + 1 "
    "WHERE {in_list} AND (owner = {p} OR lease_until <= {p}) RETURNING " + _COLUMNS
)
_INSERT = (
    "INSERT INTO {scopes} (" + _COLUMNS + ") SELECT value, {p}, {p}, 1 FROM {list} "
    "WHERE true ON CONFLICT (scope) DO NOTHING RETURNING " + _COLUMNS
)
#: A heartbeat (`{held}`: `_held_by`'s condition, asked by the write itself); SQLite's
#: upsert needs the WHERE after a SELECT.
_BEAT = (
    "INSERT INTO {daemons} (name, seen_until, process) SELECT {p}, {p}, {p} WHERE true{held} "
    "ON CONFLICT (name) DO UPDATE SET seen_until = excluded.seen_until, "
    "process = excluded.process"
)
#: An earlier release's beat, written while the table lacks `process`.
_BEAT_WITHOUT_PROCESS = (
    "INSERT INTO {daemons} (name, seen_until) SELECT {p}, {p} WHERE true{held} "
    "ON CONFLICT (name) DO UPDATE SET seen_until = excluded.seen_until"
)


class SqlScopeLeases:
    """The rows in SQL, on the recorder's own datastore (its pool, its transactions).
    Subclasses give the placeholder, the qualified table names, the REAL type, how a
    list travels as one parameter and how a cursor's rows read."""

    _p = "?"
    _real = "REAL"

    def __init__(self, recorder: Any) -> None:
        self._recorder = recorder
        self._ensured = False
        #: False once `process` could not be added (`_add_process_column`): the beats
        #: are then an earlier release's, until the next start.
        self._process_column = True

    # -- what a backend supplies ---------------------------------------------------

    def _tables(self) -> tuple[str, str]:
        return SCOPES_TABLE, DAEMONS_TABLE

    def _rows(self, cursor: Any) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in cursor.fetchall()]

    def _member(self, column: str) -> str:
        return f"{column} IN (SELECT value FROM json_each({{p}}))"

    def _members(self, values: list[str]) -> Any:
        return json.dumps(values)

    def _list(self) -> str:
        """The rows (one column, `value`) of a list given as one parameter."""
        return "json_each({p})"

    def _transaction(self, *, commit: bool) -> AbstractContextManager[Any]:
        result: AbstractContextManager[Any] = self._recorder.datastore.transaction(commit=commit)
        return result

    # -- the queries ----------------------------------------------------------------

    def _sql(self, template: str) -> str:
        scopes, daemons = self._tables()
        return (
            template.replace("{scopes}", scopes)
            .replace("{daemons}", daemons)
            .replace("{real}", self._real)
            .replace("{p}", self._p)
        )

    def _run(
        self, template: str, params: list[Any], *, fetch: bool = True
    ) -> list[tuple[Any, ...]]:
        """One statement in a transaction of its own; its rows when `fetch` (a SELECT, or
        a write with RETURNING)."""
        with self._transaction(commit=True) as cursor:
            cursor.execute(self._sql(template), params)
            return self._rows(cursor) if fetch else []

    def _columns(self, cursor: Any, table: str) -> set[str]:
        """The columns of `table` (SQLite's; PostgreSQL's below)."""
        cursor.execute(f"PRAGMA table_info({table})")
        return {str(row[1]) for row in cursor.fetchall()}

    def ensure(self) -> None:
        if self._ensured:
            return
        with self._transaction(commit=True) as cursor:
            for statement in CREATE:
                cursor.execute(self._sql(statement))
        self._add_process_column()
        self._ensured = True

    def _add_process_column(self) -> None:
        """A heartbeat table an earlier release created lacks `process`: added (DDL only
        then; another daemon adding it meanwhile is no failure). Tried once per process:
        the ALTER TABLE waits for every transaction on the table (a pg_dump, an open
        psql) up to `[store] lock_timeout`, and every other daemon's beat queues behind
        it. Refused, the heartbeat goes on without the process (the waits kept, as after
        an earlier release's beat) and the next start tries again."""
        daemons = self._tables()[1]
        with self._transaction(commit=True) as cursor:
            if PROCESS_COLUMN in self._columns(cursor, daemons):
                return
        try:
            self._run(f"ALTER TABLE {{daemons}} ADD COLUMN {PROCESS_COLUMN} TEXT", [], fetch=False)
        except Exception as exc:
            with self._transaction(commit=True) as cursor:
                if PROCESS_COLUMN in self._columns(cursor, daemons):
                    return
            self._process_column = False
            log.warning(
                "%s: the heartbeat's process column not added (%s: %s): a restart of this "
                "daemon's name waits for its calls as before; added at the next start",
                daemons, type(exc).__name__, exc,
            )  # fmt: skip

    def leases(self) -> list[ScopeLease]:
        rows = self._run(f"SELECT {_COLUMNS} FROM {{scopes}} ORDER BY scope", [])
        return [_lease(row) for row in rows]

    def members(self, now: float) -> list[str]:
        rows = self._run("SELECT name FROM {daemons} WHERE seen_until > {p} ORDER BY name", [now])
        return [str(name) for (name,) in rows]

    def beat(
        self,
        name: str,
        until: float,
        process: str | None = None,
        held_by: NameSession | None = None,
    ) -> None:
        held, params = self._held_by(held_by)
        if not self._process_column:
            beat, values = _BEAT_WITHOUT_PROCESS, [name, until]
        else:
            beat, values = _BEAT, [name, until, process_text(until, process)]
        self._run(beat.replace("{held}", held), [*values, *params], fetch=False)

    def heartbeat(self, name: str) -> Heartbeat | None:
        process = PROCESS_COLUMN if self._process_column else "NULL"
        rows = self._run(
            f"SELECT seen_until, {process} FROM {{daemons}} WHERE name = {{p}}", [name]
        )
        if not rows:
            return None
        until, text = rows[0]
        return heartbeat_of(float(until), None if text is None else str(text))

    def leave(self, name: str, held_by: NameSession | None = None) -> None:
        held, params = self._held_by(held_by)
        self._run(f"DELETE FROM {{daemons}} WHERE name = {{p}}{held}", [name, *params], fetch=False)

    def take(self, owner: str, scopes: list[str], now: float, until: float) -> list[ScopeLease]:
        if not scopes:
            return []
        listed = self._members(scopes)
        update = _TAKE.replace("{in_list}", self._member("scope"))
        insert = _INSERT.replace("{list}", self._list())
        with self._transaction(commit=True) as cursor:
            cursor.execute(self._sql(update), [owner, until, listed, owner, now])
            rows = self._rows(cursor)
            cursor.execute(self._sql(insert), [owner, until, listed])
            rows += self._rows(cursor)
        return [_lease(row) for row in rows]

    def renew(
        self, owner: str, scopes: list[str], until: float, held_by: NameSession | None = None
    ) -> list[ScopeLease]:
        if not scopes:
            return []
        held, params = self._held_by(held_by)
        rows = self._run(
            "UPDATE {scopes} SET lease_until = {p}, version = version + 1 "
            f"WHERE owner = {{p}} AND {self._member('scope')}{held} RETURNING {_COLUMNS}",
            [until, owner, self._members(scopes), *params],
        )
        return [_lease(row) for row in rows]

    def _held_by(self, session: NameSession | None) -> tuple[str, list[Any]]:
        """The condition (and its parameters) that `session` holds the name: SQLite's
        lock ends only with its process, nothing to add."""
        return "", []

    def release(
        self, owner: str, scopes: list[str], until: float, held_by: NameSession | None = None
    ) -> None:
        if scopes:
            held, params = self._held_by(held_by)
            self._run(
                "UPDATE {scopes} SET lease_until = {p}, version = version + 1 "
                f"WHERE owner = {{p}} AND {self._member('scope')}{held}",
                [until, owner, self._members(scopes), *params],
                fetch=False,
            )

    def forget(self, before: float) -> None:
        with self._transaction(commit=True) as cursor:
            cursor.execute(self._sql("DELETE FROM {scopes} WHERE lease_until < {p}"), [before])
            cursor.execute(self._sql("DELETE FROM {daemons} WHERE seen_until < {p}"), [before])

    def store_time(self) -> float | None:
        return None  # SQLite: one host, one clock


def _lease(row: tuple[Any, ...]) -> ScopeLease:
    scope, owner, lease_until, version = row
    return ScopeLease(str(scope), str(owner), float(lease_until), int(version))


class SqliteScopeLeases(SqlScopeLeases):
    pass


class PostgresScopeLeases(SqlScopeLeases):
    _p = "%s"
    _real = "DOUBLE PRECISION"

    def _tables(self) -> tuple[str, str]:
        return (
            postgres_table(self._recorder, SCOPES_TABLE),
            postgres_table(self._recorder, DAEMONS_TABLE),
        )

    def _rows(self, cursor: Any) -> list[tuple[Any, ...]]:
        return [tuple(r.values()) for r in cursor.fetchall()]

    def _member(self, column: str) -> str:
        return f"{column} = ANY({{p}})"

    @contextmanager
    def _transaction(self, *, commit: bool) -> Iterator[Any]:
        # A row another session holds (a long transaction, an open psql) is waited for
        # `[store] lock_timeout`, not without limit: a renewal stuck behind it held the
        # renewer, the round and a stopping daemon's join while the leases ran out.
        with super()._transaction(commit=commit) as cursor:
            timeout = int(self._recorder.datastore.lock_timeout)
            cursor.execute(f"SET LOCAL lock_timeout = '{timeout}s'")
            yield cursor

    def store_time(self) -> float | None:
        # clock_timestamp(), not now(): the time of the read, not of the transaction.
        rows = self._run("SELECT extract(epoch FROM clock_timestamp())", [])
        return float(rows[0][0])

    def _members(self, values: list[str]) -> Any:
        return list(values)

    def _held_by(self, session: NameSession | None) -> tuple[str, list[Any]]:
        return pg_session_holds(session)

    def _columns(self, cursor: Any, table: str) -> set[str]:
        cursor.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(%s) "
            "AND attnum > 0 AND NOT attisdropped",
            [table],
        )
        return {str(row["attname"]) for row in cursor.fetchall()}

    def _list(self) -> str:
        return "unnest({p}::text[]) AS listed(value)"

    def ensure(self) -> None:
        # Two daemons creating the tables at once: one meets the other's catalog row
        # (unique_violation); the tables are then there.
        try:
            super().ensure()
        except Exception:
            rows = self._run("SELECT to_regclass({p}) IS NOT NULL", [self._tables()[1]])
            if not (rows and rows[0][0]):
                raise
            self._add_process_column()
            self._ensured = True


def scope_leases_for(recorder: Any) -> ScopeLeaseStore:
    """The scope lease rows of the store `recorder` (a Ledger's) writes to."""
    return ByBackend[ScopeLeaseStore](
        postgres=PostgresScopeLeases, sqlite=SqliteScopeLeases, memory=MemoryScopeLeases
    )(recorder)


__all__ = [
    "DAEMONS_TABLE",
    "SCOPES_TABLE",
    "Heartbeat",
    "MemoryScopeLeases",
    "PostgresScopeLeases",
    "ScopeLease",
    "ScopeLeaseStore",
    "SqlScopeLeases",
    "SqliteScopeLeases",
    "scope_leases_for",
]
