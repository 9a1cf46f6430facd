"""The SMTP + IMAP provider: submission with smtplib, reconciliation by IMAP search of the
sent folder (docs/providers.md "Providers"; "Adding a provider" in docs/architecture.md).

* One SMTP transaction per send, driven step by step (MAIL, RCPT, DATA, the content, the
  final `.`; EHLO, STARTTLS and AUTH once per connection) so the classification knows
  exactly where it ended (`smtp_submit.py`, `smtp_classify.py`). Connections and their
  login are kept between sends, and IMAP sessions between searches (`kept.py`,
  docs/providers.md "Connections kept between sends").
* Search: `UID SEARCH HEADER Message-ID <id>` in the sent folder (default: the folder
  flagged `\\Sent`, RFC 6154), then each hit's header fetched and compared exactly, because
  servers match HEADER searches by substring (Dovecot does).
* `sent_copy = "client"`: after a 250 the provider APPENDs the copy to the sent folder
  itself. A crash between the two leaves no copy, so a miss proves nothing for such a
  provider: the policy check refuses `on_unknown = "retry"` with it.

Hit ids are `UIDVALIDITY:UID` of the sent folder, which `read_message_id` reads back. When
the sent folder holds none, the search counts the copies in the folder flagged `\\Trash`
(a sent copy deleted by its sender was sent); their ids are `trash:UIDVALIDITY:UID`, with
no read-back, and they are marked `in_trash`: a message received with the job's
Message-ID and deleted lies there too, so such copies alone settle nothing (the job goes
to review, `decisions.after_search`). Not beside a sent copy: a message addressed to its
own sender has its received copy in the trash once read and deleted, and a copy moved
there between the two folders' searches would be counted twice; either would be a false
duplicate.

Delivery reports (docs/providers.md "Bounces") arrive in INBOX, where the submission
server's own bounces are filed: one read is `UID SEARCH SINCE <day> HEADER Content-Type
"multipart/report"` there (only reports are listed: the server matches the header), the
size of each one not read before, then the bytes of those within the caller's limit. Ids
are `UIDVALIDITY:UID` of INBOX.
"""

from __future__ import annotations

import logging
import ssl
import threading
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from email.message import Message
from email.parser import BytesHeaderParser
from pathlib import Path
from typing import Any, Literal, TypeVar

from daemon.config.secret_text import read_secret_text
from daemon.providers.base import (
    FoundReport,
    ProviderBase,
    ProviderError,
    ReportRead,
    SearchHit,
    SearchResult,
    SendKind,
    SendOutcome,
)
from daemon.providers.imap_sessions import ImapSessions
from daemon.providers.kept import MailEndpoint, ReuseLimits
from daemon.providers.outcomes import SEARCH_STOPS_AT, first_copies
from daemon.providers.smtp_submit import SmtpSubmitter
from ledger.copies import TRASHED_ID
from ledger.message import Envelope
from ledger.message_id import same_message_id

log = logging.getLogger("sendledger.providers.smtp")
#: What a delivery report's Content-Type says (RFC 6522), as INBOX is searched for it.
REPORT_TYPE = "multipart/report"

Security = Literal["tls", "starttls", "none"]
SentCopy = Literal["server", "client"]
R = TypeVar("R")


def _text(value: bytes | str) -> str:
    raw = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
    return " ".join(raw.split())


