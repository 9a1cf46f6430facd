"""A PostgreSQL host that goes silent under an open store: TCP connects, the startup
packet gets no answer (a blackholed network, a hung server, a half-open proxy). Each of
the pool's connection attempts must give up after `[store] connect_timeout`: a pool
worker blocked on one for good never connects again, and once every worker the pool
counts on is so blocked, the store stays unusable after the host answers again.

A TCP relay between the Ledger and the server plays the host: it forwards, or accepts
and stays silent.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import psycopg_pool
import pytest
from eventsourcing.persistence import OperationalError
from tests.integration.silent_host import SilentRelay

from ledger.application import Ledger, Sender
from ledger.content import JobContent
from ledger.stores.postgres import PostgresJobIndexRecorder
from ledger.stores.url import PostgresStore, parse_store_url
from ledger.vocabulary import PolicyRef

pytestmark = pytest.mark.postgres

SENDER = Sender("Support <support@example.com>", "mail.example.com", PolicyRef("c", "0" * 16))
CONNECT_TIMEOUT = 2


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


def _pool(ledger: Ledger) -> psycopg_pool.ConnectionPool[Any]:
    recorder = ledger.recorder
    assert isinstance(recorder, PostgresJobIndexRecorder)
    return recorder.datastore.pool


def _reads_at_once(ledger: Ledger, count: int) -> bool:
    """`count` reads at once, each on a connection of its own (none waits for another's:
    each holds its connection until all have one)."""
    all_in = threading.Barrier(count, timeout=3 * CONNECT_TIMEOUT)

    def read() -> bool:
        with _pool(ledger).connection() as conn:
            all_in.wait()
            return conn.execute("SELECT 1").fetchone() is not None

    with ThreadPoolExecutor(count) as threads:
        results = [threads.submit(read) for _ in range(count)]
    try:
        return all(result.result() for result in results)
    except (threading.BrokenBarrierError, psycopg_pool.PoolTimeout, psycopg.Error):
        return False


def test_the_pool_grows_back_to_its_size_after_giving_its_connections_up(
    relayed: tuple[PostgresStore, SilentRelay],
) -> None:
    """psycopg's pool gives a lost connection's slot up after `reconnect_timeout` of
    failed attempts (two `connect_timeout`s: 4 s here): a host away longer leaves the
    pool with fewer connections than its size. Once the host answers, the pool grows
    back to its size as store calls ask for connections."""
    spec, relay = relayed
    with Ledger(spec) as ledger:
        ledger.submit(_content("k1"), SENDER)
        pool = _pool(ledger)
        assert pool.reconnect_timeout == 2 * CONNECT_TIMEOUT
        assert _reads_at_once(ledger, 2)
        relay.go_silent()  # both connections cut; new ones get no answer
        assert not _works(ledger)  # each lost connection is replaced, in vain
        started = time.monotonic()
        while pool.get_stats()["pool_size"] > 0:
            assert time.monotonic() - started < 30, pool.get_stats()
            time.sleep(0.2)
        relay.answer_again()
        started = time.monotonic()
        while not _reads_at_once(ledger, 2):
            assert time.monotonic() - started < 30, pool.get_stats()
        assert pool.get_stats()["pool_size"] == 2


#: When the host answers again in the test below, from the moment it went away. psycopg's
#: tries of each lost connection came (measured) at 0, 1, 4, 8 and 17 s: their pauses
#: double from 1 s (10% jitter), counted from when its worker got to them, behind the
#: first read's 4 s. At 9.5 s the try at 8 has failed and psycopg's own pool waited for the
#: one at 17, 7 s, past the bound below; ours has given its slots up by then
#: (`reconnect_timeout`, 4 s) and connects at the next call. (Before, the host was back
#: at about 20 s, 16 s after the read's 4, between the tries at 17 and about 33: the
#: same check, 10 s longer.)
BACK = 9.5


def test_the_store_serves_within_about_connect_timeout_after_a_long_absence(
    relayed: tuple[PostgresStore, SilentRelay],
) -> None:
    """The pool tries again to replace each lost connection, its pauses doubling, for
    `reconnect_timeout`: with psycopg's 5 minutes a host back after a minute's absence
    waited up to 32 s for the next try, after four minutes up to 128 s, and every store
    call meanwhile failed after `connect_timeout` (here: back at 9.5 s, served at
    about 17 s). The pool now gives a slot up after two `connect_timeout`s of tries, and grows
    back as calls ask (`test_the_pool_grows_back_to_its_size_...`)."""
    spec, relay = relayed
    with Ledger(spec) as ledger:
        ledger.submit(_content("k1"), SENDER)
        gone = time.monotonic()
        relay.go_away()
        assert not _works(ledger)
        time.sleep(max(0.0, gone + BACK - time.monotonic()))
        relay.answer_again()
        started = time.monotonic()
        while not _works(ledger):
            assert time.monotonic() - started < 60
        waited = time.monotonic() - started
        assert waited < CONNECT_TIMEOUT + 1.5, waited
