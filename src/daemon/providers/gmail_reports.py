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
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Collection
from datetime import datetime
from typing import Any

from daemon.providers.gmail_mailbox import GmailCalls, Mailbox
from daemon.providers.outcomes import FoundReport, ProviderError, ReportRead
from daemon.providers.quota import GMAIL_GET_UNITS, GMAIL_LIST_UNITS, GMAIL_SEND_UNITS
from ledger.exceptions import SendledgerError

#: The senders of delivery reports, as Gmail's from: matches them (a substring).
REPORT_SENDERS = ("mailer-daemon", "postmaster")


class _QuotaKept(SendledgerError):
    """The mailbox's bucket holds no more than a send's worth: the read stops here."""


def report_query(since: datetime) -> str:
    senders = " ".join(f"from:{sender}" for sender in REPORT_SENDERS)
    return f"in:inbox after:{int(since.timestamp())} {{{senders}}}"


class GmailReports:
    """The report reads of one GmailProvider, each acting as a given mailbox."""

    def __init__(self, provider: GmailCalls) -> None:
        self.provider = provider
        self._messages = provider.service.users().messages()

    def read(
        self,
        mailbox: Mailbox,
        since: datetime,
        *,
        known: Collection[str],
        max_bytes: int,
        limit: int,
    ) -> ReportRead:
        query = report_query(since)
        listed: list[str] = []
        found: list[FoundReport] = []
        try:
            listed = self._list(mailbox, query)
            for provider_id in [i for i in listed if i not in known][:limit]:
                found.append(self._fetch(mailbox, provider_id, max_bytes))
        except _QuotaKept:
            return ReportRead(query, tuple(listed), tuple(found), complete=False)
        unread = sum(1 for i in listed if i not in known)
        return ReportRead(query, tuple(listed), tuple(found), complete=unread <= limit)

    def _paid(self, what: str, request: Any, units: float, mailbox: Mailbox) -> dict[str, Any]:
        # A send's worth stays for the sends, where the bucket holds more than one (with
        # "{from}" it holds one send: a read waiting for more would never run).
        bucket = mailbox.bucket
        keep = GMAIL_SEND_UNITS if units + GMAIL_SEND_UNITS <= bucket.capacity else 0.0
        if not bucket.try_acquire(units, keep=keep):
            raise _QuotaKept(what)
        return self.provider.read_json(what, request, 0.0, mailbox)

    def _list(self, mailbox: Mailbox, query: str) -> list[str]:
        ids: list[str] = []
        page_token: str | None = None
        seen_tokens: set[str] = set()
        while True:
            params: dict[str, Any] = {
                "userId": mailbox.user,
                "q": query,
                "maxResults": self.provider.page_size,
            }
            if page_token:
                params["pageToken"] = page_token
            page = self._paid(
                f"reports {query}", self._messages.list(**params), GMAIL_LIST_UNITS, mailbox
            )
            for item in page.get("messages") or []:
                if not isinstance(item, dict) or not isinstance(item.get("id"), str):
                    raise ProviderError(f"reports {query}: malformed list entry {item!r}")
                if item["id"] not in ids:
                    ids.append(item["id"])
            next_token = page.get("nextPageToken")
            if not next_token:
                return ids
            if not isinstance(next_token, str) or next_token in seen_tokens:
                raise ProviderError(f"reports {query}: paging did not advance")
            seen_tokens.add(next_token)
            page_token = next_token

    def _fetch(self, mailbox: Mailbox, provider_id: str, max_bytes: int) -> FoundReport:
        request = self._messages.get(
            userId=mailbox.user, id=provider_id, format="metadata", metadataHeaders=["Subject"]
        )
        data = self._paid(f"report {provider_id}", request, GMAIL_GET_UNITS, mailbox)
        size = data.get("sizeEstimate")
        payload = data.get("payload")
        kind = payload.get("mimeType") if isinstance(payload, dict) else None
        if not isinstance(size, int) or not isinstance(kind, str):
            raise ProviderError(f"report {provider_id}: no size or type in the answer")
        kind = kind.lower()
        if kind != "multipart/report" or size > max_bytes:
            return FoundReport(provider_id, None, size, kind)
        request = self._messages.get(userId=mailbox.user, id=provider_id, format="raw")
        data = self._paid(f"report {provider_id}", request, GMAIL_GET_UNITS, mailbox)
        raw = data.get("raw")
        if not isinstance(raw, str):
            raise ProviderError(f"report {provider_id}: no raw message in the answer")
        message = _decoded(provider_id, raw)
        if len(message) > max_bytes:
            return FoundReport(provider_id, None, len(message), kind)
        return FoundReport(provider_id, message, len(message), kind)


def _decoded(provider_id: str, raw: str) -> bytes:
    """A `format=raw` answer's message: base64url, padded or not."""
    try:
        return base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4))
    except (binascii.Error, ValueError):
        raise ProviderError(f"report {provider_id}: the raw message does not decode") from None
