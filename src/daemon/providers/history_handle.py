"""The history handle: the mailbox's change log read after an unknown outcome (docs/providers.md
"What each handle proves"; docs/architecture.md "The history handle").

Gmail numbers every change of a mailbox (`historyId`, only growing) and lists the changes
after a given one (`users.history.list`). A historyId known before a claim is a point in
that log before the claim's send: the SENT messages added after it are every message the
mailbox sent since, the claim's copy among them if it was sent, with no search index in
between. So a copy of ours found there is proof the attempt sent it; its absence proves
nothing until the log's own lag has passed.

A provider offers it as a declared capability (`Provider.history()`); one without a change
log (SMTP + IMAP, Graph, Gmail's drafts mode) offers none, and its path contains no history
code. A provider never touches the store: these are values the engine turns into events.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from daemon.providers.outcomes import SearchResult
from ledger.exceptions import SendledgerError


class HistoryTooOld(SendledgerError):
    """The history since the start cannot be read: older than what the mailbox's history
    keeps (Gmail: 404, about a week), or more messages added since (or pages listed) than
    one read takes. The history cannot answer for this attempt, only the search can. Not a
    ProviderError: asking again will not help."""

    def __init__(self, history_id: str, reason: str) -> None:
        super().__init__(reason)
        self.history_id = history_id
        self.reason = reason


class HistoryProvider(Protocol):
    """What reading the mailbox's history asks of a provider, besides the provider port."""

    def history_mark(self, before_call: Callable[[], None] | None = None) -> str | None:
        """A historyId of the mailbox at or before now, to record with a claim: the one
        shared by the mailbox's claims when it is recent, else a fresh one (one call, paid
        by the send's quota reservation). None when none can be had now: the claim goes
        ahead without, and its unknown outcome is left to the search. Never raises but
        what `before_call` raises.

        `before_call()` runs first when a call is to be made or waited for (a fresh one,
        or another claim's in flight), not for a shared mark: the caller saves there what
        must not wait behind a call that may take the provider's whole timeout."""
        ...

    def sent_since(self, history_id: str, message_id: str) -> SearchResult:
        """Every SENT message added to the mailbox after `history_id` whose Message-ID
        header is exactly `message_id`, with the query as sent (every page read, each
        added message's header read back). Raises HistoryTooOld when the start is too
        old (or too much to read), ProviderError when the answer is not known (never "no
        copies" then)."""
        ...


__all__ = ["HistoryProvider", "HistoryTooOld"]
