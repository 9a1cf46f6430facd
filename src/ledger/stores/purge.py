"""What a purge asks of a store (`ledger.redaction`, `Ledger.purge`).

The redacted copies of a job's stored events travel to the recorder's insert beside the
Purged event, under `REWRITES_KWARG`, as the index rows do: each backend rewrites them in
place in the same transaction, so the job is purged whole or not at all. The events keep
their originator, version, topic and notification id; only their state changes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from eventsourcing.persistence import StoredEvent

from ledger.exceptions import SendledgerError

#: The keyword argument of `Application.save` that carries the stored events to rewrite.
REWRITES_KWARG = "sendledger_rewrites"


class RewriteFailed(SendledgerError):
    """An event to rewrite was not in the store: the purge's transaction is rolled back."""

    def __init__(self, originator_id: object, version: int) -> None:
        super().__init__(f"no stored event {originator_id} v{version} to rewrite")


def rewrites_from(kwargs: Mapping[str, Any]) -> list[StoredEvent]:
    return list(kwargs.get(REWRITES_KWARG) or [])


__all__ = ["REWRITES_KWARG", "RewriteFailed", "rewrites_from"]
