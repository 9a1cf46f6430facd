"""Where each webhook stands (`sendledger webhooks status`, docs/http-api.md "Webhooks"): its
position, how far behind the log it is, and its last error. Read only: a store without
the position table shows every configured webhook at the beginning."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from daemon.webhooks.events import WEBHOOK_TYPES, event_id_for, topics_for, type_of
from ledger.application import Ledger
from ledger.display import iso
from ledger.stores.positions import final_end

PAGE = 500
#: Undelivered events counted at most (a larger backlog shows as this, with "+").
COUNT_LIMIT = 10_000


def webhook_status(
    ledger: Ledger, configured: Mapping[str, Sequence[str]], now: float
) -> list[dict[str, Any]]:
    """One record per webhook configured (`name -> event types`) or known to the store."""
    positions = ledger.positions()
    rows = {row.name: row for row in positions.read_all()}
    end = int(ledger.recorder.max_notification_id() or 0)
    records = []
    for name in sorted(set(configured) | set(rows)):
        row = rows.get(name)
        position = row.position if row is not None else 0
        types = configured.get(name, WEBHOOK_TYPES)
        # Counted as far as the log is final, where delivery reads to (`horizon`): on
        # PostgreSQL a save still in flight below newer ids holds the webhook there, and
        # the events past it are not what it sends next (nor skipped by `webhooks skip`).
        final = final_end(positions, position)
        behind, oldest, head = _backlog(ledger, position, final, types)
        records.append(
            {
                "name": name,
                "configured": name in configured,
                "position": position,
                "log_end": end,
                "behind": behind,
                "behind_capped": behind >= COUNT_LIMIT,
                "next_event_id": head,
                "oldest_undelivered_at": iso(oldest),
                "lag_seconds": None if oldest is None else round(max(now - oldest, 0.0), 3),
                "failures": row.failures if row else 0,
                "next_attempt_at": iso(row.next_at) if row else None,
                "last_error": row.last_error if row else None,
                "last_error_at": iso(row.last_error_at) if row else None,
                "delivered": row.delivered if row else 0,
                "failed": row.failed if row else 0,
                "owner": (row.owner or None) if row else None,
                "lease_until": iso(row.lease_until) if row and row.lease_until else None,
            }
        )
    return records


def _backlog(
    ledger: Ledger, position: int, end: int, types: Sequence[str]
) -> tuple[int, float | None, str | None]:
    """(events of these types after `position`, up to COUNT_LIMIT; the time of the
    oldest, epoch seconds; its `webhook-id`)."""
    count, oldest, head = 0, None, None
    for note, event in undelivered(ledger, position, end, types):
        count += 1
        if head is None:
            head = event_id_for(note.originator_id, note.originator_version)
            oldest = None if event is None else event.timestamp.timestamp()
        if count >= COUNT_LIMIT:
            break
    return count, oldest, head


def undelivered(
    ledger: Ledger, position: int, end: int, types: Sequence[str]
) -> Iterator[tuple[Any, Any]]:
    """(notification, event) of every event of these types in (position, end], in log
    order: what a webhook at `position` has still to deliver. An event that cannot be
    read (a key that left the key file) comes with None: the worker fails on it, and
    `webhooks skip` is the way past it, so it must be counted and skippable here."""
    topics = topics_for(types)
    after = position
    while True:
        page = ledger.log_after(after, end, PAGE, topics)
        for note in page:
            try:
                event: Any = ledger.mapper.to_domain_event(note)
            except Exception:
                yield note, None
                continue
            if type_of(event, types) is not None:
                yield note, event
        if len(page) < PAGE:
            return
        after = page[-1].id


__all__ = ["COUNT_LIMIT", "undelivered", "webhook_status"]
