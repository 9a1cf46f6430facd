"""What each running daemon (and `sendledger api`) has loaded of the channel policies
(docs/operations.md "Running under systemd"; docs/cli.md "Submit and the running daemons'
policies").

`submit` runs without the daemon and reads the policy folder itself; the daemon sends
with the set it last loaded. A file added since then makes a job the daemon puts in review
at once ("no policy for the channel"); a file edited since then is checked one way and sent
another. So each server writes, at start, at each reload and as a heartbeat, one row:

- `sendledger_loaded_policies`: `name` (its `daemon.name`, with `kind`: `daemon` or
  `api`), `loaded_at` (epoch seconds of the load), `seen_until` (its heartbeat: the row
  counts only while it runs past the reader's clock) and `fingerprints` (JSON, channel to
  policy fingerprint).

A daemon's row counts, besides, only while its name is held on the store
(`ledger.stores.identity`): the lock the operating system or the server drops with the
process, so that a daemon killed -9 stops counting at once (PostgreSQL: once the server
has seen its session end), not when its heartbeat runs out; and so does an API server's
that holds a name (`NAMED_API_FORMAT`). Where that cannot be asked (a
SQLite file system without record locks) the heartbeat alone decides.

A row, not an event: webhooks read the event log, and this is no job's history. The table
is created by the first server that writes (`ensure`), so a store that never ran one has
none and reads as "no daemon running" (today's behaviour).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

from ledger.stores.format_rows import FORMAT_TABLE, FormatRow, format_rows_for, server_holder
from ledger.stores.identity import (
    ADVISORY_PREFIX,
    API_LOCK_PREFIX,
    NameSession,
    api_lock_name,
    pg_session_holds,
)
from ledger.stores.index import Withdrawn
from ledger.stores.recorder_kind import ByBackend, postgres_table

LOADED_TABLE = "sendledger_loaded_policies"
CREATE = (
    "CREATE TABLE IF NOT EXISTS {t} (name TEXT NOT NULL, kind TEXT NOT NULL, "
    "loaded_at {real} NOT NULL, seen_until {real} NOT NULL, fingerprints TEXT NOT NULL, "
    "PRIMARY KEY (name, kind))"
)
DAEMON = "daemon"
API = "api"
#: A write's question asked in its transaction (`LoadedPolicyStore.write`'s `unless`).
Asked = Callable[[], bool]
#: The session a write is made under, only while it holds the writer's name (None: any).
Held = NameSession | None


def never() -> bool:
    return False


#: Which of these daemon names a live process holds on the store; None: cannot be told.
NamesHeld = Callable[[Collection[str]], "set[str] | None"]


@dataclass(frozen=True)
class LoadedPolicies:
    name: str
    kind: str  # DAEMON or API
    loaded_at: float  # epoch seconds
    seen_until: float  # epoch seconds, by the store's clock where it has one
    fingerprints: Mapping[str, str] = field(default_factory=dict)


class LoadedPolicyStore(Protocol):
    def now(self) -> float | None:
        """The store's clock where servers on several hosts share it (PostgreSQL), so that
        writer and reader agree on "live"; None: the caller's clock (memory, SQLite)."""
        ...

    def write(self, row: LoadedPolicies, *, unless: Asked = never, held_by: Held = None) -> None:
        """Replace the row of `row.name` and `row.kind`, creating the table if needed;
        nothing when `unless()`, asked in the write's transaction before its commit (a
        server's stop: its heartbeat's write held up past the stop's removal must not
        put the row back), and asked again after it: true then, the commit came after
        the stop began, whose removal may have met this write's row and given up (or
        not seen its insert), and the row is removed again if it is still `row`.
        `held_by`: nothing either unless that session holds the server's name, asked by
        the write itself (PostgreSQL, where a database restart ends the name's lock under
        a live server and another process of the name may take it)."""
        ...

    def leave(self, name: str, kind: str, loaded_at: float) -> None:
        """Remove the row (a server that stops), if it is still the one this server wrote
        (`loaded_at`): a process that took the name since has rewritten it."""
        ...

    def live(self, now: float) -> list[LoadedPolicies]:
        """The rows whose heartbeat runs past `now`, a daemon's only while its name is
        held; none when the table is missing."""
        ...


