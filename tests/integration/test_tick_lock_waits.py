"""A tick's waits for rows another session holds, measured on PostgreSQL
(daemon/config/tick_bound.py, docs/operations.md "Running under systemd"): a tick whose
scope round meets held rows waits its lock waits before it ends, and the age past which
the watchdog and `/healthz` call the scheduler stuck is above them."""

from __future__ import annotations

import dataclasses
import time
from datetime import UTC, datetime

import pytest
from tests.integration.receipts_daemon import receipts_service

from daemon.config.settings import settings_from_dict
from daemon.config.tick_bound import tick_store_wait
from daemon.doubles.fake_provider import FakeProvider
from daemon.doubles.fake_time import FakeClock
from daemon.runtime import Daemon
from ledger.stores.scopes import DAEMONS_TABLE, SCOPES_TABLE
from ledger.stores.url import PostgresStore, parse_store_url

pytestmark = pytest.mark.postgres

#: `[store] lock_timeout` of the measured daemon, in whole seconds.
LOCK = 2


def test_a_tick_meeting_held_scope_rows_waits_for_them_within_its_limit(pg_url: str) -> None:
    """Another session holds the scope leases and the heartbeat (a long transaction, an
    open psql) when the round renews them: the tick waits a whole lock wait and ends.
    Its age then is a multiple of `store.lock_timeout`, not of the tick, and a limit of a
    minute is below it once `lock_timeout` is long enough."""
    import psycopg
    from tests.conftest import PG_URL

    spec = parse_store_url(pg_url)
    assert isinstance(spec, PostgresStore)
    spec = dataclasses.replace(spec, lock_timeout=LOCK)
    settings = settings_from_dict(
        {
            "store": {"url": pg_url, "lock_timeout": f"{LOCK}s"},
            "daemon": {"tick": "1s", "name": "d1", "stop_timeout": "30s"},
        }
    )
    clock = FakeClock(datetime.now(UTC))
    with receipts_service(settings, spec, clock, FakeProvider("fake", clock=clock)) as (_, service):
        daemon = Daemon(service, settings.daemon.tick)
        try:
            daemon.tick()  # the scope taken, the heartbeat written
            with psycopg.connect(PG_URL) as holder:
                for table in (SCOPES_TABLE, DAEMONS_TABLE):
                    held = holder.execute(
                        f'SELECT 1 FROM "{spec.schema}".{table} FOR UPDATE'
                    ).fetchall()
                    assert held, f"{table}: no row to hold"
                clock.advance(21)  # past a third of the scope lease (60 s): renewal due
                started = time.monotonic()
                daemon.tick()
                took = time.monotonic() - started
                holder.rollback()
        finally:
            service.engine.stop()
            service.close()
    waits = tick_store_wait(settings.store)
    assert waits is not None
    assert LOCK <= took <= waits, f"the tick took {took:.1f}s; lock wait {LOCK}s, bound {waits:g}s"
    assert daemon.tick_limit >= waits
