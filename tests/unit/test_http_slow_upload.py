"""A request whose body takes longer than the transport's `timeout` to upload while its
bytes keep flowing (a big Gmail message over a slow link) gets its answer, not a timeout
taken for a lost response (daemon/providers/transport.py, daemon/providers/slow_links.py):
`SingleShotHttp` writes a body of more than a piece in pieces, each bounded alone, and
waits for the answer once the bytes left this host."""

from __future__ import annotations

import socket
import time
from io import BufferedReader

from tests.unit.slow_reader import SlowServer, read_slowly

from daemon.providers.transport import SingleShotHttp

TIMEOUT = 0.5


def _slow_post(body: str | bytes, headers: dict[str, str]) -> tuple[int, bytes, float, list[int]]:
    """`body` POSTed through `SingleShotHttp` to a server reading it slowly: the answer's
    status and body, how long it took, and the bytes the server read."""
    received: list[int] = []

    def session(conn: socket.socket, reader: BufferedReader) -> None:
        length = 0
        while (line := reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            if name.lower() == "content-length":
                length = int(value)
        received.append(read_slowly(reader, lambda _tail, size: size >= length))
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")

    server = SlowServer(session)
    http = SingleShotHttp(timeout=TIMEOUT, reuse=False)
    try:
        started = time.monotonic()
        response, content = http.request(
            f"http://127.0.0.1:{server.port}/send", "POST", body=body, headers=headers
        )
        took = time.monotonic() - started
    finally:
        http.close()
        server.close()
    return int(response.status), bytes(content), took, received


def test_a_body_longer_than_the_timeout_whose_bytes_keep_flowing_is_answered() -> None:
    body = '{"raw": "' + "QUJD" * 1_000_000 + '"}'  # 4 MB of JSON, as the Gmail client's
    headers = {"content-type": "application/json", "content-length": str(len(body))}
    status, content, took, received = _slow_post(body, headers)
    assert status == 200 and content == b"{}"
    assert took > 2 * TIMEOUT, f"the upload took {took:.2f}s: not slow enough to tell"
    assert received == [len(body)]


def test_a_graph_upload_without_a_content_length_header_is_answered_too() -> None:
    """Graph's draft creation passes its base64 MIME as bytes and no Content-Length (the
    one http.client adds): written in one sendall, its upload was cut at the timeout."""
    body = b"QUJD" * 1_000_000
    status, content, took, received = _slow_post(body, {"content-type": "text/plain"})
    assert status == 200 and content == b"{}"
    assert took > 2 * TIMEOUT, f"the upload took {took:.2f}s: not slow enough to tell"
    assert received == [len(body)]
