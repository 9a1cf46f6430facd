"""Every interim `1xx` before an HTTP answer is read past, not only a `100 Continue`
(sendledger/final_answers.py; docs/providers.md "A server that answers before the body is
read"): a `103 Early Hints` was taken for the answer, and the real one left on the kept
connection was read as the next request's. Through a Gmail provider (its send, twice on
one connection), Graph's token fetch, a webhook delivery, and the transport's bounds."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from http.client import HTTPException
from io import BufferedReader
from pathlib import Path

import pytest
from tests.unit.early_server import AnsweringServer, Session
from tests.unit.test_endless_answers import _discovery, _graph_tokens

from daemon.providers.gmail import GmailProvider
from daemon.providers.outcomes import SendKind
from daemon.providers.transport import ResponseLostError, SingleShotHttp
from daemon.webhooks.delivery import post
from sendledger.client import Client
from sendledger.final_answers import INTERIM_BOUND
from testkit.credentials import write_service_account
from testkit.tls import TlsFiles, make_loopback_tls

TIMEOUT = 2.0

#: What a server (or a proxy, or a clear-text hop) writes before its final answer.
INTERIM = {
    "103": b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n",
    "102": b"HTTP/1.1 102 Processing\r\n\r\n",
    "100 then 103s": b"HTTP/1.1 100 Continue\r\n\r\n"
    + b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n" * 3,
}


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_loopback_tls(Path(tmp_path_factory.mktemp("ca")))


def _request(reader: BufferedReader) -> str | None:
    """The next request read whole (its body by Content-Length): its path; None once the
    client closed."""
    line = reader.readline()
    if not line:
        return None
    length = 0
    while (header := reader.readline()) not in (b"\r\n", b""):
        name, _, value = header.decode("latin-1").partition(":")
        if name.strip().lower() == "content-length":
            length = int(value)
    reader.read(length)
    return line.split()[1].decode("latin-1")


def _json(body: object, status: bytes = b"200 OK") -> bytes:
    data = json.dumps(body).encode()
    return b"HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
        status,
        len(data),
        data,
    )


def _after_103(paths: list[str], answer: Callable[[str], bytes]) -> Session:
    """A server that answers each request (its path kept in `paths`) with a 103, then
    `answer(path)`, written apart."""

    def session(conn: socket.socket, reader: BufferedReader) -> None:
        path = _request(reader)
        assert path is not None
        paths.append(path)
        conn.sendall(INTERIM["103"])
        conn.sendall(answer(path))

    return session


_RAW = (
    b"From: me@example.com\r\nTo: you@example.net\r\nMessage-ID: <e-%d@example.com>\r\n\r\nhi\r\n"
)


@pytest.mark.parametrize("interim", list(INTERIM))
@pytest.mark.parametrize("pause", [0.0, 0.05], ids=["together", "apart"])
def test_a_gmail_send_answered_after_an_interim_answer_is_that_answer_and_the_next_its_own(
    interim: str, pause: float, tmp_path: Path
) -> None:
    """Before: the first send was `unexpected HTTP 103`, Unknown, searched, and the second,
    on the same kept connection, read the first one's 200: Confirmed with the first
    message's id (its own answer left for a third)."""
    sends: list[int] = []
    connections: list[int] = []

    def session(conn: socket.socket, reader: BufferedReader) -> None:
        connections.append(1)
        while (path := _request(reader)) is not None:
            if path.endswith("/token"):
                conn.sendall(_json({"access_token": "t", "expires_in": 3600}))
                continue
            sends.append(1)
            conn.sendall(INTERIM[interim])
            time.sleep(pause)
            conn.sendall(_json({"id": f"id-{len(sends)}", "threadId": "t", "labelIds": ["SENT"]}))

    server = AnsweringServer(session)
    base = f"http://127.0.0.1:{server.port}"
    key = write_service_account(tmp_path / "sa.json", token_uri=f"{base}/token")
    provider = GmailProvider(
        "gmail",
        credentials_file=key,
        user="me@example.com",
        api_endpoint=base,
        token_uri=f"{base}/token",
        timeout=TIMEOUT,
    )
    try:
        first = provider.send_raw(_RAW % 1)
        second = provider.send_raw(_RAW % 2)
        stats = provider.transport_stats.snapshot()
    finally:
        provider.close()
        server.close()
    assert (first.kind, first.provider_message_id) == (SendKind.CONFIRMED, "id-1"), first
    assert (second.kind, second.provider_message_id) == (SendKind.CONFIRMED, "id-2"), second
    assert len(sends) == 2
    # The token and both sends on one connection: the second send reused it.
    assert len(connections) == 1
    assert stats["reused"] == 2 and stats["reused_lost"] == 0, stats


