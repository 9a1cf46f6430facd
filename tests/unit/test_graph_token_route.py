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
