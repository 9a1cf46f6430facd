"""An httplib2 transport that makes each request exactly once and says which phase failed.

Why not plain `httplib2.Http`: its `_conn_request` repeats a request by itself

* once more when sending or reading fails on a connection (`RETRIES = 2`), and
* once more "regardless of the number of RETRIES set" when the first read ends in
  `BadStatusLine` - and `http.client.RemoteDisconnected`, what a dropped response looks
  like, is a `BadStatusLine`. Setting `httplib2.RETRIES = 1` does not stop that one.

For `users.messages.send` either repeat is a second email. So `SingleShotHttp` replaces
`_conn_request` with one attempt, and splits it into two phases so the caller can tell
"not sent" from "maybe sent":

1. connect (DNS, TCP, TLS handshake) when there is no open connection to reuse, within
   the timeout and the claim's lease under the call (`connects.py`), straight to the
   URL's host: httplib2 goes through a proxy (`HTTPS_PROXY`) only with PySocks,
   which sendledger does not install (tests/unit/test_graph_token_route.py). No byte of
   the request has left yet, so a failure here proves nothing was sent: `NotSentError`.
2. write the request and read the whole response. From the first byte written on, a
   failure (timeout, reset, closed without a response, unreadable body) leaves the
   outcome unknown: `ResponseLostError`. The response, from when the request has left
   this host, is read within one `timeout` as a whole: a server that trickles it (interim
   `100 Continue`s, a header a byte at a time, an endless chunked body) is timed out.

Keep-alive connections are reused (a fresh TCP + TLS handshake per call was the largest
cost of a send over HTTPS; see docs/performance.md "Performance and scaling"), and reuse changes no
outcome rule: a request written on a reused connection that dies unanswered is a
`ResponseLostError` like any other - an Unknown, reconciled by searching for the
Message-ID - and is never written again. What reuse costs is that a connection the server
closed while it sat idle shows up only while writing, where it cannot be told apart from a
server that took the request and died; such a job waits for its search instead of being
retried at once. Two checks keep that rare without ever re-sending: a connection idle
longer than `max_idle` (below the keep-alive timeouts servers use) is closed and replaced
before anything is written, and so is one whose socket already reports the server's close
(readable at rest means EOF or junk: a response nobody asked for). `TransportStats`
counts requests on fresh and reused connections and how many of each died unanswered.

Also switched off: redirects (httplib2 re-POSTs on 308; Gmail does not redirect API calls,
so a 3xx is surfaced as a response and classified as unknown), the cache and httplib2's
own credential challenges (`add_credentials` is never called). The one replay left below
us is google-auth-httplib2's retry after refreshing a token on 401: a 401 means the
request was not accepted, so that replay cannot make a second copy.

Both errors derive from `httplib2.HttpLib2Error` so google-auth's httplib2 adapter wraps
them in `google.auth.exceptions.TransportError` during a token refresh, as it does for
httplib2's own errors; the original stays reachable through `__cause__`/`args`.
"""

from __future__ import annotations

import http.client
import re
import socket
import ssl
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httplib2

from daemon.providers.connects import connect
from daemon.providers.early_answers import HTTP_ANSWER_BOUND, EarlyAnswer, WatchedSocket
from daemon.providers.kept import closed_by_peer
from daemon.providers.slow_links import PIECE, pieces, wait_sent_out
from daemon.providers.timeouts import closed_unanswered
from ledger.exceptions import SendledgerError
from sendledger.connecting import close_unreturned
from sendledger.final_answers import FinalAnswer

#: Seconds a connection may sit idle and still be reused. Google's front ends keep idle
#: connections for minutes and common servers for 5 s or more; staying under that makes a
#: server-side close during our write (an avoidable Unknown) rare.
DEFAULT_MAX_IDLE = 4.0

#: An interim answer (100 Continue, 103 Early Hints), whole: status line, headers, blank.
_INTERIM = re.compile(rb"HTTP/1\.[01] 1\d\d[^\r\n]*\r\n(?:[^\r\n]+\r\n)*\r\n")
_INTERIM_START = re.compile(rb"HTTP/1\.[01] 1")


@dataclass
class TransportStats:
    """Requests by connection kind, and those that died unanswered (thread-safe)."""

    fresh: int = 0
    reused: int = 0
    fresh_lost: int = 0
    reused_lost: int = 0
    # Idle or closed by the server: replaced before anything was written.
    retired: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def bump(self, name: str) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + 1)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return {
                "fresh": self.fresh,
                "reused": self.reused,
                "fresh_lost": self.fresh_lost,
                "reused_lost": self.reused_lost,
                "retired": self.retired,
            }


