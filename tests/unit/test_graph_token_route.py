"""The route of Graph's token requests (docs/providers.md "Token endpoint, national clouds,
private CAs"): msal's requests go through the Graph calls' transport, which takes no proxy
from the environment (httplib2 without PySocks, which sendledger does not install, ignores
`HTTPS_PROXY`), so they go straight to `authority` as the Graph calls go to
`api_endpoint`; through requests they went to the proxy."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from io import BufferedReader
from pathlib import Path

import pytest
from tests.unit.early_server import AnsweringServer
from tests.unit.test_endless_answers import _discovery, _graph_tokens, _request, _token

from daemon.providers.graph_classify import TokenError
from testkit.tls import TlsFiles, make_loopback_tls


@pytest.fixture
def proxy() -> Iterator[socket.socket]:
    """Where `HTTPS_PROXY` points: a listener that never answers; whether a client came is
    whether it has a connection to accept."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        yield listener


def _came(listener: socket.socket) -> bool:
    listener.setblocking(False)
    try:
        conn, _ = listener.accept()
    except BlockingIOError:
        return False
    conn.close()
    return True


def test_graph_token_requests_take_no_proxy_from_the_environment(
    proxy: socket.socket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tls: TlsFiles = make_loopback_tls(tmp_path)
    monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{proxy.getsockname()[1]}")
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(tls.ca_file))

    def session(conn: socket.socket, reader: BufferedReader) -> None:
        path = _request(reader)
        conn.sendall(_discovery(server.port) if path.endswith("configuration") else _token())

    server = AnsweringServer(session, tls)
    tokens = _graph_tokens(server, 1.0)
    try:
        assert tokens.token() == "t"
    finally:
        tokens.close()
        server.close()
    assert not _came(proxy)


def _moved(status: int, location: str) -> bytes:
    return f"HTTP/1.1 {status} Moved\r\nLocation: {location}\r\nContent-Length: 0\r\n\r\n".encode()


@pytest.mark.parametrize(("redirected", "status"), [("configuration", 301), ("/token", 308)])
def test_a_redirect_from_the_identity_platform_is_refused_naming_authority(
    redirected: str, status: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tenant discovery (and the token request) moved from msal's requests session, which
    followed redirects, to TokenHttp, which does not: a 3xx gave "authority ...
    unreachable: Unable to complete OIDC Discovery: 301", again at every send. A redirect
    would take the credential to a host the settings never named, so it is not followed:
    one line names `authority`, the status and where it pointed."""
    tls: TlsFiles = make_loopback_tls(tmp_path)
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(tls.ca_file))
    paths: list[str] = []

    def session(conn: socket.socket, reader: BufferedReader) -> None:
        path = _request(reader)
        paths.append(path)
        if path.endswith(redirected):
            conn.sendall(_moved(status, f"https://127.0.0.1:{server.port}/moved{path}"))
        else:
            conn.sendall(_discovery(server.port) if path.endswith("configuration") else _token())

    server = AnsweringServer(session, tls)
    tokens = _graph_tokens(server, 1.0)
    try:
        with pytest.raises(TokenError) as refused:
            tokens.token()
    finally:
        tokens.close()
        server.close()
    said = refused.value.reason
    assert said.startswith("authority: https://127.0.0.1:"), said
    assert f"HTTP {status} to https://127.0.0.1:{server.port}/moved/" in said, said
    assert "redirects are not followed; set authority" in said and "\n" not in said, said
    assert refused.value.transient
    assert not any(path.startswith("/moved") for path in paths), paths
