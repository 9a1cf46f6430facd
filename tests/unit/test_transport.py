"""SingleShotHttp: one attempt per request, which phase failed, and connection reuse
that never re-sends.

Fake connections drive `_conn_request` directly; loopback sockets (a port with a full
accept queue, a server that redirects, a keep-alive server that closes idle connections)
check the real socket paths. Loopback only.
"""

from __future__ import annotations

import http.client
import socket
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any, cast

import httplib2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from daemon.providers import slow_links
from daemon.providers.slow_links import PIECE
from daemon.providers.transport import (
    NotSentError,
    ResponseLostError,
    SingleShotHttp,
    TransportStats,
    describe,
)


class FakeSock:
    """An idle connected socket: nothing to read until the peer writes or closes."""

    def __init__(self) -> None:
        self.ours, self.peer = socket.socketpair()

    def fileno(self) -> int:
        return self.ours.fileno()

    def close(self) -> None:
        self.ours.close()
        self.peer.close()


class FakeResponse:
    status = 200
    reason = "OK"
    version = 11
    will_close = False

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
        if isinstance(self.sock, FakeSock | socket.socket):
            self.sock.close()
        self.sock = None


def run(conn: FakeConn, http: SingleShotHttp | None = None) -> tuple[Any, bytes]:
    http = http or SingleShotHttp(timeout=1.0)
    fake: Any = conn
    result: tuple[Any, bytes] = http._conn_request(fake, "/x", "POST", b"{}", {})
    return result


class Ticks:
    """Injected monotonic time."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


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
    assert not caught.value.reused


def test_an_open_connection_of_unknown_age_is_replaced_before_anything_is_written() -> None:
    conn = FakeConn(sock=FakeSock())
    http = SingleShotHttp(timeout=1.0)
    response, content = run(conn, http)
    assert conn.calls == ["close", "connect", "request", "getresponse"]
    assert response.status == 200
    assert content == b'{"id": "x"}'
    assert http.stats.snapshot()["retired"] == 1


def test_without_reuse_every_request_gets_its_own_connection() -> None:
    http = SingleShotHttp(timeout=1.0, reuse=False)
    conn = FakeConn()
    run(conn, http)
    run(conn, http)
    assert conn.calls.count("connect") == 2
    assert conn.calls[-1] == "close"
    assert http.stats.snapshot()["fresh"] == 2


@pytest.mark.parametrize(
    "error",
    [
        http.client.RemoteDisconnected("closed"),
        ConnectionResetError(104, "reset"),
        BrokenPipeError(32, "Broken pipe"),
        TimeoutError("timed out"),
    ],
)
def test_a_reused_connection_that_dies_is_response_lost_never_a_second_write(
    error: BaseException,
) -> None:
    ticks = Ticks()
    stats = TransportStats()
    http = SingleShotHttp(timeout=1.0, stats=stats, clock=ticks, max_idle=5.0)
    conn = FakeConn()
    run(conn, http)  # fresh, kept open
    conn.calls.clear()
    ticks.now += 1.0
    conn._response = error
    with pytest.raises(ResponseLostError) as caught:
        run(conn, http)
    # Written once on the reused connection; no reconnect, no second request.
    assert conn.calls == ["request", "getresponse", "close"]
    assert caught.value.reused
    assert "reused connection" in caught.value.message
    assert stats.snapshot() == {
        "fresh": 1,
        "reused": 1,
        "fresh_lost": 0,
        "reused_lost": 1,
        "retired": 0,
    }
    # The next request starts on a fresh connection, where "not sent" is provable again.
    conn._response = None
    conn.calls.clear()
    run(conn, http)
    assert conn.calls[0] == "connect"


def test_a_connection_idle_too_long_is_replaced_before_writing() -> None:
    ticks = Ticks()
    http = SingleShotHttp(timeout=1.0, clock=ticks, max_idle=2.0)
    conn = FakeConn()
    run(conn, http)
    ticks.now += 1.5
    conn.calls.clear()
    run(conn, http)
    assert conn.calls == ["request", "getresponse"]  # within max_idle: reused
    ticks.now += 2.5
    conn.calls.clear()
    run(conn, http)
    assert conn.calls == ["close", "connect", "request", "getresponse"]
    assert http.stats.snapshot()["retired"] == 1


def test_a_connection_the_server_closed_while_idle_is_replaced_before_writing() -> None:
    conn = FakeConn()
    http = SingleShotHttp(timeout=1.0, clock=Ticks())
    run(conn, http)
    conn.sock.peer.close()  # the server's FIN arrives while we sit idle
    conn.calls.clear()
    run(conn, http)
    assert conn.calls == ["close", "connect", "request", "getresponse"]
    assert http.stats.snapshot()["retired"] == 1
    conn.close()


def test_a_response_that_closes_the_connection_is_not_kept() -> None:
    conn = FakeConn()
    http = SingleShotHttp(timeout=1.0)
    FakeResponse.will_close = True
    try:
        run(conn, http)
    finally:
        FakeResponse.will_close = False
    assert conn.calls[-1] == "close"


def test_timeout_is_required() -> None:
    with pytest.raises(ValueError):
        SingleShotHttp(timeout=0)


# -- real sockets on loopback ------------------------------------------------------------------


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


# -- property: whatever happens between calls, each call writes the request at most once -----

Fate = str  # "ok", "connect-fails", "response-lost", "peer-closes"


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(min_value=0, max_value=6, allow_nan=False),
            st.sampled_from(["ok", "connect-fails", "response-lost", "peer-closes"]),
        ),
        min_size=1,
        max_size=12,
    )
)
def test_every_call_writes_at_most_once_and_reuse_is_reported(
    steps: list[tuple[float, Fate]],
) -> None:
    ticks = Ticks()
    http = SingleShotHttp(timeout=1.0, clock=ticks, max_idle=3.0)
    conn = FakeConn()
    kept = False  # the previous call left an open, answered connection behind
    try:
        for gap, fate in steps:
            ticks.now += gap
            if fate == "peer-closes" and isinstance(conn.sock, FakeSock):
                conn.sock.peer.close()
            reusable = kept and gap <= 3.0 and fate != "peer-closes"
            conn._connect = OSError(111, "refused") if fate == "connect-fails" else None
            conn._response = TimeoutError("timed out") if fate == "response-lost" else None
            before = conn.calls.count("request")
            try:
                run(conn, http)
                kept = True
            except NotSentError:
                assert not reusable  # "not sent" is only ever said of a fresh connection
                assert conn.calls.count("request") == before
                kept = False
            except ResponseLostError as exc:
                assert exc.reused == reusable
                kept = False
            if fate == "connect-fails" and reusable:
                # A reused connection never connects, so the refusal never happens.
                assert conn.calls.count("request") == before + 1
            assert conn.calls.count("request") - before <= 1
        stats = http.stats.snapshot()
        assert stats["fresh"] + stats["reused"] == conn.calls.count("request")
    finally:
        conn.close()


def test_a_call_cut_by_its_claims_lease_says_so_in_its_reason() -> None:
    """A Gmail or Graph send the wire ended at its claim's lease (early_answers.py) was
    recorded "then timed out", as a silent server is: the reason of the CI's four healthy
    sends taken for ambiguous could not tell a late renewal from a stalled machine."""
    assert describe(TimeoutError("timed out: its claim's lease ends")) == (
        "timed out: its claim's lease ends"
    )
    assert describe(TimeoutError("timed out")) == "timed out"
    assert describe(TimeoutError()) == "timed out"


# -- a request of one piece leaves in one write (docs/performance.md, issue 30 (a)) ------


class _Echo(BaseHTTPRequestHandler):
    """Answers each request with the length of the body it read."""

    protocol_version = "HTTP/1.1"
    timeout = 5  # a kept connection left open by a failed test ends the server's wait

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        self._answer(str(len(body)).encode())

    def do_GET(self) -> None:
        self._answer(b"0")

    def _answer(self, content: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(content)))
        self.end_headers()
        self.wfile.write(content)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _Writes:
    """A connected socket whose writes are counted (their sizes, in order)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.sizes: list[int] = []

    def sendall(self, data: bytes | memoryview) -> None:
        self.sizes.append(len(data))
        self.sock.sendall(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sock, name)


