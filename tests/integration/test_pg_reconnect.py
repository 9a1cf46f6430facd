"""A PostgreSQL restart under an open store: the pool's dead connections are retried on
fresh ones, and the daemon's name (a session advisory lock) is taken again or refused.

A private cluster (tests/pg_cluster.py), never the shared one that other tests use.
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import psycopg_pool
import pytest
from tests.pg_cluster import PrivateCluster, require_private_cluster

from ledger.application import Ledger, Sender
from ledger.content import parse_job
from ledger.stores.identity import IdentityTaken
from ledger.stores.postgres import connection_lost
from ledger.vocabulary import PolicyRef

SENDER = Sender("Support <support@example.com>", "mail.example.com", PolicyRef("c", "0" * 16))


@pytest.fixture(scope="module")
def cluster() -> Iterator[PrivateCluster]:
    require_private_cluster()
    with PrivateCluster() as pg:
        yield pg


def _submit(ledger: Ledger, key: str) -> None:
    job = {"channel": "c", "key": key, "to": "a@example.com", "subject": "s", "body": "b"}
    ledger.submit(parse_job(job), SENDER)


@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_reads_and_writes_right_after_a_restart(cluster: PrivateCluster, mode: str) -> None:
    """Every pooled connection is dead after the restart; no call fails because of it."""
    with Ledger(cluster.url) as ledger:
        for i in range(8):
            _submit(ledger, f"{mode}-before-{i}")  # several pooled connections in use
        cluster.stop(mode)
        cluster.start()
        # The job index queries first: eventsourcing retries its own event reads.
        assert ledger.open_counts()["requested"] >= 8
        for i in range(8):
            assert ledger.row(f"{mode}-before-{i}") is not None
            assert ledger.get_job(f"{mode}-before-{i}").key == f"{mode}-before-{i}"
        _submit(ledger, f"{mode}-after")
        assert ledger.row(f"{mode}-after") is not None


def test_the_name_is_taken_again_after_a_restart(cluster: PrivateCluster) -> None:
    with Ledger(cluster.url) as ledger:
        lock = ledger.hold_identity("again")
        try:
            cluster.stop("fast")
            with pytest.raises(psycopg.OperationalError):
                lock.check()  # the database is down: no claims until a later check
            cluster.start()
            lock.check()
            assert cluster.advisory_locks() == 1
            with pytest.raises(IdentityTaken):
                ledger.hold_identity("again")  # held again: a second daemon is refused
            lock.check()  # a live session: nothing to do
        finally:
            lock.release()


def test_a_name_taken_by_another_process_meanwhile_is_lost(cluster: PrivateCluster) -> None:
    with Ledger(cluster.url) as ledger:
        first = ledger.hold_identity("contested")
        cluster.stop("fast")
        cluster.start()
        second = ledger.hold_identity("contested")  # another daemon started in between
        try:
            with pytest.raises(IdentityTaken):
                first.check()
        finally:
            second.release()
            first.release()


def test_connection_loss_is_told_apart_from_bad_statements() -> None:
    assert connection_lost(psycopg.errors.AdminShutdown("terminating connection"))
    assert connection_lost(psycopg.errors.CannotConnectNow("starting up"))
    assert connection_lost(psycopg.errors.ConnectionFailure("gone"))
    assert connection_lost(psycopg.OperationalError("server closed the connection"))
    wrapped = RuntimeError("wrapped")
    wrapped.__cause__ = psycopg.errors.CrashShutdown("crash")
    assert connection_lost(wrapped)
    # The pool already waited connect_timeout for a connection: that was the retry.
    assert not connection_lost(psycopg_pool.PoolTimeout("no connection in 10 s"))
    assert not connection_lost(psycopg.errors.SyntaxError("bad"))
    assert not connection_lost(psycopg.errors.UniqueViolation("dup"))
    assert not connection_lost(ValueError("not a database error"))