class SmtpImapProvider(ProviderBase):
    """The provider port on SMTP submission + IMAP. Thread-safe: a kept connection or
    session is used by one thread at a time."""

    # A 250 names a queue entry, not a stored copy: the Message-ID is checked by `probe`
    # and by the exact header comparison of every search instead.
    response_ids_readable = False
    reads_reports = True
    # An MTA sends a message's own Date header as it is: a bounce quotes the job's.
    keeps_date = True

    def __init__(
        self,
        name: str,
        *,
        smtp_host: str,
        smtp_port: int,
        smtp_security: Security,
        imap_host: str,
        imap_port: int,
        imap_security: Security,
        username: str,
        password: str,
        sent_folder: str = "",
        sent_copy: SentCopy = "server",
        timeout: float = 30.0,
        ssl_context: ssl.SSLContext | None = None,
        reuse: ReuseLimits | None = None,
        pipelining: bool = True,
    ) -> None:
        if timeout <= 0:
            raise ValueError(f"timeout must be positive, got {timeout!r}")
        self.name = name
        self.smtp_host, self.smtp_port, self.smtp_security = smtp_host, smtp_port, smtp_security
        self.imap_host, self.imap_port, self.imap_security = imap_host, imap_port, imap_security
        self.username = username
        self.sent_copy = sent_copy
        self.timeout = float(timeout)
        context = ssl_context or ssl.create_default_context()
        limits = reuse or ReuseLimits()
        self.smtp = SmtpSubmitter(
            MailEndpoint(
                smtp_host, smtp_port, smtp_security, username, password, self.timeout, context
            ),
            limits,
            pipelining=pipelining,
        )
        self.imap = ImapSessions(
            MailEndpoint(
                imap_host, imap_port, imap_security, username, password, self.timeout, context
            ),
            limits,
        )
        self._configured_folder = sent_folder
        self._folder: str | None = sent_folder or None
        # The folder flagged \Trash, "" when the server flags none; None: not listed yet.
        self._trash: str | None = None
        self._folder_lock = threading.Lock()
        self._closed = False

    # -- SMTP ---------------------------------------------------------------------------

    def send_raw(self, raw: bytes) -> SendOutcome:
        """One SMTP transaction, the message written once. Never raises for the call's own
        outcome; raises (before any network activity) only when the provider is closed."""
        return self.send_envelope(Envelope.of(raw))

    def send_envelope(self, envelope: Envelope) -> SendOutcome:
        """`send_raw` of a message whose envelope is already parsed."""
        if self._closed:
            raise RuntimeError(f"provider {self.name!r} is closed")
        if not envelope.recipients:
            return SendOutcome(SendKind.REJECTED, "not sent: the message has no recipients")
        outcome = self.smtp.submit(envelope)
        if outcome.kind is SendKind.CONFIRMED and self.sent_copy == "client":
            self._append_copy(envelope.data)
        return outcome

    def _append_copy(self, data: bytes) -> None:
        """File the sent copy ourselves (`sent_copy = "client"`). The send stays confirmed
        whatever happens here; a missing copy is logged, searches will not find it. Never
        made twice: a second APPEND would be a second copy."""
        try:
            self._imap_call(
                lambda client: client.append(self._sent_folder(client), data, flags=[b"\\Seen"]),
                repeatable=False,
            )
        except Exception as exc:
            log.warning("%s: sent, but the APPEND of the sent copy failed: %s", self.name, exc)

    # -- IMAP ---------------------------------------------------------------------------

    def ping(self) -> None:
        # The submission server: a hang there is what opens a circuit for sends.
        self.smtp.ping()

    def _imap_call(self, call: Callable[[Any], R], *, repeatable: bool = True) -> R:
        if self._closed:
            raise RuntimeError(f"provider {self.name!r} is closed")
        return self.imap.run(call, repeatable=repeatable)

    def _sent_folder(self, client: Any) -> str:
        with self._folder_lock:
            if self._folder is not None:
                return self._folder
        for flags, _delimiter, name in client.list_folders():
            if any(_text(flag).lower() == "\\sent" for flag in flags):
                with self._folder_lock:
                    self._folder = str(name)
                return str(name)
        raise ProviderError(
            f"IMAP {self.imap_host}: no folder is flagged \\Sent;"
            f" set sent_folder for provider {self.name!r}"
        )

    def _trash_folder(self, client: Any) -> str:
        """The folder flagged `\\Trash` (RFC 6154), or "" when the server flags none."""
        with self._folder_lock:
            if self._trash is not None:
                return self._trash
        found = next(
            (str(name) for flags, _delimiter, name in client.list_folders()
             if any(_text(flag).lower() == "\\trash" for flag in flags)),
            "",
        )  # fmt: skip
        with self._folder_lock:
            self._trash = found
        return found

    def search(self, message_id: str) -> SearchResult:
        """Every copy whose Message-ID header is exactly ours in the sent folder, or when
        it has none, in the trash: a sent copy the sender deleted (moved to the folder
        flagged `\\Trash`) was still sent, and missing it would have the job sent again
        (Gmail's search counts trashed copies too); beside a sent copy, one in the trash
        is no second send (the module docstring). A copy in the trash has no read-back
        id, and is marked `in_trash` (weaker evidence: it may have been received)."""
        if not message_id or any(c in message_id for c in '"\\\r\n'):
            raise ProviderError(f"cannot search for Message-ID {message_id!r}")

        def read(client: Any, folder: str, trashed: bool) -> Iterator[SearchHit | None]:
            """The folder's messages the server matched, each as a copy or None: their
            headers fetched `SEARCH_STOPS_AT` at a time, so a search that stops early
            (`first_copies`) fetches no more."""
            selected = client.select_folder(folder, readonly=True)
            validity = int(selected[b"UIDVALIDITY"])
            uids = sorted(int(uid) for uid in client.search(["HEADER", "Message-ID", message_id]))
            for start in range(0, len(uids), SEARCH_STOPS_AT):
                batch = uids[start : start + SEARCH_STOPS_AT]
                headers = _headers(client, batch, _SHOWN_FIELDS)
                exact = _exactly(headers, message_id)
                for uid in batch:
                    fields = exact.get(uid)
                    if fields is None:  # gone meanwhile, or a substring's match
                        yield None
                        continue
                    yield SearchHit(
                        f"{_TRASHED}{validity}:{uid}" if trashed else f"{validity}:{uid}",
                        str(fields["Message-ID"]).strip(),
                        date=str(fields.get("Date", "")),
                        to=str(fields.get("To", "")),
                        subject=str(fields.get("Subject", "")),
                        labels=(folder,) if trashed else (),
                        in_trash=trashed,
                    )

        def call(client: Any) -> tuple[list[str], list[SearchHit], bool]:
            searched: list[str] = []
            sent = self._sent_folder(client)
            trash = self._trash_folder(client)
            for folder in (sent, trash) if trash and trash != sent else (sent,):
                searched.append(folder)
                what = f"search {folder} for {message_id}"
                hits, complete = first_copies(read(client, folder, folder != sent), what)
                if hits:
                    # A sent copy: the trash is not read (the module docstring).
                    return searched, hits, complete
            return searched, [], True

        folders, hits, complete = self._imap_call(call)
        query = " and ".join(
            f'{folder}: UID SEARCH HEADER Message-ID "{message_id}"' for folder in folders
        )
        return SearchResult(query=query, hits=tuple(hits), complete=complete)

    def read_message_id(self, provider_message_id: str) -> str | None:
        """The Message-ID header of the sent-folder copy `UIDVALIDITY:UID` (a search hit).

        A 250 names no stored copy (a queue id, or our own Message-ID), so there is nothing
        to read back for it: ProviderError, which the engine logs and ignores. `sendledger
        probe` checks that a provider keeps the Message-ID.
        """
        if provider_message_id.startswith(_TRASHED):
            raise ProviderError(f"{provider_message_id}: a copy in the trash: nothing to read back")
        validity_text, colon, uid_text = provider_message_id.partition(":")
        if not (colon and validity_text.isdigit() and uid_text.isdigit()):
            raise ProviderError(
                f"{provider_message_id!r} is an SMTP reply's id, not a stored copy:"
                " nothing to read back"
            )
        uid = int(uid_text)

        def call(client: Any) -> dict[int, str | None]:
            selected = client.select_folder(self._sent_folder(client), readonly=True)
            if int(selected[b"UIDVALIDITY"]) != int(validity_text):
                raise ProviderError(f"{provider_message_id}: the sent folder's UIDVALIDITY changed")
            return _message_ids(client, [uid])

        headers = self._imap_call(call)
        if uid not in headers:
            raise ProviderError(f"{provider_message_id}: no such message in the sent folder")
        return headers[uid]

    def read_reports(
        self,
        since: datetime,
        *,
        known: Collection[str],
        max_bytes: int,
        limit: int,
        may_go_on: Callable[[], bool] | None = None,
    ) -> ReportRead:
        """The reports in INBOX since `since`'s day (IMAP's SINCE has no time of day). One
        session, no API quota spent: `may_go_on` is not asked."""
        day = since.date()
        query = f'INBOX: UID SEARCH SINCE {day:%d-%b-%Y} HEADER Content-Type "{REPORT_TYPE}"'

        def call(client: Any) -> tuple[list[str], list[FoundReport]]:
            selected = client.select_folder("INBOX", readonly=True)
            validity = int(selected[b"UIDVALIDITY"])
            uids = sorted(
                int(uid)
                for uid in client.search(["SINCE", day, "HEADER", "Content-Type", REPORT_TYPE])
            )
            ids = {uid: f"{validity}:{uid}" for uid in uids}
            unread = [uid for uid in uids if ids[uid] not in known][:limit]
            fetched = client.fetch(unread, ["RFC822.SIZE", "INTERNALDATE"]) if unread else {}
            sizes = {int(uid): int(data[b"RFC822.SIZE"]) for uid, data in fetched.items()}
            # When the server received each one: a report older than its job's first
            # attempt is a forgery (`SendJob.record_bounce`).
            received = {
                int(uid): _received(data.get(b"INTERNALDATE")) for uid, data in fetched.items()
            }
            small = [uid for uid, size in sizes.items() if size <= max_bytes]
            bodies = {
                int(uid): bytes(data[b"BODY[]"])
                for group in _by_size(small, sizes, max_bytes)
                for uid, data in client.fetch(group, ["BODY.PEEK[]"]).items()
            }
            found = [
                FoundReport(ids[uid], bodies.get(uid), size, REPORT_TYPE, received[uid])
                for uid, size in sorted(sizes.items())
            ]
            return [ids[uid] for uid in uids], found

        listed, found = self._imap_call(call)
        unread = sum(1 for i in listed if i not in known)
        return ReportRead(query, tuple(listed), tuple(found), complete=unread <= limit)

    def connection_stats(self) -> dict[str, dict[str, int]]:
        """What happened to the kept connections: {"smtp": {...}, "imap": {...}}."""
        return {"smtp": self.smtp.pool.stats.snapshot(), "imap": self.imap.pool.stats.snapshot()}

    def close(self) -> None:
        self._closed = True
        self.smtp.close()
        self.imap.close()

    def __repr__(self) -> str:
        return (
            f"SmtpImapProvider({self.name!r}, user={self.username!r}, sent_copy={self.sent_copy!r})"
        )


