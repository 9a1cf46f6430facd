"""The SMTP fault relay's own lifecycle (src/testkit/smtp_relay.py), against a stand-in
upstream on loopback: what every real-server test's teardown relies on."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from testkit.smtp_relay import SmtpFaultRelay


@pytest.fixture
def upstream() -> Iterator[int]:
    """A server that greets each connection and then reads until its client goes."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn:
                conn.sendall(b"220 stand-in ESMTP\r\n")
                conn.settimeout(30)
                try:
                    while conn.recv(4096):
                        pass
                except OSError:
                    pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        listener.close()
        thread.join(timeout=5)


def test_closing_the_relay_ends_a_connection_its_client_kept_open(upstream: int) -> None:
    """A client that never closed its kept connection (a provider a test did not close,
    kept alive by a reference cycle) does not hold the relay's close for its join timeout
    (hang_seconds + 5 s: 6.5 s in the real-server tests' teardowns): the relay hangs up,
    as a server that stops does."""
    relay = SmtpFaultRelay("127.0.0.1", upstream, hang_seconds=5.0)
    relay.__enter__()
    with socket.create_connection(("127.0.0.1", relay.port), timeout=10) as client:
        assert client.recv(100).startswith(b"220 ")
        started = time.monotonic()
        relay.close()
        took = time.monotonic() - started
        assert client.recv(100) == b""  # the relay hung up
    assert took < 5.0, f"close waited {took:.1f} s for a session its client kept open"
