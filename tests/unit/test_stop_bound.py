"""What a stop may wait for, checked against the stop timeouts (daemon/config/stop_bound.py,
docs/operations.md "Stopping"): the unit's TimeoutStopSec lives outside sendledger, so the
stop asks systemd itself for the time its `daemon.stop_timeout` needs."""

from __future__ import annotations

import logging
import socket
import time
from pathlib import Path

import pytest
from tests.unit.daemon_thread import serving

from daemon.config.stop_bound import stop_store_wait
from daemon.systemd import Notifier, timeout_stop_sec
from ledger.application import Ledger


def test_the_stop_asks_systemd_for_its_own_time_and_the_start_warns_of_nothing(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    """A `stop_timeout` longer than the unit's TimeoutStopSec (50 s) allows: the stop's
    STOPPING=1 carries EXTEND_TIMEOUT_USEC, `stop_timeout` and the exit's margin, so
    systemd waits for the daemon's own bounded stop instead of killing it at
    TimeoutStopSec (sd_notify(3), systemd 236 and later). Nothing to say at start: no
    unit to raise, and no line repeated at every start to an operator who read it."""
    path = tmp_path / "notify.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    server.bind(str(path))
    server.settimeout(5)
    monkeypatch.setenv("NOTIFY_SOCKET", str(path))
    caplog.set_level(logging.INFO, logger="sendledger.daemon")
    notifier = Notifier(str(path))
    try:
        with Ledger("memory://") as ledger, serving(ledger, notifier=notifier, stop_timeout="60s"):
            time.sleep(0.2)
        stopping: list[str] = []
        while not stopping:
            lines = server.recv(4096).decode().splitlines()
            stopping = lines if "STOPPING=1" in lines else []
    finally:
        notifier.close()
        server.close()
    assert f"EXTEND_TIMEOUT_USEC={timeout_stop_sec(60) * 1_000_000}" in stopping
    assert timeout_stop_sec(60) == 75
    assert not [r.getMessage() for r in caplog.records if "TimeoutStopSec" in r.getMessage()]


def test_only_a_postgresql_store_has_lock_waits_to_hold() -> None:
    assert stop_store_wait("postgresql://u@db/mail", 5) == 30.0
    assert stop_store_wait("sqlite:///x.sqlite", 5) is None
