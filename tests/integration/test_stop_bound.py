"""The stop's lock waits, measured (daemon/config/stop_bound.py, docs/operations.md
"Stopping"): another session holds every row a stopping daemon writes, and the stop must
end within the bound `stop_store_wait` computes, which `daemon.stop_timeout` is checked
against at load."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest

from ledger.application import Ledger
from ledger.stores.loaded_policies import DAEMON, LOADED_TABLE, LoadedPolicies
from ledger.stores.url import PostgresStore, parse_store_url

pytestmark = pytest.mark.postgres

#: `[store] lock_timeout` of the measured daemon: the bound is a whole number of these.
LOCK = 1
#: What the stop may take beyond its lock waits: the threads' joins and the statements
#: that do not wait, on a machine shared with other tests.
SLACK = 1.0


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
