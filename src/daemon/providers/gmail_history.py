"""Gmail's change history as the second handle after a send (docs/providers.md "What each
handle proves"; docs/architecture.md "The history handle").

Gmail numbers every change of a mailbox with a `historyId` that only grows, and
`users.history.list` lists the changes after a given one. A historyId known before a claim
is a point before its send, so the SENT messages added after it include the claim's copy
if the send made one, with no search index in between.

* **The mark** (`mark`): one historyId per mailbox, shared by its claims. Any historyId at
  or before a claim is a valid start for it (an older one only means more to read), so it
  is fetched (`users.getProfile`, 1 quota unit, reserved with the send: `mark_units`) only
  when none is known or the known one is older than `MARK_MAX_AGE`, and moved on for free
  by the answers the provider gets anyway: a history read's own `historyId`, a ping's, the
  read-back of a sent copy. A fetch that fails gives the claim none (the search answers
  its unknown outcome) and is not tried again for `FETCH_BACKOFF`: a send never waits for
  a mark twice in an outage.
* **The read** (`sent_since`): `history.list` from the claim's mark (`labelId = SENT`,
  `historyTypes = messageAdded`, 500 records a page, up to `MAX_PAGES`), then the Message-ID
  header of each message added (`messages.get`, `format = metadata`; a header once read is
  kept, so the unknown outcomes of one mailbox read each message once), counting those
  exactly ours. A 404 is a start older than Gmail keeps (about a week), and more than
  `MAX_MESSAGES` added since, or a listing past `MAX_PAGES` pages (as a search's), is more
  than one read may spend: each `HistoryTooOld`, and the search decides. A message
  deleted since its addition (404 on the get) is not counted.
* **Quota**: the reads are paid from the mailbox's quota like searches, but only while a
  send's worth stays in the bucket (`pay_behind_sends`), so they never take what a due
  send is about to reserve.
"""

from __future__ import annotations

import math
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from daemon.providers.answers import json_object
from daemon.providers.base import next_call
from daemon.providers.classify import provider_error_for_response
from daemon.providers.gmail_mailbox import MAX_PAGES, GmailCalls, Mailbox, metadata_header
from daemon.providers.history_handle import HistoryTooOld
from daemon.providers.outcomes import ProviderError, SearchHit, SearchResult
from daemon.providers.quota import (
    GMAIL_GET_UNITS,
    GMAIL_PROFILE_UNITS,
    GMAIL_SEND_UNITS,
    TokenBucket,
)
from ledger.message_id import same_message_id

#: Gmail's cost of one users.history.list page.
GMAIL_HISTORY_UNITS = 2.0
#: A mark older than this is fetched afresh before a claim: the older the start, the more
#: messages an unknown outcome's read goes through (at Gmail's 250 units a second a mailbox
#: sends at most 2.5 messages a second, so a read from a mark this old lists a few dozen).
MARK_MAX_AGE = 10.0
#: After a failed fetch, claims go without a mark for this long (seconds).
FETCH_BACKOFF = 30.0
#: A read that would go through more messages than this (5 quota units each) is given up:
#: the search decides (a claim recovered days later, in a busy mailbox).
MAX_MESSAGES = 500
#: Message-ID headers kept per mailbox (a message's header never changes).
KEPT_HEADERS = 4096
HISTORY_PAGE = 500  # Gmail's ceiling for history.list maxResults
SENT_LABEL = "SENT"
ADDED = "messageAdded"


@dataclass(frozen=True)
class _Read:
    """What a metadata get said of one message."""

    header: str | None
    labels: tuple[str, ...]
    date: str
    to: str
    subject: str


