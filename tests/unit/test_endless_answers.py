"""A server that never ends its answer: every wait for it ends by the provider's `timeout`
(plus a small margin), whatever it trickles, each byte well within the socket's timeout
(docs/providers.md "A server that never ends its answer"). The HTTP transport Gmail and
Graph use: interim 1xx lines, a status line or a header a byte at a time, an endless
chunked body, a TLS handshake that never ends; through a Gmail provider, its token fetch,
send and search; Graph's token fetch (msal's tenant discovery and token request). Plain
and TLS 1.3; each server trickles for `TRICKLE_FOR` (4 s) at most, which a client without
a bound of its own waited out."""

from __future__ import annotations

import json
import socket
import time
from io import BufferedReader
from pathlib import Path

import google.auth.exceptions
import google_auth_httplib2
import pytest
from google.oauth2.credentials import Credentials
from tests.unit.early_server import AnsweringServer, flood

from daemon.providers.base import ProviderError
from daemon.providers.early_answers import AnswerTooLong
from daemon.providers.gmail import GmailProvider
from daemon.providers.graph import GraphTokens, trusted_ca_bundle
from daemon.providers.graph_classify import TokenError
from daemon.providers.outcomes import SendKind, SendOutcome
from daemon.providers.transport import NotSentError, ResponseLostError, SingleShotHttp
from testkit.credentials import write_service_account
from testkit.tls import TlsFiles, make_loopback_tls

#: The client's timeout, and what a wait may take past it.
TIMEOUT = 0.5
MARGIN = 1.0

_CHUNKED = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
)

