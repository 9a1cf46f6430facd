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
"""

from __future__ import annotations

from collections.abc import Collection
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

    def items(self, what: str, mailbox: _MailboxIn, path: str) -> list[dict[str, Any]]: ...


NDR_CLASS = "REPORT.IPM.Note.NDR"
MESSAGE_CLASS = "String 0x001A"  # PidTagMessageClass
MESSAGE_SIZE = "Integer 0x0E08"  # PidTagMessageSize
REPORT_TYPE = "multipart/report"
PAGE_SIZE = 100


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
) -> ReportRead:
    query = report_filter(since)
    path = (
        "/mailFolders/inbox/messages?$filter="
        + quote(query, safe="")
        + "&$select=id,receivedDateTime&$expand="
        + quote(f"singleValueExtendedProperties($filter=id eq '{MESSAGE_SIZE}')", safe="")
        + f"&$top={PAGE_SIZE}"
    )
    sizes = _listed(provider, mailbox, path, query)
    unread = [i for i in sizes if i not in known]
    found = []
    for provider_id in unread[:limit]:
        size = sizes[provider_id]
        if size > max_bytes:
            found.append(FoundReport(provider_id, None, size, REPORT_TYPE))
            continue
        what = f"report {provider_id}"
        answer = provider.get_body(what, mailbox, f"/messages/{quote(provider_id, safe='')}/$value")
        if answer is None:
            continue  # deleted since it was listed: next time it is not listed either
        found.append(FoundReport(provider_id, answer[1], len(answer[1]), REPORT_TYPE))
    return ReportRead(f"inbox: {query}", tuple(sizes), tuple(found), complete=len(unread) <= limit)


def _listed(
    provider: ReportCalls[MailboxT], mailbox: MailboxT, path: str, query: str
) -> dict[str, int]:
    """Each report's id and size, every page."""
    what = f"reports {query}"
    sizes: dict[str, int] = {}
    for item in provider.items(what, mailbox, path):
        provider_id = item.get("id")
        if not isinstance(provider_id, str):
            raise ProviderError(f"{what}: malformed message entry {item!r}")
        sizes[provider_id] = _size(item)
    return sizes


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
