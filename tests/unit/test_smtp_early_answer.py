"""An SMTP server that refuses a message during DATA, before its final "." (a 552 for a
message too large), and stops reading is answered at once: the send ends on that reply,
refused and not sent, not after the `timeout` as a hang (daemon/providers/smtp_submit.py
`_send_content`, daemon/providers/early_answers.py). Plain and implicit TLS 1.3."""

from __future__ import annotations

import socket
import ssl
import time
from io import BufferedReader
from pathlib import Path

import pytest
from tests.unit.early_server import BIG, TIMEOUT, AnsweringServer
from tests.unit.smtp_loopback import converse, message_of_lines, submit_timed

from daemon.providers.kept import MailEndpoint
from daemon.providers.outcomes import SendKind, SendOutcome
from testkit.tls import TlsFiles, make_loopback_tls


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_loopback_tls(Path(tmp_path_factory.mktemp("ca")))


def _submit(server: AnsweringServer) -> tuple[SendOutcome, float]:
    """A message of megabytes submitted to `server`: the outcome and how long it took."""
    context = ssl.create_default_context(
        cafile=server.tls_files.ca_file if server.tls_files else None
    )
    security = "tls" if server.tls_files else "none"
    endpoint = MailEndpoint("127.0.0.1", server.port, security, "u", "p", TIMEOUT, context)
    return submit_timed(endpoint, message_of_lines(BIG // 1000, "<early-1@mail.example.com>"))


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls1.3"])
@pytest.mark.parametrize("then", ["hold", "close"])
def test_a_refusal_during_data_is_read_at_once(tls: bool, then: str, tls_files: TlsFiles) -> None:
    """Before: held, the whole timeout and "not sent: timed out" (a hang for the circuit);
    closed, "not sent: Server not connected", the refusal lost."""

    def session(conn: socket.socket, reader: BufferedReader) -> None:
        def data() -> bool:
            conn.sendall(b"354 go on\r\n")
            reader.read(64 * 1024)
            conn.sendall(b"552 5.3.4 Message size exceeds fixed limit\r\n")
            if then == "close":
                conn.shutdown(socket.SHUT_WR)
                time.sleep(0.05)
            else:
                server.hold()
            return False

        converse(conn, reader, data)

    server = AnsweringServer(session, tls_files if tls else None)
    try:
        outcome, took = _submit(server)
    finally:
        server.close()
    assert outcome.kind is SendKind.REJECTED, outcome
    assert (outcome.status, outcome.transient, outcome.timed_out) == (552, False, False)
    assert "refused at content: 552 5.3.4 Message size exceeds fixed limit" in outcome.reason
    assert took < TIMEOUT / 4, f"{took:.2f}s: the refusal waited for the timeout"


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls1.3"])
def test_a_refusal_while_a_message_that_fit_drains_is_read_at_once(
    tls: bool, tls_files: TlsFiles
) -> None:
    """A message this host's buffers take whole (200 kB): every write is done before the
    server refuses (a moment after its 354), and the refusal comes while the bytes wait
    to leave. Before, that wait ran its whole timeout (4.0 s here, not 0.3)."""

    def session(conn: socket.socket, reader: BufferedReader) -> None:
        def data() -> bool:
            conn.sendall(b"354 go on\r\n")
            time.sleep(TIMEOUT / 8)  # the writes are done by then
            conn.sendall(b"552 5.3.4 Message size exceeds fixed limit\r\n")
            server.hold()
            return False

        converse(conn, reader, data)

    server = AnsweringServer(session, tls_files if tls else None)
    context = ssl.create_default_context(cafile=tls_files.ca_file if tls else None)
    endpoint = MailEndpoint(
        "127.0.0.1", server.port, "tls" if tls else "none", "u", "p", TIMEOUT, context
    )
    try:
        outcome, took = submit_timed(endpoint, message_of_lines(200, "<fit@mail.example.com>"))
    finally:
        server.close()
    assert (outcome.kind, outcome.status) == (SendKind.REJECTED, 552), outcome
    assert took < TIMEOUT / 2, f"{took:.2f}s: the refusal waited for the drain's timeout"


def test_a_garbled_line_during_data_is_unknown_not_sent_again() -> None:
    """A line that is no SMTP reply while the content is written (a broken server) says
    nothing of what the server queued. Read after the final '.' before the early reading
    (Unknown); read early it was "not sent", transient, and the job sent again."""

    def session(conn: socket.socket, reader: BufferedReader) -> None:
        def data() -> bool:
            conn.sendall(b"354 go on\r\n")
            reader.read(64 * 1024)
            conn.sendall(b"queued, thanks\r\n")
            server.hold()
            return False

        converse(conn, reader, data)

    server = AnsweringServer(session)
    try:
        outcome, took = _submit(server)
    finally:
        server.close()
    assert outcome.kind is SendKind.UNKNOWN, outcome
    assert "answered before the final '.'" in outcome.reason
    assert took < TIMEOUT / 4, f"{took:.2f}s: the answer waited for the timeout"


def test_a_close_after_the_final_dot_with_no_reply_is_marked_unanswered() -> None:
    """A server that reads the whole message and closes without a reply: Unknown (it may
    have queued the message), marked `unanswered`, one more of a run that pauses the
    scope's sends (`Circuits.sent`). Before: nothing told it from an answer."""

    def session(conn: socket.socket, reader: BufferedReader) -> None:
        def data() -> bool:
            conn.sendall(b"354 go on\r\n")
            while reader.readline() not in (b".\r\n", b""):
                pass
            conn.close()
            return False

        converse(conn, reader, data)

    server = AnsweringServer(session)
    endpoint = MailEndpoint(
        "127.0.0.1", server.port, "none", "u", "p", TIMEOUT, ssl.create_default_context()
    )
    try:
        outcome, took = submit_timed(endpoint, message_of_lines(2, "<closed@mail.example.com>"))
    finally:
        server.close()
    assert outcome.kind is SendKind.UNKNOWN and not outcome.timed_out, outcome
    assert outcome.unanswered
    assert took < TIMEOUT / 2