class TransportFailure(httplib2.HttpLib2Error, SendledgerError):  # type: ignore[misc]
    """Base for the two phases. `cause` is the exception from the socket or http.client."""

    def __init__(self, message: str, *, host: str, cause: BaseException) -> None:
        super().__init__(message)
        self.message = message
        self.host = host
        self.cause = cause


class NotSentError(TransportFailure):
    """No connection was made: the request never left this process."""


class ResponseLostError(TransportFailure):
    """The request was (or may have been) written, and no complete response came back.
    `reused`: it went out on a kept-alive connection rather than a fresh one.
    `unanswered`: nothing of a response began, the connection closed or reset before its
    timeout (`timeouts.closed_unanswered`; `SendOutcome.unanswered`)."""

    def __init__(
        self,
        message: str,
        *,
        host: str,
        cause: BaseException,
        reused: bool = False,
        unanswered: bool = False,
    ) -> None:
        super().__init__(message, host=host, cause=cause)
        self.reused = reused
        self.unanswered = unanswered


def describe(exc: BaseException) -> str:
    """A short, stable label for a low-level failure, for reasons and logs."""
    if isinstance(exc, socket.gaierror):
        return f"DNS lookup failed ({exc})"
    if isinstance(exc, TimeoutError | socket.timeout):
        # The wire's own words when it says more: "timed out: its claim's lease ends"
        # (`early_answers.py`) is a lease the renewals did not move on, not a silent server.
        return str(exc) if str(exc).startswith("timed out: ") else "timed out"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, http.client.RemoteDisconnected):
        return "connection closed without a response"
    if isinstance(exc, ConnectionResetError):
        return "connection reset"
    if isinstance(exc, http.client.IncompleteRead):
        return "response cut off"
    if isinstance(exc, http.client.BadStatusLine):
        return "bad status line"
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class SingleShotHttp(httplib2.Http):  # type: ignore[misc]
    """`httplib2.Http` that never repeats a request; it reuses idle keep-alive connections
    (`reuse=False`: a fresh connection per request)."""

    def __init__(
        self,
        *,
        timeout: float,
        reuse: bool = True,
        max_idle: float = DEFAULT_MAX_IDLE,
        stats: TransportStats | None = None,
        clock: Callable[[], float] = time.monotonic,
        **kwargs: Any,
    ) -> None:
        if timeout is None or timeout <= 0:
            # httplib2 treats None as "no timeout": a hung server would hang us forever.
            raise ValueError(f"a positive timeout is required, got {timeout!r}")
        if max_idle < 0:
            raise ValueError(f"max_idle must not be negative, got {max_idle!r}")
        super().__init__(timeout=timeout, **kwargs)
        self.follow_redirects = False
        self.follow_all_redirects = False
        self.redirect_codes: frozenset[int] = frozenset()
        self.cache = None
        self.reuse = reuse
        self.max_idle = float(max_idle)
        self.stats = stats if stats is not None else TransportStats()
        self._clock = clock
        # When each kept connection finished its last exchange.
        self._idle_since: weakref.WeakKeyDictionary[http.client.HTTPConnection, float] = (
            weakref.WeakKeyDictionary()
        )

    def request(
        self,
        uri: str,
        method: str = "GET",
        body: Any = None,
        headers: dict[str, str] | None = None,
        redirections: int = httplib2.DEFAULT_MAX_REDIRECTS,
        connection_type: type[http.client.HTTPConnection] | None = None,
    ) -> tuple[httplib2.Response, bytes]:
        """`httplib2.Http.request`, its connections opened as every provider's is
        (`connects.connect`: within the timeout and the claim's lease) unless the caller
        names a connection class of its own."""
        if connection_type is None:
            connection_type = _OPENED_HERE.get(uri.partition(":")[0].lower())
        return super().request(  # type: ignore[no-any-return]
            uri, method, body, headers, redirections, connection_type
        )

    def _reusable(self, conn: http.client.HTTPConnection) -> bool:
        if not self.reuse or conn.sock is None:
            return False
        since = self._idle_since.get(conn)
        if since is None or self._clock() - since > self.max_idle:
            return False
        return not closed_by_peer(conn.sock)

    def _conn_request(
        self,
        conn: http.client.HTTPConnection,
        request_uri: str,
        method: str,
        body: Any,
        headers: dict[str, str],
    ) -> tuple[httplib2.Response, bytes]:
        host = f"{conn.host}:{conn.port}"
        reused = self._connect(conn, host)
        # Phase 2: from here on the server may have the request, reused connection or not.
        answer_read = False  # a reset after this is an answer cut off, not none
        try:
            watch = self._write(conn, method, request_uri, body, headers)
            raw = conn.getresponse()
            answer_read = True
            content: bytes = b"" if method == "HEAD" else raw.read()
            response = httplib2.Response(raw)
            if method != "HEAD":
                content = httplib2._decompressContent(response, content, self.limit_kwargs)
        except Exception as exc:
            # Nothing is left for a later call to trip on; the next one connects afresh.
            conn.close()
            self.stats.bump("reused_lost" if reused else "fresh_lost")
            target = f"a reused connection to {host}" if reused else host
            raise ResponseLostError(
                f"{method} sent to {target}, then {describe(exc)}",
                host=host,
                cause=exc,
                reused=reused,
                unanswered=not answer_read and closed_unanswered(exc),
            ) from exc
        self._keep_or_close(conn, watch, keep=not raw.will_close and method != "HEAD")
        if watch.cut and response.status < 400:
            # A success for a body the server never had whole proves nothing: Unknown.
            self.stats.bump("reused_lost" if reused else "fresh_lost")
            raise ResponseLostError(
                f"{method} sent to {host}, then answered {response.status} before its body"
                " was written",
                host=host,
                cause=http.client.BadStatusLine(str(response.status)),
                reused=reused,
            )
        return response, content

    def _connect(self, conn: http.client.HTTPConnection, host: str) -> bool:
        """Phase 1 (see the module docstring): the connection kept from the last request
        where it may be reused (True), else a fresh one; NotSentError when none opens."""
        reused = self._reusable(conn)
        self._idle_since.pop(conn, None)
        if not reused:
            if conn.sock is not None:
                self.stats.bump("retired")
                conn.close()
            try:
                conn.connect()
            except Exception as exc:
                close_unreturned(exc)  # a TLS wrap's socket httplib2 never got (a reset)
                conn.close()
                raise NotSentError(
                    f"no connection to {host}: {describe(exc)}", host=host, cause=exc
                ) from exc
        self.stats.bump("reused" if reused else "fresh")
        return reused

    def _keep_or_close(
        self, conn: http.client.HTTPConnection, watch: EarlyAnswer, *, keep: bool
    ) -> None:
        """After the answer: the connection kept for the next request (`keep`: the answer
        allows it), or closed; always closed once the server spoke before the body's end
        (or an interim 1xx was replayed), when it is in no state to be reused."""
        if not watch.read and self.reuse and keep and conn.sock is not None:
            conn.sock = watch.sock
            self._idle_since[conn] = self._clock()
        else:
            conn.close()

    def _write(
        self,
        conn: http.client.HTTPConnection,
        method: str,
        request_uri: str,
        body: Any,
        headers: dict[str, str],
    ) -> EarlyAnswer:
        """The request written, and the wait while it leaves this host: the answer's wait
        starts from there. A body in pieces: each write watches for an answer the server
        gives before it has read the body (a 413, a 401); then the rest is not written, and
        that answer is read at once, as is one while the body drains from this host (a body
        that fit in its buffers). A body of one piece leaves in writes this host takes at
        once, whoever reads them, and its answer is read as any: unwatched, as the watch's
        polls would cost every send (about a tenth of the call, measured); written with
        its header block in one write (`_OneWrite`) when together they are one piece."""
        sent, sent_headers = _in_pieces(body, headers)
        # Every interim 1xx read past, not only a 100 (sendledger/final_answers.py): a 103
        # taken for the answer left the real one for the next request on the connection.
        conn.response_class = FinalAnswer
        watch = EarlyAnswer(conn.sock, _final_status_begun)
        watched = isinstance(sent, Iterator)
        joined = None if watched else _OneWrite(watch.sock)
        conn.sock = WatchedSocket(watch) if joined is None else joined
        try:
            conn.request(method, request_uri, sent, sent_headers)
            if joined is not None:
                joined.flush()
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError):
            if not (watched and watch.left()):
                raise
        # A request of at most a piece in all (one write, `_OneWrite`) needs no look at
        # this host's queue: `wait_sent_out` would find at most a piece there and return,
        # over TLS a piece and its records' framing (22-29 bytes per record of 16 KiB),
        # which a wait for the piece's last 100 bytes or so would not make safer.
        if not watch.cut and (joined is None or joined.written > PIECE):
            wait_sent_out(watch.sock, self.timeout, watch.answered_within if watched else None)
        # The answer's wait, from here, ends within one timeout as a whole, however its
        # bytes trickle (early_answers.AnswerReader): else a byte per almost-timeout held
        # the call for as long as the server went on.
        conn.sock = WatchedSocket(watch, self.timeout, HTTP_ANSWER_BOUND)
        return watch


