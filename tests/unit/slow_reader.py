"""A loopback server's slow reading: `PIECE` bytes every `PAUSE` seconds, through a small
receive buffer, so that an upload of a few megabytes takes seconds while its bytes keep
flowing (a big message over a slow link: tests/unit/test_smtp_slow_upload.py,
tests/unit/test_http_slow_upload.py)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable
from io import BufferedReader

from tests.integration.listeners import stop_listening

#: The server reads this much at a time, with a pause between reads.
PIECE, PAUSE = 16 * 1024, 0.01


def read_slowly(reader: BufferedReader, done: Callable[[bytes, int], bool]) -> int:
    """Bytes read slowly until `done(last five bytes, bytes read)` or the end; how many."""
    tail, size = b"", 0
    while not done(tail, size):
        time.sleep(PAUSE)
        data = reader.read1(PIECE)
        if not data:
            break
        tail, size = (tail + data)[-5:], size + len(data)
    return size


class SlowServer:
    """One connection on a loopback port, served by `session(conn, reader)` on a thread."""

    def __init__(self, session: Callable[[socket.socket, BufferedReader], None]) -> None:
        self.server = socket.socket()
        self.server.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, PIECE)
        self.server.bind(("127.0.0.1", 0))
        self.server.listen()
        self.port: int = self.server.getsockname()[1]
        self._session = session
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            conn, _ = self.server.accept()
            with conn, conn.makefile("rb") as reader:
                self._session(conn, reader)

    def close(self) -> None:
        stop_listening(self.server)
        self.thread.join(timeout=10)
