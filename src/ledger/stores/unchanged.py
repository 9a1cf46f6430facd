"""A write that holds only while another record is as its writer read it.

A daemon decides on a record it read (a provider's handle unmarked) and writes the
decision on another (the job): another daemon may change the first in between. So the
write carries what it was decided on (`Unchanged`: the record's id and the version read)
and the store reads that record again in the write's own transaction, on its own
connection, once the write holds its turn among the writers, right before the commit;
changed, the write rolls back (`Changed`) and the writer decides again on what is there
now (docs/how-it-works.md "The read-back of the Message-ID").

A write of the record so read takes the same turn before its commit (`TAKES_TURN_KWARG`),
so it never commits between such a read and the guarded write's commit: SQLite has one
writer at a time already, the memory store one lock, and PostgreSQL the lock its job
writes take in turn (`PostgresJobIndexRecorder._serialize_writes`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from ledger.stores.index import Withdrawn

#: The keyword argument of the recorder's insert that carries the `Unchanged` a write
#: holds to (`ledger.stores.private_api.pass_to_recorder`).
UNCHANGED_KWARG = "sendledger_unchanged"
#: ... and the one that makes a write of no job take its turn among the job writes
#: before its commit (a provider handle's mark).
TAKES_TURN_KWARG = "sendledger_takes_turn"


@dataclass(frozen=True)
class Unchanged:
    """The record `originator_id` as its writer read it: its events up to `version`
    (0: none stored)."""

    originator_id: UUID
    version: int


class Changed(Withdrawn):
    """The record a write was decided on changed after its writer read it: nothing of
    the write was stored."""


def unchanged_from(kwargs: Mapping[str, Any]) -> Unchanged | None:
    found: Unchanged | None = kwargs.get(UNCHANGED_KWARG)
    return found


def takes_turn(kwargs: Mapping[str, Any]) -> bool:
    return bool(kwargs.get(TAKES_TURN_KWARG))


def hold_unchanged(kwargs: Mapping[str, Any], last_version: Callable[[UUID], int]) -> None:
    """Raise `Changed` (the transaction rolls back) when the record the write holds to
    has events past the version its writer read; `last_version(id)` reads it in the
    write's transaction (0: none)."""
    unchanged = unchanged_from(kwargs)
    if unchanged is None:
        return
    now = last_version(unchanged.originator_id)
    if now != unchanged.version:
        raise Changed(
            f"record {unchanged.originator_id} changed after it was read "
            f"(version {unchanged.version}, now {now})"
        )


__all__ = [
    "TAKES_TURN_KWARG",
    "UNCHANGED_KWARG",
    "Changed",
    "Unchanged",
    "hold_unchanged",
    "takes_turn",
    "unchanged_from",
]