def test_a_graph_token_fetch_past_interim_answers_gets_its_token(
    tls_files: TlsFiles, monkeypatch: pytest.MonkeyPatch
) -> None:
    """msal's tenant discovery and token request through the same transport: before, the
    discovery read a 103 (no document) and the token fetch failed."""
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(tls_files.ca_file))
    paths: list[str] = []
    token = {"access_token": "graph", "expires_in": 3600, "token_type": "Bearer"}

    def answer(path: str) -> bytes:
        if path.endswith("openid-configuration"):
            return _discovery(server.port)
        return _json(token)

    server = AnsweringServer(_after_103(paths, answer), tls_files)
    tokens = _graph_tokens(server, TIMEOUT)
    try:
        got = tokens.token()
    finally:
        tokens.close()
        server.close()
    assert got == "graph"
    assert [path.rsplit("/", 1)[-1] for path in paths] == ["openid-configuration", "token"]


@pytest.mark.parametrize("final", [200, 500])
def test_a_webhook_answered_after_an_interim_answer_is_judged_by_the_final_one(final: int) -> None:
    """Before: the 103 was the answer, a failure (`HTTP 103`), and an event the receiver
    took with its 200 was sent again at the next retry."""
    posts: list[str] = []
    status = b"200 OK" if final == 200 else b"500 Oops"
    answer = _json({"ok": final == 200}, status)
    server = AnsweringServer(_after_103(posts, lambda _: answer))
    try:
        outcome = post(f"http://127.0.0.1:{server.port}/hook", b"{}", {}, TIMEOUT)
    finally:
        server.close()
    assert (outcome.ok, outcome.status) == (final == 200, final), outcome
    assert posts == ["/hook"]


@pytest.mark.parametrize(
    ("interim", "error"),
    [
        (INTERIM["103"] * (INTERIM_BOUND + 1), f"more than {INTERIM_BOUND} interim answers"),
        (b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\n\r\n", "101 Switching Protocols, a"),
    ],
    ids=["past the bound", "101"],
)
def test_interim_answers_past_their_bound_or_a_switch_end_the_call_as_a_lost_answer(
    interim: bytes, error: str
) -> None:
    """No final answer to read: the request was written, its answer lost (a send: Unknown,
    searched), at once, and the connection closed."""

    def session(conn: socket.socket, reader: BufferedReader) -> None:
        _request(reader)
        conn.sendall(interim + _json({"id": "x"}))
        server.hold()

    server = AnsweringServer(session)
    http = SingleShotHttp(timeout=TIMEOUT)
    started = time.monotonic()
    try:
        with pytest.raises(ResponseLostError) as lost:
            http.request(f"http://127.0.0.1:{server.port}/send", "POST", body=b"x")
        took = time.monotonic() - started
    finally:
        http.close()
        server.close()
    assert isinstance(lost.value.cause, HTTPException), lost.value.message
    assert error in lost.value.message, lost.value.message
    assert took < TIMEOUT / 4, f"{took:.2f}s"


def test_the_python_client_reads_the_api_s_answer_past_an_interim_one() -> None:
    """The API behind a proxy that sends a 103: before, `status` returned None (the
    103's empty body), not the job's state."""
    paths: list[str] = []
    answer = _json({"key": "k1", "state": "confirmed"})
    server = AnsweringServer(_after_103(paths, lambda _: answer))
    try:
        status = Client(f"http://127.0.0.1:{server.port}", "token", retries=0).status("k1")
    finally:
        server.close()
    assert status == {"key": "k1", "state": "confirmed"}
    assert paths == ["/v1/jobs/k1"]
