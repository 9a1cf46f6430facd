"""A PostgreSQL host that goes silent under an open store: TCP connects, the startup
packet gets no answer (a blackholed network, a hung server, a half-open proxy). Each of
the pool's connection attempts must give up after `[store] connect_timeout`: a pool
worker blocked on one for good never connects again, and once every worker the pool
counts on is so blocked, the store stays unusable after the host answers again.

A TCP relay between the Ledger and the server plays the host: it forwards, or accepts
and stays silent.
"""

from __future__ import annotations

import contextlib
import dataclasses
import socket
import threading
import time
from collections.abc import Iterator

import pytest
from eventsourcing.persistence import OperationalError

from ledger.application import Ledger, Sender
from ledger.content import JobContent
from ledger.stores.postgres import PostgresJobIndexRecorder
from ledger.stores.url import PostgresStore, parse_store_url
from ledger.vocabulary import PolicyRef

pytestmark = pytest.mark.postgres

SENDER = Sender("Support <support@example.com>", "mail.example.com", PolicyRef("c", "0" * 16))
CONNECT_TIMEOUT = 2


class SilentRelay:
    """Forwards TCP connections to `target`; while `silent`, accepts them and never
    answers, keeping them open (what a hung host does; the socket stays open after the
    host recovers, as a half-open proxy's does)."""

    def __init__(self, host: str, port: int) -> None:
        self._target = (host, port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self.silent = threading.Event()
        self.held = 0
        self._forwarded: list[socket.socket] = []
        self._silent: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        for client in _accepted(self._listener):
            with self._lock:
                if self.silent.is_set():
                    self._silent.append(client)
                    self.held += 1
                    continue
                server = socket.create_connection(self._target)
                self._forwarded += [client, server]
            threading.Thread(target=_pump, args=(server, client), daemon=True).start()
            threading.Thread(target=_pump, args=(client, server), daemon=True).start()

    def go_silent(self) -> None:
        """From now on silent; the connections it forwarded are cut (the pool's
        connections die and it must make new ones)."""
        with self._lock:
            self.silent.set()
            ends, self._forwarded = self._forwarded, []
        for end in ends:
            _cut(end)

    def answer_again(self) -> None:
        self.silent.clear()

    def close(self) -> None:
        self._listener.close()
        with self._lock:
            ends = self._forwarded + self._silent
        for end in ends:
            _cut(end)


def _accepted(listener: socket.socket) -> Iterator[socket.socket]:
    """The listener's connections, until it is closed."""
    with contextlib.suppress(OSError):
        while True:
            yield listener.accept()[0]


def _pump(source: socket.socket, sink: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := source.recv(65536):
            sink.sendall(data)


def _cut(end: socket.socket) -> None:
    with contextlib.suppress(OSError):
        end.shutdown(socket.SHUT_RDWR)
    end.close()


@pytest.fixture
def relayed(pg_url: str) -> Iterator[tuple[PostgresStore, SilentRelay]]:
    spec = parse_store_url(pg_url)
    assert isinstance(spec, PostgresStore)
    relay = SilentRelay(spec.host, spec.port)
    try:
        # Two connections and no overflow: the pool replaces a lost one, never grows.
        yield (
            dataclasses.replace(
                spec,
                host="127.0.0.1",
                port=relay.port,
                pool_size=2,
                max_overflow=0,
                connect_timeout=CONNECT_TIMEOUT,
            ),
            relay,
        )
    finally:
        relay.close()


def _content(key: str) -> JobContent:
    return JobContent(channel="c", key=key, to=("a@example.com",), subject="s", body="b")


def _works(ledger: Ledger) -> bool:
    try:
        return ledger.row("k1") is not None
    except OperationalError:  # no connection within connect_timeout
        return False


def test_the_pool_connects_again_after_a_silent_host_answers_again(
    relayed: tuple[PostgresStore, SilentRelay],
) -> None:
    """Before the fix the pool's workers waited for the silent host's answer without
    limit: the store stayed unusable after it answered again (each read failed after
    connect_timeout, for the whole 30 s bound below)."""
    spec, relay = relayed
    with Ledger(spec) as ledger:
        ledger.submit(_content("k1"), SENDER)
        relay.go_silent()
        assert not _works(ledger)  # its connections are gone; new ones get no answer
        assert relay.held >= 2  # the pool's workers are connecting to the silent host
        time.sleep(CONNECT_TIMEOUT + 1)
        relay.answer_again()
        started = time.monotonic()
        while not _works(ledger) and time.monotonic() - started < 30:
            pass
        waited = time.monotonic() - started
        # The attempt under way when the host answered again gives up within
        # connect_timeout, the pool's next one (its pause doubling from 1 s) connects.
        assert waited < 3 * CONNECT_TIMEOUT + 2, waited


def test_the_pool_s_connections_are_bounded_as_the_store_s_own(pg_url: str) -> None:
    spec = parse_store_url(pg_url)
    assert isinstance(spec, PostgresStore)
    with Ledger(dataclasses.replace(spec, connect_timeout=3)) as ledger:
        recorder = ledger.recorder
        assert isinstance(recorder, PostgresJobIndexRecorder)
        with recorder.datastore.get_connection() as conn:
            given = conn.info.get_parameters()
    assert given["connect_timeout"] == "3"
    assert (given["keepalives"], given["keepalives_idle"]) == ("1", "10")
