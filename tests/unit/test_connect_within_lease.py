"""A provider's connection opens within the claim's lease under the call, as the send's
answers are awaited (docs/architecture.md "Leases"; `daemon/providers/connects.py`).
Before, the opening (the lookup, the TCP connect, the TLS handshake, STARTTLS's) waited
the provider's `timeout` alone: a server that accepts and never shakes hands held a send,
or the token request before it, a whole `timeout` (2 s here) past a lease that ended at
0.2 s. One whose lease keeps moving (renewals landing) goes on, however slow."""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager
from io import BufferedReader
from pathlib import Path

import pytest
from tests.unit.early_server import AnsweringServer
from tests.unit.smtp_loopback import message_of_lines, submit_timed

from daemon.providers.base import calls_end_in
from daemon.providers.connects import connect
from daemon.providers.imap_sessions import ImapSessions
from daemon.providers.kept import MailEndpoint, ReuseLimits
from daemon.providers.outcomes import ProviderError, SendKind
from daemon.providers.transport import NotSentError, SingleShotHttp
from sendledger.connecting import LEASE_ENDS
from testkit.tls import make_loopback_tls

#: The connection's own timeout, and when the lease ends (it is not renewed).
TIMEOUT = 2.0
LEASE = 0.2
#: What a connection cut at its lease may take at most (a loaded machine's slack).
CUT_BY = LEASE + 0.5


def _lease_ends_in(seconds: float) -> AbstractContextManager[None]:
    """A lease that ends `seconds` from now, never renewed (the store lost)."""
    ends = time.monotonic() + seconds
    return calls_end_in(lambda: ends - time.monotonic())


@pytest.fixture
def silent() -> Iterator[AnsweringServer]:
    """A server that accepts the connection and never says a word (its TLS handshake
    never answered)."""
    server: AnsweringServer

    def hold(_conn: socket.socket, _reader: BufferedReader) -> None:
        server.hold()

    server = AnsweringServer(hold)
    yield server
    server.close()


def _endpoint(port: int, security: str) -> MailEndpoint:
    return MailEndpoint(
        "127.0.0.1", port, security, "u", "p", TIMEOUT, ssl.create_default_context()
    )


def test_an_https_connection_never_shaken_hands_ends_with_the_lease(
    silent: AnsweringServer,
) -> None:
    """The HTTP providers' connection (a Gmail or Graph send's, their token requests'):
    not sent, its reason the send's words."""
    http = SingleShotHttp(timeout=TIMEOUT)
    started = time.monotonic()
    with _lease_ends_in(LEASE), pytest.raises(NotSentError, match=LEASE_ENDS):
        http.request(f"https://127.0.0.1:{silent.port}/token", "POST", body=b"x")
    took = time.monotonic() - started
    assert took < CUT_BY, f"{took:.2f}s"


def test_an_smtp_tls_connection_never_shaken_hands_ends_with_the_lease(
    silent: AnsweringServer,
) -> None:
    """Implicit TLS: not sent (nothing of the message left), a hang for the circuit, its
    reason the send's words."""
    with _lease_ends_in(LEASE):
        outcome, took = submit_timed(_endpoint(silent.port, "tls"), message_of_lines(2))
    assert took < CUT_BY, f"{took:.2f}s"
    assert outcome.kind is SendKind.REJECTED and outcome.transient, outcome
    assert outcome.timed_out and LEASE_ENDS in outcome.reason, outcome


def _greets_then_never_shakes_hands() -> AnsweringServer:
    """An SMTP server that offers STARTTLS, says 220 to it, and never shakes hands."""
    server: AnsweringServer

    def session(conn: socket.socket, reader: BufferedReader) -> None:
        conn.sendall(b"220 ready\r\n")
        while line := reader.readline():
            verb = line.split(b" ", 1)[0].strip().upper()
            if verb == b"EHLO":
                conn.sendall(b"250-hello\r\n250 STARTTLS\r\n")
            elif verb == b"STARTTLS":
                conn.sendall(b"220 go ahead\r\n")
                server.hold()
                return
            else:
                conn.sendall(b"250 ok\r\n")

    server = AnsweringServer(session)
    return server


def test_an_smtp_starttls_handshake_never_answered_ends_with_the_lease() -> None:
    server = _greets_then_never_shakes_hands()
    try:
        with _lease_ends_in(LEASE):
            outcome, took = submit_timed(_endpoint(server.port, "starttls"), message_of_lines(2))
    finally:
        server.close()
    assert took < CUT_BY, f"{took:.2f}s"
    assert outcome.kind is SendKind.REJECTED and outcome.timed_out, outcome
    assert LEASE_ENDS in outcome.reason, outcome


def test_an_imap_tls_session_never_shaken_hands_ends_with_the_lease(
    silent: AnsweringServer,
) -> None:
    """The IMAP session a send's copy is filed on (SMTP + IMAP's APPEND)."""
    sessions = ImapSessions(_endpoint(silent.port, "tls"), ReuseLimits(max_uses=1))
    started = time.monotonic()
    try:
        with _lease_ends_in(LEASE), pytest.raises(ProviderError, match=LEASE_ENDS) as failed:
            sessions.run(lambda client: client.noop())
    finally:
        sessions.close()
    took = time.monotonic() - started
    assert took < CUT_BY, f"{took:.2f}s"
    assert failed.value.timed_out


def test_a_slow_handshake_whose_lease_keeps_moving_goes_on(tmp_path: Path) -> None:
    """The server shakes hands only after 0.4 s; the lease, renewed, keeps 0.1 s ahead:
    each wait reaches its end, asks again, and goes on. The connection opens."""
    tls = make_loopback_tls(tmp_path)
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        conn, _ = listener.accept()
        time.sleep(0.4)
        with tls.server_context().wrap_socket(conn, server_side=True) as shaken:
            shaken.sendall(b"hello")
            shaken.recv(1)

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    context = ssl.create_default_context(cafile=str(tls.ca_file))
    started = time.monotonic()
    try:
        with calls_end_in(lambda: 0.1):
            sock = connect("127.0.0.1", port, TIMEOUT, tls=context, server_hostname="localhost")
        took = time.monotonic() - started
        with sock:
            assert sock.recv(5) == b"hello"
            assert sock.gettimeout() == TIMEOUT
    finally:
        server.join(5)
        listener.close()
    assert 0.35 < took < TIMEOUT, f"{took:.2f}s"