#: What each hostile server writes after its first bytes (sent at once), a byte at a time.
ENDLESS: dict[str, tuple[bytes, bytes]] = {
    "interim 1xx": (b"", b"HTTP/1.1 100 Continue\r\n\r\n" * 10_000),
    "status line": (b"HTTP/1.1 200 ", b"x" * 60_000),
    "header": (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-Slow: ", b"x" * 60_000),
    "chunked body": (_CHUNKED + b"1\r\n{\r\n", b"1\r\n \r\n" * 100_000),
}


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_loopback_tls(Path(tmp_path_factory.mktemp("ca")))


def _request(reader: BufferedReader) -> str:
    """The request read whole (its body by Content-Length): its path."""
    path = reader.readline().split()[1].decode("latin-1")
    length = 0
    while (line := reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        if name.strip().lower() == "content-length":
            length = int(value)
    reader.read(length)
    return path


def _token() -> bytes:
    body = b'{"access_token": "t", "expires_in": 3600, "token_type": "Bearer"}'
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
        len(body),
        body,
    )


def _endless(kind: str, tls_files: TlsFiles | None, *, token: bool = True) -> AnsweringServer:
    """A server whose every answer is `kind`, never ended; a token is given at once
    (`token`) or trickled as any answer."""

    def session(conn: socket.socket, reader: BufferedReader) -> None:
        path = _request(reader)
        if token and path.endswith("/token"):
            conn.sendall(_token())
            return
        first, rest = ENDLESS[kind]
        conn.sendall(first)
        server.trickle(conn, rest, every=0.05)

    server = AnsweringServer(session, tls_files)
    return server


def _post_lost(
    server: AnsweringServer, timeout: float, tls_files: TlsFiles | None
) -> tuple[ResponseLostError, float]:
    """A POST to `server` (https when it speaks TLS, trusting `tls_files`' CA), which must
    end with its answer lost: the error and how long it took. The server is closed."""
    scheme = "https" if server.tls_files else "http"
    ca = str(tls_files.ca_file) if tls_files else None
    http = SingleShotHttp(timeout=timeout, reuse=False, ca_certs=ca)
    started = time.monotonic()
    try:
        with pytest.raises(ResponseLostError) as lost:
            http.request(f"{scheme}://127.0.0.1:{server.port}/send", "POST", body=b"x" * 100)
        took = time.monotonic() - started
    finally:
        http.close()
        server.close()
    return lost.value, took


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls1.3"])
@pytest.mark.parametrize("kind", list(ENDLESS))
def test_an_answer_that_never_ends_ends_by_the_timeout(
    kind: str, tls: bool, tls_files: TlsFiles
) -> None:
    """Before: http.client read on while each byte came within the socket's timeout, for as
    long as the server went on (4 s here, for ever from a hostile one)."""
    lost, took = _post_lost(_endless(kind, tls_files if tls else None), TIMEOUT, tls_files)
    assert took < TIMEOUT + MARGIN, f"{kind}: {took:.2f}s"
    assert lost.message.endswith("then timed out"), lost.message


def test_a_tls_handshake_that_never_ends_is_not_sent_by_the_timeout(tls_files: TlsFiles) -> None:
    """A server that answers the ClientHello with a record it never finishes: no byte of
    the request left, NotSentError, within the timeout."""

    def session(conn: socket.socket, reader: BufferedReader) -> None:
        conn.recv(16 * 1024)
        conn.sendall(b"\x16\x03\x03\x40\x00")  # a handshake record of 16 KiB, to come
        server.trickle(conn, b"\x02" * 16 * 1024, every=0.05)

    server = AnsweringServer(session)
    http = SingleShotHttp(timeout=TIMEOUT, reuse=False, ca_certs=str(tls_files.ca_file))
    started = time.monotonic()
    try:
        with pytest.raises(NotSentError):
            http.request(f"https://127.0.0.1:{server.port}/send", "POST", body=b"x")
        took = time.monotonic() - started
    finally:
        http.close()
        server.close()
    assert took < TIMEOUT + MARGIN, f"{took:.2f}s"


def test_a_token_fetch_that_never_ends_ends_by_the_timeout() -> None:
    """google-auth's refresh through the same transport (Gmail's token fetch)."""
    server = _endless("header", None, token=False)
    credentials = Credentials(  # type: ignore[no-untyped-call]
        None,
        refresh_token="refresh",
        token_uri=f"http://127.0.0.1:{server.port}/token",
        client_id="client",
        client_secret="secret",
    )
    http = SingleShotHttp(timeout=TIMEOUT, reuse=False)
    started = time.monotonic()
    try:
        with pytest.raises(google.auth.exceptions.TransportError):
            credentials.refresh(google_auth_httplib2.Request(http))  # type: ignore[no-untyped-call]
        took = time.monotonic() - started
    finally:
        http.close()
        server.close()
    assert took < TIMEOUT + MARGIN, f"{took:.2f}s"


def _gmail(server: AnsweringServer, tmp_path: Path, timeout: float = TIMEOUT) -> GmailProvider:
    base = f"http://127.0.0.1:{server.port}"
    key = write_service_account(tmp_path / "sa.json", token_uri=f"{base}/token")
    return GmailProvider(
        "gmail",
        credentials_file=key,
        user="me@example.com",
        api_endpoint=base,
        token_uri=f"{base}/token",
        timeout=timeout,
        reuse_connections=False,
    )


_RAW = b"From: me@example.com\r\nTo: you@example.net\r\nMessage-ID: <e-1@example.com>\r\n\r\nhi\r\n"


def _send_timed(server: AnsweringServer, tmp_path: Path) -> tuple[SendOutcome, float]:
    provider = _gmail(server, tmp_path)
    started = time.monotonic()
    try:
        outcome = provider.send_raw(_RAW)
        took = time.monotonic() - started
    finally:
        provider.close()
        server.close()
    assert took < TIMEOUT + MARGIN, f"{took:.2f}s"
    return outcome, took


@pytest.mark.parametrize("kind", ["status line", "chunked body"])
def test_a_gmail_send_whose_answer_never_ends_is_unknown_by_the_timeout(
    kind: str, tmp_path: Path
) -> None:
    outcome, _ = _send_timed(_endless(kind, None), tmp_path)
    assert outcome.kind is SendKind.UNKNOWN, outcome


def test_a_gmail_send_whose_token_never_comes_is_not_sent_by_the_timeout(tmp_path: Path) -> None:
    outcome, _ = _send_timed(_endless("header", None, token=False), tmp_path)
    assert outcome.kind is SendKind.REJECTED and outcome.transient, outcome


def test_a_gmail_search_whose_answer_never_ends_ends_by_the_timeout(tmp_path: Path) -> None:
    server = _endless("interim 1xx", None)
    provider = _gmail(server, tmp_path)
    started = time.monotonic()
    try:
        with pytest.raises(ProviderError):
            provider.search("<e-1@example.com>")
        took = time.monotonic() - started
    finally:
        provider.close()
        server.close()
    assert took < TIMEOUT + MARGIN, f"{took:.2f}s"


def _discovery(port: int) -> bytes:
    root = f"https://127.0.0.1:{port}/tenant"
    body = json.dumps(
        {
            "issuer": f"{root}/v2.0",
            "authorization_endpoint": f"{root}/oauth2/v2.0/authorize",
            "token_endpoint": f"{root}/oauth2/v2.0/token",
        }
    ).encode()
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
        len(body),
        body,
    )


