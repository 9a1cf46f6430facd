"""The job index recorder for PostgreSQL (imported only when a postgresql:// store is used,
so that SQLite users do not pay for loading psycopg)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from eventsourcing.persistence import StoredEvent
from eventsourcing.postgres import PostgresApplicationRecorder, PostgresDatastore
from psycopg.sql import SQL

from ledger.index import CREATE_STATEMENTS, INDEX_TABLE, UPSERT, JobIndexQueries, rows_from


class PostgresJobIndexRecorder(PostgresApplicationRecorder, JobIndexQueries):
    _p = "%s"

    def __init__(self, datastore: PostgresDatastore, *, events_table_name: str = "stored_events"):
        super().__init__(datastore, events_table_name=events_table_name)
        schema = datastore.schema.replace('"', '""')
        self._table = f'"{schema}".{INDEX_TABLE}'
        for statement in CREATE_STATEMENTS:
            sql = self._sql(
                statement.replace("{real}", "DOUBLE PRECISION").replace("{options}", "")
            )
            self.sql_create_statements.append(SQL(sql).format())

    def _insert_events(
        self, curs: Any, stored_events: Sequence[StoredEvent], **kwargs: Any
    ) -> None:
        super()._insert_events(curs, stored_events, **kwargs)
        rows = rows_from(kwargs)
        if rows:
            curs.executemany(self._sql(UPSERT), [r.as_tuple() for r in rows])

    def _fetch(self, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        with self.datastore.transaction(commit=False) as curs:
            curs.execute(sql, list(params))
            return [tuple(r.values()) for r in curs.fetchall()]

    def _execute(self, sql: str, params: Sequence[Sequence[Any]]) -> None:
        with self.datastore.transaction(commit=True) as curs:
            curs.executemany(sql, [list(p) for p in params])