class _OneWrite:
    """A connection's socket while a request of one piece is written: http.client writes
    its header block and then its body, two system calls and two TCP segments, each one
    letting the interpreter lock go (a hand-off to another send worker, and a wait to
    take it back: docs/performance.md "Performance and scaling"). The header block
    is held and written with the body, the same bytes in the same order, in one write
    when together they are at most a piece (`slow_links.PIECE`: a write goes out within
    the timeout), else each in its own as before. `flush` writes what is still held (a
    request without a body). `written`: the bytes written."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.written = 0
        self._held: bytes | None = None

    def sendall(self, data: bytes | memoryview) -> None:
        held, self._held = self._held, None
        if held is None and not self.written:
            self._held = bytes(data)
            return
        if held is not None and len(held) + len(data) <= PIECE:
            data = held + bytes(data)
        elif held is not None:
            self._write(held)
        self._write(data)

    def flush(self) -> None:
        held, self._held = self._held, None
        if held is not None:
            self._write(held)

    def _write(self, data: bytes | memoryview) -> None:
        self.sock.sendall(data)
        self.written += len(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sock, name)


class _Https(httplib2.HTTPSConnectionWithTimeout):  # type: ignore[misc]
    """httplib2's HTTPS connection, opened by `connects.connect` (the lookup, the
    addresses, the handshake within the timeout and the claim's lease) rather than by
    httplib2's own connect, which gave each address and the handshake the whole timeout
    and knew no lease. Straight to the URL's host, as httplib2 goes without PySocks."""

    def connect(self) -> None:
        self.sock = connect(
            self.host, self.port, self.timeout, tls=self._context, server_hostname=self.host
        )


