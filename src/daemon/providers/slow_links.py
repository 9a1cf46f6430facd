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
from collections.abc import Iterator

#: Bytes per write: one must go out within the timeout (64 KiB in 30 s: 2 KiB/s).
PIECE = 64 * 1024
#: How often the bytes still queued are looked at while they drain.
DRAIN_LOOK = 0.02


def pieces(data: bytes) -> Iterator[memoryview]:
    """`data` in order, `PIECE` bytes at a time."""
    view = memoryview(data)
    for start in range(0, len(view), PIECE):
        yield view[start : start + PIECE]


def wait_sent_out(sock: socket.socket | None, timeout: float) -> None:
    """Wait while the bytes written on `sock` are still queued in this host and the queue
    keeps shrinking; back once it is empty, or once it has not moved for `timeout` (the
    answer's own wait then says the rest). Linux only (TIOCOUTQ); elsewhere back at once."""
    request = getattr(termios, "TIOCOUTQ", None)
    if sock is None or request is None:
        return
    moved_at, least = time.monotonic(), None
    while True:
        try:
            queued = int.from_bytes(fcntl.ioctl(sock.fileno(), request, bytes(4)), sys.byteorder)
        except (OSError, ValueError):
            return  # closed, or not a socket that says
        if queued == 0:
            return
        now = time.monotonic()
        if least is None or queued < least:
            moved_at, least = now, queued
        elif now - moved_at >= timeout:
            return
        time.sleep(DRAIN_LOOK)


__all__ = ["DRAIN_LOOK", "PIECE", "pieces", "wait_sent_out"]
