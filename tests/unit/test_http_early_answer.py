"""A server that answers a request before it has read its body (a 413 for a body too
large, a 401 for an expired token) and stops reading is answered at once with that answer,
not after the transport's `timeout` with no answer, an Unknown
(daemon/providers/early_answers.py; docs/providers.md "A server that answers before the
body is read"). Plain and TLS 1.3, whose session tickets make a socket readable with
nothing said."""

from __future__ import annotations

import json
import socket
import time
from io import BufferedReader
from pathlib import Path

import google_auth_httplib2
import pytest
from google.oauth2.credentials import Credentials
from tests.unit.early_server import BIG, TIMEOUT, AnsweringServer

from daemon.providers.transport import ResponseLostError, SingleShotHttp
from testkit.tls import TlsFiles, make_loopback_tls


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_loopback_tls(Path(tmp_path_factory.mktemp("ca")))


def _request(reader: BufferedReader) -> tuple[str, dict[str, str]]:
    """The request line's path and the headers by lower-cased name, read."""
    path = reader.readline().split()[1].decode("latin-1")
    headers = {}
    while (line := reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    return path, headers


def _answer(status: int, body: bytes = b'{"error": "no"}') -> bytes:
    return b"HTTP/1.1 %d Answer\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s" % (
        status,
        len(body),
        body,
    )


def _post(server: AnsweringServer, body: bytes) -> tuple[int | ResponseLostError, float]:
    """`body` POSTed to `server` in one request: the answer's status (or the transport's
    error) and how long it took."""
    scheme = "https" if server.tls_files else "http"
    ca = str(server.tls_files.ca_file) if server.tls_files else None
    http = SingleShotHttp(timeout=TIMEOUT, reuse=False, ca_certs=ca)
    started = time.monotonic()
    try:
        response, content = http.request(
            f"{scheme}://127.0.0.1:{server.port}/send", "POST", body=body
        )
        result: int | ResponseLostError = int(response.status)
        assert content == b'{"error": "no"}'
    except ResponseLostError as exc:
        result = exc
    finally:
        http.close()
    return result, time.monotonic() - started


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls1.3"])
@pytest.mark.parametrize("then", ["hold", "close"])
@pytest.mark.parametrize("status", [413, 401])
def test_an_answer_before_the_body_is_read_at_once(
    tls: bool, then: str, status: int, tls_files: TlsFiles
) -> None:
    """Before: a wait of the whole timeout, then "timed out" (held), or "connection
    reset" with the answer lost (closed): a ResponseLostError, Unknown, either way."""

    def session(conn: socket.socket, reader: BufferedReader) -> None:
        _request(reader)
        conn.sendall(_answer(status))
        if then == "close":
            # As servers close after an early answer: the answer and a FIN, then (the
            # body still coming) the socket, which resets the connection.
            conn.shutdown(socket.SHUT_WR)
            time.sleep(0.05)
        else:
            server.hold()

    server = AnsweringServer(session, tls_files if tls else None)
    try:
        result, took = _post(server, b"x" * BIG)
    finally:
        server.close()
    assert result == status
    assert took < TIMEOUT / 4, f"{took:.2f}s: the answer waited for the timeout"


def test_a_success_before_the_body_was_written_is_not_believed() -> None:
    """A 200 for a body the server never had whole proves nothing: Unknown, at once."""

    def session(conn: socket.socket, reader: BufferedReader) -> None:
        _request(reader)
        conn.sendall(_answer(200))
        server.hold()

    server = AnsweringServer(session)
    try:
        result, took = _post(server, b"x" * BIG)
    finally:
        server.close()
    assert isinstance(result, ResponseLostError), result
    assert "answered 200 before its body was written" in result.message
    assert took < TIMEOUT / 4


def test_an_interim_answer_before_the_body_does_not_stop_it() -> None:
    """A 100 Continue nobody asked for (a client must take one, RFC 9110 15.2): the whole
    body still goes out, and the final answer is the one read."""
    received: list[int] = []

    def session(conn: socket.socket, reader: BufferedReader) -> None:
        _, headers = _request(reader)
        conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
        received.append(len(reader.read(int(headers["content-length"]))))
        conn.sendall(_answer(200))

    server = AnsweringServer(session)
    try:
        result, _ = _post(server, b"x" * BIG)
    finally:
        server.close()
    assert result == 200
    assert received == [BIG]


def test_a_401_before_the_body_takes_the_token_path_at_once() -> None:
    """google-auth's 401 replay: the token is refreshed and the request written again
    whole, answered, all well within one timeout (before: a timeout, then Unknown)."""
    sends: list[tuple[str, int]] = []

    def session(conn: socket.socket, reader: BufferedReader) -> None:
        path, headers = _request(reader)
        if path == "/token":
            reader.read(int(headers["content-length"]))
            token = json.dumps({"access_token": "new", "expires_in": 3600}).encode()
            conn.sendall(
                _answer(200, token).replace(
                    b"\r\n\r\n", b"\r\nContent-Type: application/json\r\n\r\n", 1
                )
            )
        elif headers["authorization"] == "Bearer old":
            sends.append(("old", 0))
            conn.sendall(_answer(401))
            server.hold()
        else:
            sends.append(("new", len(reader.read(int(headers["content-length"])))))
            conn.sendall(_answer(200))

    server = AnsweringServer(session)
    credentials = Credentials(  # type: ignore[no-untyped-call]
        "old",
        refresh_token="refresh",
        token_uri=f"http://127.0.0.1:{server.port}/token",
        client_id="client",
        client_secret="secret",
    )
    http = google_auth_httplib2.AuthorizedHttp(
        credentials, http=SingleShotHttp(timeout=TIMEOUT, reuse=False)
    )
    started = time.monotonic()
    try:
        response, content = http.request(
            f"http://127.0.0.1:{server.port}/send", "POST", body=b"x" * BIG
        )
    finally:
        took = time.monotonic() - started
        http.close()
        server.close()
    assert (response.status, content) == (200, b'{"error": "no"}')
    assert sends == [("old", 0), ("new", BIG)]
    assert took < TIMEOUT


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls1.3"])
def test_an_answer_while_a_body_that_fit_drains_is_read_at_once(
    tls: bool, tls_files: TlsFiles
) -> None:
    """A body this host's buffers take whole (256 KiB): every write is done before the
    server answers, and the 413 comes while the bytes wait to leave. Before, that wait
    ran its whole timeout (2 s) before the 413 was read."""

    def session(conn: socket.socket, reader: BufferedReader) -> None:
        _request(reader)
        time.sleep(TIMEOUT / 8)  # the writes are done by then
        conn.sendall(_answer(413))
        server.hold()

    server = AnsweringServer(session, tls_files if tls else None)
    try:
        result, took = _post(server, b"x" * (256 * 1024))
    finally:
        server.close()
    assert result == 413
    assert took < TIMEOUT / 2, f"{took:.2f}s: the answer waited for the drain's timeout"


def test_an_early_answer_that_closes_the_connection_is_read_whole() -> None:
    """A 413 with `Connection: close` whose body comes in two writes: http.client closes
    the connection once it has the headers and reads the rest after. The replay of the
    early answer read the socket itself, closed by then: "Bad file descriptor", Unknown."""
    body = b"e" * 100_000

    def session(conn: socket.socket, reader: BufferedReader) -> None:
        _request(reader)
        head = b"HTTP/1.1 413 Too large\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
        conn.sendall(head % len(body) + body[:10])
        time.sleep(TIMEOUT / 8)  # the client has the headers, and has closed
        conn.sendall(body[10:])
        server.hold()

    server = AnsweringServer(session)
    http = SingleShotHttp(timeout=TIMEOUT, reuse=False)
    try:
        response, content = http.request(
            f"http://127.0.0.1:{server.port}/send", "POST", body=b"x" * BIG
        )
    finally:
        http.close()
        server.close()
    assert (response.status, content) == (413, body)
