"""A server's answer given before it has read a request's whole body: a 413 for a message
too large or a 401 for an expired token read in HTTP headers, an SMTP refusal during DATA
(docs/providers.md "A server that answers before the body is read").

A body goes out a piece at a time (`slow_links.py`), and a server that answered and
stopped reading stalled the next write: the send waited a whole `timeout` and ended with
no answer (Unknown), or with a reset that lost the answer the server had left. So
`EarlyAnswer` writes without blocking and looks, before each write and while it waits to
write, whether the server has written anything; then the writing stops, nothing more is
written, and what was read is handed to the reply's reader (`reader`). A write that
fails because the server closed is followed by one look for the answer it left (Linux
keeps what arrived before the reset readable).

Readable is not enough under TLS 1.3: servers send session tickets right after the
handshake, which make the socket readable with no application data. A non-blocking read
through the TLS layer takes them in and raises SSLWantReadError: nothing was said.

The answer's reader (`AnswerReader`) also ends the wait for it: a socket's timeout bounds
each read alone, so a server trickling a byte per almost-timeout (a header, interim
`100 Continue`s, an endless chunked body, an SMTP reply's lines) kept the reader reading
for as long as it went on. Each read waits only for what is left of one `timeout` from
when the answer was awaited (`AnswerReader.answer_within`; docs/providers.md "A server
that never ends its answer"), and a second more for each `ANSWER_FLOOR` bytes it brought,
and no more than `ANSWER_BOUND` bytes of it are read: one written without end as fast as
the link goes would otherwise be kept until then.
"""

from __future__ import annotations

import contextlib
import io
import select
import socket
import ssl
import time
from collections.abc import Callable
from typing import Any, Literal

from daemon.providers.base import call_time_left
from daemon.providers.slow_links import PIECE, queued_bytes
from ledger.exceptions import SendledgerError
from sendledger.connecting import LEASE_ENDS

_IN, _OUT = select.POLLIN, select.POLLOUT
#: What says a read or write would not block: an error or a hang-up is for them to raise.
_ENDED = select.POLLERR | select.POLLHUP
#: Bytes of one answer past which it is not read on (`AnswerReader`): far above any SMTP
#: reply or IMAP answer the providers get (a FETCH of reports asks for 2 MiB of them at a
#: time, `smtp_imap.py`), and what a server writing an answer without end
#: as fast as it can makes this process keep until the answer's timeout (measured: 476 MB
#: in 0.5 s on loopback). Not higher: imaplib parses an answer's lines slowly enough that
#: a flood did not reach 64 MiB within a 2 s timeout (loopback, load 6).
ANSWER_BOUND = 16 * 1024 * 1024
#: `ANSWER_BOUND` for an HTTP answer (`transport.py`): the largest is a Gmail draft read
#: back whole (`drafts.get format=raw`), a message of up to `max_message_bytes` (25 MB)
#: base64url-encoded in JSON, 33.4 MB (Gmail's own limit, 35 MB: 47 MB).
HTTP_ANSWER_BOUND = 64 * 1024 * 1024
#: Bytes a second an answer is read at, at least, however long it goes on: each byte read
#: moves its deadline by 1 / ANSWER_FLOOR s (`AnswerReader`). A large answer over a slow
#: link (a Gmail draft of 25 MB read back whole, 33.4 MB, over less than 9 Mbit/s) is read
#: whole, as an upload goes on while its bytes flow (`slow_links.py`); one at this rate
#: without end ends at its bound: within the timeout and 64 s (SMTP, IMAP) or 256 s (HTTP).
ANSWER_FLOOR = 256 * 1024
#: Seconds an answer's reads may end past its deadline: a read begun within this of the
#: answer's start waits the socket's own timeout (`AnswerReader.readinto`), and so does
#: one whose timeout ends within this of the claim's lease under the call (`_ends_by`).
ANSWER_SLACK = 0.05
#: Bytes read while writing past which the writing ends (`EarlyAnswer.read` is kept for
#: the answer's reader): a server that keeps sending interim 1xx answers during an
#: upload would otherwise grow it without bound. Interim answers are a few dozen bytes;
#: no server that means to read the body sends this many of them first.
READ_BOUND = 64 * 1024


