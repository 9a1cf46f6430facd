"""A PostgreSQL host that goes silent under the store's open connections: packets
dropped, no RST (`SilentLink`). A statement sent then waits for an acknowledgement
that never comes; TCP keepalives stop while bytes are in flight, and the kernel gave
up after its retransmissions, about 15 minutes, holding the read, the lease renewal or
the tick that sent it. libpq's `tcp_user_timeout` (`postgres.SILENT_HOST_SECONDS`, 25 s,
1 s here) drops the connection instead: the store call fails as a store that cannot be
reached, and the store serves again once the host answers.
"""

from __future__ import annotations

import dataclasses
import hashlib
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime

import psycopg
import pytest
from tests.conftest import PG_URL
from tests.integration.silent_host import ClusterBeyond, SilentLink, SilentRelay
from tests.integration.test_engine import claimed_and_held
from tests.pg_cluster import require_private_cluster

from daemon.doubles.fake_time import FakeClock
from daemon.engine.leases import Leases
from ledger.application import Ledger, Sender
from ledger.content import JobContent
from ledger.stores import postgres
from ledger.stores.identity import IdentityTaken
from ledger.stores.url import PostgresStore, parse_store_url
from ledger.vocabulary import PolicyRef

pytestmark = pytest.mark.postgres

SENDER = Sender("Support <support@example.com>", "mail.example.com", PolicyRef("c", "0" * 16))
CONNECT_TIMEOUT = 2
SILENT_HOST = 1  # `postgres.SILENT_HOST_SECONDS` in these tests
#: What a call into the silence may take: a try on each of the pool's two connections,
#: each dropped after SILENT_HOST, then the wait for a new one, with room for a loaded
#: machine. Without the bound the first try alone waited about 15 minutes.
FAILS_WITHIN = 2 * SILENT_HOST + CONNECT_TIMEOUT + 6
#: The store serving again after the host answers: the pool's next attempt (its pause
#: doubling from 1 s) and its connect.
SERVES_AGAIN_WITHIN = 20.0


@pytest.fixture
def linked(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[PostgresStore, SilentLink]]:
    monkeypatch.setattr(postgres, "SILENT_HOST_SECONDS", SILENT_HOST)
    spec = parse_store_url(pg_url)
    assert isinstance(spec, PostgresStore)
    with SilentLink() as link:
        relay = SilentRelay(spec.host, spec.port, listener=link.listen())
        try:
            # Two connections and no overflow: the pool replaces a lost one, never grows.
            yield (
                dataclasses.replace(
                    spec,
                    host=link.far_ip,
                    port=relay.port,
                    pool_size=2,
                    max_overflow=0,
                    connect_timeout=CONNECT_TIMEOUT,
                ),
                link,
            )
        finally:
            link.answer_again()  # a call still waiting (the bound missing) ends
            relay.close()


def _ended_within(seconds: float, call: Callable[[], object]) -> BaseException | None:
    """What `call` raised, on a thread of its own, or None when it returned; fails the
    test when it has not ended after `seconds` (the thread is left to end with the
    fixture, which lets the host answer)."""
    ended = threading.Event()
    raised: list[BaseException] = []

    def run() -> None:
        try:
            call()
        except BaseException as exc:  # handed to the test's thread
            raised.append(exc)
        finally:
            ended.set()

    threading.Thread(target=run, daemon=True).start()
    assert ended.wait(seconds), f"still waiting after {seconds} s on a silent host"
    return raised[0] if raised else None


def _until(seconds: float, works: Callable[[], bool]) -> float:
    """Seconds until `works()` said yes; fails the test past `seconds`."""
    started = time.monotonic()
    while not works():
        assert time.monotonic() - started < seconds, f"not served again within {seconds} s"
        time.sleep(0.2)
    return time.monotonic() - started


def _reads(ledger: Ledger) -> bool:
    try:
        return ledger.row("k1") is not None
    except Exception:  # any store failure: not yet
        return False


def _content(key: str) -> JobContent:
    return JobContent(channel="c", key=key, to=("a@example.com",), subject="s", body="b")


