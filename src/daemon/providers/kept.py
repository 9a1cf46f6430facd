"""Connections kept between calls: the SMTP connections of the send workers and the IMAP
sessions of searches and read-backs (docs/providers.md "Connections kept between sends").

A pool of idle connections, last in first out: a worker gives its connection back after a
call and takes the most recently used one for its next, so with N workers busy the same N
connections serve them, and a connection never outlives `max_age` or `max_uses`. A
connection is only ever used by one thread at a time (it is out of the pool while in use),
and a worker thread that ends leaves nothing stranded, which a per-thread slot would.
Whether a connection taken from the pool still works is the caller's check (an SMTP NOOP,
an IMAP NOOP): this module only knows ages, counts and idle times.
"""

from __future__ import annotations

import errno
import select
import ssl
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from sendledger.connecting import LOOPBACK_NAMES, loopback_only, resolve

T = TypeVar("T")

__all__ = [
    "Kept",
    "KeptPool",
    "MailEndpoint",
    "ReuseLimits",
    "ReuseStats",
    "closed_by_peer",
    "opened_at",
]


@dataclass(frozen=True)
class MailEndpoint:
    """Where a mail protocol's connections go and as whom (an SMTP or an IMAP server)."""

    host: str
    port: int
    security: str  # "tls", "starttls" or "none"
    username: str
    password: str
    timeout: float
    ssl_context: ssl.SSLContext

    def opened(self, open_at: Callable[[str], T]) -> T:
        """`open_at(host)`, the client connected to the server (`opened_at`)."""
        return opened_at(self.host, self.port, self.security, self.timeout, open_at)


def opened_at(
    host: str, port: int, security: str, timeout: float, open_at: Callable[[str], T]
) -> T:
    """`open_at(host)`, a connection to a mail server: at its name as written, but with
    `security = "none"` to a loopback name (`localhost`, allowed by its name as loopback;
    the password goes in clear text) at each of the name's loopback addresses in the
    resolver's order, the next one when an address refuses the connection, as the
    system's connect goes on to the next address (a server on 127.0.0.1 alone, `localhost`
    resolving to ::1 first). Never at an address outside: OSError naming the name when it
    has no loopback one. The daemon's SMTP and IMAP clients and the probe's relay."""
    if security != "none" or host.lower() not in LOOPBACK_NAMES:
        return open_at(host)
    found = resolve(host, port, time.monotonic() + timeout)
    addresses = list(dict.fromkeys(info[4][0] for info in loopback_only(host, found)))
    for address in addresses[:-1]:
        try:
            return open_at(address)
        except OSError as exc:
            # Only a connection never made goes on: what a server said (an SMTP
            # greeting's refusal, a reset after it) is that server's answer.
            if not isinstance(exc, ConnectionRefusedError) and exc.errno not in _NO_ROUTE:
                raise
    return open_at(addresses[-1])


#: A loopback address the host cannot connect from or to (IPv6 switched off).
_NO_ROUTE = frozenset({errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT, errno.ENETUNREACH})


def closed_by_peer(sock: Any) -> bool:
    """True when an idle connection's socket has something to read: the server's FIN, a
    reset, or bytes nobody asked for (an SMTP 421 notice before it closes). Either way it
    must not carry a request. No round trip: one `poll` with a zero timeout (`select`
    refuses a descriptor above 1023, which a daemon holding many connections reaches: every
    kept connection would have read as closed, none reused)."""
    if isinstance(sock, ssl.SSLSocket) and sock.pending():
        return True
    try:
        watch = select.poll()
        watch.register(sock, select.POLLIN)
        return bool(watch.poll(0))
    except (OSError, ValueError):
        return True


@dataclass(frozen=True)
class ReuseLimits:
    """How long and how much one connection is used (the provider's settings)."""

    #: Calls (SMTP: messages) one connection makes at most; 1 = a connection per call.
    max_uses: int = 100
    #: Seconds from its opening after which a connection is closed, not reused; 0 = never
    #: reused.
    max_age: float = 300.0
    #: A connection idle longer than this is checked (NOOP) before it is reused.
    idle_check_after: float = 2.0


@dataclass(eq=False)
class Kept(Generic[T]):
    """One connection and what the pool knows of it."""

    conn: T
    opened: float
    last_used: float
    uses: int = 0
    #: The connection is mid-transaction (an SMTP refusal before the end of data): it
    #: needs a reset (RSET) before its next use.
    dirty: bool = False
    #: Whether it came from the pool (False: opened for this call).
    reused: bool = False

    def idle(self, now: float) -> float:
        return now - self.last_used


class ReuseStats:
    """Counters of what happened to connections (the bench prints them)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()

    def count(self, what: str) -> None:
        with self._lock:
            self._counts[what] += 1

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


@dataclass(eq=False)
class KeptPool(Generic[T]):
    """Idle connections, most recently used first. `close_conn` ends one politely (QUIT,
    LOGOUT) and must not raise."""

    limits: ReuseLimits
    close_conn: Callable[[T], None]
    clock: Callable[[], float] = time.monotonic
    stats: ReuseStats = field(default_factory=ReuseStats)
    _idle: list[Kept[T]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _closed: bool = False

    def take(self) -> Kept[T] | None:
        """The most recently used idle connection still within its limits, or None (open
        a fresh one). Connections past their age are closed on the way."""
        expired: list[Kept[T]] = []
        found: Kept[T] | None = None
        now = self.clock()
        with self._lock:
            while self._idle:
                kept = self._idle.pop()
                if now - kept.opened >= self.limits.max_age:
                    expired.append(kept)
                    continue
                found = kept
                break
        for kept in expired:
            self.stats.count("retired")
            self.close_conn(kept.conn)
        if found is not None:
            self.stats.count("reused")
            found.reused = True
        return found

    def fresh(self, conn: T) -> Kept[T]:
        """A connection just opened, for this call."""
        now = self.clock()
        self.stats.count("fresh")
        return Kept(conn, opened=now, last_used=now)

    def give_back(self, kept: Kept[T]) -> None:
        """After a call that left the connection usable: kept for the next call unless it
        has reached its limits (then closed)."""
        kept.uses += 1
        now = kept.last_used = self.clock()
        keep = kept.uses < self.limits.max_uses and now - kept.opened < self.limits.max_age
        with self._lock:
            if keep and not self._closed:
                self._idle.append(kept)
                return
        self.stats.count("retired")
        self.close_conn(kept.conn)

    def drop(self, kept: Kept[T], close: Callable[[T], None] | None = None) -> None:
        """A connection that failed or whose state is unknown: never reused."""
        self.stats.count("dropped")
        (close or self.close_conn)(kept.conn)

    def close(self) -> None:
        """Close every idle connection; those in use are closed when given back."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for kept in idle:
            self.close_conn(kept.conn)