def ready(sock: socket.socket, *, write: bool, timeout: float | None) -> tuple[bool, bool]:
    """Whether `sock` can be read, and (`write`) written, without blocking, waiting at most
    `timeout` seconds for either (None: for ever). poll, not select: a daemon holding more
    than 1,024 descriptors gets sockets select cannot watch."""
    poller = select.poll()
    poller.register(sock, _IN | (_OUT if write else 0))
    events = poller.poll(None if timeout is None else timeout * 1000)
    mask = events[0][1] if events else 0
    return bool(mask & (_IN | _ENDED)), write and bool(mask & (_OUT | _ENDED))


def read_now(sock: socket.socket) -> bytes | None:
    """What the server has written on `sock` and not yet been read, without waiting: its
    bytes, b"" when it has closed, None when nothing (or only TLS post-handshake
    messages, or a reset: the write that follows says it)."""
    pending = sock.pending() if isinstance(sock, ssl.SSLSocket) else 0
    try:
        if not pending and not ready(sock, write=False, timeout=0)[0]:
            return None
    except (OSError, ValueError):
        return None  # closed here: the write that follows says it
    timeout = sock.gettimeout()
    sock.setblocking(False)
    try:
        return sock.recv(PIECE)
    except (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError):
        return None
    except OSError:
        return None
    finally:
        sock.settimeout(timeout)


def any_bytes(_read: bytes) -> bool:
    return True


class EarlyAnswer:
    """Writes to a socket while watching for the server's answer. `final(bytes read)`:
    whether they are the start of the answer that ends the request (HTTP: not an
    interim 1xx); SMTP has none, any reply ends it."""

    def __init__(self, sock: socket.socket, final: Callable[[bytes], bool] = any_bytes) -> None:
        self.sock = sock
        self.final = final
        #: The bytes the server wrote while the body was being written, to be replayed.
        self.read = b""
        #: The writing stopped before the end: the server cannot have the body whole.
        self.cut = False

    def sendall(self, data: bytes | memoryview) -> None:
        """`data` written as `socket.sendall` writes it, bounded by the socket's timeout as
        a whole, but ended without an error, and nothing written from then on, once the
        server has answered or closed: a blocked write is not waited out while the
        answer sits unread."""
        if self.cut:
            return
        view = memoryview(data).cast("B")
        timeout = self.sock.gettimeout()
        deadline = None if timeout is None else time.monotonic() + timeout
        self.sock.setblocking(False)
        try:
            while view:
                # Looked at before each write: a write that fails on the server's close
                # leaves a TLS connection unable to read the answer that came first.
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                # The claim's lease under the call, when it ends first: asked again when
                # the wait reaches it, as a renewal moves it on (`base.call_time_left`).
                lease = call_time_left()
                if lease is not None and lease <= 0:
                    raise TimeoutError(LEASE_ENDS)
                bounded = lease is not None and (left is None or lease < left)
                wait = lease if bounded else left
                readable, writable = ready(self.sock, write=True, timeout=wait)
                if readable and self.answered():
                    return
                if not (readable or writable or bounded):
                    raise TimeoutError("timed out")
                if writable:
                    # Under TLS a write that could not finish is repeated with the same
                    # bytes (OpenSSL's rule): `view` moves on only by what was taken.
                    with contextlib.suppress(
                        BlockingIOError, ssl.SSLWantWriteError, ssl.SSLWantReadError
                    ):
                        view = view[self.sock.send(view) :]
        finally:
            self.sock.settimeout(timeout)

    def answered(self) -> bool:
        """Whether the server has answered or closed, so that the rest is not written."""
        got = read_now(self.sock)
        if got is None:
            return False
        self.read += got
        self.cut = not got or self.final(self.read) or len(self.read) > READ_BOUND
        return self.cut

    def answered_within(self, seconds: float) -> bool:
        """Whether the server answers (or closes) within `seconds`: the wait while the
        body drains from this host (`slow_links.wait_sent_out`), which a body that fit in
        its buffers spends after the last write, ends at once on an answer."""
        # Readable by the socket alone: no answer sits decrypted in the TLS layer unseen,
        # as a read (`read_now`, PIECE bytes) takes a whole TLS record (16 KiB at most)
        # and OpenSSL reads no further record ahead; bytes of the next one are still the
        # socket's.
        try:
            readable = ready(self.sock, write=False, timeout=seconds)[0]
        except (OSError, ValueError):
            return False
        # Looked at once readable: the segment that brings an answer acknowledges what
        # the server had, so more than a piece still unacknowledged then was never read,
        # and the answer is early. At most a piece: the drain's next look ends it, and
        # the answer is the reply's as any (a server that read it all and said 200).
        if not readable or (queued_bytes(self.sock) or 0) <= PIECE:
            return False
        if self.answered():
            return True
        time.sleep(seconds)  # TLS tickets, or an error the drain's next look says
        return False

    def left(self) -> bool:
        """After a write failed (the server closed, EPIPE or ECONNRESET): whether it left
        an answer in this host's receive buffer."""
        got = read_now(self.sock)
        if got:
            self.read += got
        self.cut = bool(self.read)
        return self.cut

    def reader(self, within: float | None = None, bound: int = ANSWER_BOUND) -> io.BufferedReader:
        """The server's bytes from the first: those read while writing, then the socket's;
        all of them within `within` seconds from now (None: each read the socket's
        timeout, until `AnswerReader.answer_within`), `bound` bytes at most."""
        raw = AnswerReader(self.sock, self.read, bound)
        if within is not None:
            raw.answer_within(within)
        return io.BufferedReader(raw)


