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
import dataclasses
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
from ledger.stores.url import PostgresStore, parse_store_url
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
        #: Set: the server unreachable (every connection cut, new ones closed at once).
        self.down = threading.Event()
        self.down_at_drop = False  # the server unreachable from the dropped COMMIT on
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self.down.is_set():
                client.close()
                continue
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
                if self.down.is_set():
                    break
                if self.armed.is_set() and b"COMMIT" in data:
                    self.armed.clear()
                    mute.set()  # the server's answer to the COMMIT never arrives
                    server.sendall(data)
                    time.sleep(0.5)  # the server applies it
                    if self.down_at_drop:
                        self.down.set()
                    self.dropped.set()
                    for end in (client, server):
                        with contextlib.suppress(OSError):
                            end.shutdown(socket.SHUT_RDWR)
                        end.close()
                    return
                server.sendall(data)
        for end in (client, server):  # the server unreachable: the connection cut
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)
            end.close()

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


def _engine(ledger: Ledger, *, lease: float) -> tuple[FakeProvider, Engine]:
    """Daemon "a" on `ledger`, its provider's timeout and grace `lease` each."""
    fake = FakeProvider("fake", clock=ledger.clock)
    engine = Engine(ledger, PolicyHolder(lambda: POLICIES), {"fake": Mailboxes(fake)},
                    provider_timeouts={"fake": lease}, deadline_grace=lease,
                    rng=random.Random(1), daemon_name="a")  # fmt: skip
    return fake, engine


def _quick_to_give_up(url: str) -> Ledger:
    """A Ledger on `url` whose wait for a connection to an unreachable server is libpq's
    least (`connect_timeout = 2`)."""
    spec = parse_store_url(url)
    assert isinstance(spec, PostgresStore)
    return Ledger(dataclasses.replace(spec, connect_timeout=2))


def _cut_the_claim_at_its_commit(
    ledger: Ledger,
    proxy: LostAckProxy,
    monkeypatch: pytest.MonkeyPatch,
    *,
    back_by_the_read_back: bool,
) -> None:
    """The next claim's COMMIT reaches the server, its answer and the look-up of its
    transaction are lost, and the store's tries give up (an outage as long as
    `store_wait`): the save raises, the claim stored. `back_by_the_read_back`: the
    server answers the read-back that follows; else it stays unreachable through it
    (`LostAckProxy.down`)."""

    def look_up_lost(xid: int) -> bool:
        # The server unreachable meanwhile: no connection to ask it on.
        if back_by_the_read_back:
            ledger.store_wait = Ledger.store_wait
        raise PoolTimeout("couldn't get a connection after 0.01 sec")

    monkeypatch.setattr(ledger.recorder, "_committed", look_up_lost)
    save_job = ledger.save_job

    def claim_cut_at_its_commit(job: SendJob, **kwargs: Any) -> None:
        if job.state is JobState.ATTEMPTED and not proxy.dropped.is_set():
            ledger.store_wait = 0.0  # no try again: the save gives up at once
            proxy.down_at_drop = not back_by_the_read_back
            proxy.armed.set()
        save_job(job, **kwargs)

    monkeypatch.setattr(ledger, "save_job", claim_cut_at_its_commit)


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
        fake, engine = _engine(ledger, lease=5.0)
        try:
            submit(ledger, "k4", 0)
            _cut_the_claim_at_its_commit(ledger, proxy, monkeypatch, back_by_the_read_back=True)
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