def read_password_file(path: Path) -> str:
    """The password: the file's first line, without its line end. ValueError names why not."""
    text = read_secret_text(path)
    password = text.splitlines()[0] if text else ""
    if not password:
        raise ValueError(f"{path}: empty (the password is its first line)")
    return password


def _exactly(headers: dict[int, Message], message_id: str) -> dict[int, Message]:
    """The messages whose Message-ID is exactly `message_id` (servers match substrings)."""
    return {
        uid: fields
        for uid, fields in headers.items()
        if fields.get("Message-ID") is not None
        and same_message_id(str(fields["Message-ID"]).strip(), message_id)
    }


def _message_ids(client: Any, uids: list[int]) -> dict[int, str | None]:
    """UID -> the Message-ID header (None when absent) of each message that still exists."""
    result: dict[int, str | None] = {}
    for uid, fields in _headers(client, uids, ("MESSAGE-ID",)).items():
        header = fields.get("Message-ID")
        result[uid] = str(header).strip() if header is not None else None
    return result


#: What a human checking a copy sees of it (docs/review.md "Review"), with the Message-ID.
_SHOWN_FIELDS = ("MESSAGE-ID", "DATE", "TO", "SUBJECT")
#: The prefix of a search hit found in the trash (`search`).
_TRASHED = TRASHED_ID


