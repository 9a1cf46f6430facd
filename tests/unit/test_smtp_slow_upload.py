"""A message whose upload takes longer than the SMTP `timeout` while its bytes keep
flowing (a big attachment over a slow link) is sent, not refused as "not sent"
(docs/providers.md "SMTP + IMAP setup"): the timeout bounds a stalled connection, not the
length of a healthy upload. Since Python 3.5 one `sendall` is bounded by the socket's
timeout as a whole, so the content went out in one and every such message timed out at
the same point on each retry."""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from io import BufferedReader

from tests.integration.listeners import stop_listening

from daemon.providers.kept import MailEndpoint, ReuseLimits
from daemon.providers.outcomes import SendKind
from daemon.providers.smtp_submit import SmtpSubmitter

#: The server reads the content this much at a time, with a pause between reads.
PIECE, PAUSE = 16 * 1024, 0.01
#: The client's timeout: far below the whole upload, far above one piece's wait.
TIMEOUT = 0.5


class SlowSink:
    """A loopback SMTP server that takes any login and any message, and reads each
    message's content slowly (`PIECE` bytes every `PAUSE` seconds, a small receive
    buffer): an upload of several megabytes takes seconds, the bytes flowing all along."""

    def __init__(self) -> None:
        self.server = socket.socket()
        self.server.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, PIECE)
        self.server.bind(("127.0.0.1", 0))
        self.server.listen()
        self.port = self.server.getsockname()[1]
        self.received: list[int] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            conn, _ = self.server.accept()
            with conn:
                self._session(conn)

    def _session(self, conn: socket.socket) -> None:
        reader = conn.makefile("rb")
        conn.sendall(b"220 sink ESMTP\r\n")
        while line := reader.readline():
            verb = line[:4].upper()
            if verb == b"EHLO":
                conn.sendall(b"250-sink\r\n250-AUTH PLAIN\r\n250 8BITMIME\r\n")
            elif verb == b"AUTH":
                conn.sendall(b"235 2.7.0 ok\r\n")
            elif verb == b"DATA":
                conn.sendall(b"354 go on\r\n")
                self.received.append(self._content(reader))
                conn.sendall(b"250 2.0.0 Ok: queued as SLOW1\r\n")
            elif verb == b"QUIT":
                conn.sendall(b"221 bye\r\n")
                return
            else:
                conn.sendall(b"250 ok\r\n")

    def _content(self, reader: BufferedReader) -> int:
        """The message's bytes up to its final `.`, read slowly; how many."""
        tail, size = b"", 0
        while not tail.endswith(b"\r\n.\r\n"):
            time.sleep(PAUSE)
            data = reader.read1(PIECE)
            if not data:
                break
            tail, size = (tail + data)[-5:], size + len(data)
        return size

    def close(self) -> None:
        stop_listening(self.server)
        self.thread.join(timeout=10)


@contextmanager
def slow_sink() -> Iterator[SlowSink]:
    sink = SlowSink()
    try:
        yield sink
    finally:
        sink.close()


@dataclass
class Message:
    data: bytes
    message_id: str = "<slow-1@mail.example.com>"
    eight_bit: bool = False

    @property
    def recipients(self) -> list[str]:
        return ["to@example.net"]

    def wire_data(self) -> bytes:
        return self.data


def test_an_upload_longer_than_the_timeout_whose_bytes_keep_flowing_is_sent() -> None:
    body = b"".join(b"x" * 998 + b"\r\n" for _ in range(4000))  # 4 MB of lines
    message = Message(b"Message-ID: <slow-1@mail.example.com>\r\n\r\n" + body + b".\r\n")
    with slow_sink() as sink:
        endpoint = MailEndpoint(
            "127.0.0.1", sink.port, "none", "u", "p", TIMEOUT, ssl.create_default_context()
        )
        submitter = SmtpSubmitter(endpoint, ReuseLimits(max_uses=1))
        started = time.monotonic()
        try:
            outcome = submitter.submit(message)
        finally:
            submitter.close()
        took = time.monotonic() - started
    assert outcome.kind is SendKind.CONFIRMED, outcome
    assert took > 2 * TIMEOUT, f"the upload took {took:.2f}s: not slow enough to tell"
    assert sink.received and sink.received[0] >= len(message.data)
