"""The in-memory provider with a change history (Gmail's `users.history.list`), for engine
tests: the history handle without a socket (docs/architecture.md "The history handle").

Every copy stored gets the next historyId; `history_mark` answers the mailbox's current one
(no call is counted: the Gmail provider shares one between claims), and `sent_since` lists
the copies stored after a start whose Message-ID is exactly the one asked for, each only
`history_lag` seconds after it was stored (0 by default), on the injected clock. A mark
never passes a copy the lag still hides, as Gmail's history never lists a change after one
it does not show yet. Reads and marks can be scripted to fail, and every start given so far
to expire (`HistoryTooOld`, Gmail's 404). `replaces_message_id` stores another Message-ID,
so the history finds no copy of ours, as the search does not.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timedelta

from daemon.doubles.fake_provider import FakeProvider
from daemon.providers.base import ProviderError, SearchHit, SearchResult
from daemon.providers.history_handle import HistoryProvider, HistoryTooOld


class FakeHistoryProvider(FakeProvider):
    def __init__(
        self,
        name: str = "fake-history",
        *,
        clock: Callable[[], datetime],
        index_lag: float = 0.0,
        history_lag: float = 0.0,
        replaces_message_id: bool = False,
    ) -> None:
        super().__init__(
            name, clock=clock, index_lag=index_lag, replaces_message_id=replaces_message_id
        )
        self.history_lag = history_lag
        self._history_ids = itertools.count(1001)
        self._history_of: dict[str, int] = {}  # a copy's provider id -> its historyId
        self._current = 1000
        self._expired_below = 0  # starts below this are too old
        self._failing_marks = 0
        self._failing_reads = 0
        self._reads_unavailable = False
        self.marks = 0  # historyIds handed to claims
        self.history_reads = 0
        #: History reads that got an answer, by the Message-ID read for: a job can have no
        #: more HistoryMissed events than that (a failed read is never a miss).
        self.answered_history: Counter[str] = Counter()
        #: Called in the middle of every history read, after it read the log and before its
        #: answer reaches the caller (as `during_search`).
        self.during_history: Callable[[], None] | None = None

    # -- scripting ----------------------------------------------------------------------

    def fail_marks(self, count: int) -> None:
        """The next `count` claims get no historyId (the profile call failed)."""
        with self._lock:
            self._failing_marks += count

    def fail_history(self, count: int, *, unavailable: bool = False) -> None:
        """The next `count` history reads fail (`unavailable`: as a refused connection)."""
        with self._lock:
            self._failing_reads += count
            self._reads_unavailable = unavailable

    def expire_history(self) -> None:
        """Every historyId given so far is too old from now on (Gmail's 404)."""
        with self._lock:
            self._expired_below = self._current + 1

    # -- the history handle -------------------------------------------------------------

    def history(self) -> HistoryProvider | None:
        return self

    def history_mark(self, before_call: Callable[[], None] | None = None) -> str | None:
        # A shared mark: no call, so `before_call` is not run (a test that makes the mark
        # call runs it, as Gmail does before a fetch).
        with self._lock:
            if self._failing_marks:
                self._failing_marks -= 1
                return None
            self.marks += 1
            return str(self._horizon())

    def sent_since(self, history_id: str, message_id: str) -> SearchResult:
        start = int(history_id)
        query = f"history since {start}"
        with self._lock:
            self.history_reads += 1
            if self._failing_reads:
                self._failing_reads -= 1
                if self._reads_unavailable:
                    raise ProviderError("history: connection refused (scripted)", unavailable=True)
                raise ProviderError("history failed (scripted)", retry_after=1.0)
            if start < self._expired_below:
                raise HistoryTooOld(history_id, f"historyId {start} expired (scripted)")
            self.answered_history[message_id] += 1
            horizon = self._horizon()
            # Gmail lists the messages added with the SENT label: not a message received
            # with the Message-ID and deleted (`store_copy(..., in_trash=True)`).
            hits = tuple(
                SearchHit(copy.provider_message_id, copy.message_id, ("SENT",))
                for copy in self.copies
                if start < self._history_of[copy.provider_message_id] <= horizon
                and copy.message_id == message_id
                and not copy.in_trash
            )
        hook = self.during_history
        if hook is not None:
            hook()
        return SearchResult(query=query, hits=hits)

    # -- inside ---------------------------------------------------------------------------

    def _store(
        self, message_id: str, to: str = "", subject: str = "", *, in_trash: bool = False
    ) -> str:
        provider_id = super()._store(message_id, to, subject, in_trash=in_trash)
        self._current = next(self._history_ids)
        self._history_of[provider_id] = self._current
        return provider_id

    def _horizon(self) -> int:
        """The latest historyId whose change, and every one before it, is listed now."""
        visible_before = self.clock() - timedelta(seconds=self.history_lag)
        hidden = [
            self._history_of[copy.provider_message_id]
            for copy in self.copies
            if copy.stored_at > visible_before
        ]
        return min(hidden) - 1 if hidden else self._current
