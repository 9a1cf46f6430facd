"""One Gmail mailbox the provider acts as, and how its messages are asked for and read:
shared by the provider (`gmail.py`) and its drafts, history and report calls (`GmailCalls`:
`gmail_drafts.py`, `gmail_history.py`, `gmail_reports.py`), so none imports `gmail.py`
for them (docs/providers.md "Gmail setup").

`Mailbox` holds one mailbox's credentials (one token) and quota bucket; `search_term` is
a Message-ID as Gmail's `rfc822msgid:` operator takes it; `metadata_header` reads a header
of a `format=metadata` answer.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Protocol

from google.auth.credentials import Credentials as AuthCredentials

from daemon.providers.base import ProviderError
from daemon.providers.quota import GMAIL_SEND_UNITS, TokenBucket

#: One API call's complete HTTP answer: status, lower-cased headers, body.
Response = tuple[int, dict[str, str], bytes]


class Mailbox:
    """One mailbox the provider acts as: its credentials (one token) and its quota bucket.
    With `user = "{from}"` there is one per From address, made on first use and dropped
    once idle (`daemon/providers/mailboxes.py`), its live token kept until it expires."""

    def __init__(
        self,
        user: str,
        credentials: AuthCredentials,
        bucket: TokenBucket,
        departures: TokenBucket,
        draft_units: float = 0.0,
    ) -> None:
        self.user = user
        self.credentials = credentials
        self.bucket = bucket
        # The same pace again, as the sends leave: a reservation is taken when a job is
        # picked, and a claim saved slowly (a busy store) would otherwise let the sends
        # behind it reach Gmail bunched, over the quota Gmail meters on arrival.
        self.departures = departures
        # Sends whose quota the engine already took (`reserve_send`): they do not wait.
        self._prepaid = 0
        # send_via = "drafts": each reservation also takes the draft step's units (the
        # calls before the claim), so a job is taken only when its whole step is paid.
        self.draft_units = draft_units
        self._prepaid_drafts = 0.0
        self._calls = 0  # in flight now
        self._lock = threading.Lock()

    @contextmanager
    def calling(self) -> Iterator[None]:
        """Around each API call made as this mailbox: a call in flight keeps the entry."""
        with self._lock:
            self._calls += 1
        try:
            yield
        finally:
            with self._lock:
                self._calls -= 1

    def idle_at(self, now: float) -> float | None:
        """None when a fresh mailbox would equal this one: no call in flight and the
        bucket full again (so a bucket in debt is never forgotten). A reservation not
        spent is not kept: a fresh bucket charges its send again, which only waits more.
        Otherwise when to look again (`daemon/providers/mailboxes.py`)."""
        with self._lock:
            busy = self._calls > 0
        refill = max(self.bucket.until_full(), self.departures.until_full())
        if not busy and refill <= 0.0:
            return None
        return now + max(refill, 1.0 if busy else 0.0)

    def reserve_send(self, extra: float = 0.0) -> float:
        """The quota of one send (and its draft step, and `extra`: its claim's history
        mark when one is to be fetched) taken now (0.0), or the seconds until it could be."""
        units = GMAIL_SEND_UNITS + self.draft_units + extra
        with self._lock:
            if self.bucket.try_acquire(units):
                self._prepaid += 1
                self._prepaid_drafts += self.draft_units
                return 0.0
        # Never 0.0 when nothing was taken: the caller would spin.
        return max(self.bucket.wait_for(units), 0.001)

    def pay_send(self) -> None:
        """A send's quota: the one reserved for it, else waited for now; then its place
        in the pace of the sends leaving (`departures`), which only sends that bunched
        on the way wait for."""
        with self._lock:
            prepaid = self._prepaid > 0
            if prepaid:
                self._prepaid -= 1
                # What a finished draft step left is not saved up beyond the reservations
                # still out: a credit spent much later would be a burst over the quota.
                self._prepaid_drafts = min(self._prepaid_drafts, self.draft_units * self._prepaid)
        if not prepaid:
            self.bucket.acquire(GMAIL_SEND_UNITS)
        self.departures.acquire(GMAIL_SEND_UNITS)

    def pay_draft(self, units: float) -> None:
        """A drafts call's quota: out of what reservations took for draft steps, the
        rest waited for now."""
        with self._lock:
            taken = min(units, self._prepaid_drafts)
            self._prepaid_drafts -= taken
        if units - taken > 1e-9:
            self.bucket.acquire(units - taken)


#: Pages one listing follows at most (a search, a draft lookup; a report read goes on at
#: its next read), as Graph's (`graph.MAX_PAGES`): each new next-page token passes the
#: repeat check, so an answer naming page after page with nothing on them was listed for
#: as long as they came, each page paid from the mailbox's quota.
MAX_PAGES = 50


def search_term(message_id: str) -> str:
    """The Message-ID as Gmail documents the operator: `rfc822msgid:local@domain`, without
    angle brackets. Refuses values that would change the meaning of the query."""
    value = message_id.strip()
    if value.startswith("<") and value.endswith(">"):
        value = value[1:-1].strip()
    if not value or any(c.isspace() or c in '"(){}' for c in value):
        raise ProviderError(f"cannot search for Message-ID {message_id!r}")
    return value


def message_id_header(message: Mapping[str, Any]) -> str | None:
    return metadata_header(message, "message-id")


def metadata_header(message: Mapping[str, Any], name: str) -> str | None:
    """The first `name` header (lower case) of a metadata answer, or None."""
    payload = message.get("payload")
    if not isinstance(payload, dict):
        return None
    for header in payload.get("headers") or ():
        if (
            isinstance(header, dict)
            and str(header.get("name", "")).lower() == name
            and isinstance(header.get("value"), str)
        ):
            return str(header["value"])
    return None


class GmailCalls(Protocol):
    """What the drafts, history and report calls use of their provider (`gmail.py:
    GmailProvider`): its API service and its one request stack, so quota and the
    single-shot transport are the provider's for them too."""

    service: Any
    page_size: int

    def prepare(
        self, request: Any, units: float | None, mailbox: Mailbox, *, draft: bool = False
    ) -> None: ...

    def execute(self, request: Any, mailbox: Mailbox) -> Response: ...

    def answer(
        self, what: str, request: Any, units: float, mailbox: Mailbox, *, draft: bool = False
    ) -> Response: ...

    def read_json(
        self, what: str, request: Any, units: float, mailbox: Mailbox, *, draft: bool = False
    ) -> dict[str, Any]: ...

    def pages(
        self,
        what: str,
        method: Callable[..., Any],
        params: dict[str, Any],
        mailbox: Mailbox,
        *,
        draft: bool = False,
    ) -> Iterator[dict[str, Any]]: ...