def test_a_read_sent_to_a_silent_host_fails_within_the_bound(
    linked: tuple[PostgresStore, SilentLink],
) -> None:
    """The pool's connections are open and idle when the host goes silent; the read is
    sent on one of them and never acknowledged."""
    spec, link = linked
    with Ledger(spec) as ledger:
        ledger.submit(_content("k1"), SENDER)
        link.go_silent()
        raised = _ended_within(FAILS_WITHIN, lambda: ledger.row("k1"))
        assert raised is not None  # the store is unreachable: said, not waited out
        link.answer_again()
        _until(SERVES_AGAIN_WITHIN, lambda: _reads(ledger))


def test_a_lease_renewal_sent_to_a_silent_host_is_tried_again_once_it_answers(
    linked: tuple[PostgresStore, SilentLink], caplog: pytest.LogCaptureFixture
) -> None:
    """A slow call's lease falls due while the host is silent: the renewal fails as a
    store that cannot be reached (the lease stays pending, tried again a second later),
    not after 15 minutes past the lease's end; once the host answers it lands."""
    spec, link = linked
    clock = FakeClock(datetime.now(UTC))
    with Ledger(spec, clock=clock) as ledger:
        ledger.store_wait = 1.0  # a save tried again for a second (60 s by default)
        leases = Leases(ledger, clock, "d1", clock.elapsed)
        claimed_and_held(ledger, leases, clock, "k1")
        lease = leases.lease("k1")
        assert lease is not None
        link.go_silent()
        clock.advance(11)  # the renewal is due (a third of the 30 s lease)

        def renewal_ended() -> None:
            assert leases.renew_due() == 0
            while lease.in_flight:
                time.sleep(0.05)

        assert _ended_within(FAILS_WITHIN, renewal_ended) is None
        assert "lease not renewed" in caplog.text
        link.answer_again()

        def renewed() -> bool:
            clock.advance(1)  # the failed renewal is tried again a second later
            return leases.renew_due() == 1

        _until(SERVES_AGAIN_WITHIN, renewed)
        assert ledger.get_job("k1").due_at is not None
        assert "LeaseRenewed" in [type(e).__name__ for e in ledger.history("k1")]
        leases.close()


def test_the_name_s_session_on_a_silent_host_fails_its_check_then_is_held_again(
    linked: tuple[PostgresStore, SilentLink], caplog: pytest.LogCaptureFixture
) -> None:
    """The daemon checks its name's session before every tick (`SELECT 1` on it): on a
    silent host that check, and the tick behind it, waited the 15 minutes. It fails
    instead (no claims until a later check passes). Once the host answers the name is
    taken again: the server still keeps the earlier session, holding it (here the relay
    keeps its side open; a real server, until its keepalives notice), and the daemon was
    refused as a second one with its name (IdentityTaken: it stopped). That session is
    its own: ended, and the name held again, by one session."""
    spec, link = linked
    with Ledger(spec) as ledger:
        lock = ledger.hold_identity("silent")
        try:
            link.go_silent()
            raised = _ended_within(FAILS_WITHIN, lock.check)
            assert isinstance(raised, psycopg.OperationalError)
            link.answer_again()

            def checked() -> bool:
                try:
                    lock.check()
                except psycopg.OperationalError:
                    return False
                return True

            _until(SERVES_AGAIN_WITHIN, checked)
            assert "ended this daemon's earlier session" in caplog.text
            assert _name_holders(spec, "silent") == 1
            with pytest.raises(IdentityTaken):  # a second daemon is still refused
                ledger.hold_identity("silent")
            lock.check()
        finally:
            lock.release()


def _name_key(spec: PostgresStore, name: str) -> int:
    """The advisory lock key of `name` on the store, as `AdvisoryIdentityLock` makes it."""
    digest = hashlib.sha256(f"sendledger:{spec.schema}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def _name_holders(spec: PostgresStore, name: str) -> int:
    """Sessions holding the advisory lock of `name` on the store (PostgreSQL shows a
    bigint key's halves)."""
    key = _name_key(spec, name)
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted "
            "AND classid::bigint = %s AND objid::bigint = %s AND objsubid = 1",
            ((key >> 32) & 0xFFFFFFFF, key & 0xFFFFFFFF),
        ).fetchone()
    return 0 if row is None else int(row[0])


