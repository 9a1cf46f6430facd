"""The PostgreSQL backend: eventsourcing's PostgreSQL recorder, writing the job index row
in the same transaction as the events, and the store's schema.

Imported only when a postgresql:// store is used, so that SQLite users do not pay for
loading psycopg (`ledger.stores.backend_for` imports it lazily).
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import psycopg
from eventsourcing.persistence import InterfaceError, OperationalError, StoredEvent
from eventsourcing.postgres import PostgresApplicationRecorder, PostgresDatastore
from eventsourcing.utils import get_topic, retry
from psycopg.sql import SQL

from ledger.stores import exception_chain
from ledger.stores.identity import IdentityTaken
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

    @retry((InterfaceError, OperationalError), max_attempts=10, wait=0.2)
    def insert_events(
        self, stored_events: Sequence[StoredEvent], **kwargs: Any
    ) -> Sequence[int] | None:
        if not self.datastore.enable_db_functions:
            ids: Sequence[int] | None = super().insert_events(stored_events, **kwargs)
            return ids
        # POSTGRES_ENABLE_DB_FUNCTIONS=y (read from the process environment too): the
        # library calls its insert function and skips `_insert_events`, so the index
        # rows would be lost. Call the same function, then write the rows, in one
        # transaction.
        pg_events = [
            self.construct_pg_stored_event(e.originator_id, e.originator_version, e.topic, e.state)
            for e in stored_events
        ]
        with (
            self.datastore.get_connection() as conn,
            conn.transaction(),
            conn.cursor() as curs,
        ):
            curs.execute(self.sql_invoke_pg_function_insert_events, (pg_events,), prepare=True)
            ids = [int(r[self.pg_function_name_insert_events]) for r in curs.fetchall()]
            self._upsert_rows(curs, **kwargs)
        return ids

    def _insert_events(
        self, curs: Any, stored_events: Sequence[StoredEvent], **kwargs: Any
    ) -> None:
        super()._insert_events(curs, stored_events, **kwargs)
        self._upsert_rows(curs, **kwargs)

    def _upsert_rows(self, curs: Any, **kwargs: Any) -> None:
        rows = rows_from(kwargs)
        if rows:
            curs.executemany(self._sql(UPSERT), [r.as_tuple() for r in rows])

    def _transaction(self, *, commit: bool) -> AbstractContextManager[Any]:
        return self.datastore.transaction(commit=commit)

    def _tuples(self, cursor: Any) -> list[tuple[Any, ...]]:
        return [tuple(r.values()) for r in cursor.fetchall()]

    def _has_events_sql(self) -> tuple[str, Callable[[str], Any]]:
        schema = self.datastore.schema.replace('"', '""')
        table = self.events_table_name.replace('"', '""')
        sql = f'SELECT 1 FROM "{schema}"."{table}" WHERE originator_id = %s LIMIT 1'
        return sql, UUID


def _sqlstates(exc: BaseException) -> set[str]:
    return {
        error.sqlstate
        for error in exception_chain(exc)
        if isinstance(error, psycopg.Error) and error.sqlstate
    }


def schema_exists(store: PostgresStore) -> bool:
    """True when the job index table (created last) is in the store's schema. Creates
    nothing: read-only commands ask this before they open a store."""
    with psycopg.connect(**_connect_args(store)) as conn:
        found = conn.execute(
            "SELECT to_regclass(%s)", (f'"{store.schema}".{INDEX_TABLE}',)
        ).fetchone()
        return found is not None and found[0] is not None


def prepare_schema(store: PostgresStore) -> bool:
    """True when the job index table (created last) is already in the store's schema;
    else create the schema if it is missing (the application creates the tables)."""
    try:
        with psycopg.connect(**_connect_args(store)) as conn:
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


class AdvisoryIdentityLock:
    """`ledger.stores.identity`: a session advisory lock on a connection of its own."""

    def __init__(self, store: PostgresStore, name: str) -> None:
        digest = hashlib.sha256(f"sendledger:{store.schema}:{name}".encode()).digest()
        key = int.from_bytes(digest[:8], "big", signed=True)
        self._conn: psycopg.Connection[Any] | None = psycopg.connect(
            **_connect_args(store),
            autocommit=True,
            # A daemon's host that vanishes (no FIN) must not hold its name for hours.
            keepalives=1,
            keepalives_idle=10,
            keepalives_interval=5,
            keepalives_count=3,
        )
        row = self._conn.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()
        if row is None or not row[0]:
            self.release()
            raise IdentityTaken(name, f"{store.host}:{store.port}/{store.dbname}")

    def release(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(psycopg.Error):
                self._conn.close()  # the session ends: its advisory locks with it
            self._conn = None


def _connect_args(store: PostgresStore) -> dict[str, Any]:
    return {
        "dbname": store.dbname,
        "host": store.host,
        "port": store.port,
        "user": store.user,
        "password": store.password or None,
        "connect_timeout": 10,
    }


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

    def identity_lock(self, name: str) -> AdvisoryIdentityLock:
        return AdvisoryIdentityLock(self.spec, name)

    def is_retryable(self, exc: BaseException) -> bool:
        return bool(_sqlstates(exc) & _TRANSIENT)

    def is_setup_race(self, exc: BaseException) -> bool:
        return bool(_sqlstates(exc) & _SETUP_RACE)


__all__ = [
    "AdvisoryIdentityLock",
    "PostgresBackend",
    "PostgresJobIndexRecorder",
    "prepare_schema",
]
