"""journald-friendly logging and the sd_notify client, without systemd."""

from __future__ import annotations

import logging
import socket
from contextlib import closing
from pathlib import Path
from types import SimpleNamespace

import pytest
from tests.unit.engine_rig import EngineRig, policy

from daemon.logs import JournalFormatter, setup_logging
from daemon.runtime import Daemon
from daemon.systemd import Notifier, under_systemd, watchdog_interval
from ledger.vocabulary import OPEN_STATES


def record(level: int, message: str) -> logging.LogRecord:
    return logging.LogRecord("sendledger.engine", level, __file__, 1, message, None, None)


@pytest.mark.parametrize(
    ("level", "prefix"),
    [
        (logging.CRITICAL, "<2>"),
        (logging.ERROR, "<3>"),
        (logging.WARNING, "<4>"),
        (logging.INFO, "<6>"),
        (logging.DEBUG, "<7>"),
    ],
)
def test_journal_lines_carry_the_priority_and_no_timestamp(level: int, prefix: str) -> None:
    line = JournalFormatter("%(levelname)s %(name)s: %(message)s").format(record(level, "hi"))
    assert line.startswith(prefix)
    assert "20" not in line.split(":")[0]  # no date before the logger name
    assert line.endswith("sendledger.engine: hi")


def test_journal_lines_stay_one_line() -> None:
    line = JournalFormatter("%(message)s").format(record(logging.ERROR, "a\nb"))
    assert "\n" not in line


def test_setup_logging_picks_the_journal_format_under_systemd(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("INVOCATION_ID", "abc")
    assert under_systemd()
    setup_logging("info")
    assert isinstance(logging.getLogger().handlers[0].formatter, JournalFormatter)
    monkeypatch.delenv("INVOCATION_ID")
    monkeypatch.delenv("JOURNAL_STREAM", raising=False)
    setup_logging("info")
    assert not isinstance(logging.getLogger().handlers[0].formatter, JournalFormatter)


def test_notifier_sends_datagrams(tmp_path: Path) -> None:
    path = tmp_path / "notify.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    server.bind(str(path))
    server.settimeout(2)
    notifier = Notifier(str(path))
    try:
        assert notifier.ready("jobs: requested 1")
        ready = server.recv(4096).decode()
        assert "READY=1" in ready.splitlines()
        assert "STATUS=jobs: requested 1" in ready.splitlines()
        assert notifier.watchdog()
        assert server.recv(4096) == b"WATCHDOG=1"
        assert notifier.stopping()
        assert server.recv(4096).decode().startswith("STOPPING=1")
    finally:
        notifier.close()
        server.close()


def test_notifier_is_a_no_op_without_a_socket_and_survives_a_vanished_one(
    tmp_path: Path,
) -> None:
    assert not Notifier("").notify("READY=1")
    gone = Notifier(str(tmp_path / "nobody-listens.sock"))
    assert gone.enabled
    assert gone.notify("READY=1") is False  # systemd gone: never an exception
    gone.close()


def test_a_notify_socket_nobody_reads_never_hangs_the_daemon(tmp_path: Path) -> None:
    """A reader that stops reading fills its queue; the next line then waits at most the
    send timeout and is dropped (before: `sendto` blocked for good, SIGTERM included)."""
    path = tmp_path / "stuck.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    server.bind(str(path))
    notifier = Notifier(str(path), send_timeout=0.05)
    try:
        assert notifier.status("line 0")
        assert not all(notifier.status(f"line {n}") for n in range(1, 10_000))  # none hung
        server.recv(4096)
        assert notifier.status("room again")
    finally:
        notifier.close()
        server.close()


def test_watchdog_interval_is_half_of_watchdog_usec(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    monkeypatch.delenv("WATCHDOG_USEC", raising=False)
    assert watchdog_interval() is None
    monkeypatch.setenv("WATCHDOG_USEC", "60000000")
    assert watchdog_interval() == 30.0
    monkeypatch.setenv("WATCHDOG_PID", "1")  # meant for another process
    assert watchdog_interval() is None


def test_the_status_line_counts_the_open_states_and_says_the_loud_warnings() -> None:
    with closing(EngineRig(policy("legal"))) as rig:
        rig.submit("legal", "k1")
        calm = SimpleNamespace(engine=rig.engine)
        assert Daemon.status_line(calm) == (  # type: ignore[arg-type]
            "jobs: " + ", ".join(f"{s} {1 if s == 'requested' else 0}" for s in OPEN_STATES)
        )
        loud = SimpleNamespace(
            engine=SimpleNamespace(
                ledger=rig.ledger,
                unreliable_providers=lambda: ["gmail"],
                open_circuits=list,
                clock=rig.clock,
                policies=SimpleNamespace(last_error="legal.toml: bad"),
            )
        )
        line = Daemon.status_line(loud)  # type: ignore[arg-type]
        assert line.endswith("; HANDLE UNRELIABLE: gmail; policy reload failed: legal.toml: bad")