#: From this event format on, a `sendledger api` holds its name on the store
#: (`api_lock_name`), and its row counts only while it does, as a daemon's: one killed -9
#: stops counting once its lock is gone, not 60 s later. An API server whose declaration
#: reads less (an earlier release's, or none) holds no name: its heartbeat alone decides.
NAMED_API_FORMAT = 2


def _lock_name(row: LoadedPolicies) -> str:
    return api_lock_name(row.name) if row.kind == API else row.name


def _holds_a_name(row: LoadedPolicies, declared: Mapping[str, FormatRow]) -> bool:
    """Whether `row`'s server holds a name its row counts by: a daemon always, an API
    server of a release that holds one (its declaration, `NAMED_API_FORMAT`)."""
    if row.kind == DAEMON:
        return True
    found = declared.get(server_holder(row.kind, row.name))
    return row.kind == API and found is not None and found.format >= NAMED_API_FORMAT


def _named(
    rows: Sequence[LoadedPolicies], names_held: NamesHeld, recorder: Any
) -> list[LoadedPolicies]:
    """`rows` but those of servers whose name no live process holds (killed, not
    stopped): the daemons', and the API servers' that hold one (`_holds_a_name`)."""
    declared = format_rows_for(recorder).rows() if any(r.kind == API for r in rows) else {}
    asked = {id(row): _lock_name(row) for row in rows if _holds_a_name(row, declared)}
    held = names_held(set(asked.values())) if asked else set()
    if held is None:
        return list(rows)
    return [row for row in rows if id(row) not in asked or asked[id(row)] in held]


_memory_lock = threading.Lock()


class MemoryLoadedPolicies:
    """The memory store's rows, shared by every Ledger on the same recorder."""

    def __init__(self, recorder: Any, names_held: NamesHeld) -> None:
        self._names_held = names_held
        self._recorder = recorder
        with _memory_lock:
            rows: dict[tuple[str, str], LoadedPolicies] | None = getattr(
                recorder, "_sendledger_loaded_policies", None
            )
            if rows is None:
                rows = {}
                recorder._sendledger_loaded_policies = rows
        self._rows = rows

    def now(self) -> float | None:
        return None

    def write(self, row: LoadedPolicies, *, unless: Asked = never, held_by: Held = None) -> None:
        # The question and the write are one step under the lock: no commit to hold up.
        # A memory name ends only with its process: `held_by` has nothing to add.
        with _memory_lock:
            if not unless():
                self._rows[(row.name, row.kind)] = row

    def leave(self, name: str, kind: str, loaded_at: float) -> None:
        with _memory_lock:
            row = self._rows.get((name, kind))
            if row is not None and row.loaded_at == loaded_at:
                del self._rows[(name, kind)]

    def live(self, now: float) -> list[LoadedPolicies]:
        with _memory_lock:
            rows = [row for _, row in sorted(self._rows.items()) if row.seen_until > now]
        return _named(rows, self._names_held, self._recorder)


_COLUMNS = "name, kind, loaded_at, seen_until, fingerprints"
#: `{held}`: `_held_by`'s condition, asked by the write itself; SQLite's upsert needs the
#: WHERE after a SELECT.
_WRITE = (
    "INSERT INTO {t} (" + _COLUMNS + ") SELECT {p}, {p}, {p}, {p}, {p} WHERE true{held} "
    "ON CONFLICT (name, kind) DO UPDATE SET loaded_at = excluded.loaded_at, "
    "seen_until = excluded.seen_until, fingerprints = excluded.fingerprints"
)


