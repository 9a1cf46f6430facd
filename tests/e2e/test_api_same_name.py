"""Two `sendledger api` processes of one `daemon.name` on one store: the second is
refused, exit 3, one line, and writes nothing; a daemon of the same config runs beside
an API server as before (docs/configuration.md "Daemon names"). Before, the second
declared its event format and wrote the heartbeat row of the name over the first's: the
first's stop removed what the second had written, and `admin copy-store` or an upgrade
then took a store an API server still wrote to for one nothing ran on."""

from __future__ import annotations

import socket
import sqlite3
from pathlib import Path

import httpx
from tests.e2e.api_process import sendledger_api
from tests.e2e.conftest import forked_sendledger

from ledger.application import Ledger


def _rows(store: Path) -> list[tuple[object, ...]]:
    with sqlite3.connect(store) as conn:
        return [
            *conn.execute("SELECT holder, format, at FROM sendledger_event_format ORDER BY 1"),
            *conn.execute("SELECT name, kind, loaded_at FROM sendledger_loaded_policies"),
        ]


def test_a_second_api_server_of_the_name_is_refused_and_writes_nothing(tmp_path: Path) -> None:
    with sendledger_api(tmp_path) as (url, folder, _emulator):
        config = str(folder / "sendledger.toml")
        before = _rows(folder / "ledger.sqlite")
        with socket.socket() as spare:
            spare.bind(("127.0.0.1", 0))
            port = spare.getsockname()[1]
        second = forked_sendledger(
            "--config", config, "api", "--listen", f"127.0.0.1:{port}", timeout=30
        )
        assert second.returncode == 3, second.stderr
        name = socket.gethostname()
        assert second.stderr.splitlines()[-1] == (
            f"sendledger: daemon.name {name!r} is held by another running sendledger api on "
            f"{folder / 'ledger.sqlite'}: stop it, or give this sendledger api another name"
        ), second.stderr
        assert _rows(folder / "ledger.sqlite") == before  # its declaration, its heartbeat
        assert httpx.get(url + "/healthz").status_code == 200

        # A daemon of the same config holds the name itself, not the API server's.
        with Ledger(f"sqlite:///{folder / 'ledger.sqlite'}") as ledger:
            ledger.hold_identity(name).release()
