"""The provider port: what the daemon asks of a mail provider, every capability declared.

A provider never touches the store. It returns values (`outcomes.py`: a send's outcome, a
search's copies, the error of a call that gave no answer; imported here, so the port is
one name to import from); the daemon turns them into events.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime
from typing import TYPE_CHECKING, Protocol, cast

from daemon.providers.outcomes import (
    Fenced,
    FoundReport,
    ProviderError,
    ReportRead,
    SearchHit,
    SearchResult,
    SendKind,
    SendOutcome,
)
from ledger.exceptions import SendledgerError

if TYPE_CHECKING:
    from daemon.providers.draft_handle import BeforeDeleting, DraftFirst, DraftsProvider
    from daemon.providers.history_handle import HistoryProvider

# The defaults of the Message-ID read-back (daemon/engine/readback.py): the port declares them
# so providers and settings share them without importing the engine (docs/performance.md,
# "Performance and scaling").
#: Enough to catch a provider that replaces every Message-ID before anything else depends on it.
DEFAULT_READBACK_FIRST = 10
#: One send in a hundred: a read-back costs an API call (5 Gmail quota units) per send.
DEFAULT_READBACK_RATE = 0.01
#: What `ProviderBase.ping` searches for: `.invalid` is reserved (RFC 2606), so no message
#: anyone sent has it.
PING_MESSAGE_ID = "<ping@sendledger.invalid>"


class Provider(Protocol):
    """What the engine asks of a mail provider: four calls, and the capabilities below
    them. A provider class subclasses :class:`ProviderBase`, which gives every capability
    its default, and writes only the four calls and what it does differently
    (``docs/architecture.md``, "Adding a provider")."""

    name: str
    #: Whether the id a confirmed send returns names a stored copy that `read_message_id`
    #: can read (Gmail's message id does; an SMTP 250 names only a queue entry).
    response_ids_readable: bool
    #: Seconds one call may take before it is abandoned (the claim's deadline adds the
    #: daemon's grace to it).
    timeout: float
    #: The Message-ID read-back after confirmed sends (``daemon/engine/readback.py``): every
    #: one of the first `readback_first` after start-up, then a `readback_rate` share.
    readback_first: int
    readback_rate: float
    #: Whether a send may leave an unsent draft with the job's Message-ID in the mailbox
    #: (Graph's create step; Gmail with `send_via = "drafts"`): the engine then deletes
    #: them with `delete_drafts` before it counts a lapsed claim's copies, and once the
    #: job is settled (docs/architecture.md "Drafts never outlive their job").
    leaves_drafts: bool
    #: Whether `read_reports` finds delivery reports (bounces) in the mailbox the provider
    #: acts as: the engine watches a channel's confirmed jobs (`watch_bounces`) only on a
    #: provider that does (docs/how-it-works.md "Bounces").
    reads_reports: bool
    #: Whether the message the provider sends carries the Date we wrote, unchanged (an
    #: SMTP server keeps it): a delivery report of a job must then quote that Date in its
    #: original's headers (docs/how-it-works.md "Bounces: what a report proves").
    keeps_date: bool

    def send_raw(self, raw: bytes) -> SendOutcome:
        """Send one complete RFC 5322 message exactly once. Never raises for
        outcomes of the call itself: every failure is classified into the outcome. A send
        of several calls that stops before any call that could send the message (its
        quota scope went to another daemon: `next_call` raised `ScopeLost`) answers
        `stopped_before_send(...)`: Rejected, transient, `not_attempted`, no attempt."""
        ...

    def search(self, message_id: str) -> SearchResult:
        """Every SENT copy (spam and trash included) whose Message-ID header is
        exactly `message_id`, with the query sent. Raises ProviderError when the answer
        is not known."""
        ...

    def read_message_id(self, provider_message_id: str) -> str | None:
        """The Message-ID header of a stored copy (None if it has none).
        Raises ProviderError when the answer is not known."""
        ...

    def close(self) -> None: ...

    def drafts(self) -> DraftsProvider | None:
        """The provider's drafts calls when it sends through drafts (Gmail with
        `send_via = "drafts"`): the engine then records the draft before the claim and
        sends that draft (docs/architecture.md "The life of one job on a drafts
        provider"). None for every other provider."""
        ...

    def draft_first(self) -> DraftFirst | None:
        """The provider's two steps when each of its sends makes a draft and sends it
        (Graph): the engine makes the draft before the claim, records its id with the
        claim and sends it (docs/architecture.md "Microsoft Graph"). None for every
        other provider."""
        ...

    def history(self) -> HistoryProvider | None:
        """The mailbox's change log, when the provider keeps one the engine can read after
        an unknown outcome (Gmail with `send_via = "messages"`): a historyId recorded with
        each claim, and the SENT messages added since it (docs/architecture.md "The
        history handle"). None for every other provider."""
        ...

    def delete_drafts(
        self, message_id: str, before_deleting: BeforeDeleting | None = None
    ) -> list[str]:
        """Delete every unsent draft whose Message-ID header is exactly `message_id`, and
        say which were deleted (none for a provider that leaves no drafts). Raises
        ProviderError when the answer is not known. `before_deleting`, when given, is
        called once with the ids listed for deletion (perhaps none), after the listing
        and before the first deletion: whatever it raises stops the call there, nothing
        deleted (a person's resend records its fence so, on the version it decided on:
        docs/architecture.md "Drafts never outlive their job")."""
        ...

    def ping(self) -> None:
        """A call that sends nothing and proves the provider answers now. Raises
        ProviderError (unavailable, or timed_out) when it does not. The probe of a circuit
        that hung calls opened: no job is sent into a hang to find out whether it ended."""
        ...

    def read_reports(
        self,
        since: datetime,
        *,
        known: Collection[str],
        max_bytes: int,
        limit: int,
        may_go_on: Callable[[], bool] | None = None,
    ) -> ReportRead:
        """The messages of the mailbox that may be delivery reports, received since
        `since`: every candidate's id, and the bytes of at most `limit` of those not in
        `known` (a message over `max_bytes` is listed with `raw` None, not read). Paid
        from the mailbox's quota as a search is, leaving a send's worth in it. Raises
        ProviderError when the answer is not known. `may_go_on()`, where a read makes
        several calls, is asked before each (whether the mailbox's quota scope is still
        the caller's, `owners.py`): False stops the read there, incomplete, to go on at
        the next one."""
        ...

    def forget_report_reads(self) -> None:
        """Drop what the provider keeps of a report read of this mailbox that stopped
        before its end (a listing, the page it stopped at): the engine reads the mailbox
        no more (nothing watched there, its channel gone or no longer watching), so the
        read would never go on. A read asked for later starts afresh, from page 1."""
        ...

    def for_job(self, from_addr: str, thread_id: str | None) -> Provider:
        """The provider as one job sees it: a provider that acts per mailbox or per thread
        (Gmail with `user = "{from}"`, a job's `thread_id`) returns a view acting as the
        job's From mailbox; any other returns itself."""
        ...

    def scope(self) -> str:
        """Whose quota and availability this provider's calls spend: its name, or its name
        and mailbox where the quota is per mailbox. The engine keeps one circuit and one
        queue of due sends per scope (docs/operations.md, "Outages and quotas")."""
        ...

    def scope_of(self, mailbox: str) -> str:
        """The scope a job from `mailbox` (its From's address, lower case:
        `ledger.addresses.mailbox_key`) spends: `for_job(...).scope()` of such a job,
        known without making the view. Daemons sharing a store lease scopes by it before
        they load a job (docs/performance.md "Several daemons")."""
        ...

    def reserve_send(self) -> float:
        """Take the quota one send needs (with Gmail's `send_via = "drafts"`, its draft
        step before the claim too), without waiting: 0.0 when it was taken (the next
        `send_raw` of this scope spends it and does not wait), else the seconds until
        it could be (nothing taken). The engine takes a job only once its scope's send is
        reserved, so waiting for a quota never holds a worker."""
        ...

    def quota_available(self) -> float | None:
        """Quota units left now (the metrics gauge), or None for a provider without a
        metered quota."""
        ...

    def forget_idle(self) -> int:
        """Drop what the provider keeps per mailbox for the mailboxes idle long enough
        that a fresh one would equal it (a provider acting as each job's From mailbox);
        how many were dropped. The engine calls it every tick, so it costs what it
        drops, never what it keeps (``daemon/providers/mailboxes.py``)."""
        ...


class ProviderBase:
    """The defaults of every capability of :class:`Provider`; a provider subclasses it
    and overrides what it does differently."""

    name: str = ""
    response_ids_readable: bool = False
    timeout: float = 30.0
    readback_first: int = DEFAULT_READBACK_FIRST
    readback_rate: float = DEFAULT_READBACK_RATE
    leaves_drafts: bool = False
    reads_reports: bool = False
    keeps_date: bool = False

    def drafts(self) -> DraftsProvider | None:
        return None

    def draft_first(self) -> DraftFirst | None:
        return None

    def history(self) -> HistoryProvider | None:
        return None

    def read_reports(
        self,
        since: datetime,
        *,
        known: Collection[str],
        max_bytes: int,
        limit: int,
        may_go_on: Callable[[], bool] | None = None,
    ) -> ReportRead:
        # A provider that finds no reports: nothing listed (the engine never asks it).
        return ReportRead(query="")

    def forget_report_reads(self) -> None:
        pass  # it keeps nothing between reads

    def delete_drafts(
        self, message_id: str, before_deleting: BeforeDeleting | None = None
    ) -> list[str]:
        if before_deleting is not None:
            before_deleting([])  # nothing listed: a provider that leaves no drafts
        return []

    def ping(self) -> None:
        # A search for a Message-ID nobody can have sent: an answer, and no copy. A
        # provider with a cheaper call that sends nothing overrides it.
        cast(Provider, self).search(PING_MESSAGE_ID)

    def for_job(self, from_addr: str, thread_id: str | None) -> Provider:
        # Typed as Provider: a subclass that omits one of the four calls fails mypy here.
        return self  # type: ignore[return-value]

    def scope(self) -> str:
        return self.name

    def scope_of(self, mailbox: str) -> str:
        return self.scope()

    def reserve_send(self) -> float:
        return 0.0

    def quota_available(self) -> float | None:
        return None

    def forget_idle(self) -> int:
        return 0


def for_job(provider: Provider, from_addr: str, thread_id: str | None) -> Provider:
    """`provider.for_job(...)`: the provider as one job sees it."""
    return provider.for_job(from_addr, thread_id)


def fence_job(
    provider: Provider,
    message_id: str,
    made: Collection[str] = (),
    before_deleting: BeforeDeleting | None = None,
) -> Fenced:
    """The job's unsent drafts deleted: on a provider that makes its drafts before the
    claim, the ones its claims recorded (`made`) by id too, what was read of them kept
    for the search that follows (`search_job`). `before_deleting`: as
    `Provider.delete_drafts` takes it."""
    first = provider.draft_first()
    if first is not None and made:
        return first.delete_made(message_id, made, before_deleting=before_deleting)
    return Fenced(provider.delete_drafts(message_id, before_deleting))


def search_job(
    provider: Provider,
    message_id: str,
    made: Collection[str] = (),
    fenced: Fenced | None = None,
) -> SearchResult:
    """The job's copies searched (reading only): on a provider that makes its drafts before
    the claim, the copies the drafts its claims recorded (`made`) became, read by id too,
    whichever process made them; a listing by Message-ID may not show them for minutes.
    One piece of code for the daemon's searches and a person's (docs/architecture.md
    "Microsoft Graph"). `fenced`: the job's fence made just before by the same caller
    (`fence_job`), whose reads by id are not made again."""
    first = provider.draft_first()
    if first is not None and made:
        return first.search_made(message_id, made, fenced)
    return provider.search(message_id)


__all__ = [
    "DEFAULT_READBACK_FIRST",
    "DEFAULT_READBACK_RATE",
    "PING_MESSAGE_ID",
    "FoundReport",
    "Provider",
    "ProviderBase",
    "ProviderError",
    "ReportRead",
    "SearchHit",
    "SearchResult",
    "SendKind",
    "SendOutcome",
    "fence_job",
    "for_job",
    "search_job",
    "stopped_before_send",
]


# -- several calls, one operation -----------------------------------------------------

#: Whether the operation under way in this thread may make its next call: set by the
#: engine around a check's call (`calls_while`), asked between its calls by a provider
#: whose one operation makes several (Graph's search and draft deletion: `next_call`).
_MAY_GO_ON: ContextVar[Callable[[], bool] | None] = ContextVar("may_go_on", default=None)


class ScopeLost(SendledgerError):
    """An operation of several calls stopped between two of them: the quota scope it
    spends went to another daemon meanwhile (`owners.py`), and calls of both on one
    mailbox would exceed its quota. No answer, and no failure of the provider's (nothing
    for its circuit): the scope's new owner makes the operation again."""


@contextmanager
def calls_while(may_go_on: Callable[[], bool] | None) -> Iterator[None]:
    """The provider calls made inside, in this thread, go on while `may_go_on()` says
    yes (None: always); an operation of several calls asks before each (`next_call`),
    as `Provider.read_reports` asks its `may_go_on`."""
    token = _MAY_GO_ON.set(may_go_on)
    try:
        yield
    finally:
        _MAY_GO_ON.reset(token)


# -- a call's time, bounded by its claim's lease --------------------------------------

#: What is left, in seconds, of the claim's lease under the call being made in this
#: thread, less the grace: set by the engine around every call made under the claim
#: (`calls_end_in`: the send, the draft's check, the read-back), asked by the wire at each
#: wait for an answer (`early_answers.AnswerReader`) and at each wait of a connection's
#: opening (`connects.py`). A send of many answers (SMTP's MAIL, RCPT each, DATA, the
#: final '.') awaits each within `timeout`, so a slow server holds it many `timeout`s:
#: while the lease's renewals land it goes on, and once they stop landing (the store
#: lost) it ends before another daemon's recovery can take the claim
#: (docs/architecture.md "Leases").
_ENDS_IN: ContextVar[Callable[[], float] | None] = ContextVar("ends_in", default=None)


@contextmanager
def calls_end_in(seconds_left: Callable[[], float] | None) -> Iterator[None]:
    """The provider calls made inside, in this thread, end once `seconds_left()` is not
    above 0 (None: no bound but each wait's `timeout`)."""
    token = _ENDS_IN.set(seconds_left)
    try:
        yield
    finally:
        _ENDS_IN.reset(token)


def call_time_left() -> float | None:
    """The seconds the call being made in this thread has left (`calls_end_in`), or None."""
    seconds_left = _ENDS_IN.get()
    return None if seconds_left is None else seconds_left()


def stopped_before_send(lost: ScopeLost) -> SendOutcome:
    """The outcome of a send stopped (`lost`) before any call that could send its message:
    nothing made or sent, due again for the scope's owner; no attempt, and no failure of
    the provider's (`SendOutcome.not_attempted`)."""
    return SendOutcome(SendKind.REJECTED, f"not sent: {lost}", transient=True, not_attempted=True)


def next_call(what: str) -> None:
    """Before one more call of an operation: raises ScopeLost when it may not go on."""
    may_go_on = _MAY_GO_ON.get()
    if may_go_on is not None and not may_go_on():
        raise ScopeLost(f"{what}: stopped, its quota scope went to another daemon")
