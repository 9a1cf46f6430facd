"""An SMTP server that never ends its reply: every wait for one ends by the `timeout` (plus
a small margin), whatever it trickles a byte at a time, each well within the socket's
timeout (docs/providers.md "A server that never ends its answer"): the greeting, EHLO's
lines without end, the reply to the final "." (Unknown: the message was written whole),
an implicit TLS handshake (not sent). Each server trickles for `TRICKLE_FOR` (4 s) at
most, which a client without a bound of its own waited out."""

from __future__ import annotations

import socket
import ssl
from collections.abc import Callable
from io import BufferedReader
from pathlib import Path

import pytest
from tests.unit.early_server import AnsweringServer, flood
from tests.unit.smtp_loopback import converse, message_of_lines, submit_timed

from daemon.providers.kept import MailEndpoint
from daemon.providers.outcomes import SendKind, SendOutcome
from testkit.tls import TlsFiles, make_loopback_tls

#: The client's timeout, and what a wait may take past it.
TIMEOUT = 0.5
MARGIN = 1.0


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_loopback_tls(Path(tmp_path_factory.mktemp("ca")))


def _submit(
    server: AnsweringServer, security: str, ca: Path | None, timeout: float = TIMEOUT
) -> tuple[SendOutcome, float]:
    context = ssl.create_default_context(cafile=ca)
    endpoint = MailEndpoint("127.0.0.1", server.port, security, "u", "p", timeout, context)
    return submit_timed(endpoint, message_of_lines(10, "<endless-1@mail.example.com>"))


def _not_sent_by_the_timeout(outcome: SendOutcome, took: float) -> None:
    assert outcome.kind is SendKind.REJECTED and outcome.transient, outcome
    assert outcome.timed_out, outcome
    assert took < TIMEOUT + MARGIN, f"{took:.2f}s"


def _greeting(server: AnsweringServer, conn: socket.socket, reader: BufferedReader) -> None:
    conn.sendall(b"220")
    server.trickle(conn, b" " + b"x" * 60_000, every=0.05)


def _ehlo_lines(server: AnsweringServer, conn: socket.socket, reader: BufferedReader) -> None:
    conn.sendall(b"220 loopback ESMTP\r\n")
    reader.readline()
    server.trickle(conn, b"250-loopback\r\n" * 10_000, every=0.01)


@pytest.mark.parametrize("endless", [_greeting, _ehlo_lines], ids=["greeting", "EHLO lines"])
def test_a_reply_before_the_message_that_never_ends_is_not_sent_by_the_timeout(
    endless: Callable[[AnsweringServer, socket.socket, BufferedReader], None],
) -> None:
    server = AnsweringServer(lambda conn, reader: endless(server, conn, reader))
    try:
        outcome, took = _submit(server, "none", None)
    finally:
        server.close()
    _not_sent_by_the_timeout(outcome, took)


def test_an_implicit_tls_handshake_that_never_ends_is_not_sent_by_the_timeout(
    tls_files: TlsFiles,
) -> None:
    def session(conn: socket.socket, reader: BufferedReader) -> None:
        conn.recv(16 * 1024)
        conn.sendall(b"\x16\x03\x03\x40\x00")  # a handshake record of 16 KiB, to come
        server.trickle(conn, b"\x02" * 16 * 1024, every=0.05)

    server = AnsweringServer(session)
    try:
        outcome, took = _submit(server, "tls", tls_files.ca_file)
    finally:
        server.close()
    _not_sent_by_the_timeout(outcome, took)


@pytest.mark.parametrize("security", ["none", "tls", "starttls"])
def test_an_end_of_data_reply_that_never_ends_is_unknown_by_the_timeout(
    security: str, tls_files: TlsFiles
) -> None:
    """The message was written whole: the server may have queued it. STARTTLS: smtplib
    reads the TLS layer with a reader made afresh, which is bounded too."""

    def session(conn: socket.socket, reader: BufferedReader) -> None:
        def data() -> bool:
            conn.sendall(b"354 go on\r\n")
            while reader.readline() not in (b".\r\n", b""):
                pass
            conn.sendall(b"25")
            server.trickle(conn, b"0 " + b"x" * 60_000, every=0.05)
            return False

        if security == "starttls":
            conn.sendall(b"220 loopback ESMTP\r\n")
            reader.readline()
            conn.sendall(b"250-loopback\r\n250 STARTTLS\r\n")
            reader.readline()
            conn.sendall(b"220 go ahead\r\n")
            conn = tls_files.server_context().wrap_socket(conn, server_side=True)
            reader = conn.makefile("rb")
        converse(conn, reader, data, greet=security != "starttls")

    server = AnsweringServer(session, tls_files if security == "tls" else None)
    try:
        outcome, took = _submit(server, security, tls_files.ca_file)
    finally:
        server.close()
    assert outcome.kind is SendKind.UNKNOWN, outcome
    assert took < TIMEOUT + MARGIN, f"{took:.2f}s"


def test_a_reply_without_end_at_the_link_s_speed_is_not_sent_at_its_bound() -> None:
    """EHLO's lines as fast as the link goes: before, read (and kept) for the whole timeout
    (2 s here); now cut past `ANSWER_BOUND` bytes in a fraction of it: not sent."""

    def session(conn: socket.socket, reader: BufferedReader) -> None:
        conn.sendall(b"220 loopback ESMTP\r\n")
        reader.readline()
        flood(server, conn, (b"250-" + b"x" * 1000 + b"\r\n") * 1000)

    server = AnsweringServer(session)
    try:
        outcome, took = _submit(server, "none", None, timeout=2.0)
    finally:
        server.close()
    assert outcome.kind is SendKind.REJECTED and outcome.transient, outcome
    assert "an answer longer than" in outcome.reason, outcome.reason
    assert took < 1.0, f"{took:.2f}s"
