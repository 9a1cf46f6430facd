"""Large answers the providers legitimately get are read whole, under the bound an answer
without end is cut at (`early_answers.ANSWER_BOUND`, docs/providers.md "A server that
never ends its answer"): a Gmail draft read back whole (`drafts.get format=raw`, the
message base64url-encoded in JSON) of the largest message a gmail provider accepts; and
one that takes longer than the `timeout` over a slow but steady link."""

from __future__ import annotations

import base64
import json
import socket
import time
from io import BufferedReader
from pathlib import Path

from tests.unit.early_server import AnsweringServer
from tests.unit.test_endless_answers import _gmail, _request, _token

from daemon.config.settings import GmailProviderSettings
from daemon.providers.draft_handle import Draft
from daemon.providers.early_answers import ANSWER_FLOOR
from daemon.providers.transport import SingleShotHttp

#: Far above what a loopback link takes to carry the answer: only the bound may cut it.
TIMEOUT = 20.0


def _largest_message() -> bytes:
    """A message of the size a gmail provider accepts at most (`max_message_bytes`)."""
    size = int(GmailProviderSettings.model_fields["max_message_bytes"].default)
    head = b"From: me@example.com\r\nMessage-ID: <big-1@example.com>\r\n\r\n"
    line = b"x" * 76 + b"\r\n"
    body = line * ((size - len(head)) // len(line))
    return head + body + b"y" * (size - len(head) - len(body))


def test_a_gmail_draft_of_the_largest_message_is_read_back_whole(tmp_path: Path) -> None:
    """Before: cut at 16 MiB (AnswerTooLong): a draft of a message above about 12 MB
    could never be read back, and a job tried again with one (recorded, or found by its
    Message-ID) never sent."""
    raw = _largest_message()
    encoded = base64.urlsafe_b64encode(raw).decode("ascii")
    body = json.dumps({"id": "d1", "message": {"id": "m1", "raw": encoded}}).encode()
    answer = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"

    def session(conn: socket.socket, reader: BufferedReader) -> None:
        path = _request(reader)
        if path.endswith("/token"):
            conn.sendall(_token())
            return
        conn.sendall(answer % len(body))
        conn.sendall(body)

    server = AnsweringServer(session)
    provider = _gmail(server, tmp_path, timeout=TIMEOUT)
    try:
        assert provider.draft_raw(Draft("d1", "m1")) == raw
    finally:
        provider.close()
        server.close()


def test_an_answer_coming_steadily_over_a_slow_link_is_read_past_the_timeout() -> None:
    """Four times the floor's worth, at twice its rate: 2 s, four times the timeout (a
    Gmail draft of 25 MB, 33.4 MB, takes 27 s at 10 Mbit/s, and a 30 s timeout cut it on
    any link below 9). Before: cut at the timeout, "timed out" (a hang for the circuit)."""
    timeout = 0.5
    piece = ANSWER_FLOOR // 10
    pieces = 40

    def session(conn: socket.socket, reader: BufferedReader) -> None:
        _request(reader)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (piece * pieces))
        for _ in range(pieces):
            time.sleep(0.05)
            conn.sendall(b"x" * piece)

    server = AnsweringServer(session)
    http = SingleShotHttp(timeout=timeout, reuse=False)
    started = time.monotonic()
    try:
        response, content = http.request(f"http://127.0.0.1:{server.port}/big", "GET")
        took = time.monotonic() - started
    finally:
        http.close()
        server.close()
    assert response.status == 200 and len(content) == piece * pieces
    assert took > 3 * timeout, f"{took:.2f}s"
