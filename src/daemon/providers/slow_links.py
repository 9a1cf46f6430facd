"""Writes a slow but healthy link does not cut: a provider's `timeout` bounds a wait for
the server, not the length of an upload (docs/providers.md "SMTP + IMAP setup").

Python bounds one `sendall` by the socket's timeout as a whole (3.5 and later; plain and
TLS sockets alike), so a message written in one call timed out while its bytes kept
flowing once it took longer than the timeout to upload. Written `PIECE` bytes a call, each
call is bounded alone. And the last call returns once its bytes are queued in this host,
megabytes before the server has them: the wait for the answer, bounded by the timeout,
then begins too early; `wait_sent_out` lets the queue drain first.
"""

from __future__ import annotations

import fcntl
import socket
import sys
import termios
import time
from collections.abc import Callable, Iterator

from daemon.providers.base import call_time_left

#: Bytes per write: one must go out within the timeout (64 KiB in 30 s: 2 KiB/s).
PIECE = 64 * 1024
#: How often the bytes still queued are looked at while they drain.
DRAIN_LOOK = 0.02


def pieces(data: bytes) -> Iterator[memoryview]:
    """`data` in order, `PIECE` bytes at a time."""
    view = memoryview(data)
    for start in range(0, len(view), PIECE):
        yield view[start : start + PIECE]


_OUTQ: int | None = getattr(termios, "TIOCOUTQ", None)


def queued_bytes(sock: socket.socket) -> int | None:
    """The bytes written on `sock` that the far end has not acknowledged yet (TIOCOUTQ:
    unsent and in flight), or None where the socket does not say."""
    if _OUTQ is None:
        return None
    try:
        return int.from_bytes(fcntl.ioctl(sock.fileno(), _OUTQ, bytes(4)), sys.byteorder)
    except (OSError, ValueError):
        return None


def wait_sent_out(
    sock: socket.socket | None,
    timeout: float,
    answered: Callable[[float], bool] | None = None,
) -> None:
    """Wait while more than a piece written on `sock` is still queued in this host and a
    piece leaves it within each `timeout`; back once at most a piece is queued, or once a
    piece has not gone out in `timeout` (the answer's own wait then says the rest), or
    once `answered(seconds)` (a wait of at most that long for the server's answer) says
    the server has answered: one that answered and stopped reading never drains a
    body that fit in this host's buffers. Linux only (TIOCOUTQ); elsewhere back at once."""
    if sock is None or _OUTQ is None:
        return
    moved_at, mark = time.monotonic(), None
    while True:
        queued = queued_bytes(sock)
        if queued is None:
            return  # closed, or not a socket that says
        if queued <= PIECE:
            # A piece goes out within the timeout, as each write's did. Not 0: the bytes
            # in flight stay queued until the far end acknowledges them, a round trip for
            # every request, which a wait here would add to every send.
            return
        now = time.monotonic()
        # A piece per timeout, the rate a write is held to: any shrinking at all would let
        # a link taking a byte per almost-timeout hold the send for days.
        if mark is None or queued <= mark - PIECE:
            moved_at, mark = now, queued
        elif now - moved_at >= timeout:
            return
        lease = call_time_left()
        if lease is not None and lease <= 0:
            return  # the claim's lease under the call ended: the answer's wait says so
        if answered is None:
            time.sleep(DRAIN_LOOK)
        elif answered(DRAIN_LOOK):
            return


__all__ = ["DRAIN_LOOK", "PIECE", "pieces", "queued_bytes", "wait_sent_out"]
