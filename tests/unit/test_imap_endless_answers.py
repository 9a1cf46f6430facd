"""An IMAP server that never ends its answer: every wait for one ends by the `timeout`
(plus a small margin), whatever it trickles a byte at a time, each well within the
socket's timeout (docs/providers.md "A server that never ends its answer"): the greeting,
a SEARCH answer, untagged responses without end; plain and implicit TLS 1.3. A search
that does not end is a ProviderError, no information, timed out (a hang for the
circuit). Each server trickles for `TRICKLE_FOR` (4 s) at most, which a client without a
bound of its own waited out."""

from __future__ import annotations

import socket
import ssl
import time
from io import BufferedReader
from pathlib import Path
from typing import Any

import pytest
from tests.unit.early_server import AnsweringServer, flood

from daemon.providers.base import ProviderError
from daemon.providers.imap_sessions import ImapSessions
from daemon.providers.kept import MailEndpoint, ReuseLimits
from testkit.tls import TlsFiles, make_loopback_tls

#: The client's timeout, and what a wait may take past it.
TIMEOUT = 0.5
MARGIN = 1.0

#: What each hostile server writes, its first bytes at once, then the rest a byte at a
#: time: as its greeting, or as its answer to a SEARCH.
ENDLESS: dict[str, tuple[bytes, bytes]] = {
    "greeting": (b"* OK", b" " + b"x" * 60_000),
    "search answer": (b"* SEARCH", b" 1" * 60_000),
    "untagged lines": (b"", b"* 1 EXISTS\r\n" * 10_000),
}


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_loopback_tls(Path(tmp_path_factory.mktemp("ca")))


def _search(
    server: AnsweringServer, security: str, ca: Path, timeout: float = TIMEOUT
) -> tuple[BaseException | None, float]:
    """A SEARCH of INBOX on a fresh session: the error it ended with, and how long it took."""
    context = ssl.create_default_context(cafile=ca)
    endpoint = MailEndpoint("127.0.0.1", server.port, security, "u", "p", timeout, context)
    sessions = ImapSessions(endpoint, ReuseLimits(max_uses=1))

    def call(client: Any) -> object:
        client.select_folder("INBOX")
        return client.search(["ALL"])

    started = time.monotonic()
    try:
        sessions.run(call)
        error = None
    except ProviderError as exc:
        error = exc
    finally:
        took = time.monotonic() - started
        sessions.close()
    return error, took


@pytest.mark.parametrize("security", ["none", "tls", "starttls"])
@pytest.mark.parametrize("kind", list(ENDLESS))
def test_an_answer_that_never_ends_ends_the_search_by_the_timeout(
    kind: str, security: str, tls_files: TlsFiles
) -> None:
    """STARTTLS: imaplib makes a reader of its own for the TLS layer, which is bounded too."""
    first, rest = ENDLESS[kind]

    def session(conn: socket.socket, reader: BufferedReader) -> None:
        if kind == "greeting":
            conn.sendall(first)
            server.trickle(conn, rest, every=0.01)
            return
        conn.sendall(b"* OK ready\r\n")
        while line := reader.readline():
            tag, _, command = line.rstrip().partition(b" ")
            verb = command.upper()
            if b"SEARCH" in verb:
                conn.sendall(first)
                server.trickle(conn, rest, every=0.01)
                return
            if verb.startswith(b"CAPABILITY"):
                conn.sendall(b"* CAPABILITY IMAP4rev1 STARTTLS\r\n")
            elif verb.startswith(b"SELECT"):
                conn.sendall(b"* 1 EXISTS\r\n")
            conn.sendall(tag + b" OK done\r\n")
            if verb == b"STARTTLS":
                conn = tls_files.server_context().wrap_socket(conn, server_side=True)
                reader = conn.makefile("rb")

    server = AnsweringServer(session, tls_files if security == "tls" else None)
    try:
        error, took = _search(server, security, tls_files.ca_file)
    finally:
        server.close()
    assert isinstance(error, ProviderError) and error.timed_out, error
    assert took < TIMEOUT + MARGIN, f"{kind}: {took:.2f}s"


def test_untagged_lines_at_the_link_s_speed_end_the_search_at_their_bound(
    tls_files: TlsFiles,
) -> None:
    """Before, read (and kept) for the whole timeout (2 s here); now cut past
    `ANSWER_BOUND` bytes in a fraction of it: no information."""

    def session(conn: socket.socket, reader: BufferedReader) -> None:
        conn.sendall(b"* OK ready\r\n")
        flood(server, conn, (b"* OK " + b"x" * 1000 + b"\r\n") * 1000)

    server = AnsweringServer(session)
    try:
        error, took = _search(server, "none", tls_files.ca_file, timeout=2.0)
    finally:
        server.close()
    assert isinstance(error, ProviderError) and not error.timed_out, error
    assert "an answer longer than" in str(error), error
    assert took < 1.0, f"{took:.2f}s"