@dataclass
class _Log:
    """One mailbox's mark and what was read of its messages."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    history_id: int | None = None
    fresh_at: float = -math.inf  # when the mark was last known to be recent (monotonic)
    fetch_after: float = -math.inf  # no fetch before this (after a failed one)
    prepaid: int = 0  # getProfile units that send reservations took for a fetch
    fetching: threading.Lock = field(default_factory=threading.Lock)
    read: OrderedDict[str, _Read] = field(default_factory=OrderedDict)


def pay_behind_sends(
    bucket: TokenBucket, units: float, sleep: Callable[[float], None] = time.sleep
) -> None:
    """Take `units` for a read only while a send's worth of quota stays in the bucket, so
    a read never takes what a due send is about to reserve (`reserve_send` never waits: it
    would find the bucket empty and the send would wait a tick). A bucket too small to keep
    a send back is paid as a search pays."""
    if units + GMAIL_SEND_UNITS > bucket.capacity:
        bucket.acquire(units)
        return
    while not bucket.try_acquire(units, keep=GMAIL_SEND_UNITS):
        sleep(max(bucket.wait_for(units + GMAIL_SEND_UNITS), 0.001))


class GmailHistory:
    """The history calls of one GmailProvider, each acting as a given mailbox."""

    def __init__(
        self,
        provider: GmailCalls,
        clock: Callable[[], float],
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.provider = provider
        self._clock = clock
        self._sleep = sleep
        self._history = provider.service.users().history()
        self._messages = provider.service.users().messages()
        # Kept as long as its mailbox: a "{from}" mailbox dropped once idle takes its mark
        # and headers with it (the next claim fetches a mark again), and a mailbox made
        # later for another address never meets them.
        self._logs: weakref.WeakKeyDictionary[Mailbox, _Log] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()
        self.fetches = 0  # getProfile calls made for a mark (tests, the bench)

    def _log(self, mailbox: Mailbox) -> _Log:
        with self._lock:
            log = self._logs.get(mailbox)
            if log is None:
                log = self._logs[mailbox] = _Log()
            return log

    # -- the mark ------------------------------------------------------------------------

    def _wants_fetch(self, log: _Log, now: float) -> bool:
        stale = log.history_id is None or now - log.fresh_at > MARK_MAX_AGE
        return stale and now >= log.fetch_after

    def mark_units(self, mailbox: Mailbox) -> float:
        """The quota a send's reservation takes for its claim's mark: a getProfile's unit
        when the next claim would fetch one and no reservation has paid for it yet."""
        log = self._log(mailbox)
        with log.lock:
            if log.prepaid or not self._wants_fetch(log, self._clock()):
                return 0.0
            return GMAIL_PROFILE_UNITS

    def mark_paid(self, mailbox: Mailbox) -> None:
        log = self._log(mailbox)
        with log.lock:
            log.prepaid += 1

    def mark(self, mailbox: Mailbox, before_call: Callable[[], None] | None = None) -> str | None:
        """The mailbox's shared historyId for a claim, fetched first when it is missing or
        old (one fetch at a time: the claims waiting for it share it). Never raises but
        what `before_call` raises: it runs before a fetch is made or waited for
        (`HistoryProvider.history_mark`)."""
        log = self._log(mailbox)
        with log.lock:
            if not self._wants_fetch(log, self._clock()):
                return None if log.history_id is None else str(log.history_id)
        if before_call is not None:
            before_call()
        with log.fetching:
            with log.lock:  # another claim may have fetched it meanwhile
                if not self._wants_fetch(log, self._clock()):
                    return None if log.history_id is None else str(log.history_id)
                prepaid = log.prepaid > 0
                log.prepaid = max(log.prepaid - 1, 0)
            try:
                self.fetch(mailbox, prepaid=prepaid)
            except ProviderError:
                with log.lock:
                    log.fetch_after = self._clock() + FETCH_BACKOFF
        with log.lock:
            # A mark that could not be refreshed is still a valid start (any historyId
            # before the claim is): only more to read.
            return None if log.history_id is None else str(log.history_id)

    def fetch(self, mailbox: Mailbox, *, prepaid: bool = False) -> None:
        """users.getProfile: the mailbox's current historyId, as its mark."""
        if not prepaid:
            mailbox.bucket.acquire(GMAIL_PROFILE_UNITS)
        self.fetches += 1
        request = self.provider.service.users().getProfile(userId=mailbox.user)
        profile = self.provider.read_json("users.getProfile", request, 0.0, mailbox)
        self.saw(mailbox, profile.get("historyId"), fresh=True)

    def saw(self, mailbox: Mailbox, history_id: object, *, fresh: bool) -> None:
        """A historyId an answer gave: the mark moves on to it (never back). `fresh`: the
        answer says where the mailbox is now (a profile, a history read, a copy just
        sent), not where an old message was."""
        value = _history_id(history_id)
        if value is None:
            return
        log = self._log(mailbox)
        with log.lock:
            if log.history_id is None or value > log.history_id:
                log.history_id = value
            if fresh:
                log.fresh_at = self._clock()

    def saw_message(self, mailbox: Mailbox, data: Mapping[str, Any]) -> None:
        """A message's metadata read for another reason (the read-back of a sent copy):
        its header is kept and its historyId, a moment ago, moves the mark on."""
        message_id = data.get("id")
        if isinstance(message_id, str):
            self._keep(self._log(mailbox), message_id, _read_of(data))
        self.saw(mailbox, data.get("historyId"), fresh=True)

    # -- the read ------------------------------------------------------------------------

    def sent_since(self, mailbox: Mailbox, history_id: str, message_id: str) -> SearchResult:
        start = _history_id(history_id)
        if start is None:
            raise ProviderError(f"not a historyId: {history_id!r}")
        query = f"history.list startHistoryId={start} labelId={SENT_LABEL} historyTypes={ADDED}"
        added, latest = self._added_since(mailbox, start, query)
        if len(added) > MAX_MESSAGES:
            raise HistoryTooOld(
                history_id,
                f"more than {MAX_MESSAGES} messages sent since historyId {start}: too many to read",
            )
        log = self._log(mailbox)
        hits: list[SearchHit] = []
        for provider_id in added:
            read = self._read(mailbox, log, provider_id)
            if read is None or read.header is None:
                continue
            if same_message_id(read.header, message_id):
                hits.append(
                    SearchHit(
                        provider_id,
                        read.header,
                        read.labels,
                        date=read.date,
                        to=read.to,
                        subject=read.subject,
                    )
                )
        self.saw(mailbox, latest, fresh=True)
        return SearchResult(query=query, hits=tuple(hits))

    def _added_since(self, mailbox: Mailbox, start: int, query: str) -> tuple[list[str], object]:
        """The ids of the SENT messages added after `start`, each once, in order, and the
        mailbox's historyId the last page gave."""
        added: list[str] = []
        seen: set[str] = set()
        page_token: str | None = None
        tokens: set[str] = set()
        latest: object = None
        for _ in range(MAX_PAGES):
            if page_token:
                # A further call, asked as a search's pages are (`next_call`;
                # docs/architecture.md "Scope leases"): gone, no answer (ScopeLost), never
                # HistoryMissed, and the scope's owner reads it again.
                next_call(query)
            request = self._history.list(
                userId=mailbox.user,
                startHistoryId=str(start),
                labelId=SENT_LABEL,
                historyTypes=[ADDED],
                maxResults=HISTORY_PAGE,
                **({"pageToken": page_token} if page_token else {}),
            )
            pay_behind_sends(mailbox.bucket, GMAIL_HISTORY_UNITS, self._sleep)
            status, headers, body = self.provider.answer(query, request, 0.0, mailbox)
            if status == 404:
                raise HistoryTooOld(
                    str(start), f"historyId {start} expired (HTTP 404: Gmail keeps about a week)"
                )
            if not 200 <= status < 300:
                raise provider_error_for_response(query, status, headers, body)
            page = json_object(query, status, body)
            latest = page.get("historyId", latest)
            for record in page.get("history") or []:
                for entry in (
                    (record.get("messagesAdded") or []) if isinstance(record, dict) else []
                ):
                    message = entry.get("message") if isinstance(entry, dict) else None
                    provider_id = message.get("id") if isinstance(message, dict) else None
                    if not isinstance(provider_id, str) or not provider_id:
                        raise ProviderError(f"{query}: malformed history entry {entry!r}")
                    labels = message.get("labelIds") if isinstance(message, dict) else None
                    if isinstance(labels, list) and SENT_LABEL not in labels:
                        continue
                    if provider_id not in seen:
                        seen.add(provider_id)
                        added.append(provider_id)
            if len(added) > MAX_MESSAGES:
                return added, latest  # enough to know it is too much to read
            next_token = page.get("nextPageToken")
            if not next_token:
                return added, latest
            if not isinstance(next_token, str) or next_token in tokens:
                raise ProviderError(f"{query}: paging did not advance")
            tokens.add(next_token)
            page_token = next_token
        # New tokens without end passed the repeat check (pages with nothing on them): a
        # read too long to make, as too many messages is, and the search decides.
        raise HistoryTooOld(str(start), f"more than {MAX_PAGES} pages of history since {start}")

    def _read(self, mailbox: Mailbox, log: _Log, provider_id: str) -> _Read | None:
        """What one added message says of itself, read once per process; None when it was
        deleted since (it cannot be read, so it is not counted)."""
        with log.lock:
            kept = log.read.get(provider_id)
        if kept is not None:
            return kept
        next_call(f"get {provider_id}")  # after the listing's: a further call
        request = self._messages.get(
            userId=mailbox.user,
            id=provider_id,
            format="metadata",
            metadataHeaders=["Message-ID", "Date", "To", "Subject"],
        )
        what = f"get {provider_id}"
        pay_behind_sends(mailbox.bucket, GMAIL_GET_UNITS, self._sleep)
        status, headers, body = self.provider.answer(what, request, 0.0, mailbox)
        if status == 404:
            return None
        if not 200 <= status < 300:
            raise provider_error_for_response(what, status, headers, body)
        read = _read_of(json_object(what, status, body))
        self._keep(log, provider_id, read)
        return read

    @staticmethod
    def _keep(log: _Log, provider_id: str, read: _Read) -> None:
        with log.lock:
            log.read[provider_id] = read
            log.read.move_to_end(provider_id)
            while len(log.read) > KEPT_HEADERS:
                log.read.popitem(last=False)


def _read_of(data: Mapping[str, Any]) -> _Read:
    return _Read(
        header=metadata_header(data, "message-id"),
        labels=tuple(str(label) for label in data.get("labelIds") or ()),
        date=metadata_header(data, "date") or "",
        to=metadata_header(data, "to") or "",
        subject=metadata_header(data, "subject") or "",
    )


def _history_id(value: object) -> int | None:
    """A historyId as Gmail writes it (a decimal string of a uint64), or None."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 20:
        return int(value)
    return None


__all__ = [
    "GMAIL_HISTORY_UNITS",
    "MARK_MAX_AGE",
    "MAX_MESSAGES",
    "GmailHistory",
    "pay_behind_sends",
]
