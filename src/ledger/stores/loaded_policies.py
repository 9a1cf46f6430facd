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

A row, not an event: webhooks read the event log, and this is no job's history. The table
is created by the first server that writes (`ensure`), so a store that never ran one has
none and reads as "no daemon running" (today's behaviour).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

from ledger.stores.recorder_kind import ByBackend

LOADED_TABLE = "sendledger_loaded_policies"
CREATE = (
    "CREATE TABLE IF NOT EXISTS {t} (name TEXT NOT NULL, kind TEXT NOT NULL, "
    "loaded_at {real} NOT NULL, seen_until {real} NOT NULL, fingerprints TEXT NOT NULL, "
    "PRIMARY KEY (name, kind))"
)
DAEMON = "daemon"
API = "api"


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

    def write(self, row: LoadedPolicies) -> None:
        """Replace the row of `row.name` and `row.kind`, creating the table if needed."""
        ...

    def leave(self, name: str, kind: str, loaded_at: float) -> None:
        """Remove the row (a server that stops), if it is still the one this server wrote
        (`loaded_at`): a process that took the name since has rewritten it."""
        ...

    def live(self, now: float) -> list[LoadedPolicies]:
        """The rows whose heartbeat runs past `now`; none when the table is missing."""
        ...


_memory_lock = threading.Lock()


class MemoryLoadedPolicies:
    """The memory store's rows, shared by every Ledger on the same recorder."""

    def __init__(self, recorder: Any) -> None:
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

    def write(self, row: LoadedPolicies) -> None:
        with _memory_lock:
            self._rows[(row.name, row.kind)] = row

    def leave(self, name: str, kind: str, loaded_at: float) -> None:
        with _memory_lock:
            row = self._rows.get((name, kind))
            if row is not None and row.loaded_at == loaded_at:
                del self._rows[(name, kind)]

    def live(self, now: float) -> list[LoadedPolicies]:
        with _memory_lock:
            return [row for _, row in sorted(self._rows.items()) if row.seen_until > now]


_COLUMNS = "name, kind, loaded_at, seen_until, fingerprints"
_WRITE = (
    "INSERT INTO {t} (" + _COLUMNS + ") VALUES ({p}, {p}, {p}, {p}, {p}) "
    "ON CONFLICT (name, kind) DO UPDATE SET loaded_at = excluded.loaded_at, "
    "seen_until = excluded.seen_until, fingerprints = excluded.fingerprints"
)


class SqlLoadedPolicies:
    _p = "?"
    _real = "REAL"

    def __init__(self, recorder: Any) -> None:
        self._recorder = recorder
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

    def write(self, row: LoadedPolicies) -> None:
        self.ensure()
        fingerprints = json.dumps(dict(row.fingerprints), sort_keys=True)
        params = [row.name, row.kind, row.loaded_at, row.seen_until, fingerprints]
        self._run(_WRITE, params, fetch=False)

    def leave(self, name: str, kind: str, loaded_at: float) -> None:
        if self._exists():
            self._run(
                "DELETE FROM {t} WHERE name = {p} AND kind = {p} AND loaded_at = {p}",
                [name, kind, loaded_at],
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
        return [_row(row) for row in rows]


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

    def _table(self) -> str:
        schema = str(self._recorder.datastore.schema).replace('"', '""')
        return f'"{schema}".{LOADED_TABLE}'

    def _rows(self, cursor: Any) -> list[tuple[Any, ...]]:
        return [tuple(r.values()) for r in cursor.fetchall()]

    def _bound_waits(self, cursor: Any) -> None:
        # The row held by another session (an open psql that touched it) was waited for
        # without limit: a stopping daemon's removal of it hung its stop until
        # `daemon.stop_timeout` gave up, the heartbeat never wrote again. One lock wait,
        # as every other write of a stop (daemon/config/stop_bound.py).
        timeout = int(self._recorder.datastore.lock_timeout)
        cursor.execute(f"SET LOCAL lock_timeout = '{timeout}s'")

    def _exists(self) -> bool:
        rows = self._run("SELECT to_regclass({p}) IS NOT NULL", [self._table()])
        return bool(rows and rows[0][0])

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


def loaded_policies_for(recorder: Any) -> LoadedPolicyStore:
    """The loaded-policy rows of the store `recorder` (a Ledger's) writes to."""
    return ByBackend[LoadedPolicyStore](
        postgres=PostgresLoadedPolicies, sqlite=SqliteLoadedPolicies, memory=MemoryLoadedPolicies
    )(recorder)


__all__ = [
    "API",
    "DAEMON",
    "LOADED_TABLE",
    "LoadedPolicies",
    "LoadedPolicyStore",
    "loaded_policies_for",
]
