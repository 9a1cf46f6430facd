"""Stopping a test's own servers. On Linux `close()` does not wake a thread blocked in
`accept()` on the socket (it waited there for the rest of the session, which the thread
guard, tests/thread_guard.py, names); `shutdown()` first does (accept raises EINVAL). A
handler that keeps its connection a while (`hold`) lets go once the test's servers stop,
not seconds after the test ended (the guard would wait for it)."""

from __future__ import annotations

import contextlib
import socket
import threading

_STOPPED = threading.Event()


def stop_listening(listener: socket.socket) -> None:
    """Wake the thread waiting in `listener.accept()` (it returns on the OSError), close."""
    with contextlib.suppress(OSError):  # never listened, or already closed
        listener.shutdown(socket.SHUT_RDWR)
    listener.close()


def hold(seconds: float) -> None:
    """Keep the calling handler, and its connection, for `seconds` or until `stop_all`."""
    _STOPPED.wait(seconds)


def serving() -> None:
    """A test's servers start: `hold` holds again (called at its fixture's setup)."""
    _STOPPED.clear()


def stop_all(listeners: list[socket.socket]) -> None:
    """The test's servers stop: each listener, and every handler in `hold`."""
    _STOPPED.set()
    while listeners:
        stop_listening(listeners.pop())
