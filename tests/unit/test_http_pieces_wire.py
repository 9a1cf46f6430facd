"""A body `SingleShotHttp` writes in pieces is the request http.client writes for it, byte
for byte, Content-Length included (daemon/providers/transport.py `_in_pieces`), for every
body the Google client and Graph pass: text (ISO-8859-1 or not), bytes, with and without
a Content-Length header, a file or an iterable."""

from __future__ import annotations

import http.client
import io
import socket
import threading
from typing import Any

import pytest

from daemon.providers.slow_links import PIECE
from daemon.providers.transport import _in_pieces

BIG = PIECE * 2 + 17


def _wire(body: Any, headers: dict[str, str]) -> bytes:
    """The bytes an http.client connection writes for a POST of `body` with `headers`."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(10)
    got = bytearray()

    def read_all() -> None:
        conn, _ = server.accept()
        with conn:
            while data := conn.recv(1 << 16):
                got.extend(data)

    reader = threading.Thread(target=read_all, daemon=True)
    reader.start()
    port = server.getsockname()[1]
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("POST", "/send", body, headers)
    finally:
        conn.close()
        reader.join(timeout=10)
        server.close()
    # Each server has a port of its own, which the Host header names.
    return bytes(got).replace(b":%d\r\n" % port, b":PORT\r\n", 1)


CASES: dict[str, tuple[Any, dict[str, str]]] = {
    "text with a length": ("é" * BIG, {"content-length": str(BIG)}),
    "text without": ("é" * BIG, {"content-type": "application/json"}),
    "bytes with a length": (b"x" * BIG, {"content-length": str(BIG)}),
    "bytes without (Graph's)": (b"x" * BIG, {"authorization": "Bearer t"}),
    "small bytes without": (b"x" * 10, {"authorization": "Bearer t"}),
    "bytes framed by the caller": (b"3\r\nabc\r\n0\r\n\r\n", {"transfer-encoding": "chunked"}),
    "big bytes framed by the caller": (b"x" * BIG, {"Transfer-Encoding": "chunked"}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_pieces_are_the_request_http_client_writes(case: str) -> None:
    body, headers = CASES[case]
    assert _wire(*_in_pieces(body, headers)) == _wire(body, headers)


def test_a_file_or_an_iterable_is_left_to_http_client() -> None:
    headers = {"content-length": str(BIG)}
    for body in (io.BytesIO(b"x" * BIG), [b"x" * BIG]):
        assert _in_pieces(body, headers) == (body, headers)


def test_text_outside_iso_8859_1_is_refused_by_http_client_as_before() -> None:
    body, headers = "ł" * BIG, {"content-length": str(BIG)}
    assert _in_pieces(body, headers) == (body, headers)
    with pytest.raises(UnicodeEncodeError, match="not valid Latin-1"):
        http.client.HTTPConnection("127.0.0.1").request("POST", "/send", body, headers)
