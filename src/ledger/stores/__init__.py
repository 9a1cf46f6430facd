"""Where the ledger's events and job index are kept: one module per backend, laid out as
eventsourcing lays out its own persistence (eventsourcing.sqlite, eventsourcing.postgres,
eventsourcing.popo).

- `url`: store URLs and the specs they parse into;
- `index`: the job index row and the queries every backend answers;
- `sqlite`, `postgres`, `memory`: each a recorder that writes the index in the same
  transaction (or under the same lock) as the events, and a `StoreBackend`.
- `pg_refusals`: a PostgreSQL server's refusal of a connection told by its SQLSTATE,
  and the fix said with it (imported by `postgres` only).

`backend_for` picks the backend of a spec. The PostgreSQL modules (and so psycopg) are
imported only for a PostgreSQL spec.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Protocol

from ledger.stores.identity import IdentityLock, IdentityTaken
from ledger.stores.url import (
    MemoryStore,
    PostgresStore,
    SqliteStore,
    StoreSpec,
    StoreUrlError,
    parse_store_url,
)


class StoreBackend(Protocol):
    """What the `Ledger` application needs from a backend, and nothing about SQL."""

    @property
    def spec(self) -> StoreSpec: ...

    @property
    def env(self) -> Mapping[str, str]:
        """The eventsourcing environment that opens the application on this store
        (persistence module, connection settings, the index-writing recorder)."""
        ...

    def prepare(self) -> bool:
        """Run before the application opens: create what the tables need around them
        (a folder, a PostgreSQL schema). True when the tables exist already, so that
        opening must not run DDL."""
        ...

    def upgrade(self) -> None:
        """Add what an existing store from an earlier release lacks in its job index
        (`ADDED_COLUMNS`, `ADDED_INDEXES`): DDL only when something is missing. Run once
        the store's key checks passed (`ledger.stores.keycheck`), so that a store
        refused at open is left as it was."""
        ...

    def identity_lock(self, name: str) -> IdentityLock:
        """Hold `name` for this process as long as it lives (`ledger.stores.identity`);
        IdentityTaken when another live process holds it."""
        ...

    def names_held(self, names: Collection[str]) -> set[str] | None:
        """Which of `names` a live process holds on this store now (`identity_lock`),
        asked without taking any; None where this process cannot tell (a file system
        without record locks). PostgreSQL answers None here: its loaded-policy rows ask
        the server in the statement that reads them (`ledger.stores.loaded_policies`)."""
        ...

    def scrub(self) -> bool:
        """After purges: make what they rewrote unreachable in the store's files as far
        as the backend can (SQLite: checkpoint and truncate the WAL; PostgreSQL: VACUUM).
        False when it could not finish now (it is tried again after the next purge)."""
        ...

    def access_problem(self) -> str | None:
        """Why this process may not read or write the store's files (`permission denied:
        USER may not ...`, naming the file or folder), asked once a read or write was
        refused (`causes.access_denied`); None when no mode is the cause, or the store
        has no files of this process's (PostgreSQL's privileges are its own words)."""
        ...

    def is_retryable(self, exc: BaseException) -> bool:
        """A transient lock error: the same read or write may simply be tried again."""
        ...

    def is_setup_race(self, exc: BaseException) -> bool:
        """An error from opening the store while another process creates the same
        tables: opening again will find them."""
        ...


def backend_for(spec: StoreSpec) -> StoreBackend:
    if isinstance(spec, SqliteStore):
        from ledger.stores.sqlite import SQLiteBackend

        return SQLiteBackend(spec)
    if isinstance(spec, MemoryStore):
        from ledger.stores.memory import MemoryBackend

        return MemoryBackend(spec)
    from ledger.stores.postgres import PostgresBackend

    return PostgresBackend(spec)


def store_exists(spec: StoreSpec) -> bool:
    """Whether the store at `spec` holds sendledger's tables, asked without creating
    anything (a memory store exists only inside its process: never)."""
    if isinstance(spec, SqliteStore):
        from ledger.stores.sqlite import schema_exists

        spec.refuse_unmounted()  # "no store at PATH" would send the reader to `submit`
        return schema_exists(spec)
    if isinstance(spec, PostgresStore):
        from ledger.stores.postgres import schema_exists as postgres_schema_exists

        return postgres_schema_exists(spec)
    return False


__all__ = [
    "IdentityLock",
    "IdentityTaken",
    "MemoryStore",
    "PostgresStore",
    "SqliteStore",
    "StoreBackend",
    "StoreSpec",
    "StoreUrlError",
    "backend_for",
    "parse_store_url",
]
