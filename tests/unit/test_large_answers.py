"""Large answers the providers legitimately get are read whole, under the bound an answer
without end is cut at (`early_answers.ANSWER_BOUND`, docs/providers.md "A server that
never ends its answer"): a Gmail draft read back whole (`drafts.get format=raw`, the
message base64url-encoded in JSON) of the largest message a gmail provider accepts."""

from __future__ import annotations

import base64
import json
import socket
from io import BufferedReader
from pathlib import Path

from tests.unit.early_server import AnsweringServer
from tests.unit.test_endless_answers import _gmail, _request, _token

from daemon.config.settings import GmailProviderSettings
from daemon.providers.draft_handle import Draft

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