def test_a_claim_whose_commit_and_read_back_are_lost_is_read_back_once_the_store_answers(
    proxied: tuple[str, LostAckProxy], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The COMMIT of a claim's save reaches the server and its answer is lost, and the
    server stays unreachable through the read-back: before, the claim waited for its
    deadline and was recovered as an unknown outcome, searched for a send never made.
    It is read back again at the next tick the store answers, before its deadline, and
    released on the version read: the job is sent once, with no search."""
    url, proxy = proxied
    with _quick_to_give_up(url) as ledger:
        fake, engine = _engine(ledger, lease=60.0)
        try:
            submit(ledger, "k5", 0)
            _cut_the_claim_at_its_commit(ledger, proxy, monkeypatch, back_by_the_read_back=False)
            read_back = ledger.stored_after_unsure
            failed: list[BaseException] = []

            def server_back_after_the_read_back(job: SendJob) -> bool:
                try:
                    return read_back(job)
                except Exception as exc:
                    failed.append(exc)  # the claim unsure still: kept to read again
                    proxy.down.clear()  # and the server reachable again right after
                    ledger.store_wait = Ledger.store_wait
                    raise

            monkeypatch.setattr(ledger, "stored_after_unsure", server_back_after_the_read_back)
            give_up = time.monotonic() + 30
            while time.monotonic() < give_up:
                # The pool's connections come back at its own pace: its reads fail until.
                with contextlib.suppress(OperationalError):
                    engine.tick()
                    if len(ledger.history("k5")) > 2:
                        break
            assert proxy.dropped.is_set() and failed  # the read-back at once failed
            _requested, claim, release = ledger.history("k5")
            assert isinstance(claim, SendJob.Attempted) and claim.daemon == "a"
            assert isinstance(release, SendJob.Rejected) and release.released
            assert release.timestamp < claim.deadline  # no recovery was due yet
            while ledger.get_job("k5").state is not JobState.CONFIRMED:
                time.sleep(0.05)
                engine.tick()
            assert (fake.sends, fake.searches) == (1, 0)
            assert "Unknown" not in [type(e).__name__ for e in ledger.history("k5")]
        finally:
            engine.close()


def test_a_claim_cut_at_its_commit_by_an_outage_holds_its_worker_one_wait_a_read(
    proxied: tuple[str, LostAckProxy], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A claim's COMMIT reaches the server, its answer is lost and the server stays
    unreachable: the look-up of its transaction and the read-back both fail. Each such
    read waited for a pooled connection, and pinged the server, once for each of the
    library's ten tries: with `connect_timeout = 2`, 22 s for the look-up and 42 s for
    the read-back, the send worker held 64 s for one claim (a stop as long, past
    `daemon.stop_timeout`'s 35 s at the default 10 s). Each read now waits once (about
    6 s here: the wait, the ping, the library's quick tries again)."""
    url, proxy = proxied
    with _quick_to_give_up(url) as ledger:
        fake, engine = _engine(ledger, lease=60.0)
        try:
            submit(ledger, "k6", 0)
            took: dict[str, float] = {}
            save_job, read_back = ledger.save_job, ledger.stored_after_unsure

            def claim_cut_for_good(job: SendJob, **kwargs: Any) -> None:
                if job.state is not JobState.ATTEMPTED or proxy.dropped.is_set():
                    return save_job(job, **kwargs)
                proxy.down_at_drop = True  # down from its COMMIT on
                proxy.armed.set()
                began = time.monotonic()
                try:
                    save_job(job, **kwargs)
                finally:
                    took["save"] = time.monotonic() - began

            def timed_read_back(job: SendJob) -> bool:
                if "read-back" in took:
                    # The same tick reads the kept claim back again (`unsent.py`): the
                    # store still down, it fails as the read timed above did, at once,
                    # not after another wait that this test does not measure (6 s).
                    raise OperationalError("the store is still down")
                began = time.monotonic()
                try:
                    return read_back(job)
                finally:
                    took["read-back"] = time.monotonic() - began

            monkeypatch.setattr(ledger, "save_job", claim_cut_for_good)
            monkeypatch.setattr(ledger, "stored_after_unsure", timed_read_back)
            with contextlib.suppress(OperationalError):
                engine.tick()  # its due read after the sends fails: the store is down
            assert proxy.dropped.is_set() and fake.sends == 0
            assert engine.unsent.kept() == ["k6"], took
            assert took["save"] < 12 and took["read-back"] < 12, took  # were 22 s and 42 s
        finally:
            proxy.down.clear()
            engine.close()