class SqlLoadedPolicies:
    _p = "?"
    _real = "REAL"

    def __init__(self, recorder: Any, names_held: NamesHeld) -> None:
        self._recorder = recorder
        self._names_held = names_held
        self._ensured = False

    def _table(self) -> str:
        return LOADED_TABLE

    def _rows(self, cursor: Any) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in cursor.fetchall()]

    def _bound_waits(self, cursor: Any) -> None:
        """Limit how long the statement may wait for a lock (SQLite: its busy handler)."""

    def _exists(self) -> bool:
        rows = self._run(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = {p}",
            [LOADED_TABLE],
        )
        return bool(rows and rows[0][0])

    def _transaction(self, *, commit: bool) -> AbstractContextManager[Any]:
        result: AbstractContextManager[Any] = self._recorder.datastore.transaction(commit=commit)
        return result

    def _sql(self, template: str) -> str:
        return (
            template.replace("{t}", self._table())
            .replace("{real}", self._real)
            .replace("{p}", self._p)
        )

    def _run(
        self, template: str, params: list[Any], *, fetch: bool = True
    ) -> list[tuple[Any, ...]]:
        """One statement in a transaction of its own; its rows when `fetch` (a SELECT)."""
        with self._transaction(commit=True) as cursor:
            self._bound_waits(cursor)
            cursor.execute(self._sql(template), params)
            return self._rows(cursor) if fetch else []

    def ensure(self) -> None:
        if not self._ensured:
            self._run(CREATE, [], fetch=False)
            self._ensured = True

    def now(self) -> float | None:
        return None

    def write(self, row: LoadedPolicies, *, unless: Asked = never, held_by: Held = None) -> None:
        self.ensure()
        fingerprints = json.dumps(dict(row.fingerprints), sort_keys=True)
        held, condition = self._held_by(held_by)
        params = [row.name, row.kind, row.loaded_at, row.seen_until, fingerprints, *condition]
        try:
            with self._transaction(commit=True) as cursor:
                self._bound_waits(cursor)
                cursor.execute(self._sql(_WRITE.replace("{held}", held)), params)
                # Asked once the row is held: a stop's removal after this answer waits
                # for this commit (the row's lock, SQLite's write lock) and removes it.
                if unless():
                    raise Withdrawn("the server stopped")
        except Withdrawn:
            return  # rolled back
        if unless():
            # A commit the store held up past the stop's wait for it and its removal's
            # lock wait: what this write put there is taken back, and only that (a
            # process that took the name since wrote another `seen_until`).
            self._remove(row.name, row.kind, row.loaded_at, row.seen_until)

    def _held_by(self, session: NameSession | None) -> tuple[str, list[Any]]:
        """The condition (and its parameters) that `session` holds the name: SQLite's
        lock ends only with its process, nothing to add."""
        return "", []

    def leave(self, name: str, kind: str, loaded_at: float) -> None:
        if self._exists():
            self._remove(name, kind, loaded_at)

    def _remove(
        self, name: str, kind: str, loaded_at: float, seen_until: float | None = None
    ) -> None:
        """The row of `name` and `kind` if it is still at `loaded_at` (and `seen_until`)."""
        written = "" if seen_until is None else " AND seen_until = {p}"
        self._run(
            "DELETE FROM {t} WHERE name = {p} AND kind = {p} AND loaded_at = {p}" + written,
            [name, kind, loaded_at] + ([] if seen_until is None else [seen_until]),
            fetch=False,
        )

    def live(self, now: float) -> list[LoadedPolicies]:
        # Checked first, not caught: a failed statement would abort a PostgreSQL
        # transaction, and a store no server of this release wrote to has no table.
        if not self._exists():
            return []
        rows = self._run(
            f"SELECT {_COLUMNS} FROM {{t}} WHERE seen_until > {{p}} ORDER BY name, kind", [now]
        )
        return _named([_row(row) for row in rows], self._names_held, self._recorder)


def _row(row: tuple[Any, ...]) -> LoadedPolicies:
    name, kind, loaded_at, seen_until, fingerprints = row
    try:
        decoded = json.loads(fingerprints)
    except ValueError:
        decoded = {}
    if not isinstance(decoded, dict):
        decoded = {}  # a row written by hand: it loaded nothing we can read
    return LoadedPolicies(
        str(name),
        str(kind),
        float(loaded_at),
        float(seen_until),
        {str(k): str(v) for k, v in decoded.items()},
    )


class SqliteLoadedPolicies(SqlLoadedPolicies):
    pass


