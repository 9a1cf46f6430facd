"""A loopback server, plain or TLS 1.3 (testkit's throw-away CA), that answers before it
has read a request's body and then stops reading: it keeps the connection open until the
test ends (`hold`) or closes it (`close`) (tests/unit/test_http_early_answer.py,
tests/unit/test_smtp_early_answer.py). Its receive buffer is small, so a body of
megabytes does not fit in the buffers between the two ends: the client's writes stall.
A hostile one never ends its answer (`trickle`: a byte at a time, each well within the
client's socket timeout; `flood`: as fast as the link goes; tests/unit/test_endless_answers.py)."""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
import time
from collections.abc import Callable
from io import BufferedReader

from tests.integration.listeners import stop_listening

from testkit.tls import TlsFiles

#: The client's timeout: what a stalled write waited before; an answer read at once takes
#: a small part of it.
TIMEOUT = 2.0
#: A body that cannot fit in the buffers of a stalled loopback connection.
BIG = 16 * 1024 * 1024

#: How long a hostile server trickles at most: past it, a client still reading had no
#: bound of its own.
TRICKLE_FOR = 4.0

Session = Callable[[socket.socket, BufferedReader], None]


class AnsweringServer:
    """Serves each connection with `session(conn, reader)` on a thread of its own; `tls`:
    TLS 1.3 only, with a certificate `tls_files.ca_file` vouches for."""

    def __init__(self, session: Session, tls_files: TlsFiles | None = None) -> None:
        self.tls_files = tls_files
        self._context: ssl.SSLContext | None = None
        if tls_files is not None:
            self._context = tls_files.server_context()
            self._context.minimum_version = ssl.TLSVersion.TLSv1_3
        self.server = socket.socket()
        self.server.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
        self.server.bind(("127.0.0.1", 0))
        self.server.listen()
        self.port: int = self.server.getsockname()[1]
        self._session = session
        self._done = threading.Event()
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = self.server.accept()
                thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
                self._threads.append(thread)
                thread.start()

    def _serve(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError):
            if self._context is not None:
                conn = self._context.wrap_socket(conn, server_side=True)
            with conn, conn.makefile("rb") as reader:
                self._session(conn, reader)

    def hold(self) -> None:
        """Keep the connection, not reading from it, until the test ends."""
        self._done.wait(30)

    def trickle(self, conn: socket.socket, data: bytes, *, every: float = 0.1) -> None:
        """`data` written a byte each `every` seconds, until it ends, the test ends, or
        `TRICKLE_FOR` has passed (a client that never stops reading fails its test then,
        rather than hanging it)."""
        ends = time.monotonic() + TRICKLE_FOR
        for at in range(len(data)):
            if self._done.wait(every) or time.monotonic() > ends:
                return
            conn.sendall(data[at : at + 1])

    def close(self) -> None:
        self._done.set()
        stop_listening(self.server)
        for thread in self._threads:
            thread.join(timeout=10)


def flood(server: AnsweringServer, conn: socket.socket, block: bytes) -> None:
    """`block` written again and again as fast as the client takes it, until the test ends
    or `TRICKLE_FOR` has passed: an answer without end at the link's speed."""
    ends = time.monotonic() + TRICKLE_FOR
    while not server._done.is_set() and time.monotonic() < ends:
        conn.sendall(block)
