"""Which event format a store holds, and which format each server reading it knows: one
small table beside the events (docs/operations.md "Upgrading").

- `sendledger_event_format`: `holder` (`store`: the highest format any release wrote to
  it; `daemon NAME` or `api NAME`: the newest format the release of that server reads,
  written at its start), `format` (an integer, `ledger.event_format.EVENT_FORMAT`) and
  `at` (epoch seconds of the write, by the store's clock where it has one). A server's
  row is removed when it stops (`withdraw`), unless another server of its name has written
  its own since: a fresh one is a server starting or running.

The `store` row only ever rises (`raise_to`): two releases raising at once leave the
higher. The table is created by the first write, so a store that no release of the
Twelfth wave or later wrote to has none and reads as holding `FIRST_FORMAT`; a read
creates nothing (a read-only command writes nothing to the store).
"""

from __future__ import annotations

import threading
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from ledger.stores.recorder_kind import ByBackend, postgres_table

FORMAT_TABLE = "sendledger_event_format"
STORE_HOLDER = "store"
CREATE = (
    "CREATE TABLE IF NOT EXISTS {t} (holder TEXT PRIMARY KEY, format INTEGER NOT NULL, "
    "at {real} NOT NULL)"
)
# The bare name qualifies the row already there (both SQLite and PostgreSQL call the
# target of an upsert by its table name, without the schema).
_UPSERT = (
    "INSERT INTO {t} (holder, format, at) VALUES ({p}, {p}, {p}) ON CONFLICT (holder) "
    "DO UPDATE SET format = excluded.format, at = excluded.at"
)
_RAISE = _UPSERT + " WHERE " + FORMAT_TABLE + ".format < excluded.format"


@dataclass(frozen=True)
class FormatRow:
    holder: str  # STORE_HOLDER, or "KIND NAME" of a server (`server_holder`)
    format: int
    at: float  # epoch seconds


def server_holder(kind: str, name: str) -> str:
    """The row of a server: its kind (`daemon`, `api`) and its `daemon.name`."""
    return f"{kind} {name}"


class FormatRows(Protocol):
    def rows(self) -> dict[str, FormatRow]:
        """Every row by holder; none when the table is missing (nothing is created)."""
        ...

    def declare(self, row: FormatRow) -> None:
        """Replace the row of `row.holder`, creating the table if needed."""
        ...

    def raise_to(self, format: int, at: float) -> None:
        """The store's row set to `format` unless it holds a higher one already."""
        ...

    def withdraw(self, row: FormatRow) -> None:
        """Remove the declaration `row` (a server that stops) if it is still there: not
        one written since under the same holder (another server of that name)."""
        ...

    def put_back(self, declared: FormatRow, replaced: FormatRow) -> None:
        """Write `replaced` again in place of `declared` (a refused start's) if `declared`
        is still there: one written since under the holder (a new process of the name,
        another refused start) is newer than `replaced`, and kept."""
        ...


_memory_lock = threading.Lock()


class MemoryFormatRows:
    """The memory store's rows, shared by every Ledger on the same recorder."""

    def __init__(self, recorder: Any) -> None:
        with _memory_lock:
            rows: dict[str, FormatRow] | None = getattr(recorder, "_sendledger_formats", None)
            if rows is None:
                rows = {}
                recorder._sendledger_formats = rows
        self._rows = rows

    def rows(self) -> dict[str, FormatRow]:
        with _memory_lock:
            return dict(self._rows)

    def declare(self, row: FormatRow) -> None:
        with _memory_lock:
            self._rows[row.holder] = row

    def raise_to(self, format: int, at: float) -> None:
        with _memory_lock:
            kept = self._rows.get(STORE_HOLDER)
            if kept is None or kept.format < format:
                self._rows[STORE_HOLDER] = FormatRow(STORE_HOLDER, format, at)

    def withdraw(self, row: FormatRow) -> None:
        with _memory_lock:
            if self._rows.get(row.holder) == row:
                del self._rows[row.holder]

    def put_back(self, declared: FormatRow, replaced: FormatRow) -> None:
        with _memory_lock:
            if self._rows.get(declared.holder) == declared:
                self._rows[declared.holder] = replaced


