"""The writes of this process whose commit is not known (docs/architecture.md "Ambiguous
commits"): a save that failed after it may have reached the store - PostgreSQL's
connection lost at COMMIT, whose transaction the server may have committed - leaves its
events pending on the job as if nothing was stored. The next save of the job (the next
renewal, the outcome, a try again) then meets them in the store and conflicts with its
own events. `OwnWrites` remembers, per job, the events of such saves, so that a conflict
whose newer stored events are exactly those is told from another writer's: those events
are adopted as stored and the rest is written on top of them.

Only events this process tried to write in a save that failed count: equal events written
by someone else (two engines of one name on one clock, in a test) still conflict.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

#: Jobs remembered at most: an entry lives until its job's next save that succeeds, and
#: one whose job is never saved again is dropped, oldest first, past this many (its next
#: save, if any, then conflicts as before: lost, never sent twice).
REMEMBERED = 10_000


class OwnWrites:
    """Per job key, the pending events of this process's saves that failed unsure."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._unsure: OrderedDict[str, list[Any]] = OrderedDict()

    def failed(self, key: str, events: Sequence[Any]) -> None:
        """A save of `events` (the job's pending events) failed: they may be stored."""
        with self._lock:
            known = self._unsure.pop(key, [])
            self._unsure[key] = known + [e for e in events if not _among(e, known)]
            while len(self._unsure) > REMEMBERED:
                self._unsure.popitem(last=False)

    def saved(self, key: str) -> None:
        """The job's pending events are stored: nothing of it is unsure any more."""
        with self._lock:
            self._unsure.pop(key, None)

    def any_of(self, key: str) -> bool:
        """Whether a save of the job failed unsure since its last one that succeeded."""
        with self._lock:
            return key in self._unsure

    def stored_of_ours(self, key: str, pending: Sequence[Any], stored: Sequence[Any]) -> int:
        """How many of `pending` (a job's pending events, oldest first) are the events
        `stored` after the job's version: all of `stored`, when each equals the pending
        event at its place and is one this process tried to write in a save that failed;
        0 otherwise (another writer's: a conflict)."""
        if not stored or len(stored) > len(pending):
            return 0
        with self._lock:
            unsure = list(self._unsure.get(key, ()))
        for ours, found in zip(pending, stored, strict=False):
            if found != ours or not _among(ours, unsure):
                return 0
        return len(stored)


def _among(event: Any, events: Sequence[Any]) -> bool:
    """`event` is one of `events` (the very object: equal events are not the same write)."""
    return any(event is e for e in events)
