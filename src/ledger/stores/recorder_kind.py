"""Which backend a Ledger's recorder writes to, for the stores kept beside the events
(webhook positions, scope leases, loaded policies) that have a class per backend."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")


def recorder_backend(recorder: object) -> str:
    """ "postgres", "sqlite" or "memory": the backend of a Ledger's recorder, by the
    eventsourcing module its class comes from (importing the PostgreSQL one, and so
    psycopg, only to ask would slow every SQLite command)."""
    modules = {cls.__module__ for cls in type(recorder).__mro__}
    if "eventsourcing.postgres" in modules:
        return "postgres"
    if "eventsourcing.sqlite" in modules:
        return "sqlite"
    return "memory"


def postgres_table(recorder: Any, table: str) -> str:
    """`table` in the schema of the PostgreSQL store `recorder` writes to, the schema
    quoted as SQL names it (a configured schema may hold any character)."""
    schema = str(recorder.datastore.schema).replace('"', '""')
    return f'"{schema}".{table}'


@dataclass(frozen=True)
class ByBackend(Generic[T]):
    """A store kept beside the events with a class per backend: `ByBackend[Protocol](...)
    (recorder)` builds the one of the backend `recorder` (a Ledger's) writes to."""

    postgres: Callable[[Any], T]
    sqlite: Callable[[Any], T]
    memory: Callable[[Any], T]

    def __call__(self, recorder: Any) -> T:
        kind = {"postgres": self.postgres, "sqlite": self.sqlite, "memory": self.memory}
        return kind[recorder_backend(recorder)](recorder)


__all__ = ["ByBackend", "postgres_table", "recorder_backend"]