class SqliteFormatRows:
    _p = "?"
    _real = "REAL"

    def __init__(self, recorder: Any) -> None:
        self._recorder = recorder

    def _table(self) -> str:
        return FORMAT_TABLE

    def _exists(self, cursor: Any) -> bool:
        cursor.execute(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?",
            [FORMAT_TABLE],
        )
        return bool(self._tuples(cursor)[0][0])

    def _tuples(self, cursor: Any) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in cursor.fetchall()]

    def _transaction(self, *, commit: bool) -> AbstractContextManager[Any]:
        result: AbstractContextManager[Any] = self._recorder.datastore.transaction(commit=commit)
        return result

    def _sql(self, template: str) -> str:
        return template.replace("{t}", self._table()).replace("{p}", self._p)

    def rows(self) -> dict[str, FormatRow]:
        with self._transaction(commit=False) as cursor:
            # Looked for first, not caught: a failed statement aborts a PostgreSQL
            # transaction, and a store of an earlier release has no table.
            if not self._exists(cursor):
                return {}
            cursor.execute(self._sql("SELECT holder, format, at FROM {t}"))
            found = self._tuples(cursor)
        return {str(h): FormatRow(str(h), int(f), float(a)) for h, f, a in found}

    def _write(self, template: str, params: list[Any]) -> None:
        with self._transaction(commit=True) as cursor:
            if not self._exists(cursor):
                cursor.execute(self._sql(CREATE).replace("{real}", self._real))
            cursor.execute(self._sql(template), params)

    def declare(self, row: FormatRow) -> None:
        self._write(_UPSERT, [row.holder, row.format, row.at])

    def raise_to(self, format: int, at: float) -> None:
        self._write(_RAISE, [STORE_HOLDER, format, at])

    def _bound_waits(self, cursor: Any) -> None:
        pass  # SQLite's wait is the busy handler's, for another process's write

    def withdraw(self, row: FormatRow) -> None:
        self._if_still(row, "DELETE FROM {t}", [])

    def put_back(self, declared: FormatRow, replaced: FormatRow) -> None:
        self._if_still(
            declared, "UPDATE {t} SET format = {p}, at = {p}", [replaced.format, replaced.at]
        )

    def _if_still(self, row: FormatRow, change: str, params: list[Any]) -> None:
        # One statement, compared and changed under the row's lock: a row of the holder
        # written in between (by a process that declared meanwhile) is not touched.
        with self._transaction(commit=True) as cursor:
            if self._exists(cursor):  # a store of an earlier release: nothing to change
                self._bound_waits(cursor)
                cursor.execute(
                    self._sql(change + " WHERE holder = {p} AND format = {p} AND at = {p}"),
                    [*params, row.holder, row.format, row.at],
                )


class PostgresFormatRows(SqliteFormatRows):
    _p = "%s"
    _real = "DOUBLE PRECISION"

    def _table(self) -> str:
        return postgres_table(self._recorder, FORMAT_TABLE)

    def _exists(self, cursor: Any) -> bool:
        cursor.execute("SELECT to_regclass(%s) IS NOT NULL AS found", [self._table()])
        return bool(self._tuples(cursor)[0][0])

    def _tuples(self, cursor: Any) -> list[tuple[Any, ...]]:
        return [tuple(r.values()) for r in cursor.fetchall()]

    def _bound_waits(self, cursor: Any) -> None:
        # A stop's write: one lock wait, not until the session holding the row (an open
        # psql) ends (daemon/config/stop_bound.py).
        timeout = int(self._recorder.datastore.lock_timeout)
        cursor.execute(f"SET LOCAL lock_timeout = '{timeout}s'")


def format_rows_for(recorder: Any) -> FormatRows:
    """The format rows of the store `recorder` (a Ledger's) writes to."""
    return ByBackend[FormatRows](
        postgres=PostgresFormatRows, sqlite=SqliteFormatRows, memory=MemoryFormatRows
    )(recorder)


__all__ = [
    "FORMAT_TABLE",
    "STORE_HOLDER",
    "FormatRow",
    "FormatRows",
    "format_rows_for",
    "server_holder",
]