class _Counted(httplib2.HTTPConnectionWithTimeout):  # type: ignore[misc]
    opened: list[_Writes] = []

    def connect(self) -> None:
        super().connect()
        counted = _Writes(cast(socket.socket, self.__dict__["sock"]))
        self.sock = counted
        _Counted.opened.append(counted)


@pytest.mark.parametrize(
    ("method", "body", "writes", "looks"),
    [
        ("POST", b'{"raw": "..."}', 1, 0),  # a send: header block and body in one write
        ("GET", None, 1, 0),
        # Together more than a piece: each in its own write, and the queue looked at
        # before the answer's wait begins, as before.
        ("POST", b"x" * PIECE, 2, 1),
    ],
)
def test_a_request_of_one_piece_leaves_in_one_write_and_is_not_waited_out(
    monkeypatch: pytest.MonkeyPatch, method: str, body: bytes | None, writes: int, looks: int
) -> None:
    """http.client writes the header block, then the body: two system calls a send, each
    letting the interpreter lock go to another worker, and a look at this host's queue
    (`slow_links.wait_sent_out`) that can find no more than a piece there."""
    looked: list[int | None] = []

    def queued(sock: socket.socket) -> int | None:
        looked.append(slow_links_queued(sock))
        return looked[-1]

    slow_links_queued = slow_links.queued_bytes
    monkeypatch.setattr(slow_links, "queued_bytes", queued)
    _Counted.opened = []
    server = HTTPServer(("127.0.0.1", 0), _Echo)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    http = SingleShotHttp(timeout=2.0)
    try:
        response, content = http.request(
            f"http://127.0.0.1:{server.server_address[1]}/send",
            method,
            body=body,
            connection_type=_Counted,
        )
        assert (response.status, content) == (200, str(len(body or b"")).encode())
        (sock,) = _Counted.opened
        assert len(sock.sizes) == writes
        assert len(looked) == looks
    finally:
        http.close()
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
