"""A PostgreSQL commit whose acknowledgement is lost: the COMMIT reaches the server and
is applied, and the connection drops before its answer reaches the daemon. The save is
tried again on a fresh connection and meets its own rows; it must read as the success it
was (one copy of each event), not as another writer's conflict (which makes a claim make
no call and leaves it to be recovered as an unknown outcome, and tells an operator's
resolve that it did not happen).

A TCP proxy between the Ledger and the server drops the connection at the COMMIT; the
effects are counted in the store itself.
"""

from __future__ import annotations

import contextlib
import random
import socket
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
from eventsourcing.persistence import OperationalError
from psycopg_pool import PoolTimeout
from tests.integration.listeners import stop_listening
from tests.unit.test_scope_owners import POLICIES, Mailboxes, submit

from daemon.doubles.fake_provider import FakeProvider
from daemon.doubles.fake_time import FakeClock
from daemon.engine import Engine, PolicyHolder
from ledger.application import ConcurrentUpdate, Ledger, Sender
from ledger.content import JobContent
from ledger.job import JobState, SendJob
from ledger.stores.cipher import new_key
from ledger.vocabulary import PolicyRef

pytestmark = pytest.mark.postgres

SENDER = Sender("Support <support@example.com>", "mail.example.com", PolicyRef("c", "0" * 16))


class LostAckProxy:
    """Forwards PostgreSQL connections. Once `armed`, the next COMMIT a client sends
    reaches the server, the server's answer is dropped, and the connection is closed."""

    def __init__(self, host: str, port: int) -> None:
        self._target = (host, port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.armed = threading.Event()
        self.dropped = threading.Event()
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self._target)
            self._sockets += [client, server]
            mute = threading.Event()
            threading.Thread(target=self._down, args=(server, client, mute), daemon=True).start()
            threading.Thread(target=self._up, args=(client, server, mute), daemon=True).start()

    def _down(self, server: socket.socket, client: socket.socket, mute: threading.Event) -> None:
        with contextlib.suppress(OSError):
            while data := server.recv(65536):
                if not mute.is_set():
                    client.sendall(data)

    def _up(self, client: socket.socket, server: socket.socket, mute: threading.Event) -> None:
        with contextlib.suppress(OSError):
            while data := client.recv(65536):
                if self.armed.is_set() and b"COMMIT" in data:
                    self.armed.clear()
                    mute.set()  # the server's answer to the COMMIT never arrives
                    server.sendall(data)
                    time.sleep(0.5)  # the server applies it
                    self.dropped.set()
                    for end in (client, server):
                        with contextlib.suppress(OSError):
                            end.shutdown(socket.SHUT_RDWR)
                        end.close()
                    return
                server.sendall(data)

    def close(self) -> None:
        stop_listening(self._listener)
        for end in self._sockets:  # a shutdown wakes the pump waiting in its recv()
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                end.close()


@pytest.fixture
def proxied(pg_url: str) -> Iterator[tuple[str, LostAckProxy]]:
    parts = urlsplit(pg_url)
    assert parts.hostname is not None and parts.port is not None
    proxy = LostAckProxy(parts.hostname, parts.port)
    user = parts.netloc.rpartition("@")[0]
    through = f"{user}@127.0.0.1:{proxy.port}" if user else f"127.0.0.1:{proxy.port}"
    try:
        yield urlunsplit(parts._replace(netloc=through)), proxy
    finally:
        proxy.close()


def _content(key: str) -> JobContent:
    return JobContent(channel="c", key=key, to=("a@example.com",), subject="s", body="b")


@pytest.mark.parametrize("keys", [(), (new_key(),)], ids=["plain", "encrypted"])
def test_a_claim_whose_commit_answer_is_lost_is_saved_once_and_reads_as_saved(
    proxied: tuple[str, LostAckProxy], clock: FakeClock, keys: tuple[str, ...]
) -> None:
    url, proxy = proxied
    with Ledger(url, clock=clock, encryption_keys=keys) as ledger:
        ledger.submit(_content("k1"), SENDER)
        job = ledger.get_job("k1")
        job.claim(provider="p", deadline=clock() + timedelta(seconds=30), at=clock())
        proxy.armed.set()
        ledger.save_job(job)  # no ConcurrentUpdate: the claim is ours, the call may go
        assert proxy.dropped.is_set()
        types = [type(e).__name__ for e in ledger.history("k1")]
        assert types == ["Requested", "Attempted"]
        assert ledger.get_job("k1").state is JobState.ATTEMPTED
        assert not job.pending_events


