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
import time
from collections.abc import Iterator

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
