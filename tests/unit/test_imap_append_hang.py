"""The sent copy's APPEND (`sent_copy = "client"`) on an IMAP server that never answers it
(docs/providers.md "A server that never ends its answer"): it ends by the `timeout`, is
logged, and the send it follows stays Confirmed and is no hang for the circuit. The
circuit guards sends, and its probe is the submission server's: counting a hang of the
copy's server there would hold back sends that server takes."""

from __future__ import annotations

import logging
import socket
import time
from io import BufferedReader

import pytest
from tests.unit.early_server import AnsweringServer
from tests.unit.smtp_loopback import converse

from daemon.providers.base import SendKind
from daemon.providers.smtp_imap import SmtpImapProvider

TIMEOUT = 0.5
MARGIN = 1.0
RAW = b"From: a@example.com\r\nTo: b@example.net\r\nMessage-ID: <append-1@x>\r\n\r\nhi\r\n"


def _smtp(conn: socket.socket, reader: BufferedReader) -> None:
    def data() -> bool:
        conn.sendall(b"354 go\r\n")
        while reader.readline() not in (b".\r\n", b""):
            pass
        conn.sendall(b"250 2.0.0 queued\r\n")
        return True

    converse(conn, reader, data)


def test_an_append_never_answered_is_logged_and_the_send_stays_confirmed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def imap(conn: socket.socket, reader: BufferedReader) -> None:
        conn.sendall(b"* OK ready\r\n")
        while line := reader.readline():
            tag, _, command = line.rstrip().partition(b" ")
            if command.upper().startswith(b"APPEND"):
                conn.sendall(b"+ go ahead\r\n")
                reader.read(int(command.rsplit(b"{", 1)[1].rstrip(b"}")))
                imap_server.hold()  # the copy taken, never answered
                return
            if command.upper().startswith(b"CAPABILITY"):
                conn.sendall(b"* CAPABILITY IMAP4rev1\r\n")
            conn.sendall(tag + b" OK done\r\n")

    smtp_server, imap_server = AnsweringServer(_smtp), AnsweringServer(imap)
    provider = SmtpImapProvider(
        "m",
        smtp_host="127.0.0.1",
        smtp_port=smtp_server.port,
        smtp_security="none",
        imap_host="127.0.0.1",
        imap_port=imap_server.port,
        imap_security="none",
        username="u",
        password="p",
        sent_folder="Sent",
        sent_copy="client",
        timeout=TIMEOUT,
    )
    started = time.monotonic()
    try:
        with caplog.at_level(logging.WARNING):
            outcome = provider.send_raw(RAW)
        took = time.monotonic() - started
    finally:
        provider.close()
        smtp_server.close()
        imap_server.close()
    assert outcome.kind is SendKind.CONFIRMED and not outcome.timed_out, outcome
    assert took < TIMEOUT + MARGIN, f"{took:.2f}s"
    assert "sent, but the APPEND of the sent copy failed" in caplog.text, caplog.text
