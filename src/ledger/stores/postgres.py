"""The PostgreSQL backend: eventsourcing's PostgreSQL recorder, writing the job index row
in the same transaction as the events, and the store's schema.

Imported only when a postgresql:// store is used, so that SQLite users do not pay for
loading psycopg (`ledger.stores.backend_for` imports it lazily).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from eventsourcing.persistence import StoredEvent
from eventsourcing.postgres import PostgresApplicationRecorder, PostgresDatastore
from eventsourcing.utils import get_topic
from psycopg.sql import SQL

from ledger.stores import exception_chain
from ledger.stores.index import CREATE_STATEMENTS, INDEX_TABLE, UPSERT, SqlJobIndex, rows_from
from ledger.stores.url import PostgresStore

# SQLSTATEs of a transaction that lost a lock race and was rolled back: try it again.
_TRANSIENT = frozenset({"40001", "40P01", "55P03"})  # serialization, deadlock, lock timeout
# Two processes creating the same tables, types and functions at once.
_SETUP_RACE = _TRANSIENT | {
    "23505",  # unique_violation (in the catalog)
    "42P06",  # duplicate_schema
    "42P07",  # duplicate_table
    "42710",  # duplicate_object
    "42723",  # duplicate_function
    "XX000",  # "tuple concurrently updated": CREATE OR REPLACE FUNCTION raced
}


class PostgresJobIndexRecorder(PostgresApplicationRecorder, SqlJobIndex):
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


def _sqlstates(exc: BaseException) -> set[str]:
    return {
        error.sqlstate
        for error in exception_chain(exc)
        if isinstance(error, psycopg.Error) and error.sqlstate
    }


def prepare_schema(store: PostgresStore) -> bool:
    """True when the job index table (created last) is already in the store's schema;
    else create the schema if it is missing (the application creates the tables)."""
    try:
        with psycopg.connect(
            dbname=store.dbname,
            host=store.host,
            port=store.port,
            user=store.user,
            password=store.password or None,
            connect_timeout=10,
        ) as conn:
            found = conn.execute(
                "SELECT to_regclass(%s)", (f'"{store.schema}".{INDEX_TABLE}',)
            ).fetchone()
            if found is not None and found[0] is not None:
                return True
            quoted = store.schema.replace('"', '""')
            conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{quoted}"')
            conn.commit()
            return False
    except psycopg.Error:
        # Unknown: let the normal set-up (with its retries) find out.
        return False


@dataclass(frozen=True)
class PostgresBackend:
    spec: PostgresStore

    @property
    def env(self) -> dict[str, str]:
        spec = self.spec
        return {
            "PERSISTENCE_MODULE": "eventsourcing.postgres",
            "POSTGRES_DBNAME": spec.dbname,
            "POSTGRES_HOST": spec.host,
            "POSTGRES_PORT": str(spec.port),
            "POSTGRES_USER": spec.user,
            "POSTGRES_PASSWORD": spec.password,
            "POSTGRES_SCHEMA": spec.schema,
            "POSTGRES_POOL_SIZE": "4",
            "POSTGRES_MAX_OVERFLOW": "4",
            "POSTGRES_CONNECT_TIMEOUT": "10",
            "APPLICATION_RECORDER_TOPIC": get_topic(PostgresJobIndexRecorder),
        }

    def prepare(self) -> bool:
        # Opening an existing store must not run DDL: concurrent CREATE OR REPLACE
        # FUNCTION fails with "tuple concurrently updated".
        return prepare_schema(self.spec)

    def is_retryable(self, exc: BaseException) -> bool:
        return bool(_sqlstates(exc) & _TRANSIENT)

    def is_setup_race(self, exc: BaseException) -> bool:
        return bool(_sqlstates(exc) & _SETUP_RACE)


__all__ = ["PostgresBackend", "PostgresJobIndexRecorder", "prepare_schema"]