def _headers(client: Any, uids: list[int], names: Sequence[str]) -> dict[int, Message]:
    """UID -> the named header fields of each message that still exists (read, never
    marked seen)."""
    wanted = " ".join(names)
    fetched = client.fetch(uids, [f"BODY.PEEK[HEADER.FIELDS ({wanted})]"])
    parser = BytesHeaderParser()
    result: dict[int, Message] = {}
    for uid, data in fetched.items():
        raw = next((v for k, v in data.items() if k.upper().startswith(b"BODY[HEADER")), b"")
        result[int(uid)] = parser.parsebytes(bytes(raw))
    return result


def _by_size(uids: Sequence[int], sizes: Mapping[int, int], most: int) -> Iterator[list[int]]:
    """`uids` in order, in groups whose `sizes` add up to `most` at most (one larger
    alone): a FETCH of the bodies of many reports, each within a report read's bound, is
    one IMAP answer, which past `early_answers.ANSWER_BOUND` is cut, the read failing
    every time while those reports were unread."""
    group: list[int] = []
    total = 0
    for uid in uids:
        if group and total + sizes[uid] > most:
            yield group
            group, total = [], 0
        group.append(uid)
        total += sizes[uid]
    if group:
        yield group


def _received(value: object) -> datetime | None:
    """A message's INTERNALDATE as IMAPClient gives it (a datetime, naive in local time
    unless the client was told not to normalise), in UTC; None when it gave none."""
    if not isinstance(value, datetime):
        return None
    return value.astimezone(UTC)


__all__ = ["SmtpImapProvider", "read_password_file"]