def test_another_writers_event_at_the_same_version_is_still_a_conflict(
    pg_url: str, clock: FakeClock
) -> None:
    with Ledger(pg_url, clock=clock) as ledger, Ledger(pg_url, clock=clock) as other:
        ledger.submit(_content("k2"), SENDER)
        mine, theirs = ledger.get_job("k2"), other.get_job("k2")
        theirs.claim(provider="p", deadline=clock() + timedelta(seconds=30), at=clock())
        other.save_job(theirs)
        clock.advance(0.000001)
        mine.claim(provider="p", deadline=clock() + timedelta(seconds=30), at=clock())
        with pytest.raises(ConcurrentUpdate):
            ledger.save_job(mine)
        assert mine.pending_events


def test_a_claim_whose_commit_and_its_look_up_are_both_lost_is_adopted_as_saved(
    proxied: tuple[str, LostAckProxy], clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The server's answer on whether the transaction committed is lost too: the insert,
    # tried again, meets its own rows. They are this process's own write, read back and
    # adopted (docs/architecture.md "Ambiguous commits"), not another writer's conflict.
    url, proxy = proxied
    with Ledger(url, clock=clock) as ledger:
        ledger.submit(_content("k3"), SENDER)
        job = ledger.get_job("k3")
        job.claim(provider="p", deadline=clock() + timedelta(seconds=30), at=clock())

        def look_up_lost(xid: int) -> bool:
            raise OperationalError("the look-up's connection was lost too")

        monkeypatch.setattr(ledger.recorder, "_committed", look_up_lost)
        proxy.armed.set()
        ledger.save_job(job)  # no ConcurrentUpdate: the claim is ours, the call may go
        assert proxy.dropped.is_set()
        assert [type(e).__name__ for e in ledger.history("k3")] == ["Requested", "Attempted"]
        assert not job.pending_events
        assert job.version == ledger.get_job("k3").version


def test_a_claim_whose_save_gave_up_at_a_lost_commit_is_read_back_and_released(
    proxied: tuple[str, LostAckProxy], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The COMMIT of a claim's save reaches the server, its answer and the look-up of its
    transaction are lost, and the store's tries give up (an outage as long as
    `store_wait`): the save raises, the claim stored. Before, the job stayed claimed
    until its deadline and was recovered as an unknown outcome: searched, or with
    `on_unknown = "review"` a person's look, for a send never made. The store is now
    read back at once: the claim is this process's own, released with no call made,
    and the job is sent at the next tick, once."""
    url, proxy = proxied
    with Ledger(url) as ledger:
        fake = FakeProvider("fake", clock=ledger.clock)
        calls = Mailboxes(fake)
        engine = Engine(ledger, PolicyHolder(lambda: POLICIES), {"fake": calls},
                        provider_timeouts={"fake": 5.0}, deadline_grace=5.0,
                        rng=random.Random(1), daemon_name="a")  # fmt: skip
        try:
            submit(ledger, "k4", 0)

            def look_up_lost(xid: int) -> bool:
                # The server unreachable meanwhile: no connection to ask it on, and the
                # store's tries give up; it answers again by the read-back.
                ledger.store_wait = Ledger.store_wait
                raise PoolTimeout("couldn't get a connection after 0.01 sec")

            monkeypatch.setattr(ledger.recorder, "_committed", look_up_lost)
            save_job = ledger.save_job

            def claim_cut_at_its_commit(job: SendJob, **kwargs: Any) -> None:
                if job.state is JobState.ATTEMPTED and not proxy.dropped.is_set():
                    ledger.store_wait = 0.0  # no try again: the save gives up at once
                    proxy.armed.set()
                save_job(job, **kwargs)

            monkeypatch.setattr(ledger, "save_job", claim_cut_at_its_commit)
            engine.tick()
            assert proxy.dropped.is_set()
            assert fake.sends == 0
            job = ledger.get_job("k4")
            assert job.state is JobState.REQUESTED, [type(e).__name__ for e in ledger.history("k4")]
            engine.tick()
            while ledger.get_job("k4").state is not JobState.CONFIRMED:
                time.sleep(0.05)
                engine.tick()
            assert (fake.sends, fake.searches) == (1, 0)
        finally:
            engine.close()
