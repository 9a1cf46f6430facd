"""A Ctrl-C in `sendledger demo`, which runs the daemon on a thread of its own: noted,
and acted on where the demo waits, never raised wherever its main thread happens to be.

Python's own handler raises KeyboardInterrupt between any two bytecodes of the main
thread: in a store write, a thread's start, an import, a lock's release. The demo's main
thread then left without stopping the daemon it had started, whose workers' threads the
interpreter's exit waits for; one waiting on what the interrupted thread held (a pooled
connection, an import's lock) kept the process from ending. Here the handler writes one
byte to a pipe (daemon/wakeup.py: no lock, nothing that blocks), and `pause`, the demo's
waits, raises KeyboardInterrupt where nothing is half done; the demo then stops its
daemon as SIGTERM stops `run` (docs/operations.md "Stopping"), and a second Ctrl-C
during that stop ends it at once.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any

from daemon.wakeup import WakeUp


def ours(signum: int) -> bool:
    """Whether a handler of this process may take `signum` over: not when whoever started
    it had it ignored (a job started in the background by a script: a SIGINT meant for
    others), nor when it is handled outside Python (None: nothing to put back)."""
    before = signal.getsignal(signum)
    return before is not signal.SIG_IGN and before is not None


class CtrlC:
    """While entered (from the main thread), SIGINT is noted, not raised."""

    def __init__(self) -> None:
        self._wake = WakeUp()
        self._before: Any = None
        self._installed = False
        #: The demo stopped without its calls in flight (a second Ctrl-C, or its daemon's
        #: stop timeout passed): their worker threads would hold the interpreter's exit,
        #: so it ends without them (their claims are durable and recovered at the next
        #: start, as after a crash).
        self.at_once = False

    def __enter__(self) -> CtrlC:
        # A handler can only be set from the main thread; elsewhere (a test calling the
        # demo from a thread) SIGINT never reaches this thread anyway. A SIGINT ignored
        # by whoever started the demo (a job started in the background) stays ignored.
        if threading.current_thread() is threading.main_thread() and ours(signal.SIGINT):
            self._before = signal.signal(signal.SIGINT, self._noted)
            self._installed = True
        return self

    def __exit__(self, *exc: object) -> None:
        if self._installed:
            signal.signal(signal.SIGINT, self._before)
        self._wake.close()

    def _noted(self, signum: int, frame: FrameType | None) -> None:
        self._wake.post(signum)

    def pause(self, seconds: float) -> None:
        """Wait `seconds`, or raise KeyboardInterrupt at once when a Ctrl-C came (before
        the wait too: `pause(0)` only asks)."""
        if self._wake.wait(seconds):
            raise KeyboardInterrupt


__all__ = ["CtrlC", "ours"]
