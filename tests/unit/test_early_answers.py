"""What `EarlyAnswer` takes for a server's answer (daemon/providers/early_answers.py): not
TLS 1.3 session tickets, which make a socket readable with nothing said; and an answer
left in this host's receive buffer by a server that then reset the connection."""

from __future__ import annotations

import select
import socket
import ssl
import threading
from io import BufferedReader
from pathlib import Path

import pytest
from tests.unit.early_server import BIG, TIMEOUT, AnsweringServer

from daemon.providers.early_answers import READ_BOUND, EarlyAnswer, read_now
from daemon.providers.slow_links import PIECE
from testkit.tls import make_loopback_tls


def test_tls_session_tickets_are_not_an_answer(tmp_path: Path) -> None:
    files = make_loopback_tls(tmp_path)
    server_context = files.server_context()
    server_context.minimum_version = ssl.TLSVersion.TLSv1_3
    listener = socket.create_server(("127.0.0.1", 0))
    speak, done = threading.Event(), threading.Event()

    def serve() -> None:
        conn, _ = listener.accept()
        with server_context.wrap_socket(conn, server_side=True) as tls:
            speak.wait(10)
            tls.sendall(b"552 too big\r\n")
            done.wait(10)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    client_context = ssl.create_default_context(cafile=files.ca_file)
    raw = socket.create_connection(listener.getsockname(), timeout=5)
    try:
        with client_context.wrap_socket(raw, server_hostname="localhost") as client:
            assert client.version() == "TLSv1.3"
            # The tickets follow the handshake: readable, and nothing said.
            assert select.select([client], [], [], 5)[0]
            assert read_now(client) is None
            assert client.gettimeout() == 5  # the socket's own timeout again
            speak.set()
            assert select.select([client], [], [], 5)[0]
            assert read_now(client) == b"552 too big\r\n"
    finally:
        done.set()
        thread.join(10)
        listener.close()


def test_an_answer_left_before_a_reset_is_read_after_the_failed_write() -> None:
    """A server that answers and closes with the body unread resets the connection: the
    write fails (EPIPE or ECONNRESET) and the answer still sits in the receive buffer."""
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname(), timeout=5)
    try:
        conn, _ = listener.accept()
        client.sendall(b"POST /send HTTP/1.1\r\n")  # left unread: the close resets
        conn.sendall(b"HTTP/1.1 413 Too large\r\n\r\n")
        conn.close()
        watch = EarlyAnswer(client)
        with pytest.raises((BrokenPipeError, ConnectionResetError)):
            for _ in range(100):
                client.sendall(b"x" * 65536)
        assert watch.left()
        assert watch.read == b"HTTP/1.1 413 Too large\r\n\r\n"
        assert watch.reader().read(26) == b"HTTP/1.1 413 Too large\r\n\r\n"
    finally:
        client.close()
        listener.close()


def test_interim_answers_that_keep_coming_during_an_upload_end_it_bounded() -> None:
    """A server that keeps sending interim answers (103 Early Hints) while the body
    goes out, never its final one, and does not read the body. Before, each look
    appended what it read: 2 MB kept here (without bound on a server that goes on), and
    the write then waited its timeout. Now more than `READ_BOUND` read ends the writing
    (cut), the bytes kept for the answer's reader."""
    interim = b"HTTP/1.1 103 Early Hints\r\n\r\n"

    def session(conn: socket.socket, reader: BufferedReader) -> None:
        for _ in range(64):
            conn.sendall(interim * 1024)  # 29 kB
        server.hold()

    server = AnsweringServer(session)
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=TIMEOUT) as sock:
            watch = EarlyAnswer(sock, lambda read: False)  # every answer an interim one
            watch.sendall(b"x" * BIG)
            assert watch.cut
            assert READ_BOUND < len(watch.read) <= READ_BOUND + PIECE
            assert watch.reader().read(len(interim)) == interim
    finally:
        server.close()
