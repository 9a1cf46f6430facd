"""The Gmail emulator's change log: `users.history.list` of one mailbox at a time.

Gmail keeps a log of each mailbox's changes, each record numbered by a `historyId` that only
grows; `users.history.list` answers the records after a `startHistoryId`, filtered by label
and record type, in pages, with the mailbox's current `historyId`. A start that is too old
(Gmail keeps about a week) is answered 404: the client must start again from a fresh one.

What the emulator keeps of it, and why:
- a record per message added (`messageAdded`: a send, a draft's creation, an injected
  message) and per label added to a message (`labelAdded`: a draft that was sent, whose
  message keeps its id and becomes SENT), with the message's labels as they were then;
- a lag (`lag`, 0 by default): a record is listed only `lag` seconds after it was written,
  and the `historyId` an answer (or getProfile) gives is never past a record still hidden,
  so a client that starts from it later misses nothing;
- `expire()`: every start up to now is answered 404 from then on.

Only the emulator uses it; it holds no lock of its own (the emulator's lock is held around
every call).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

MESSAGE_ADDED = "messageAdded"
LABEL_ADDED = "labelAdded"
HISTORY_TYPES = (MESSAGE_ADDED, LABEL_ADDED, "messageDeleted", "labelRemoved")


@dataclass(frozen=True)
class HistoryRecord:
    id: int
    kind: str  # MESSAGE_ADDED or LABEL_ADDED
    message_id: str
    thread_id: str
    labels: tuple[str, ...]  # the message's labels once the change was made
    added_labels: tuple[str, ...]  # LABEL_ADDED: the labels this change added
    visible_at: float


class HistoryGone(Exception):
    """The start is older than what the mailbox's history keeps (Gmail answers 404)."""


class MailboxHistory:
    """One mailbox's records, oldest first."""

    def __init__(self) -> None:
        self.records: list[HistoryRecord] = []
        self.floor = 0  # starts below this are answered 404 (`expire`)

    def add(self, record: HistoryRecord) -> None:
        self.records.append(record)

    def expire(self, current: int) -> None:
        """Every start before `current` is too old from now on (the caller moved the
        history id on to it, so a fresh start is `current` and works)."""
        self.floor = current

    def horizon(self, current: int, now: float) -> int:
        """The historyId an answer may give: `current`, or just before the first record
        still hidden by the lag (a client starting from it later must not skip that one)."""
        hidden = [record.id for record in self.records if record.visible_at > now]
        return min(hidden) - 1 if hidden else current

    def page(
        self,
        start: int,
        *,
        current: int,
        now: float,
        label: str | None,
        kinds: Sequence[str],
        max_results: int,
        after: int | None,
    ) -> dict[str, Any]:
        """One page of `users.history.list` from `start`; `after`: the page token (the
        last record id of the page before)."""
        if start < self.floor:
            raise HistoryGone(start)
        horizon = self.horizon(current, now)
        found = [
            record
            for record in self.records
            if start < record.id <= horizon
            and (after is None or record.id > after)
            and (not kinds or record.kind in kinds)
            and (label is None or label in record.labels)
        ]
        page = found[:max_results]
        answer: dict[str, Any] = {"historyId": str(horizon)}
        if page:
            answer["history"] = [_history_json(record) for record in page]
        if len(found) > max_results:
            answer["nextPageToken"] = str(page[-1].id)
        return answer


def _history_json(record: HistoryRecord) -> dict[str, Any]:
    message = {
        "id": record.message_id,
        "threadId": record.thread_id,
        "labelIds": list(record.labels),
    }
    entry: dict[str, Any] = {
        "id": str(record.id),
        "messages": [{"id": record.message_id, "threadId": record.thread_id}],
    }
    if record.kind == MESSAGE_ADDED:
        entry["messagesAdded"] = [{"message": message}]
    else:
        entry["labelsAdded"] = [{"message": message, "labelIds": list(record.added_labels)}]
    return entry


__all__ = ["HISTORY_TYPES", "HistoryGone", "HistoryRecord", "MailboxHistory"]
