"""The job index: one row per job beside the events, written in the same transaction.

Ticks, `status`, `review list` and audits read this table instead of replaying history,
so their cost grows with the jobs that match, not with everything ever stored. The row
is a pure function of the aggregate (`index_row`), which is what lets
`admin rebuild-index` recreate it from the events and tests compare the two.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from eventsourcing.persistence import StoredEvent
from eventsourcing.sqlite import SQLiteApplicationRecorder, SQLiteCursor, SQLiteDatastore

from ledger.job import SendJob

INDEX_TABLE = "sendledger_jobs"
INDEX_ROWS_KWARG = "sendledger_index_rows"
COLUMNS = (
    "key",
    "job_id",
    "channel",
    "state",
    "message_id",
    "due_at",
    "created_at",
    "updated_at",
    "version",
    "attempts",
    "reason",
)


@dataclass(frozen=True)
class IndexRow:
    key: str
    job_id: str
    channel: str
    state: str
    message_id: str
    due_at: float | None  # epoch seconds, UTC
    created_at: float
    updated_at: float
    version: int
    attempts: int
    reason: str | None

    def as_tuple(self) -> tuple[Any, ...]:
        return tuple(getattr(self, column) for column in COLUMNS)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def due(self) -> datetime | None:
        return None if self.due_at is None else datetime.fromtimestamp(self.due_at, UTC)


def index_row(job: SendJob) -> IndexRow:
    return IndexRow(
        key=job.key,
        job_id=job.id.hex,
        channel=job.channel,
        state=job.state.value,
        message_id=job.message_id,
        due_at=None if job.due_at is None else job.due_at.timestamp(),
        created_at=job.created_on.timestamp(),
        updated_at=job.modified_on.timestamp(),
        version=job.version,
        attempts=job.attempts,
        reason=job.reason,
    )


def _row(values: Sequence[Any]) -> IndexRow:
    return IndexRow(*values)


# Each secondary index costs every write: only the lookups a tick or a command makes.
# (state, due_at) serves "due now" and "in state S"; message_id serves reconciliation.
CREATE_STATEMENTS = [
    "CREATE TABLE IF NOT EXISTS {t} ("
    "key TEXT PRIMARY KEY, job_id TEXT NOT NULL, channel TEXT NOT NULL, "
    "state TEXT NOT NULL, message_id TEXT NOT NULL, due_at {real}, "
    "created_at {real} NOT NULL, updated_at {real} NOT NULL, version INTEGER NOT NULL, "
    "attempts INTEGER NOT NULL, reason TEXT){options}",
    "CREATE INDEX IF NOT EXISTS {n}_state_due ON {t} (state, due_at)",
    "CREATE INDEX IF NOT EXISTS {n}_message_id ON {t} (message_id)",
]

# Only a newer version may overwrite a row: the event insert's optimistic concurrency
# already refuses a stale writer, this keeps a rebuild from racing a live daemon.
UPSERT = (
    "INSERT INTO {t} ("
    + ", ".join(COLUMNS)
    + ") VALUES ("
    + ", ".join(["{p}"] * len(COLUMNS))
    + ") ON CONFLICT (key) DO UPDATE SET "
    + ", ".join(f"{c} = excluded.{c}" for c in COLUMNS if c != "key")
    + " WHERE excluded.version > {t}.version"
)
_SELECT = "SELECT " + ", ".join(COLUMNS) + " FROM {t} "


class JobIndexQueries:
    """Index reads shared by both backends; subclasses supply `_fetch` and `_p`."""

    _p = "?"
    _table = INDEX_TABLE

    def _sql(self, template: str) -> str:
        return (
            template.replace("{t}", self._table).replace("{n}", INDEX_TABLE).replace("{p}", self._p)
        )

    def _fetch(self, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        raise NotImplementedError

    def _execute(self, sql: str, params: Sequence[Sequence[Any]]) -> None:
        raise NotImplementedError

    def job_by_key(self, key: str) -> IndexRow | None:
        rows = self._fetch(self._sql(_SELECT + "WHERE key = {p}"), [key])
        return _row(rows[0]) if rows else None

    def job_by_message_id(self, message_id: str) -> IndexRow | None:
        rows = self._fetch(self._sql(_SELECT + "WHERE message_id = {p}"), [message_id])
        return _row(rows[0]) if rows else None

    def jobs_due(self, state: str, now: float, limit: int) -> list[IndexRow]:
        rows = self._fetch(
            self._sql(
                _SELECT + "WHERE state = {p} AND due_at IS NOT NULL AND due_at <= {p} "
                "ORDER BY due_at LIMIT {p}"
            ),
            [state, now, limit],
        )
        return [_row(r) for r in rows]

    def find(
        self,
        *,
        state: str | None = None,
        channel: str | None = None,
        updated_from: float | None = None,
        updated_to: float | None = None,
        after_key: str | None = None,
        limit: int = 1000,
    ) -> list[IndexRow]:
        """One page of rows in key order; page on with `after_key` = the last key."""
        clauses: list[str] = []
        params: list[Any] = []
        for clause, value in (
            ("state = {p}", state),
            ("channel = {p}", channel),
            ("updated_at >= {p}", updated_from),
            ("updated_at < {p}", updated_to),
            ("key > {p}", after_key),
        ):
            if value is not None:
                clauses.append(clause)
                params.append(value)
        where = ("WHERE " + " AND ".join(clauses) + " ") if clauses else ""
        rows = self._fetch(self._sql(_SELECT + where + "ORDER BY key LIMIT {p}"), [*params, limit])
        return [_row(r) for r in rows]

    def jobs_in_state(
        self, state: str, *, limit: int = 1000, after_key: str | None = None
    ) -> list[IndexRow]:
        return self.find(state=state, limit=limit, after_key=after_key)

    def next_due(self, states: Sequence[str]) -> float | None:
        placeholders = ", ".join(["{p}"] * len(states))
        rows = self._fetch(
            self._sql(f"SELECT MIN(due_at) FROM {{t}} WHERE state IN ({placeholders})"),
            list(states),
        )
        value = rows[0][0] if rows else None
        return None if value is None else float(value)

    def count_in_states(self, states: Sequence[str]) -> dict[str, int]:
        """Counts for the given states: a range of the (state, due_at) index each, so
        asking for the open states costs what is open, not what was ever stored."""
        placeholders = ", ".join(["{p}"] * len(states))
        rows = self._fetch(
            self._sql(
                f"SELECT state, COUNT(*) FROM {{t}} WHERE state IN ({placeholders}) GROUP BY state"
            ),
            list(states),
        )
        counts = dict.fromkeys(states, 0)
        counts.update({str(state): int(count) for state, count in rows})
        return counts

    def count_by_state(self) -> dict[str, int]:
        rows = self._fetch(self._sql("SELECT state, COUNT(*) FROM {t} GROUP BY state"), [])
        return {str(state): int(count) for state, count in rows}

    def all_rows(self, *, limit: int = 1000, after_key: str | None = None) -> list[IndexRow]:
        return self.find(limit=limit, after_key=after_key)

    def replace_all(self, rows: Iterable[IndexRow]) -> None:
        """Used by rebuild: clear, then write every row (in batches)."""
        self._execute(self._sql("DELETE FROM {t}"), [[]])
        batch: list[tuple[Any, ...]] = []
        for row in rows:
            batch.append(row.as_tuple())
            if len(batch) >= 500:
                self._execute(self._sql(UPSERT), batch)
                batch = []
        if batch:
            self._execute(self._sql(UPSERT), batch)


def rows_from(kwargs: dict[str, Any]) -> list[IndexRow]:
    rows = kwargs.get(INDEX_ROWS_KWARG) or []
    return list(rows)


class SQLiteJobIndexRecorder(SQLiteApplicationRecorder, JobIndexQueries):
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

    def _fetch(self, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        with self.datastore.transaction(commit=False) as c:
            c.execute(sql, list(params))
            return [tuple(r) for r in c.fetchall()]

    def _execute(self, sql: str, params: Sequence[Sequence[Any]]) -> None:
        with self.datastore.transaction(commit=True) as c:
            c.executemany(sql, [list(p) for p in params])


__all__ = [
    "INDEX_ROWS_KWARG",
    "IndexRow",
    "JobIndexQueries",
    "SQLiteDatastore",
    "SQLiteJobIndexRecorder",
    "index_row",
]
