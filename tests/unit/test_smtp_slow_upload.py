"""A message whose upload takes longer than the SMTP `timeout` while its bytes keep
flowing (a big attachment over a slow link) is sent, not refused as "not sent"
(docs/providers.md "SMTP + IMAP setup"; daemon/providers/slow_links.py): the timeout
bounds a stalled connection, not the length of a healthy upload."""

from __future__ import annotations

import socket
import ssl
import time
from dataclasses import dataclass
from io import BufferedReader

from tests.unit.slow_reader import SlowServer, read_slowly

from daemon.providers.kept import MailEndpoint, ReuseLimits
from daemon.providers.outcomes import SendKind
from daemon.providers.smtp_submit import SmtpSubmitter

#: The client's timeout: far below the whole upload, far above one piece's wait.
TIMEOUT = 0.5


class SlowSink:
    """A loopback SMTP server that takes any login and any message, reading each
    message's content slowly (`slow_reader.py`)."""

    def __init__(self) -> None:
        self.received: list[int] = []
        self.server = SlowServer(self._session)

    def _session(self, conn: socket.socket, reader: BufferedReader) -> None:
        conn.sendall(b"220 sink ESMTP\r\n")
        while line := reader.readline():
            verb = line[:4].upper()
            if verb == b"EHLO":
                conn.sendall(b"250-sink\r\n250-AUTH PLAIN\r\n250 8BITMIME\r\n")
            elif verb == b"AUTH":
                conn.sendall(b"235 2.7.0 ok\r\n")
            elif verb == b"DATA":
                conn.sendall(b"354 go on\r\n")
                end = read_slowly(reader, lambda tail, _size: tail.endswith(b"\r\n.\r\n"))
                self.received.append(end)
                conn.sendall(b"250 2.0.0 Ok: queued as SLOW1\r\n")
            elif verb == b"QUIT":
                conn.sendall(b"221 bye\r\n")
                return
            else:
                conn.sendall(b"250 ok\r\n")


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
    sink = SlowSink()
    try:
        endpoint = MailEndpoint(
            "127.0.0.1", sink.server.port, "none", "u", "p", TIMEOUT, ssl.create_default_context()
        )
        submitter = SmtpSubmitter(endpoint, ReuseLimits(max_uses=1))
        started = time.monotonic()
        try:
            outcome = submitter.submit(message)
        finally:
            submitter.close()
        took = time.monotonic() - started
    finally:
        sink.server.close()
    assert outcome.kind is SendKind.CONFIRMED, outcome
    assert took > 2 * TIMEOUT, f"the upload took {took:.2f}s: not slow enough to tell"
    assert sink.received and sink.received[0] >= len(message.data)
