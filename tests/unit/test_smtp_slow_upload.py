"""A message whose upload takes longer than the SMTP `timeout` while its bytes keep
flowing (a big attachment over a slow link) is sent, not refused as "not sent"
(docs/providers.md "SMTP + IMAP setup"; daemon/providers/slow_links.py): the timeout
bounds a stalled connection, not the length of a healthy upload."""

from __future__ import annotations

import socket
import ssl
from io import BufferedReader

from tests.unit.slow_reader import SlowServer, read_slowly
from tests.unit.smtp_loopback import converse, message_of_lines, submit_timed

from daemon.providers.kept import MailEndpoint
from daemon.providers.outcomes import SendKind

#: The client's timeout: far below the whole upload, far above one piece's wait.
TIMEOUT = 0.5


class SlowSink:
    """A loopback SMTP server that takes any login and any message, reading each
    message's content slowly (`slow_reader.py`)."""

    def __init__(self) -> None:
        self.received: list[int] = []
        self.server = SlowServer(self._session)

    def _session(self, conn: socket.socket, reader: BufferedReader) -> None:
        def data() -> bool:
            conn.sendall(b"354 go on\r\n")
            end = read_slowly(reader, lambda tail, _size: tail.endswith(b"\r\n.\r\n"))
            self.received.append(end)
            conn.sendall(b"250 2.0.0 Ok: queued as SLOW1\r\n")
            return True

        converse(conn, reader, data)


def test_an_upload_longer_than_the_timeout_whose_bytes_keep_flowing_is_sent() -> None:
    message = message_of_lines(4000)  # 4 MB
    sink = SlowSink()
    try:
        endpoint = MailEndpoint(
            "127.0.0.1", sink.server.port, "none", "u", "p", TIMEOUT, ssl.create_default_context()
        )
        outcome, took = submit_timed(endpoint, message)
    finally:
        sink.server.close()
    assert outcome.kind is SendKind.CONFIRMED, outcome
    assert took > 2 * TIMEOUT, f"the upload took {took:.2f}s: not slow enough to tell"
    assert sink.received and sink.received[0] >= len(message.data)
