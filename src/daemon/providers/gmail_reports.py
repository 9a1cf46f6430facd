"""Delivery reports in a Gmail mailbox (docs/providers.md "Bounces").

`rfc822msgid:` finds a message by its own Message-ID, and a bounce has its own: it is no
search for the job's. What finds reports is who sends them: Gmail's own bounces come from
mailer-daemon@googlemail.com, other servers' from MAILER-DAEMON@ or postmaster@. So one
read of a mailbox is one list of its INBOX since the window's start,
``in:inbox after:<epoch> {from:mailer-daemon from:postmaster}`` (every page), then for
each message not read before a `messages.get` with `format=metadata`, whose size and
top-level type decide whether it is worth its `format=raw` read: a message that is not a
`multipart/report`, or is over the caller's limit, is never downloaded.

Every call is paid from the mailbox's quota bucket (list and get: 5 units) only when a
send's worth (100 units) is left after it: a read stops there, says it is incomplete, and
goes on at the next one, so it never takes the quota of a due send. A bucket of one send
(`user = "{from}"`) keeps none back: the engine reads such a mailbox only while none of
its sends waits (docs/providers.md "Bounces").

A read stopped that way, after `MAX_PAGES` pages of the listing (as Graph's), or by Gmail
refusing a call as unavailable (429, 503: the read fails), is kept per mailbox
(`_Progress`): the next read goes on with the same query from the page where the listing
stopped, and hands out the reports already downloaded, instead of listing from page 1
again, which a mailbox with more pages than its quota lets through in a row would never
get past.
"""

from __future__ import annotations

import base64
import binascii
import threading
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from daemon.providers.gmail_mailbox import MAX_PAGES, GmailCalls, Mailbox
from daemon.providers.outcomes import FoundReport, ProviderError, ReportRead
from daemon.providers.quota import GMAIL_GET_UNITS, GMAIL_LIST_UNITS, GMAIL_SEND_UNITS
from ledger.exceptions import SendledgerError

#: The senders of delivery reports, as Gmail's from: matches them (a substring).
REPORT_SENDERS = ("mailer-daemon", "postmaster")


class _QuotaKept(SendledgerError):
    """The mailbox's bucket holds no more than a send's worth, the caller may not go on
    (its quota scope went to another daemon), or the read listed `MAX_PAGES` pages: the
    read stops here, and the next goes on from where it stopped."""


def report_query(since: datetime) -> str:
    senders = " ".join(f"from:{sender}" for sender in REPORT_SENDERS)
    return f"in:inbox after:{int(since.timestamp())} {{{senders}}}"


@dataclass
class _Progress:
    """A mailbox's read that stopped before its end: its query (a page token belongs to
    it), the ids listed so far, the next page (None: the listing is done), and the reports
    downloaded but not handed out yet."""

    query: str
    ids: list[str] = field(default_factory=list)
    page_token: str | None = ""  # "": the first page
    found: dict[str, FoundReport] = field(default_factory=dict)
    # `ids` as a set: whether an id is listed already is asked once per id listed, and
    # a list's `in` made a listing of n ids cost n * n / 2 comparisons.
    _listed: set[str] = field(default_factory=set, init=False, repr=False)

    def __post_init__(self) -> None:
        self._listed.update(self.ids)

    def add(self, provider_id: str) -> None:
        """An id a page listed, kept in the listing's order unless listed already."""
        if provider_id not in self._listed:
            self._listed.add(provider_id)
            self.ids.append(provider_id)


