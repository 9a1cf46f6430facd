"""`sendledger api` and the store's event format (docs/operations.md "Upgrading"): it reads
the format again at each heartbeat, as a running daemon does. Before, it read it only at its
start: under one whose heartbeat lapsed a newer release raised the format, and it went on
serving intake and review in the old format, failing to load the newer events."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from tests.e2e.api_process import sendledger_api
from tests.e2e.daemon_kit import shared_fork_server

from ledger.application import Ledger
from ledger.event_format import EVENT_FORMAT
from ledger.stores.format_rows import format_rows_for


def test_sendledger_api_stops_at_its_next_heartbeat_on_a_newer_format(tmp_path: Path) -> None:
    with sendledger_api(tmp_path, exits=2) as (_url, folder, _emulator):
        pid = int((folder / "api.pid").read_text())
        with Ledger(f"sqlite:///{folder / 'ledger.sqlite'}") as ledger:
            # A newer release's raise, as under a server whose heartbeat lapsed.
            format_rows_for(ledger.recorder).raise_to(EVENT_FORMAT + 1, time.time())
        os.kill(pid, signal.SIGHUP)  # the reload wakes the heartbeat, which reads the format
        code, _at = shared_fork_server().exited(pid, timeout=15)
    text = (folder / "api.log").read_text(encoding="utf-8")
    line = (
        f"this store holds events of format {EVENT_FORMAT + 1}, this release reads up to "
        f"{EVENT_FORMAT}: upgrade sendledger on this host"
    )
    assert code == 2, text
    assert f"stopping: {line}" in text
    assert text.rstrip().endswith(line), text