class AnswerTooLong(SendledgerError, OSError):
    """An answer went on past its reader's bound (`ANSWER_BOUND`): not read on (an OSError,
    as a connection that failed while it was read: the caller's handling of one is right
    for it)."""


class AnswerReader(io.RawIOBase):
    """A server's answer on `sock` (after `first`, bytes read while writing), its reads
    bounded together from `answer_within` on (see the module docstring). Read through the
    socket's own raw reader (`makefile`), so that a connection closed while its last
    answer is read (http.client's `Connection: close`) stays open until the reader is."""

    def __init__(self, sock: socket.socket, first: bytes = b"", bound: int = ANSWER_BOUND) -> None:
        super().__init__()
        self._bound = bound
        self._first = memoryview(first)
        self._sock = sock
        self._raw = sock.makefile("rb", buffering=0)
        self._deadline: float | None = None
        self._taken = 0

    def answer_within(self, seconds: float) -> None:
        """The answer's wait begins: every read from now on ends within `seconds` (and a
        second more for each `ANSWER_FLOOR` bytes read), and they take the reader's bound
        (`ANSWER_BOUND`) bytes at most."""
        self._deadline = time.monotonic() + seconds
        self._taken = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int | None:
        if self._first:
            return self._from_first(buffer)
        if self._deadline is None:
            return self._raw.readinto(buffer)
        if self._taken > self._bound:
            raise AnswerTooLong(f"an answer longer than {self._bound} bytes")
        left = self._deadline - time.monotonic()
        lease = call_time_left()
        if lease is not None and lease < left and not _ends_by(self._sock.gettimeout(), lease):
            left = self._within_lease(self._deadline, lease)
        elif left <= 0 and not self._readable_now():
            raise TimeoutError("timed out")
        if self._first:  # what the wait took without waiting, counted whole as it came
            self._taken += len(self._first)
            self._deadline += len(self._first) / ANSWER_FLOOR
            return self._from_first(buffer)
        # Past an end only when readable now (closed, or an error to raise): the read
        # returns at once.
        try:
            got = self._read(buffer, max(left, ANSWER_SLACK))
        except (ConnectionError, ssl.SSLEOFError) as exc:
            self._no_answer_in_time(exc)
            raise
        if not got:
            self._no_answer_in_time(None)
        else:
            self._taken += got
            self._deadline += got / ANSWER_FLOOR
        return got

    def _read(self, buffer: Any, left: float) -> int | None:
        timeout = self._sock.gettimeout()
        if timeout is not None and timeout <= left + ANSWER_SLACK:
            # Begun this early, a read the socket's timeout ends is over by the deadline
            # plus the slack at most: the timeout is not changed (two system calls a read,
            # on every call's first).
            return self._raw.readinto(buffer)
        self._sock.settimeout(left)
        try:
            return self._raw.readinto(buffer)
        finally:
            self._sock.settimeout(timeout)

    def _no_answer_in_time(self, cause: BaseException | None) -> None:
        """The connection's end (a close; `cause`: a reset) was read: TimeoutError when
        it was read past the answer's wait or the claim's lease with nothing of the
        answer before it. No answer came within the wait: a pause of this process (a
        loaded machine, SIGSTOP) let the wait pass, and meanwhile a hang's far end gave
        up on the held request. Read as "closed without a response", the call counted
        for the circuit as an answer, and the next sends went into the hang unprobed
        (docs/architecture.md "Outages: waited out, not escalated"). When the end came
        is not known; either way the call timed out."""
        if self._taken or self._deadline is None:
            return
        if time.monotonic() >= self._deadline:
            raise TimeoutError("timed out") from cause
        lease = call_time_left()
        if lease is not None and lease <= 0:
            raise TimeoutError("timed out: its claim's lease ends") from cause

    def _within_lease(self, deadline: float, lease: float) -> float:
        """Waits, while the claim's lease under this call (`base.call_time_left`) ends
        before the answer's own deadline, until the answer is readable: what is left of
        the answer's wait then. Its end is asked again whenever the wait reaches it, as a
        renewal moves it on; once it has passed, the call ends "timed out". Polled, not
        read with a timeout: a read that timed out leaves the socket's reader unusable.
        Under TLS a readable socket may hold part of a record only (a server trickling
        it) or post-handshake messages: a read would then wait for the rest its whole
        timeout, past the lease. So what is readable is read without waiting, here, and
        kept (`_first`) once a record is whole; until then the wait goes on."""
        readable = False
        while True:
            left = deadline - time.monotonic()
            if readable or 0 < left <= lease:
                return left
            if left <= 0 or lease <= 0:
                # Past an end, what arrived by then is still taken, without waiting: a
                # pause of this process (a loaded machine), not the server's silence,
                # let the wait pass it. Nothing more is waited for.
                if self._readable_now():
                    return left
                raise TimeoutError("timed out" if left <= 0 else LEASE_ENDS)
            readable = isinstance(self._sock, ssl.SSLSocket) and self._sock.pending() > 0
            if not readable and ready(self._sock, write=False, timeout=lease)[0]:
                readable = self._took_a_record()
            asked = call_time_left()
            lease = left if asked is None else asked

    def _readable_now(self) -> bool:
        """Whether a read would not wait now (`_took_a_record`), looked at without
        waiting."""
        pending = isinstance(self._sock, ssl.SSLSocket) and self._sock.pending() > 0
        try:
            if not pending and not ready(self._sock, write=False, timeout=0)[0]:
                return False
        except (OSError, ValueError):
            return True  # closed here: the read says it
        return self._took_a_record()

    def _took_a_record(self) -> bool:
        """The socket is readable: whether a read would not wait now. What a read without
        waiting takes (under TLS, a record made whole) is kept in `_first`; nothing
        taken (part of a TLS record, a post-handshake message) says no. A close or an
        error says yes: the read says it."""
        timeout = self._sock.gettimeout()
        self._sock.setblocking(False)
        try:
            got = self._sock.recv(PIECE)
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError):
            return False
        except OSError:
            return True
        finally:
            self._sock.settimeout(timeout)
        self._first = memoryview(got)
        return True

    def _from_first(self, buffer: Any) -> int:
        size = min(len(buffer), len(self._first))
        buffer[:size] = self._first[:size]
        self._first = self._first[size:]
        return size

    def close(self) -> None:
        self._raw.close()
        super().close()


