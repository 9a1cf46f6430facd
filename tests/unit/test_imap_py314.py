"""The IMAP sessions' bounded reader on imaplib as Python 3.14 has it
(daemon/providers/imap_replies.py): `IMAP4.file` a property without a setter, and
`read` / `readline` reading the socket itself into a buffer of their own. This machine
runs an older Python, so that imaplib is stood in for here by the base below; a session
on it must open, and its answers stay bounded by the `timeout` (docs/providers.md "A
server that never ends its answer")."""

from __future__ import annotations

import imaplib
import socket
import time
from io import BufferedReader

import pytest
from tests.unit.early_server import AnsweringServer

from daemon.providers.imap_replies import _BoundedAnswers

TIMEOUT = 0.5
MARGIN = 1.0


class _Imap314(imaplib.IMAP4):
    """imaplib.IMAP4's socket side as in Python 3.14 (its `open`, `file`, `read`,
    `readline`, `shutdown`)."""

    def open(self, host: str = "", port: int = 143, timeout: float | None = None) -> None:
        self.host, self.port = host, port
        self.sock = socket.create_connection((host, port), timeout)
        self._file = self.sock.makefile("rb")
        self._readbuf = b""

    @property
    def file(self) -> BufferedReader:  # type: ignore[override]
        return self._file

    def read(self, size: int) -> bytes:
        while len(self._readbuf) < size and (got := self.sock.recv(8192)):
            self._readbuf += got
        data, self._readbuf = self._readbuf[:size], self._readbuf[size:]
        return data

    def readline(self) -> bytes:
        while b"\n" not in self._readbuf and (got := self.sock.recv(8192)):
            self._readbuf += got
        line, _, self._readbuf = self._readbuf.partition(b"\n")
        return line + b"\n"

    def shutdown(self) -> None:
        self._file.close()
        self.sock.close()


class _Session(_BoundedAnswers, _Imap314):
    def __init__(self, port: int) -> None:
        self._within = TIMEOUT
        super().__init__("127.0.0.1", port, TIMEOUT * 4)


@pytest.mark.parametrize("answer", ["whole", "never ends"])
def test_a_session_on_the_3_14_imaplib_opens_and_its_answers_stay_bounded(answer: str) -> None:
    """Before: `AttributeError: property 'file' ... has no setter` at the session's open,
    every search and read-back failed; reading through imaplib's own `read` and
    `readline` (the socket itself) a trickled answer went on for as long as the server
    did (4 s here), each byte within the socket's timeout."""

    def session(conn: socket.socket, reader: BufferedReader) -> None:
        conn.sendall(b"* OK ready\r\n")
        while line := reader.readline():
            tag, _, command = line.rstrip().partition(b" ")
            if command.upper().startswith(b"CAPABILITY"):
                conn.sendall(b"* CAPABILITY IMAP4rev1\r\n" + tag + b" OK done\r\n")
            elif answer == "whole":
                conn.sendall(b"* 1 EXISTS\r\n" + tag + b" OK done\r\n")
            else:
                conn.sendall(b"* 1 EXISTS\r\n* OK")
                server.trickle(conn, b" " + b"x" * 60_000, every=0.01)
                return

    server = AnsweringServer(session)
    started = time.monotonic()
    try:
        imap = _Session(server.port)
        try:
            if answer == "whole":
                assert imap.noop()[0] == "OK"
            else:
                with pytest.raises(TimeoutError):
                    imap.noop()
        finally:
            imap.shutdown()
        took = time.monotonic() - started
    finally:
        server.close()
    assert took < TIMEOUT + MARGIN, f"{took:.2f}s"
    assert imap.sock.fileno() == -1  # closed, the bounded reader's hold on it too