class _Http(httplib2.HTTPConnectionWithTimeout):  # type: ignore[misc]
    """httplib2's plain HTTP connection (an emulator on loopback), opened as `_Https`."""

    def connect(self) -> None:
        self.sock = connect(self.host, self.port, self.timeout)


#: The connection class of each scheme a `SingleShotHttp` opens itself.
_OPENED_HERE: dict[str, type[http.client.HTTPConnection]] = {"https": _Https, "http": _Http}


def _final_status_begun(read: bytes) -> bool:
    """Whether the bytes a server wrote during the body start its final answer, past any
    interim 1xx (which a client must accept unasked, RFC 9110 15.2): the body is then
    not written on."""
    at = 0
    while interim := _INTERIM.match(read, at):
        at = interim.end()
    rest = read[at:]
    return len(rest) >= len(b"HTTP/1.1 100") and not _INTERIM_START.match(rest)


def _in_pieces(body: Any, headers: dict[str, str]) -> tuple[Any, dict[str, str]]:
    """A body of more than a piece as its bytes in pieces, each write bounded by the
    timeout alone (`slow_links.py`: a big message over a slow link is not cut while its
    bytes keep flowing), with the headers to send it with; the same bytes as http.client
    writes (a text body in ISO-8859-1). A generator would be sent chunked without a
    Content-Length, another request on the wire, so one is given where http.client would
    have put its own (Graph's bodies come without one; the Google client sets it)."""
    names = {name.lower() for name in headers}
    if isinstance(body, str):
        try:
            body = body.encode("iso-8859-1")
        except UnicodeEncodeError:
            return body, headers  # http.client refuses it with its own words
    if not isinstance(body, bytes) or len(body) <= PIECE:
        return body, headers
    if "content-length" not in names:
        if "transfer-encoding" in names:
            return body, headers  # the caller frames the body itself
        # http.client writes its Content-Length before the caller's headers.
        headers = {"Content-Length": str(len(body)), **headers}
    return pieces(body), headers
