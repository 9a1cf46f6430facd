"""What a stop may wait for, checked against the stop timeouts (daemon/config/stop_bound.py,
docs/operations.md "Stopping"): the unit's TimeoutStopSec lives outside sendledger, so a
`daemon.stop_timeout` it cannot hold is said at start, on one line."""

from __future__ import annotations

import logging
import time

import pytest
from tests.unit.daemon_thread import serving

from daemon.config.settings import DEFAULT_STOP_TIMEOUT, settings_from_dict
from daemon.config.stop_bound import stop_store_wait, warn_unit_stop
from daemon.systemd import Notifier, timeout_stop_sec
from ledger.application import Ledger

#: What the shipped unit and `sendledger init` give (packaging/sendledger.service).
UNIT = timeout_stop_sec(DEFAULT_STOP_TIMEOUT)


@pytest.mark.parametrize(("stop", "warned"), [("35s", False), ("36s", True), ("1s", False)])
def test_a_stop_timeout_the_units_timeoutstopsec_cannot_hold_is_said_under_systemd(
    monkeypatch: pytest.MonkeyPatch, stop: str, warned: bool
) -> None:
    seconds = settings_from_dict({"daemon": {"stop_timeout": stop}}).daemon.stop_timeout
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert warn_unit_stop(seconds, UNIT) is None  # not under systemd: no unit to hold it
    monkeypatch.setenv("NOTIFY_SOCKET", "/run/systemd/notify")
    line = warn_unit_stop(seconds, UNIT)
    if not warned:
        assert line is None
        return
    assert line == (
        "daemon.stop_timeout is 36s: the unit's TimeoutStopSec must be at least 51s (the "
        "shipped unit and `sendledger init` give 50s), or systemd kills a stop still "
        "waiting (systemctl edit sendledger)"
    )


def test_the_running_daemon_says_it_at_start(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    notifier = Notifier(address="")  # no datagrams: only the start's check reads the variable
    monkeypatch.setenv("NOTIFY_SOCKET", "/nonexistent/notify")
    caplog.set_level(logging.WARNING, logger="sendledger.daemon")
    with Ledger("memory://") as ledger, serving(ledger, notifier=notifier, stop_timeout="60s"):
        for _ in range(200):
            if any("TimeoutStopSec" in r.getMessage() for r in caplog.records):
                break
            time.sleep(0.01)
    said = [r.getMessage() for r in caplog.records if "TimeoutStopSec" in r.getMessage()]
    assert said == [
        "daemon.stop_timeout is 60s: the unit's TimeoutStopSec must be at least 75s (the "
        "shipped unit and `sendledger init` give 50s), or systemd kills a stop still "
        "waiting (systemctl edit sendledger)"
    ]


def test_only_a_postgresql_store_has_lock_waits_to_hold() -> None:
    assert stop_store_wait("postgresql://u@db/mail", 5) == 35.0
    assert stop_store_wait("sqlite:///x.sqlite", 5) is None
