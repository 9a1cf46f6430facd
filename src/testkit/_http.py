"""HTTP plumbing shared by the Gmail emulator and the fault relay.

A threaded HTTP/1.1 server that remembers its open connections so that stop() can cut
keep-alive and held connections instead of waiting for clients to go away, plus Google's
error JSON shape.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import sys
import threading
import traceback
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self

from testkit.tls import TlsFiles

# Bodies bigger than Gmail's own upload limit (35 MB, a little more for base64) are refused
# instead of being read into memory.
MAX_BODY = 64 * 1024 * 1024

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)


class BodyError(ValueError):
    """The request body could not be read as HTTP/1.1 frames it."""


class TrackingHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    # socketserver's default backlog of 5 resets connections when many clients connect
    # at once (64 send workers starting together), which a real API front end never does.
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler]) -> None:
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if isinstance(request, socket.socket):
            with self._connections_lock:
                self._connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        if isinstance(request, socket.socket):
            with self._connections_lock:
                self._connections.discard(request)
        super().shutdown_request(request)

    def close_connections(self) -> None:
        with self._connections_lock:
            connections = list(self._connections)
        for connection in connections:
            # shutdown, not close: the handler thread still owns the descriptor; this only
            # wakes it from a blocking read so it can finish on its own.
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Clients that vanish mid-request are routine here (timeouts are the point of the
        # exercise); anything else is a bug worth a traceback.
        exc = sys.exc_info()[1]
        if isinstance(exc, OSError):
            return
        super().handle_error(request, client_address)


class BackgroundServer:
    """serve_forever in a daemon thread, with a stop that never waits on a client."""

    def __init__(self, server: TrackingHTTPServer) -> None:
        self.server = server
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"http-{server.server_address[1]}",
            daemon=True,
        )

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        host_text = host.decode() if isinstance(host, bytes) else str(host)
        if ":" in host_text:
            host_text = f"[{host_text}]"
        return f"http://{host_text}:{port}"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.close_connections()
        self.server.server_close()
        self._thread.join(timeout=5)


class QuietHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # An idle keep-alive client must not pin a thread forever.
    timeout = 300

    def setup(self) -> None:
        super().setup()
        # Headers and body leave in separate writes; with Nagle on, the body waits for the
        # client's delayed ACK (~40 ms per request), which would dwarf everything we measure.
        with contextlib.suppress(OSError):
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: Any) -> None:
        # The acceptance log and the relay log are the record; stderr noise helps nobody.
        return

    def read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            return self._read_chunked()
        length_text = self.headers.get("Content-Length")
        if length_text is None:
            return b""
        try:
            length = int(length_text)
        except ValueError as exc:
            raise BodyError(f"bad Content-Length: {length_text!r}") from exc
        if length < 0 or length > MAX_BODY:
            raise BodyError(f"Content-Length out of range: {length}")
        data = self.rfile.read(length)
        if len(data) != length:
            raise BodyError("connection closed before the whole body arrived")
        return data

    def _read_chunked(self) -> bytes:
        chunks: list[bytes] = []
        total = 0
        while True:
            line = self.rfile.readline(1024)
            if not line:
                raise BodyError("connection closed inside a chunked body")
            try:
                size = int(line.split(b";", 1)[0].strip(), 16)
            except ValueError as exc:
                raise BodyError(f"bad chunk size line: {line!r}") from exc
            if size == 0:
                # Trailers, then the blank line that ends the body.
                while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                    pass
                return b"".join(chunks)
            total += size
            if total > MAX_BODY:
                raise BodyError("chunked body too large")
            chunks.append(self.rfile.read(size))
            self.rfile.readline(8)

    def send_body(
        self,
        status: int,
        body: bytes,
        headers: list[tuple[str, str]] | None = None,
        *,
        reason: str | None = None,
    ) -> None:
        self.send_response_only(status, reason)
        names = set()
        for name, value in headers or []:
            names.add(name.lower())
            self.send_header(name, value)
        if "date" not in names:
            self.send_header("Date", self.date_time_string())
        self.send_header("Content-Length", str(len(body)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
        self.wfile.flush()


class TlsQuietHandler(QuietHandler):
    """QuietHandler that, when its class has an `ssl_context`, serves HTTPS: the handshake
    runs in this connection's thread, not the accept loop, so a slow or broken client
    holds up nobody else."""

    ssl_context: ssl.SSLContext | None = None

    def setup(self) -> None:
        if self.ssl_context is not None:
            self.request.settimeout(self.timeout)
            with contextlib.suppress(OSError):
                self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.request = self.ssl_context.wrap_socket(self.request, server_side=True)
        super().setup()

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            if self.ssl_context is not None:
                # The server closes the socket it accepted, which wrap_socket detached.
                with contextlib.suppress(OSError):
                    self.request.close()


Response = tuple[int, list[tuple[str, str]], bytes]


class AnsweringHandler(TlsQuietHandler):
    """Reads each request's body, hands the request to `answer` and writes what it
    returns. An unreadable body and a bug in `answer` are answered through `failure` in the
    emulated API's own error shape (a 5xx for a bug, loudly on stderr), never as a dropped
    connection that a test would read as a network fault."""

    def answer(self, method: str, target: str, headers: dict[str, str], body: bytes) -> Response:
        raise NotImplementedError

    def failure(self, status: int, message: str) -> Response:
        raise NotImplementedError

    def _serve(self) -> None:
        try:
            body = self.read_body()
        except BodyError as exc:
            self.close_connection = True
            status, response_headers, data = self.failure(400, str(exc))
            self.send_body(status, data, response_headers)
            return
        headers = {name.lower(): value for name, value in self.headers.items()}
        try:
            status, response_headers, data = self.answer(self.command, self.path, headers, body)
        except Exception:
            traceback.print_exc()
            status, response_headers, data = self.failure(500, "emulator failure")
        self.send_body(status, data, response_headers, reason=HTTPStatus(status).phrase)

    do_GET = _serve
    do_POST = _serve
    do_PUT = _serve
    do_PATCH = _serve
    do_DELETE = _serve


def google_error(
    code: int,
    message: str,
    reason: str,
    status: str,
    *,
    domain: str = "global",
    **detail: str,
) -> dict[str, Any]:
    """The JSON Google APIs answer errors with (googleapiclient parses `reason` from it)."""
    item: dict[str, Any] = {"message": message, "domain": domain, "reason": reason}
    item.update(detail)
    return {"error": {"code": code, "message": message, "errors": [item], "status": status}}


class LoopbackService:
    """The lifecycle the emulator and the relay share: serve `_handler()` on loopback in a
    background thread; start() is idempotent, stop() cuts open connections."""

    _what = "service"

    def __init__(self, host: str, port: int, tls: TlsFiles | None = None) -> None:
        self._host = host
        self._port = port
        self._server: BackgroundServer | None = None
        # With `tls` the service speaks HTTPS with a throw-away CA's certificate
        # (`testkit.tls`); handlers built on TlsQuietHandler take `_ssl_context`.
        self.tls = tls
        self._ssl_context = tls.server_context() if tls is not None else None

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError(f"the {self._what} is not started")
        plain = self._server.url
        return "https://" + plain.removeprefix("http://") if self.tls is not None else plain

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        raise NotImplementedError

    def _before_start(self) -> None:
        """Hook for subclasses."""

    def _before_stop(self) -> None:
        """Hook for subclasses."""

    def start(self) -> Self:
        if self._server is not None:
            return self
        self._before_start()
        handler = self._handler()
        if issubclass(handler, TlsQuietHandler):
            handler.ssl_context = self._ssl_context
        self._server = BackgroundServer(TrackingHTTPServer((self._host, self._port), handler))
        # Started again after a stop, it listens on the same port: an outage (connection
        # refused) that a test ends by starting the service again.
        self._port = int(self._server.server.server_address[1])
        self._server.start()
        return self

    def stop(self) -> None:
        self._before_stop()
        server, self._server = self._server, None
        if server is not None:
            server.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