def test_every_connection_of_the_store_carries_the_bound(
    linked: tuple[PostgresStore, SilentLink],
) -> None:
    """The pool's, and those the store opens itself (the name's session, the schema's
    checks and upgrade, the commands')."""
    spec, _link = linked
    with Ledger(spec) as ledger:
        recorder = ledger.recorder
        assert isinstance(recorder, postgres.PostgresJobIndexRecorder)
        with recorder.datastore.get_connection() as conn:
            pooled = conn.info.get_parameters()
    with postgres.connect_at_open(spec) as conn:
        own = conn.info.get_parameters()
    for given in (pooled, own):
        assert given["tcp_user_timeout"] == str(SILENT_HOST * 1000)
        assert (given["keepalives"], given["keepalives_idle"]) == ("1", "10")


def test_the_server_drops_the_name_s_session_as_soon(
    linked: tuple[PostgresStore, SilentLink],
) -> None:
    """The server's side of the name's session is bounded as the daemon's side: a
    daemon's host that vanished does not keep its name for the server's two hours."""
    spec, _link = linked
    lock = postgres.AdvisoryIdentityLock(spec, "bounded")
    try:
        session = lock._conn  # the session whose server side holds the name
        assert session is not None
        shown = [
            session.execute(f"SHOW {name}").fetchone()
            for name in (
                "tcp_keepalives_idle",
                "tcp_keepalives_interval",
                "tcp_keepalives_count",
                "tcp_user_timeout",
            )
        ]
    finally:
        lock.release()
    assert shown == [("10",), ("5",), ("3",), (str(SILENT_HOST * 1000),)]


#: The server's side of the name's session after its daemon's host went silent: ended
#: after the bound (1 s here) when its last answer was not yet acknowledged (1.0 s
#: measured: the link goes silent right after the lock is taken), else at its
#: keepalives' second probe, 15 s; with room for a loaded machine. The server's own
#: default: over two hours (checked: still held at 25 s).
FREED_WITHIN = 25.0


def test_a_vanished_daemon_s_name_is_freed_by_the_server_within_the_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The daemon's host vanishes (its link silent for good) while the daemon holds its
    name: the server, whose side of the session carries the same bounds, ends it and
    frees the name for the daemon taking over."""
    monkeypatch.setattr(postgres, "SILENT_HOST_SECONDS", SILENT_HOST)
    require_private_cluster()
    with SilentLink() as link, ClusterBeyond(link) as cluster:
        spec = parse_store_url(cluster.url)
        assert isinstance(spec, PostgresStore)
        spec = dataclasses.replace(spec, connect_timeout=CONNECT_TIMEOUT)
        vanished = postgres.AdvisoryIdentityLock(spec, "vanished")
        link.go_silent()
        started = time.monotonic()
        # The daemon taking over, on the server's own host (its Unix socket).
        key = _name_key(spec, "vanished")
        with psycopg.connect(cluster.local_url, autocommit=True) as taking_over:
            while taking_over.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone() != (
                True,
            ):
                assert time.monotonic() - started < FREED_WITHIN, "the name is still held"
                time.sleep(0.5)
        vanished.release()


def test_a_server_without_the_settings_still_gives_the_name(
    pg_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A server before PostgreSQL 12 knows no tcp_user_timeout: the name is held all the
    same (its server's own keepalives bound it), and a warning says so."""
    from psycopg.sql import SQL

    monkeypatch.setattr(postgres, "_server_notices", lambda: SQL("SET tcp_no_such_setting = 1"))
    spec = parse_store_url(pg_url)
    assert isinstance(spec, PostgresStore)
    lock = postgres.AdvisoryIdentityLock(spec, "older")
    try:
        assert _name_holders(spec, "older") == 1
        assert "the server keeps its own TCP bounds" in caplog.text
    finally:
        lock.release()
