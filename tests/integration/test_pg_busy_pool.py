"""A PostgreSQL store that answers but whose pool is busy: a read waits for a connection
as long as the store answers, not once (docs/operations.md "What a store outage costs").

`PoolWait.one_wait` bounds a read to one wait for a pooled connection while the store
does not answer; a pool smaller than the threads that read (send workers, the tick,
check workers, the API's request threads) whose queue outlasts `connect_timeout` is no
outage, and its reads must not fail where they waited before.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any

import psycopg_pool
import pytest

from ledger.application import Ledger, Sender
from ledger.content import JobContent
from ledger.stores.postgres import PostgresJobIndexRecorder
from ledger.stores.url import PostgresStore, parse_store_url
from ledger.vocabulary import PolicyRef

pytestmark = pytest.mark.postgres

SENDER = Sender("Support <support@example.com>", "mail.example.com", PolicyRef("c", "0" * 16))
CONNECT_TIMEOUT = 2


def _pool(ledger: Ledger) -> psycopg_pool.ConnectionPool[Any]:
    recorder = ledger.recorder
    assert isinstance(recorder, PostgresJobIndexRecorder)
    return recorder.datastore.pool


def test_a_read_behind_a_busy_pool_waits_as_long_as_the_store_answers(pg_url: str) -> None:
    """One connection, held by a statement for longer than connect_timeout (a write
    waiting for a row lock, `lock_timeout` 5 s): a read of a job behind it gets the
    connection once it is given back. Before, the read's first wait ran out and the
    library's tries after it each took only a connection that was there: the read failed
    after about 4 s, the store answering all along."""
    spec = parse_store_url(pg_url)
    assert isinstance(spec, PostgresStore)
    spec = dataclasses.replace(spec, pool_size=1, max_overflow=0, connect_timeout=CONNECT_TIMEOUT)
    with Ledger(spec) as ledger:
        ledger.submit(
            JobContent(channel="c", key="k1", to=("a@example.com",), subject="s", body="b"),
            SENDER,
        )
        holding = threading.Event()

        def hold() -> None:
            with _pool(ledger).connection() as conn:
                holding.set()
                conn.execute("SELECT pg_sleep(%s)", (2.4 * CONNECT_TIMEOUT,))

        holder = threading.Thread(target=hold)
        holder.start()
        assert holding.wait(10)
        started = time.monotonic()
        try:
            assert ledger.get_job("k1").key == "k1"
        finally:
            holder.join()
        assert time.monotonic() - started < 4 * CONNECT_TIMEOUT
