"""A provider in memory, for tests and benchmarks of everything above the provider port.

It keeps a mailbox of sent copies and answers searches from it, with an index lag measured
on an injected clock, so the engine's timing rules can be exercised without a socket:
thousands of simulated ticks per second. Outcomes are scripted per send: a dropped response
(the copy is stored, the caller hears nothing), a failure before the provider accepted
anything, a transient or permanent rejection; with no script a send is confirmed.
"""

from __future__ import annotations

import itertools
import threading
from collections import Counter, deque
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from email.parser import BytesHeaderParser

from daemon.providers.base import (
    FoundReport,
    ProviderBase,
    ProviderError,
    ReportRead,
    ScopeLost,
    SearchHit,
    SearchResult,
    SendKind,
    SendOutcome,
    stopped_before_send,
)
from ledger.exceptions import SendledgerError


class SimulatedCrash(SendledgerError):
    """The sending process died during the call (what kill -9 does to a real daemon)."""


@dataclass(frozen=True)
class Scripted:
    """One send's fate: what the caller hears and whether a copy was stored."""

    outcome: SendOutcome
    stored: bool
    answers_id: bool = True  # a confirmed outcome carries the stored copy's id
    crashes: bool = False  # the caller dies before it hears anything
    hangs_until: threading.Event | None = None  # the call returns only once this is set

    @classmethod
    def confirmed(cls) -> Scripted:
        return cls(SendOutcome(SendKind.CONFIRMED, "200"), stored=True)

    @classmethod
    def dropped_response(cls) -> Scripted:
        """Sent, but the response never arrived: the ambiguity sendledger exists for."""
        return cls(SendOutcome(SendKind.UNKNOWN, "response lost"), stored=True)

    @classmethod
    def unanswered(cls, *, stored: bool = True) -> Scripted:
        """The provider (or a proxy before it) closed the connection after the request
        with nothing of a response: Unknown, as a dropped response is, and one more of a
        run that pauses the scope's sends (`Circuits.sent`). `stored`: whether it took the
        message before it closed."""
        outcome = SendOutcome(
            SendKind.UNKNOWN, "connection closed without a response", unanswered=True
        )
        return cls(outcome, stored=stored)

    @classmethod
    def lost_request(cls) -> Scripted:
        """Unknown to the caller, but nothing reached the provider."""
        return cls(SendOutcome(SendKind.UNKNOWN, "timeout"), stored=False)

    @classmethod
    def server_error_after_send(cls) -> Scripted:
        return cls(SendOutcome(SendKind.UNKNOWN, "HTTP 500", status=500), stored=True)

    @classmethod
    def rejected(
        cls, *, transient: bool, retry_after: float | None = None, reason: str = ""
    ) -> Scripted:
        """`reason`: the provider's words (an SMTP reply often names the recipient)."""
        status = 429 if transient else 400
        outcome = SendOutcome(
            SendKind.REJECTED,
            reason or f"HTTP {status}",
            transient=transient,
            retry_after=retry_after,
            status=status,
        )
        return cls(outcome, stored=False)

    @classmethod
    def unavailable(cls, *, retry_after: float | None = None) -> Scripted:
        """Nothing sent, the provider unreachable (refused, DNS, 429): waited out."""
        outcome = SendOutcome(
            SendKind.REJECTED,
            "not sent: connection refused",
            transient=True,
            retry_after=retry_after,
            unavailable=True,
        )
        return cls(outcome, stored=False)

    @classmethod
    def stopped_before_send(cls) -> Scripted:
        """A send of several calls stopped before any call that could send the message,
        its quota scope gone to another daemon (Graph's tidy of an earlier draft): no
        attempt."""
        lost = ScopeLost("tidy: stopped, its quota scope went to another daemon")
        return cls(stopped_before_send(lost), stored=False)

    @classmethod
    def hang(cls, release: threading.Event) -> Scripted:
        """A call that hangs (its worker blocked) until `release` is set, then confirmed."""
        return cls(SendOutcome(SendKind.CONFIRMED, "200"), stored=True, hangs_until=release)

    @classmethod
    def timed_out(cls, release: threading.Event | None = None, *, stored: bool = False) -> Scripted:
        """A call that outlives its timeout (a hang at the provider): Unknown, timed out.
        With `release`, its worker is held until it is set, as a real timeout holds it."""
        outcome = SendOutcome(SendKind.UNKNOWN, "timed out", timed_out=True)
        return cls(outcome, stored=stored, hangs_until=release)

    @classmethod
    def slow(cls, release: threading.Event) -> Scripted:
        """A call that answers, but only once `release` is set (a provider slower than
        the lease, not one past its timeout): stored, then confirmed."""
        return cls.hang(release)

    @classmethod
    def crash_during_call(cls, *, stored: bool) -> Scripted:
        """The caller dies mid-call: raises SimulatedCrash after the provider did (or did
        not) store the copy, so nothing after the claim is recorded."""
        return cls(SendOutcome(SendKind.UNKNOWN, "crashed"), stored=stored, crashes=True)

    @classmethod
    def confirmed_without_id(cls) -> Scripted:
        return cls(
            SendOutcome(SendKind.CONFIRMED, "200 without an id"), stored=True, answers_id=False
        )


