"""Starts of a running daemon's name refused at once on PostgreSQL, as processes: a start
declares its event format only once it holds its name (docs/operations.md "Upgrading"),
so a refused one writes nothing to take back, and the running daemon's declaration is the
row whatever the order of the refusals. Before, each start declared at its open, put the
row it replaced back at its refusal (only over its own), and of two at once the second
put back the first's declaration in place of the running daemon's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest
import tests.conftest as conftest
from tests.e2e.daemon_kit import DaemonProcess, PostgresRig

from ledger.application import Ledger
from ledger.event_format import check_event_format
from ledger.stores.format_rows import FORMAT_TABLE, format_rows_for
from ledger.stores.loaded_policies import DAEMON

pytestmark = pytest.mark.postgres


def test_two_starts_of_a_running_name_refused_at_once_leave_its_declaration(
    pg_url: str, tmp_path: Path
) -> None:
    with PostgresRig(tmp_path, pg_url, daemon_extra='name = "a"') as rig, Ledger(pg_url) as running:
        # The running daemon: its name held, its declaration the row of its name.
        held = running.hold_identity("a")
        try:
            check_event_format(running, server=(DAEMON, "a"))
            rows = format_rows_for(running.recorder)
            before = rows.rows()
            assert before["daemon a"] == running.format_declaration
            recorder: Any = running.recorder
            table = f'"{recorder.datastore.schema}".{FORMAT_TABLE}'
            # An open psql holding the row: a start that writes it waits there (its
            # declaration, its put-back), one that writes nothing is refused at once.
            with psycopg.connect(conftest.PG_URL) as held_row:
                held_row.execute(f"SELECT * FROM {table} WHERE holder = 'daemon a' FOR UPDATE")
                starts = [DaemonProcess(rig, "b"), DaemonProcess(rig, "c")]
                rig.daemons.extend(starts)
                for start in starts:
                    assert start.wait(15) == 3, start.tail()
                    assert "daemon.name 'a' is held by another running daemon" in start.tail()
                held_row.rollback()
            assert rows.rows() == before
        finally:
            held.release()
