"""The stop's lock waits, measured (daemon/config/stop_bound.py, docs/operations.md
"Stopping"): another session holds every row a stopping daemon writes, and the stop must
end within the bound `stop_store_wait` computes, which `daemon.stop_timeout` is checked
against at load."""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from tests.integration.listeners import stop_listening
from tests.integration.receipts_daemon import receipts_service
from tests.unit.engine_rig import policy, receipt
from tests.unit.test_heartbeat_commit_held import a_commit_held_past_the_stop
from tests.unit.test_submit_by_loaded_policies import a_beat_held_past_the_stop

from daemon.config.settings import settings_from_dict
from daemon.config.stop_bound import stop_store_wait
from daemon.doubles.fake_provider import FakeProvider, Scripted
from daemon.doubles.fake_time import FakeClock
from daemon.runtime import Daemon
from ledger.application import Ledger
from ledger.event_format import check_event_format
from ledger.stores.format_rows import FORMAT_TABLE
from ledger.stores.index import INDEX_TABLE
from ledger.stores.loaded_policies import DAEMON, LOADED_TABLE, LoadedPolicies
from ledger.stores.positions import POSITIONS_TABLE
from ledger.stores.scopes import DAEMONS_TABLE, SCOPES_TABLE
from ledger.stores.url import PostgresStore, parse_store_url

pytestmark = pytest.mark.postgres

#: `[store] lock_timeout` of the measured daemon: the bound is a whole number of these.
LOCK = 1
#: What the stop may take beyond its lock waits: the threads' joins and the statements
#: that do not wait, on a machine shared with other tests.
SLACK = 1.0
#: Webhooks, each with an attempt in flight: their waits at a stop do not add up.
HOOKS = ("w1", "w2", "w3")


class _Unanswered:
    """A webhook receiver that reads a POST and never answers it: an attempt in flight
    for the webhook's whole timeout (10 s)."""

    def __init__(self) -> None:
        self._server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._server.getsockname()[1]}/"
        self.posts = 0
        self._held: list[socket.socket] = []
        threading.Thread(target=self._take, daemon=True).start()

    def _take(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = self._server.accept()
                self._held.append(conn)
                conn.recv(65536)
                self.posts += 1

    def close(self) -> None:
        stop_listening(self._server)
        for conn in self._held:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()


def _waiting_on(look: Any, holder: Any) -> int:
    """The sessions waiting for a lock that `holder`'s session holds."""
    row = look.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))",
        [holder.info.backend_pid],
    ).fetchone()
    return 0 if row is None else int(row[0])


def _until(done: Any, seconds: float = 10.0) -> None:
    give_up = time.monotonic() + seconds
    while not done():
        assert time.monotonic() < give_up, "not in time"
        time.sleep(0.02)


@contextmanager
def _holding(schema: str, key: str) -> Iterator[tuple[Any, Any]]:
    """Another session holding every row a stop writes: the job's index row, the scope
    leases, the heartbeat, the loaded policies, the event format declarations and the
    webhook positions; and a session to look at the waits with."""
    import psycopg
    from tests.conftest import PG_URL

    with psycopg.connect(PG_URL) as holder, psycopg.connect(PG_URL, autocommit=True) as look:
        holder.execute(f'SELECT 1 FROM "{schema}".{INDEX_TABLE} WHERE key = %s FOR UPDATE', [key])
        for table in (SCOPES_TABLE, DAEMONS_TABLE, LOADED_TABLE, FORMAT_TABLE, POSITIONS_TABLE):
            held = holder.execute(f'SELECT 1 FROM "{schema}".{table} FOR UPDATE').fetchall()
            assert held, f"{table}: no row to hold"
        try:
            yield holder, look
        finally:
            holder.rollback()


