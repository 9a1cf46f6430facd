"""SingleShotHttp: one attempt per request, and which phase failed.

Fake connections drive `_conn_request` directly; two loopback sockets (a port with a full
accept queue, a server that redirects) check the real socket paths. Loopback only.
"""

from __future__ import annotations

import http.client
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import pytest

from daemon.providers.transport import NotSentError, ResponseLostError, SingleShotHttp


class FakeSock:
    pass


class FakeResponse:
    status = 200
    reason = "OK"
    version = 11

    def __init__(self, body: bytes = b'{"id": "x"}') -> None:
        self._body = body

    def items(self) -> list[tuple[str, str]]:
        # httplib2.Response reads a non-http.client response as a mapping.
        return [("status", "200"), ("content-type", "application/json")]

    def read(self) -> bytes:
        return self._body


class FakeConn:
    host = "gmail.test"
    port = 443

    def __init__(
        self,
        *,
        connect: BaseException | None = None,
        request: BaseException | None = None,
        response: BaseException | None = None,
        sock: Any = None,
    ) -> None:
        self.sock = sock
        self.calls: list[str] = []
        self._connect = connect
        self._request = request
        self._response = response

    def connect(self) -> None:
        self.calls.append("connect")
        if self._connect is not None:
            raise self._connect
        self.sock = FakeSock()

    def request(self, method: str, uri: str, body: Any, headers: Any) -> None:
        self.calls.append("request")
        if self._request is not None:
            raise self._request

    def getresponse(self) -> FakeResponse:
        self.calls.append("getresponse")
        if self._response is not None:
            raise self._response
        return FakeResponse()

    def close(self) -> None:
        self.calls.append("close")
        self.sock = None


def run(conn: FakeConn) -> tuple[Any, bytes]:
    http = SingleShotHttp(timeout=1.0)
    fake: Any = conn
    result: tuple[Any, bytes] = http._conn_request(fake, "/x", "POST", b"{}", {})
    return result


@pytest.mark.parametrize(
    "error",
    [
        ConnectionRefusedError(111, "Connection refused"),
        socket.gaierror(-2, "Name or service not known"),
        TimeoutError("timed out"),
        OSError(101, "Network is unreachable"),  # stock httplib2 would try again
    ],
)
def test_connect_failure_is_not_sent_and_nothing_is_written(error: BaseException) -> None:
    conn = FakeConn(connect=error)
    with pytest.raises(NotSentError) as caught:
        run(conn)
    assert caught.value.cause is error
    assert "request" not in conn.calls
    assert conn.calls.count("connect") == 1


@pytest.mark.parametrize(
    ("where", "error"),
    [
        ("request", BrokenPipeError(32, "Broken pipe")),
        ("request", TimeoutError("timed out")),
        ("response", http.client.RemoteDisconnected("closed")),  # stock: re-sent
        ("response", http.client.BadStatusLine("junk")),  # stock: re-sent
        ("response", ConnectionResetError(104, "reset")),
        ("response", TimeoutError("timed out")),
    ],
)
def test_failure_after_connect_is_response_lost_after_one_attempt(
    where: str, error: BaseException
) -> None:
    conn = FakeConn(**{where: error})
    with pytest.raises(ResponseLostError) as caught:
        run(conn)
    assert caught.value.cause is error
    assert conn.calls.count("request") == 1
    assert conn.calls.count("connect") == 1
    assert conn.calls[-1] == "close"


def test_a_reused_connection_is_closed_before_connecting_afresh() -> None:
    conn = FakeConn(sock=FakeSock())
    response, content = run(conn)
    assert conn.calls == ["close", "connect", "request", "getresponse", "close"]
    assert response.status == 200
    assert content == b'{"id": "x"}'


def test_timeout_is_required() -> None:
    with pytest.raises(ValueError):
        SingleShotHttp(timeout=0)


# -- real sockets on loopback ------------------------------------------------------------------


@pytest.fixture
def full_backlog_port() -> Iterator[int]:
    """A listening port whose accept queue is full: a new SYN gets no answer, so connect()
    times out - a connect timeout, the one failure that looks like a read timeout."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    port = server.getsockname()[1]
    fillers: list[socket.socket] = []
    try:
        for _ in range(4):
            probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            probe.settimeout(0.2)
            fillers.append(probe)
            try:
                probe.connect(("127.0.0.1", port))
            except TimeoutError:
                break
        else:
            pytest.skip("this kernel accepts connections beyond the backlog")
        yield port
    finally:
        for sock in fillers:
            sock.close()
        server.close()


def test_real_connect_timeout_is_not_sent(full_backlog_port: int) -> None:
    http = SingleShotHttp(timeout=0.3)
    with pytest.raises(NotSentError, match="timed out"):
        http.request(f"http://127.0.0.1:{full_backlog_port}/x", "POST", body=b"{}")


class _Redirector(BaseHTTPRequestHandler):
    posts = 0

    def do_POST(self) -> None:
        type(self).posts += 1
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.send_response(308)
        self.send_header("Location", "/elsewhere")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_redirects_are_not_followed() -> None:
    # Stock httplib2 re-POSTs the body to the new location on 308.
    server = HTTPServer(("127.0.0.1", 0), _Redirector)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        http = SingleShotHttp(timeout=2.0)
        response, _ = http.request(
            f"http://127.0.0.1:{server.server_address[1]}/send", "POST", body=b"{}"
        )
        assert response.status == 308
        assert _Redirector.posts == 1
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
