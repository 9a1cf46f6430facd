"""Which backend a Ledger's recorder writes to, for the stores kept beside the events
(webhook positions, scope leases) that have a class per backend."""

from __future__ import annotations


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


__all__ = ["recorder_backend"]
