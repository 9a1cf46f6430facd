"""Two `sendledger api` servers of one name on real PostgreSQL, after a database restart
ended the first one's lock on the name (docs/operations.md "How fast an API server is
replaced"): the second takes the name, and the first, still running until its next
heartbeat asks its name, must write nothing over the second's loaded-policy row, nor
remove it at its stop."""

from __future__ import annotations

import time

import psycopg
import pytest
import tests.conftest as conftest
from tests.unit.test_scope_owners import POLICIES

from daemon.engine import PolicyHolder
from daemon.service_layer.loaded import announce_policies
from ledger.application import Ledger
from ledger.stores.identity import api_lock_name
from ledger.stores.loaded_policies import API

pytestmark = pytest.mark.postgres


def _api_rows(ledger: Ledger) -> list[float]:
    rows = ledger.loaded_policies()
    now = rows.now()
    assert now is not None
    return [row.loaded_at for row in rows.live(now) if row.kind == API and row.name == "web"]


def test_an_api_server_whose_name_a_restart_handed_on_writes_nothing_over_the_new_row(
    pg_url: str,
) -> None:
    """Before, the first server's heartbeat wrote its row over the second's (for up to a
    beat, 20 s, until it asked its name after the write and stopped), and its stop then
    removed the row it had written: the second server had no row until its own next beat.
    Each write is now made only while the writer's session holds the name."""
    with Ledger(pg_url) as first, Ledger(pg_url) as second:
        old = first.hold_identity(api_lock_name("web"))
        old_row = announce_policies(
            first, "web", PolicyHolder(lambda: POLICIES), API, held_by=old.session
        )
        try:
            [old_loaded] = _api_rows(first)
            session = old.session()
            assert session is not None and session.pid
            # A database restart, as the first server's name sees it: its session ended.
            with psycopg.connect(conftest.PG_URL, autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", (session.pid,))
            deadline = time.monotonic() + 5
            while True:
                try:
                    new = second.hold_identity(api_lock_name("web"))
                    break
                except Exception:
                    assert time.monotonic() < deadline  # the server ends it a moment after
                    time.sleep(0.02)
            new_row = announce_policies(
                second, "web", PolicyHolder(lambda: POLICIES), API, held_by=new.session
            )
            try:
                [new_loaded] = _api_rows(second)
                assert new_loaded != old_loaded
                old_row.write()  # the first server's heartbeat, before it asks its name
                assert _api_rows(second) == [new_loaded]
                old_row.stop()
                assert _api_rows(second) == [new_loaded]
            finally:
                new_row.stop()
                new.release()
        finally:
            old_row.stop()
            old.release()