class GmailReports:
    """The report reads of one GmailProvider, each acting as a given mailbox."""

    def __init__(self, provider: GmailCalls) -> None:
        self.provider = provider
        self._messages = provider.service.users().messages()
        self._lock = threading.Lock()
        self._progress: dict[str, _Progress] = {}  # mailbox user -> its stopped read

    def read(
        self,
        mailbox: Mailbox,
        since: datetime,
        *,
        known: Collection[str],
        max_bytes: int,
        limit: int,
        may_go_on: Callable[[], bool] | None = None,
    ) -> ReportRead:
        """`may_go_on()`: asked before each call; False stops the read there, as a quota
        kept for the sends does."""
        with self._lock:
            progress = self._progress.pop(mailbox.user, None)
        if progress is None:
            progress = _Progress(report_query(since))
        query, found = progress.query, progress.found
        listed_before, found_before = len(progress.ids), len(found)
        try:
            if progress.page_token is not None:
                self._list(mailbox, progress, may_go_on)
            unread = [i for i in progress.ids if i not in known]
            for provider_id in [i for i in unread if i not in found][: max(limit - len(found), 0)]:
                found[provider_id] = self._fetch(mailbox, provider_id, max_bytes, may_go_on)
        except _QuotaKept:
            # Goes on from here at the next read; what was downloaded is handed out now.
            self._keep(mailbox, _Progress(query, progress.ids, progress.page_token))
            return ReportRead(query, tuple(progress.ids), tuple(found.values()), complete=False)
        except ProviderError as exc:
            if exc.unavailable:  # refused for now (429, 503): goes on from here next time
                self._keep(mailbox, progress)
                exc.progressed = len(progress.ids) > listed_before or len(found) > found_before
            raise
        complete = len(unread) <= limit
        if not complete:  # the caller's limit: the rest of this listing at the next read
            self._keep(mailbox, _Progress(query, progress.ids, None))
        return ReportRead(query, tuple(progress.ids), tuple(found.values()), complete=complete)

    def forget(self, mailbox: Mailbox) -> None:
        """Drop the mailbox's stopped read: the next one lists from page 1."""
        with self._lock:
            self._progress.pop(mailbox.user, None)

    def kept(self) -> int:
        """How many mailboxes have a stopped read kept."""
        with self._lock:
            return len(self._progress)

    def _keep(self, mailbox: Mailbox, progress: _Progress) -> None:
        with self._lock:
            self._progress[mailbox.user] = progress

    def _paid(
        self,
        what: str,
        request: Any,
        units: float,
        mailbox: Mailbox,
        may_go_on: Callable[[], bool] | None,
    ) -> dict[str, Any]:
        if may_go_on is not None and not may_go_on():
            # A read of many calls may outlast its quota scope's lease: none is made for
            # a scope that went to another daemon meanwhile (two daemons reading one
            # mailbox, over its quota).
            raise _QuotaKept(what)
        # A send's worth stays for the sends, where the bucket holds more than one (with
        # "{from}" it holds one send: a read waiting for more would never run).
        bucket = mailbox.bucket
        keep = GMAIL_SEND_UNITS if units + GMAIL_SEND_UNITS <= bucket.capacity else 0.0
        if not bucket.try_acquire(units, keep=keep):
            raise _QuotaKept(what)
        return self.provider.read_json(what, request, 0.0, mailbox)

    def _list(
        self, mailbox: Mailbox, progress: _Progress, may_go_on: Callable[[], bool] | None
    ) -> None:
        """Every page of the listing, from `progress.page_token` on, into `progress`
        (a page at a time: a call refused leaves it where it stopped)."""
        query, page_token = progress.query, progress.page_token
        seen_tokens: set[str] = set()
        for _ in range(MAX_PAGES):
            params: dict[str, Any] = {
                "userId": mailbox.user,
                "q": query,
                "maxResults": self.provider.page_size,
            }
            if page_token:
                params["pageToken"] = page_token
            page = self._paid(
                f"reports {query}",
                self._messages.list(**params),
                GMAIL_LIST_UNITS,
                mailbox,
                may_go_on,
            )
            for item in page.get("messages") or []:
                if not isinstance(item, dict) or not isinstance(item.get("id"), str):
                    raise ProviderError(f"reports {query}: malformed list entry {item!r}")
                progress.add(item["id"])
            next_token = page.get("nextPageToken")
            if not next_token:
                progress.page_token = None
                return
            if not isinstance(next_token, str) or next_token in seen_tokens:
                raise ProviderError(f"reports {query}: paging did not advance")
            seen_tokens.add(next_token)
            page_token = progress.page_token = next_token
        # New tokens without end passed the repeat check: the next read goes on.
        raise _QuotaKept(f"reports {query}: {MAX_PAGES} pages listed")

    def _fetch(
        self,
        mailbox: Mailbox,
        provider_id: str,
        max_bytes: int,
        may_go_on: Callable[[], bool] | None,
    ) -> FoundReport:
        request = self._messages.get(
            userId=mailbox.user, id=provider_id, format="metadata", metadataHeaders=["Subject"]
        )
        data = self._paid(f"report {provider_id}", request, GMAIL_GET_UNITS, mailbox, may_go_on)
        size = data.get("sizeEstimate")
        payload = data.get("payload")
        kind = payload.get("mimeType") if isinstance(payload, dict) else None
        if not isinstance(size, int) or not isinstance(kind, str):
            raise ProviderError(f"report {provider_id}: no size or type in the answer")
        kind = kind.lower()
        received = _received(data.get("internalDate"))
        if kind != "multipart/report" or size > max_bytes:
            return FoundReport(provider_id, None, size, kind, received)
        request = self._messages.get(userId=mailbox.user, id=provider_id, format="raw")
        data = self._paid(f"report {provider_id}", request, GMAIL_GET_UNITS, mailbox, may_go_on)
        raw = data.get("raw")
        if not isinstance(raw, str):
            raise ProviderError(f"report {provider_id}: no raw message in the answer")
        message = _decoded(provider_id, raw)
        if len(message) > max_bytes:
            return FoundReport(provider_id, None, len(message), kind, received)
        return FoundReport(provider_id, message, len(message), kind, received)


def _received(internal_date: object) -> datetime | None:
    """When Gmail received the message: its `internalDate` (milliseconds since the epoch,
    a decimal string); None when it is missing or not one."""
    if not isinstance(internal_date, str) or not internal_date.isascii():
        return None
    if not internal_date.isdigit() or len(internal_date) > 18:
        return None
    try:
        return datetime.fromtimestamp(int(internal_date) / 1000, UTC)
    except (ValueError, OverflowError, OSError):  # beyond the years a datetime holds
        return None


def _decoded(provider_id: str, raw: str) -> bytes:
    """A `format=raw` answer's message: base64url, padded or not."""
    try:
        return base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4))
    except (binascii.Error, ValueError):
        raise ProviderError(f"report {provider_id}: the raw message does not decode") from None