class PostgresLoadedPolicies(SqlLoadedPolicies):
    _p = "%s"
    _real = "DOUBLE PRECISION"
    _formats = False  # the event format table exists (`_api_named`)

    def _table(self) -> str:
        return postgres_table(self._recorder, LOADED_TABLE)

    def _rows(self, cursor: Any) -> list[tuple[Any, ...]]:
        return [tuple(r.values()) for r in cursor.fetchall()]

    def _bound_waits(self, cursor: Any) -> None:
        # The row held by another session (an open psql that touched it) was waited for
        # without limit: a stopping daemon's removal of it hung its stop until
        # `daemon.stop_timeout` gave up, the heartbeat never wrote again. One lock wait,
        # as every other write of a stop (daemon/config/stop_bound.py).
        timeout = int(self._recorder.datastore.lock_timeout)
        cursor.execute(f"SET LOCAL lock_timeout = '{timeout}s'")

    def _held_by(self, session: NameSession | None) -> tuple[str, list[Any]]:
        return pg_session_holds(session)

    def _exists(self) -> bool:
        rows = self._run("SELECT to_regclass({p}) IS NOT NULL", [self._table()])
        return bool(rows and rows[0][0])

    def live(self, now: float) -> list[LoadedPolicies]:
        # A server's name is a session advisory lock (`AdvisoryIdentityLock`): the server
        # knows which are held, on any host, in `pg_locks`, whose (classid, objid) are the
        # key's high and low 32 bits. The key is `advisory_key`, computed here in SQL, of
        # the daemon's name or the API server's (`api_lock_name`); an API server's row is
        # asked only when its declaration says it holds one (`_holds_a_name`).
        if not self._exists():
            return []
        named, params = self._api_named()
        prefix = f"{ADVISORY_PREFIX}{self._recorder.datastore.schema}:"
        rows = self._run(
            f"SELECT {_COLUMNS} FROM {{t}} WHERE seen_until > {{p}} AND (kind NOT IN ({{p}}, "
            f"{{p}}) OR (kind = {{p}} AND NOT {named}) OR EXISTS (SELECT 1 FROM pg_locks l "
            "WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 AND l.database = "
            "(SELECT oid FROM pg_database WHERE datname = current_database()) AND "
            "((l.classid::int8 << 32) | l.objid::int8) = ('x' || left(encode(sha256(convert_to("
            "{p} || CASE WHEN kind = {p} THEN {p} ELSE '' END || name, 'UTF8')), 'hex'), "
            "16))::bit(64)::int8)) ORDER BY name, kind",
            [now, DAEMON, API, API, *params, prefix, API, API_LOCK_PREFIX],
        )
        return [_row(row) for row in rows]

    def _api_named(self) -> tuple[str, list[Any]]:
        """The condition that an API server's row counts by its name's lock: its
        declaration reads `NAMED_API_FORMAT` or more (none without the format table)."""
        formats = postgres_table(self._recorder, FORMAT_TABLE)
        if not self._formats:
            rows = self._run("SELECT to_regclass({p}) IS NOT NULL", [formats])
            self._formats = bool(rows and rows[0][0])  # never dropped once made
        if not self._formats:
            return "false", []
        return (
            f"EXISTS (SELECT 1 FROM {formats} d WHERE d.holder = {{p}} || ' ' || name "
            "AND d.format >= {p})",
            [API, NAMED_API_FORMAT],
        )

    def now(self) -> float | None:
        # Servers and `submit` may run on hosts whose clocks differ: the store's is shared.
        rows = self._run("SELECT extract(epoch FROM clock_timestamp())", [])
        return float(rows[0][0])

    def ensure(self) -> None:
        # Two servers creating the table at once: one meets the other's catalog row.
        try:
            super().ensure()
        except Exception:
            if not self._exists():
                raise
            self._ensured = True


def loaded_policies_for(recorder: Any, names_held: NamesHeld) -> LoadedPolicyStore:
    """The loaded-policy rows of the store `recorder` (a Ledger's) writes to; a daemon's
    counts while `names_held` (its backend's) says a live process holds its name."""
    return ByBackend[LoadedPolicyStore](
        postgres=lambda r: PostgresLoadedPolicies(r, names_held),
        sqlite=lambda r: SqliteLoadedPolicies(r, names_held),
        memory=lambda r: MemoryLoadedPolicies(r, names_held),
    )(recorder)


__all__ = [
    "API",
    "DAEMON",
    "LOADED_TABLE",
    "LoadedPolicies",
    "LoadedPolicyStore",
    "loaded_policies_for",
]