def test_a_stop_with_every_row_it_writes_held_ends_within_its_bound(
    pg_url: str, tmp_path: Path
) -> None:
    """A send in flight whose lease renewal waits for its job's row, three webhooks' POSTs
    in flight (their receiver does not answer), the loaded policies' heartbeat and the scope
    leases: another session holds all their rows when
    the call answers and the daemon is asked to stop. Every write of the stop then waits
    its whole lock wait and fails; the stop ends within `stop_store_wait` all the same,
    not abandoned (`daemon.stop_timeout` is far longer)."""
    spec = parse_store_url(pg_url)
    assert isinstance(spec, PostgresStore)
    spec = dataclasses.replace(spec, lock_timeout=LOCK)
    receiver = _Unanswered()
    secret = tmp_path / "hook-secret"
    secret.write_text("whsec_" + base64.b64encode(b"k" * 24).decode() + "\n")
    secret.chmod(0o600)
    settings = settings_from_dict(
        {
            "store": {"url": pg_url, "lock_timeout": f"{LOCK}s"},
            "daemon": {"tick": "50ms", "name": "d1", "stop_timeout": "30s"},
            "webhooks": {name: {"url": receiver.url, "secret_file": str(secret)} for name in HOOKS},
        }
    )
    # 10 s behind the store's clock, 11 s ahead once moved: within half the grace either
    # way, so the daemon keeps its scopes (daemon/engine/owners.py "The clocks").
    clock = FakeClock(datetime.now(UTC) - timedelta(seconds=10))
    provider = FakeProvider("fake", clock=clock)
    release = threading.Event()
    provider.script(Scripted.slow(release))
    with receipts_service(settings, spec, clock, provider) as (ledger, service):
        check_event_format(ledger, server=(DAEMON, "d1"))  # its start's declaration
        daemon = Daemon(service, settings.daemon.tick)
        runner = threading.Thread(target=daemon.serve, daemon=True)
        runner.start()
        try:
            _until(lambda: provider.hanging == 1)
            # Sent at once: its Confirmed is the webhook's POST, never answered.
            ledger.submit(receipt("receipts", "k0"), policy("receipts").sender)
            _until(lambda: receiver.posts == len(HOOKS))
            with _holding(spec.schema, "k1") as (holder, look):
                clock.advance(21)  # past a third of the leases (60 s): their renewals are due
                _until(lambda: _waiting_on(look, holder) >= 2)
                release.set()  # the call answers: its outcome waits for the row too
                time.sleep(0.2)
                started = time.monotonic()
                daemon.request_stop()
                runner.join(timeout=60)
                took = time.monotonic() - started
        finally:
            release.set()
            daemon.request_stop()
            runner.join(timeout=60)
            receiver.close()
    assert not runner.is_alive()
    assert not daemon.abandoned
    bound = stop_store_wait(pg_url, LOCK)
    assert bound is not None
    assert took <= bound + SLACK, f"the stop took {took:.1f}s, its bound is {bound:g}s"


def _timed(write: Callable[[], None], limit: float) -> tuple[float, BaseException | None]:
    """How long `write` took on a thread of its own, and what it raised; fails the test
    when it is still waiting after `limit` seconds."""
    pool = ThreadPoolExecutor(1)
    started = time.monotonic()
    future = pool.submit(write)
    try:
        failed = future.exception(timeout=limit)
    except TimeoutError:
        pytest.fail(f"still waiting for the row after {limit:g}s")
    finally:
        pool.shutdown(wait=False)  # a write still waiting ends with the holder's session
    return time.monotonic() - started, failed


def test_the_loaded_policies_row_held_by_another_session_is_waited_for_one_lock_wait(
    pg_url: str,
) -> None:
    """A stopping daemon removes its loaded-policies row, and its heartbeat rewrites it:
    with the row held (an open psql), each gives up at `[store] lock_timeout`, as every
    other write of the stop does, not after the store's minute or never."""
    import psycopg
    from tests.conftest import PG_URL

    spec = parse_store_url(pg_url)
    assert isinstance(spec, PostgresStore)
    row = LoadedPolicies("d1", DAEMON, 1.0, time.time() + 60, {"receipts": "f"})
    with Ledger(dataclasses.replace(spec, lock_timeout=LOCK)) as ledger:
        rows = ledger.loaded_policies()
        rows.write(row)
        with psycopg.connect(PG_URL) as holder:
            holder.execute(f'SELECT 1 FROM "{spec.schema}".{LOADED_TABLE} FOR UPDATE')
            for write in (lambda: rows.write(row), lambda: rows.leave("d1", DAEMON, 1.0)):
                took, failed = _timed(write, LOCK + 3.0)
                assert failed is not None and "lock timeout" in str(failed), failed
                assert took < LOCK + 1.0, f"{took:.1f}s"
            holder.rollback()


def test_a_heartbeat_held_up_past_the_stop_does_not_write_the_row_again(pg_url: str) -> None:
    """The unit test's case on PostgreSQL (tests/unit/test_submit_by_loaded_policies.py):
    the beat's write, let go after the stop removed the row, rolls back."""
    with Ledger(pg_url) as ledger:
        a_beat_held_past_the_stop(ledger)


def test_a_heartbeat_whose_commit_is_held_past_the_stop_leaves_no_row(pg_url: str) -> None:
    """The unit test's case on PostgreSQL (tests/unit/test_heartbeat_commit_held.py): the
    removal meets the held row's lock and gives up; the commit, once let go, is taken back."""
    spec = parse_store_url(pg_url)
    assert isinstance(spec, PostgresStore)
    with Ledger(dataclasses.replace(spec, lock_timeout=LOCK)) as ledger:
        assert a_commit_held_past_the_stop(ledger) == []
