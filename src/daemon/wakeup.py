"""A self-pipe: how a signal handler (or another thread) wakes the daemon's main thread.

A Python signal handler runs in the main thread between two bytecodes, wherever that
thread is, also inside `threading.Event.wait`, which holds the event's lock: a handler
that calls the event's `set()` there waits for a lock its own thread holds, for good (the
daemon once ignored SIGINT and SIGTERM this way until killed; docs/operations.md
"Stopping").
So a handler here only writes one byte, the signal's number, to a non-blocking pipe: no
lock, nothing that can block. The main thread waits on the pipe's other end with
`select`, and acts on what it reads outside the handler.
"""

from __future__ import annotations

import contextlib
import os
import select

#: Not a signal number: a thread asked the daemon to stop (`Daemon.request_stop`).
REQUESTED = 0
#: Not a signal number: the shutdown thread finished.
DONE = 255


class WakeUp:
    def __init__(self) -> None:
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)
        os.set_inheritable(self._read, False)
        os.set_inheritable(self._write, False)

    def post(self, code: int) -> None:
        """Safe in a signal handler: one `write(2)`, no lock. A full pipe already holds
        enough to wake the reader; a closed one has no reader left."""
        with contextlib.suppress(OSError):  # BlockingIOError included
            os.write(self._write, bytes((code,)))

    def wait(self, timeout: float) -> bytes:
        """What was posted, waiting up to `timeout` seconds for something (empty: nothing).
        A signal during `select` is handled by Python, which then resumes the wait
        (PEP 475); the handler's byte ends it at once."""
        try:
            ready, _, _ = select.select([self._read], [], [], max(timeout, 0.0))
        except (OSError, ValueError):
            return b""  # closed
        if not ready:
            return b""
        try:
            return os.read(self._read, 4096)
        except (BlockingIOError, OSError):
            return b""

    def close(self) -> None:
        for fd in (self._read, self._write):
            with contextlib.suppress(OSError):
                os.close(fd)


__all__ = ["DONE", "REQUESTED", "WakeUp"]