def _graph_tokens(server: AnsweringServer, timeout: float) -> GraphTokens:
    """Graph's tokens from `server` as the daemon asks for them, trusting the CA the
    environment names."""
    return GraphTokens(
        authority=f"https://127.0.0.1:{server.port}",
        tenant_id="tenant",
        client_id="client",
        credential="secret",
        timeout=timeout,
        ca_bundle=trusted_ca_bundle(),
    )


@pytest.mark.parametrize("endless", ["discovery", "token"])
def test_a_graph_token_fetch_that_never_ends_ends_by_the_timeout(
    endless: str, tls_files: TlsFiles, monkeypatch: pytest.MonkeyPatch
) -> None:
    """msal's tenant discovery or token request (msal's own requests session read on while
    each byte came within its timeout): a transient TokenError, the send tried later. The
    CA trusted as the daemon trusts one (requests let the variable win over its argument)."""
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(tls_files.ca_file))

    def session(conn: socket.socket, reader: BufferedReader) -> None:
        path = _request(reader)
        if endless == "token" and path.endswith("openid-configuration"):
            conn.sendall(_discovery(server.port))
            return
        conn.sendall(b"HTTP/1.1 200 OK\r\nX-Slow: ")
        server.trickle(conn, b"x" * 60_000, every=0.05)

    server = AnsweringServer(session, tls_files)
    tokens = _graph_tokens(server, TIMEOUT)
    started = time.monotonic()
    try:
        with pytest.raises(TokenError) as error:
            tokens.token()
        took = time.monotonic() - started
    finally:
        tokens.close()
        server.close()
    assert error.value.transient, error.value
    assert "timed out" in error.value.reason, error.value.reason
    assert took < TIMEOUT + MARGIN, f"{endless}: {took:.2f}s"


def test_an_answer_without_end_at_the_link_s_speed_ends_at_its_bound() -> None:
    """Before: read for the whole timeout (2 s here), all of it kept (1.3 GB measured);
    now cut past `ANSWER_BOUND` bytes in a fraction of it: Unknown, as any lost answer."""

    def session(conn: socket.socket, reader: BufferedReader) -> None:
        _request(reader)
        conn.sendall(_CHUNKED)
        flood(server, conn, b"%x\r\n%s\r\n" % (1 << 20, b"x" * (1 << 20)))

    server = AnsweringServer(session)
    lost, took = _post_lost(server, 2.0, None)
    assert isinstance(lost.cause, AnswerTooLong), lost.message
    assert took < 1.0, f"{took:.2f}s"