def _ends_by(timeout: float | None, lease: float) -> bool:
    """Whether a read the socket's `timeout` ends is over by the end of the claim's
    `lease` (seconds left) plus `ANSWER_SLACK`: then it needs no wait of its own for the
    lease (`AnswerReader._within_lease`: a poll and a change of the socket's timeout
    each way, four system calls where a read makes two). An ordinary send's first read
    is one: its lease was counted from before its claim's save, a few milliseconds
    before its answer's wait began, so it ends that much before the answer's timeout."""
    return timeout is not None and lease > 0 and timeout <= lease + ANSWER_SLACK


class WatchedSocket:
    """A connection's socket for one HTTP exchange: its writes are `watch`'s, and the
    answer's reader (http.client's `sock.makefile("rb")`) starts with the bytes read
    while writing and ends within `within` seconds of being made (None: each read the
    socket's timeout), `bound` bytes at most."""

    def __init__(
        self, watch: EarlyAnswer, within: float | None = None, bound: int = ANSWER_BOUND
    ) -> None:
        self.watch = watch
        self.within = within
        self.bound = bound

    def sendall(self, data: bytes | memoryview) -> None:
        self.watch.sendall(data)

    def makefile(self, mode: Literal["rb"]) -> io.BufferedReader:
        return self.watch.reader(self.within, self.bound)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.watch.sock, name)


__all__ = [
    "ANSWER_BOUND",
    "ANSWER_FLOOR",
    "ANSWER_SLACK",
    "HTTP_ANSWER_BOUND",
    "READ_BOUND",
    "AnswerReader",
    "AnswerTooLong",
    "EarlyAnswer",
    "WatchedSocket",
    "any_bytes",
    "read_now",
    "ready",
]
