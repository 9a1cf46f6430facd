"""The traced second try that tells a PostgreSQL refusal by its code
(`ledger.stores.pg_refusals`), in a process holding more than 1,024 files: a daemon with
many mailboxes' connections open, its file limit raised. The server here is a loopback
listener that refuses every start-up with an ErrorResponse, as a server does."""

from __future__ import annotations

import os
import resource
import socket
import struct
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from psycopg import pq
from tests.integration.listeners import stop_listening

from ledger.stores.pg_refusals import ServerRefusal, server_refusal

#: What the listener answers each start-up with.
REFUSAL = ServerRefusal("28P01", 'password authentication failed for user "mail"')
#: More open files than `select()` takes descriptors.
MANY = 1100


def _error_response(refusal: ServerRefusal) -> bytes:
    body = (
        b"SFATAL\x00VFATAL\x00C" + refusal.code.encode() + b"\x00M" + refusal.message.encode()
    ) + b"\x00\x00"
    return b"E" + struct.pack("!I", len(body) + 4) + body


@contextmanager
def _refusing_server(answer: bytes = _error_response(REFUSAL)) -> Iterator[list[int]]:
    """A loopback port whose every connection gets `answer` once its start-up packet has
    come (a refusal as `REFUSAL`; b"": closed without a word). The list holds the port,
    then one more item for each connection made."""
    listener = socket.create_server(("127.0.0.1", 0))
    made: list[int] = [listener.getsockname()[1]]

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return  # stopped
            made.append(1)
            with conn:
                conn.settimeout(5)
                head = conn.recv(4)
                if len(head) == 4:
                    conn.recv(struct.unpack("!I", head)[0] - 4)
                    conn.sendall(answer)

    thread = threading.Thread(target=serve, name="refusing-server")
    thread.start()
    try:
        yield made
    finally:
        stop_listening(listener)
        thread.join()


@contextmanager
def _files_open(count: int) -> Iterator[None]:
    """This process holding at least `count` open files, the limit raised as far as the
    hard limit lets it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = count + 100
    if soft != resource.RLIM_INFINITY and soft < wanted:
        top = wanted if hard == resource.RLIM_INFINITY else min(hard, wanted)
        resource.setrlimit(resource.RLIMIT_NOFILE, (top, hard))
    held: list[int] = []
    try:
        while not held or held[-1] < count:
            held.append(os.open(os.devnull, os.O_RDONLY))
        yield
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_refusal_is_told_in_a_process_holding_more_than_1024_files() -> None:
    """The traced try's socket is then numbered past 1,023, which `select()` refuses:
    the try raised ValueError ("filedescriptor out of range in select()") from the open's
    or the pool's refusal, in place of the store's line. It waits with poll() now."""
    with _refusing_server() as made:
        conninfo = f"host=127.0.0.1 port={made[0]} user=mail dbname=mail sslmode=disable"
        if pq.version() >= 180000:  # traced where libpq shows a start-up's answer
            said = f"connection failed: FATAL:  {REFUSAL.message}"
            with _files_open(MANY):
                assert server_refusal(conninfo, 5.0, said + " (many files)") == REFUSAL
        else:  # libpq 15 traces no answer before the password: none found, none raised
            with _files_open(MANY):
                assert server_refusal(conninfo, 5.0, REFUSAL.message) is None


def test_a_refusal_no_trace_shows_is_tried_once_a_minute_not_at_each_ask() -> None:
    """A refusal whose answer the trace does not show (libpq 15's, before the password;
    here a server that closes the start-up without a word) was tried again, traced, at
    each ask: a running daemon's pool refused by the server asks at each store call that
    waits out its connection, so each made one more connection to the server (one more
    refused login in its log) and left libpq a stream of a few KB never freed. It is
    asked once per message a minute now, as one shown is once per message."""
    said = "connection failed: server closed the connection unexpectedly (no trace)"
    with _refusing_server(answer=b"") as made:
        conninfo = f"host=127.0.0.1 port={made[0]} user=mail dbname=mail sslmode=disable"
        for _ in range(3):
            assert server_refusal(conninfo, 5.0, said) is None
        assert len(made) - 1 == 1
