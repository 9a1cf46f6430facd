"""Delivery reports in a Microsoft 365 mailbox through Graph (docs/providers.md "Bounces").

Exchange files every non-delivery report as an item of class `REPORT.IPM.Note.NDR` (its
own, and a DSN another server sent), a MAPI property Graph filters on. So one read is one
listing of Inbox, every page:
`$filter=receivedDateTime ge <since> and singleValueExtendedProperties/Any(ep: ep/id eq
'String 0x001A' and ep/value eq 'REPORT.IPM.Note.NDR')`, with each item's size (the
`Integer 0x0E08` property, expanded in the same answer); then the MIME (`/$value`) of each
report not read before and within the caller's limit. Ids are immutable ids. Graph's
delay notifications have other classes and are not listed: on Graph only permanent
failures are read.

One read follows at most `MAX_PAGES` pages of the listing (a mailbox may hold more
reports than that in its window): then it says it is incomplete, and the next read goes
on from the next page's link, with the same query, as it does after a page refused as
unavailable (429, 503) or a listing cut by the caller's limit (`KeptListings`, per
mailbox), so a large mailbox is read to its end over a few reads, never failing each.
The reports a read downloaded before a download was refused are kept with its listing:
the next read hands them out and does not download them again, and the refusal says the
read got on (`ProviderError.progressed`), as Gmail's reads do (`gmail_reports.py`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar
from urllib.parse import quote

from daemon.providers.outcomes import FoundReport, ProviderError, ReportRead

#: The provider's mailbox (`graph.py: _Mailbox`): passed back to it as it came.
MailboxT = TypeVar("MailboxT")
_MailboxIn = TypeVar("_MailboxIn", contravariant=True)


class ReportCalls(Protocol[_MailboxIn]):
    """What the report reads use of their provider (`graph.py: GraphProvider`): its GETs,
    so tokens, the mailbox's request limit and the transport are the provider's."""

    def get_body(
        self, what: str, mailbox: _MailboxIn, path: str, *, url: str | None = None
    ) -> tuple[int, bytes] | None: ...

    def page(
        self, what: str, mailbox: _MailboxIn, path: str, *, url: str | None = None
    ) -> tuple[list[dict[str, Any]], str | None]: ...


NDR_CLASS = "REPORT.IPM.Note.NDR"
MESSAGE_CLASS = "String 0x001A"  # PidTagMessageClass
MESSAGE_SIZE = "Integer 0x0E08"  # PidTagMessageSize
REPORT_TYPE = "multipart/report"
PAGE_SIZE = 100
#: Pages of the listing one read follows; the rest at the next read.
MAX_PAGES = 50


@dataclass
class _Listing:
    """A mailbox's listing that stopped before its end: its query (a next link belongs
    to it), the ids, sizes and receipt times listed so far, the next page (None: the
    first), whether it was listed to its end (then cut by the caller's limit), and the
    reports read but not handed out yet (a read refused after some downloads)."""

    query: str
    sizes: dict[str, tuple[int, datetime | None]] = field(default_factory=dict)
    next_url: str | None = None
    listed_all: bool = False
    found: dict[str, FoundReport] = field(default_factory=dict)


class KeptListings:
    """Each mailbox's stopped listing, by the mailbox's user; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kept: dict[str, _Listing] = {}

    def take(self, key: str) -> _Listing | None:
        with self._lock:
            return self._kept.pop(key, None)

    def keep(self, key: str, listing: _Listing) -> None:
        with self._lock:
            self._kept[key] = listing

    def __len__(self) -> int:
        with self._lock:
            return len(self._kept)


def report_filter(since: datetime) -> str:
    moment = since.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return (
        f"receivedDateTime ge {moment} and singleValueExtendedProperties/Any(ep: ep/id eq "
        f"'{MESSAGE_CLASS}' and ep/value eq '{NDR_CLASS}')"
    )


def read_reports_in(
    provider: ReportCalls[MailboxT],
    mailbox: MailboxT,
    since: datetime,
    *,
    known: Collection[str],
    max_bytes: int,
    limit: int,
    kept: KeptListings | None = None,
    key: str = "",
    may_go_on: Callable[[], bool] | None = None,
) -> ReportRead:
    """`kept`: where a listing that stopped before its end is kept, under `key` (the
    mailbox), for the next read to go on with. `may_go_on()`: asked before each call;
    False stops the read there (its quota scope went to another daemon), incomplete."""
    go_on = may_go_on or (lambda: True)
    listing = None if kept is None else kept.take(key)
    if listing is None:
        listing = _Listing(report_filter(since))
    query, listed_before, found_before = listing.query, len(listing.sizes), len(listing.found)
    path = (
        "/mailFolders/inbox/messages?$filter="
        + quote(query, safe="")
        + "&$select=id,receivedDateTime&$expand="
        + quote(f"singleValueExtendedProperties($filter=id eq '{MESSAGE_SIZE}')", safe="")
        + f"&$top={PAGE_SIZE}"
    )
    try:
        if not listing.listed_all:
            listing.listed_all = _listed(provider, mailbox, path, listing, go_on)
        read = _found(
            provider, mailbox, listing, known, max_bytes, limit, go_on,
            complete=listing.listed_all,
        )  # fmt: skip
    except ProviderError as exc:
        if exc.unavailable and kept is not None:
            # Refused for now (429, 503): the next read goes on from here, and hands out
            # the reports read before the refusal instead of downloading them again.
            kept.keep(key, listing)
            exc.progressed = len(listing.sizes) > listed_before or len(listing.found) > found_before
        raise
    listing.found.clear()  # handed out now
    if not read.complete and kept is not None:
        # Pages left (`MAX_PAGES`), or reports past the caller's limit: the next read goes
        # on with this listing.
        kept.keep(key, listing)
    return read


def _found(
    provider: ReportCalls[MailboxT],
    mailbox: MailboxT,
    listing: _Listing,
    known: Collection[str],
    max_bytes: int,
    limit: int,
    go_on: Callable[[], bool],
    *,
    complete: bool,
) -> ReportRead:
    """The reports listed so far that are not `known`, read up to `limit` (those a
    refused read left in `_Listing.found` first, not downloaded again); complete when the
    listing was and none is left for a next read. Each report read goes into
    `_Listing.found` at once, so a download refused after it keeps it."""
    query, sizes, found = listing.query, listing.sizes, listing.found
    unread = [i for i in sizes if i not in known]
    for provider_id in [i for i in unread if i not in found][: max(limit - len(found), 0)]:
        size, received = sizes[provider_id]
        if size > max_bytes:
            found[provider_id] = FoundReport(provider_id, None, size, REPORT_TYPE, received)
            continue
        if not go_on():  # the scope went to another daemon: no more calls for it
            complete = False
            break
        what = f"report {provider_id}"
        answer = provider.get_body(what, mailbox, f"/messages/{quote(provider_id, safe='')}/$value")
        if answer is None:
            continue  # deleted since it was listed: next time it is not listed either
        raw = answer[1]
        found[provider_id] = FoundReport(provider_id, raw, len(raw), REPORT_TYPE, received)
    complete = complete and len(unread) <= limit
    return ReportRead(f"inbox: {query}", tuple(sizes), tuple(found.values()), complete=complete)


def _listed(
    provider: ReportCalls[MailboxT],
    mailbox: MailboxT,
    path: str,
    listing: _Listing,
    go_on: Callable[[], bool],
) -> bool:
    """Each report's id and size into `listing`, from its next page on (a page at a time:
    a page refused leaves it where it stopped), at most `MAX_PAGES` pages. Whether the
    listing reached its end."""
    what = f"reports {listing.query}"
    for _ in range(MAX_PAGES):
        if not go_on():  # the scope went to another daemon: no more calls for it
            return False
        items, next_url = provider.page(what, mailbox, path, url=listing.next_url)
        if next_url is not None and next_url == listing.next_url:
            # A link to the page just read: a listing that never ends is no answer (and
            # kept, it would be read again at every read).
            raise ProviderError(f"{what}: paging did not advance")
        for item in items:
            provider_id = item.get("id")
            if not isinstance(provider_id, str):
                raise ProviderError(f"{what}: malformed message entry {item!r}")
            listing.sizes[provider_id] = (_size(item), _received(item.get("receivedDateTime")))
        listing.next_url = next_url
        if next_url is None:
            return True
    return False


def _received(value: object) -> datetime | None:
    """The item's `receivedDateTime` (ISO 8601, UTC: `2026-12-03T16:51:28Z`); None when
    it is missing or not a time. One without a zone is read as UTC, as Graph means it."""
    if not isinstance(value, str) or not value.isascii():
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _size(item: dict[str, Any]) -> int:
    """The item's size in bytes, from the expanded property; unknown counts as too big
    to read blind (a report whose size Graph does not say is never downloaded)."""
    for prop in item.get("singleValueExtendedProperties") or ():
        if isinstance(prop, dict) and prop.get("id") == MESSAGE_SIZE:
            try:
                return int(str(prop.get("value")))
            except ValueError:
                break
    return 2**62