@dataclass(frozen=True)
class Copy:
    provider_message_id: str
    message_id: str
    stored_at: datetime
    to: str = ""
    subject: str = ""
    in_trash: bool = False  # a message received with the Message-ID and deleted, ...


@dataclass(frozen=True)
class Arrived:
    """A message in the inbox (a delivery report, or a forgery of one)."""

    provider_message_id: str
    raw: bytes
    arrived_at: datetime


class FakeProvider(ProviderBase):
    response_ids_readable = True
    reads_reports = True

    def __init__(
        self,
        name: str = "fake",
        *,
        clock: Callable[[], datetime],
        index_lag: float = 0.0,
        replaces_message_id: bool = False,
        keeps_date: bool = False,
    ) -> None:
        self.name = name
        self.keeps_date = keeps_date
        self.clock = clock
        self.index_lag = index_lag
        self.replaces_message_id = replaces_message_id
        self.copies: list[Copy] = []
        self._originals: dict[str, str] = {}  # copy's provider id -> the Message-ID we gave
        self.sends = 0
        #: Of `sends`, those that stopped before any call that could send the message
        #: (`SendOutcome.not_attempted`): no send request, though a call of the port.
        self.sends_stopped = 0
        self.sends_by_message_id: Counter[str] = Counter()
        self.searches = 0
        #: Searches that got an answer, by the Message-ID searched for: a job can have no
        #: more believed misses than that (a failed search is never a miss).
        self.answered_searches: Counter[str] = Counter()
        self.hanging = 0  # calls blocked in a scripted hang right now
        #: Sends of each Message-ID in flight now (a scripted hang), and which of its calls
        #: (1 for its first send, ...) stored a copy: what a record of "not sent" after
        #: attempt N is held against.
        self.in_flight: Counter[str] = Counter()
        self.hanging_in: Counter[str] = Counter()  # by the name of the thread that waits
        self.stored_by_call: dict[str, list[int]] = {}
        self.pings = 0
        #: The inbox delivery reports arrive in (`deliver`), and the reads of it.
        self.inbox: list[Arrived] = []
        self.report_reads = 0
        self.reports_fetched = 0
        self.report_reads_forgotten = 0  # `forget_report_reads` calls
        self._failing_reads = 0
        self._failing_reads_wait: float | None = None
        self._script: deque[Scripted] = deque()
        self._failing_searches = 0
        self._searches_unavailable = False
        self._searches_wait = 1.0
        self._failing_pings = 0
        #: Called in the middle of every search, after it read the mailbox and before its
        #: answer reaches the caller (a hook for tests that let another actor move while a
        #: search's answer is on its way).
        self.during_search: Callable[[], None] | None = None
        #: Called in the middle of every send, after the copy was stored and before the
        #: outcome reaches the caller (a call that takes time on an injected clock).
        self.during_send: Callable[[], object] | None = None
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    # -- scripting ----------------------------------------------------------------------

    def script(self, *fates: Scripted) -> None:
        """The next sends' fates, in order; after them, sends are confirmed."""
        with self._lock:
            self._script.extend(fates)

    def fail_searches(
        self, count: int, *, unavailable: bool = False, retry_after: float = 1.0
    ) -> None:
        """The next `count` searches fail; `unavailable`: as a refused connection does
        (counted toward the circuit), else as a 500 does, with the provider's
        `retry_after`."""
        with self._lock:
            self._failing_searches += count
            self._searches_unavailable = unavailable
            self._searches_wait = retry_after

    def fail_pings(self, count: int) -> None:
        """The next `count` pings time out (the provider still hangs); 0: they answer."""
        with self._lock:
            self._failing_pings = count

    def deliver(self, raw: bytes) -> str:
        """A message arrives in the inbox now (a bounce, or anything else); its id."""
        with self._lock:
            provider_id = f"inbox-{next(self._ids):06d}"
            self.inbox.append(Arrived(provider_id, raw, self.clock()))
            return provider_id

    def fail_reads(self, count: int, *, retry_after: float | None = None) -> None:
        """The next `count` reads for delivery reports fail (unavailable, with the
        provider's `retry_after` when given)."""
        with self._lock:
            self._failing_reads = count
            self._failing_reads_wait = retry_after

    def copies_of(self, message_id: str) -> int:
        """Copies sent for `message_id`, counted by the Message-ID we gave (a replaced one
        too), as the e2e tests count by the job's subject; a message in the trash
        (`store_copy(..., in_trash=True)`) is not one."""
        with self._lock:
            return sum(
                1
                for copy in self.copies
                if not copy.in_trash
                and self._originals.get(copy.provider_message_id, copy.message_id) == message_id
            )

    def store_copy(self, message_id: str, *, in_trash: bool = False) -> str:
        """A copy the provider holds without a send through us (a second sender);
        `in_trash`: in the mailbox's trash (a message received with the Message-ID and
        deleted), which a search lists only when no other copy is there, as the SMTP +
        IMAP and Graph providers search."""
        with self._lock:
            return self._store(message_id, in_trash=in_trash)

    # -- the provider port ----------------------------------------------------------------

    def send_raw(self, raw: bytes) -> SendOutcome:
        headers = BytesHeaderParser().parsebytes(raw)
        message_id = str(headers.get("Message-ID", "")).strip()
        shown = (str(headers.get("To", "")), str(headers.get("Subject", "")))
        with self._lock:
            self.sends += 1
            self.sends_by_message_id[message_id] += 1
            call = self.sends_by_message_id[message_id]
            fate = self._script.popleft() if self._script else Scripted.confirmed()
            self.sends_stopped += fate.outcome.not_attempted
            provider_id = self._store(message_id, *shown) if fate.stored else None
            if fate.stored:
                self.stored_by_call.setdefault(message_id, []).append(call)
        if fate.hangs_until is not None:
            self.hang(message_id, fate.hangs_until)
        if self.during_send is not None:
            self.during_send()
        if fate.crashes:
            raise SimulatedCrash(f"crashed while sending {message_id}")
        outcome = fate.outcome
        if outcome.kind is SendKind.CONFIRMED and provider_id and fate.answers_id:
            return SendOutcome(SendKind.CONFIRMED, outcome.reason, provider_message_id=provider_id)
        return outcome

    def hang(self, message_id: str, release: threading.Event) -> None:
        """A call of `message_id` held until `release` is set."""
        thread = threading.current_thread().name
        with self._lock:
            self.hanging += 1
            self.in_flight[message_id] += 1
            self.hanging_in[thread] += 1
        release.wait()
        with self._lock:
            self.hanging -= 1
            self.in_flight[message_id] -= 1
            self.hanging_in[thread] -= 1

    def hanging_of(self, daemon: str) -> int:
        """Calls hanging now in the send workers of the daemon named `daemon`."""
        with self._lock:
            return sum(n for thread, n in self.hanging_in.items() if thread.endswith(f"@{daemon}"))

    def ping(self) -> None:
        with self._lock:
            self.pings += 1
            if self._failing_pings:
                self._failing_pings -= 1
                raise ProviderError("ping: timed out (scripted)", timed_out=True)

    def search(self, message_id: str) -> SearchResult:
        query = f"rfc822msgid:{message_id.strip('<>')}"
        with self._lock:
            self.searches += 1
            if self._failing_searches:
                self._failing_searches -= 1
                if self._searches_unavailable:
                    raise ProviderError("search: connection refused (scripted)", unavailable=True)
                raise ProviderError("search failed (scripted)", retry_after=self._searches_wait)
            self.answered_searches[message_id] += 1
            visible_before = self.clock() - timedelta(seconds=self.index_lag)
            visible = list(self._visible(message_id, visible_before))
            sent = [copy for copy in visible if not copy.in_trash]
            hits = tuple(
                SearchHit(
                    copy.provider_message_id,
                    copy.message_id,
                    ("TRASH",) if copy.in_trash else ("SENT",),
                    date=copy.stored_at.isoformat(),
                    to=copy.to,
                    subject=copy.subject,
                    in_trash=copy.in_trash,
                )
                for copy in sent or visible
            )
        hook = self.during_search
        if hook is not None:
            hook()  # the answer is read; it reaches the caller only now
        return SearchResult(query=query, hits=hits)

    def read_reports(
        self,
        since: datetime,
        *,
        known: Collection[str],
        max_bytes: int,
        limit: int,
        may_go_on: Callable[[], bool] | None = None,
    ) -> ReportRead:
        with self._lock:
            self.report_reads += 1
            if self._failing_reads:
                self._failing_reads -= 1
                raise ProviderError(
                    "read: connection refused (scripted)",
                    unavailable=True,
                    retry_after=self._failing_reads_wait,
                )
            listed = [m for m in self.inbox if m.arrived_at >= since]
            new = [m for m in listed if m.provider_message_id not in known]
            found = tuple(
                FoundReport(
                    m.provider_message_id,
                    m.raw if len(m.raw) <= max_bytes else None,
                    len(m.raw),
                    received_at=m.arrived_at,
                )
                for m in new[:limit]
            )
            self.reports_fetched += sum(1 for f in found if f.raw is not None)
            return ReportRead(
                query=f"inbox since {since.isoformat()}",
                listed=tuple(m.provider_message_id for m in listed),
                found=found,
                complete=len(new) <= limit,
            )

    def forget_report_reads(self) -> None:
        with self._lock:
            self.report_reads_forgotten += 1

    def read_message_id(self, provider_message_id: str) -> str | None:
        with self._lock:
            for copy in self.copies:
                if copy.provider_message_id == provider_message_id:
                    return copy.message_id
        raise ProviderError(f"no message {provider_message_id}")

    def close(self) -> None:
        pass

    # -- inside ---------------------------------------------------------------------------

    def _store(
        self, message_id: str, to: str = "", subject: str = "", *, in_trash: bool = False
    ) -> str:
        provider_id = f"fake-{next(self._ids):06d}"
        stored = f"<replaced-{provider_id}@fake>" if self.replaces_message_id else message_id
        self.copies.append(Copy(provider_id, stored, self.clock(), to, subject, in_trash))
        self._originals[provider_id] = message_id
        return provider_id

    def _visible(self, message_id: str, visible_before: datetime) -> Iterable[Copy]:
        return (
            copy
            for copy in self.copies
            if copy.message_id == message_id and copy.stored_at <= visible_before
        )
