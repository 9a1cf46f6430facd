"""`sendledger api` killed with `kill -9` on PostgreSQL, as processes (docs/operations.md
"How fast an API server is replaced"): its row stops counting as a running server's once
the server has seen its session end, where it counted the rest of its heartbeat (60 s:
an upgrade waited, exit 3, and `admin copy-store` was refused that long); and the same
command started again serves within seconds."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx
import pytest
from tests.e2e.daemon_kit import PostgresRig, shared_fork_server
from tests.integration.api_kit import free_port

from daemon.service_layer.copy_store import running_on
from ledger.application import Ledger

pytestmark = pytest.mark.postgres


def _serving(url: str, log: Path, limit: float) -> float:
    """Seconds until `url` answers its /healthz, at most `limit`."""
    started = time.monotonic()
    while time.monotonic() - started < limit:
        try:
            if httpx.get(url + "/healthz", timeout=1).status_code in (200, 503):
                return time.monotonic() - started
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise AssertionError(log.read_text(encoding="utf-8")[-2000:])


def _api_running(ledger: Ledger) -> bool:
    return any(line.startswith("api ") for line in running_on(ledger))


def test_a_killed_api_server_counts_no_longer_and_its_restart_serves_at_once(
    pg_url: str, tmp_path: Path
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = shared_fork_server()
    with PostgresRig(tmp_path, pg_url, api_port=port) as rig, Ledger(pg_url) as ledger:
        argv = ["--config", str(rig.config), "api"]
        first = server.start(argv, tmp_path, tmp_path / "first.log")
        try:
            _serving(url, tmp_path / "first.log", 60)
            assert _api_running(ledger)
        finally:
            os.kill(first, signal.SIGKILL)
        killed = time.monotonic()
        while _api_running(ledger):
            # 60 s before; 0.08 s measured
            assert time.monotonic() - killed < 10, running_on(ledger)
            time.sleep(0.05)
        second = server.start(argv, tmp_path, tmp_path / "second.log")
        try:
            assert _serving(url, tmp_path / "second.log", 30) < 10  # 0.4 s measured
            assert _api_running(ledger)
        finally:
            os.kill(second, signal.SIGTERM)
            deadline = time.monotonic() + 30
            while _api_running(ledger) and time.monotonic() < deadline:
                time.sleep(0.1)
