"""The daemon as a systemd service: SIGTERM drains, SIGHUP reloads, sd_notify speaks."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import time
from pathlib import Path

from tests.e2e.daemon_kit import RETRY_POLICY, NotifyListener, Rig, events_of, job

from testkit.relay import FaultPlan

# A drain waits at most daemon.stop_timeout (35 s by default); these drains must take far less.
STOP_LIMIT = 10.0


def _running(rig: Rig) -> None:
    """Signals before the handlers are installed would kill the process: wait for them."""
    daemon = rig.daemon
    assert daemon is not None
    rig.wait_for(lambda: "sendledger running" in daemon.stderr_text(), "the daemon to start")


def test_sigterm_with_a_send_in_flight_records_its_outcome_then_exits_0(
    tmp_path: Path,
) -> None:
    """SIGTERM while the relay holds a forwarded send (hang 2s, client timeout 1s): the
    daemon lets the call end, records its Unknown, and exits 0 within the stop limit."""
    key = "term-inflight"
    with Rig(tmp_path, plan=FaultPlan(send=["hang"]), hang_seconds=2.0, timeout="1s") as rig:
        rig.submit([job(key)])
        daemon = rig.start_daemon()
        rig.wait_for(
            lambda: bool(rig.sends(forwarded=True)), "the send to be forwarded", interval=0.02
        )
        in_flight = rig.state(key)
        started = time.monotonic()
        daemon.signal(signal.SIGTERM)
        rc = daemon.wait(STOP_LIMIT)
        took = time.monotonic() - started
        assert in_flight == "attempted", "SIGTERM came too late: the call had already ended"
        assert rc == 0, daemon.tail()
        assert took < STOP_LIMIT
        history = rig.history(key)
        # A lease renewed while the call hung is bookkeeping, not an outcome.
        types = [r["type"] for r in history if r["type"] != "LeaseRenewed"]
        assert types == ["Requested", "Attempted", "Unknown"], types
        unknown = events_of(history, "Unknown")[0]
        assert unknown["search_due_at"] is not None  # left for the next start to search
        assert "stopping" in daemon.stderr_text()
        assert rig.copies(key) == 1  # the relay forwarded it: Gmail has it


def test_sighup_keeps_last_good_policies_then_picks_up_the_fixed_folder(
    tmp_path: Path,
) -> None:
    """A broken policy file + SIGHUP: the daemon logs an error naming the file, keeps
    running on the last good policies (a new job on a good channel is still sent). The
    file fixed (now a new channel) + SIGHUP: the new channel's policy is in force."""
    with Rig(tmp_path) as rig:
        daemon = rig.start_daemon()
        _running(rig)
        broken = rig.policies_dir / "alerts.toml"
        broken.write_text('channel = "alerts"\nprovider = [unclosed\n', encoding="utf-8")
        daemon.signal(signal.SIGHUP)
        rig.wait_for(
            lambda: "policy reload failed" in daemon.stderr_text(), "the reload error in the log"
        )
        error_lines = [
            line for line in daemon.stderr_text().splitlines() if "policy reload failed" in line
        ]
        assert "alerts.toml" in error_lines[0], error_lines
        assert daemon.alive()

        # Intake refuses the broken file's channel and keeps accepting the others (docs/review.md
        # "Review": one rule in every door).
        refused = rig.cli(
            "submit", "-", stdin=json.dumps(job("hup-refused", channel="alerts")), check=False
        )
        assert refused.returncode == 2 and "alerts.toml" in refused.stderr, refused.stderr
        rig.submit([job("hup-good")])
        rig.wait_state("hup-good", "confirmed")

        rig.write_policy(
            "alerts", {**RETRY_POLICY, "from": "Alerts <alerts@shop.example>"}, name="alerts"
        )
        daemon.signal(signal.SIGHUP)
        rig.wait_for(
            lambda: "policies reloaded: alerts, receipts" in daemon.stderr_text(),
            "the fixed folder to be loaded",
        )
        rig.submit([job("hup-alert", channel="alerts")])
        rig.wait_state("hup-alert", "confirmed")
        assert daemon.terminate() == 0, daemon.tail()

        confirmed = events_of(rig.history("hup-alert"), "Confirmed")[0]
        assert confirmed["policy"] == "alerts"
        assert rig.copies("hup-good") == 1
        assert rig.copies("hup-alert") == 1
        accepted = {e["message_id"]: e for e in rig.emulator.accepted()}
        assert "alerts@shop.example" in accepted[rig.message_id("hup-alert")]["from"]


def _has_open(pid: int, path: Path) -> bool:
    """Whether process `pid` holds `path` open (Linux: /proc/PID/fd)."""
    folder = Path(f"/proc/{pid}/fd")
    try:
        return any(os.readlink(folder / fd) == str(path) for fd in os.listdir(folder))
    except OSError:
        return False


def test_a_sighup_during_start_up_reloads_once_the_daemon_runs(tmp_path: Path) -> None:
    """SIGHUP while the daemon is still starting (its policies read, its store being
    opened: held here by another process's exclusive lock) is not lost: once it runs, it
    reloads, and a channel added meanwhile is in force."""
    with Rig(tmp_path) as rig:
        rig.submit([job("before")])  # the store exists: opening it reads it
        store = rig.dir / "ledger.sqlite"
        holder = sqlite3.connect(store, isolation_level=None)
        try:
            holder.execute("PRAGMA locking_mode = EXCLUSIVE")
            holder.execute("BEGIN EXCLUSIVE")  # no reader either, until the rollback
            daemon = rig.start_daemon()
            # The store is opened after the policies are read (`cmd_run`): waiting on it.
            rig.wait_for(lambda: _has_open(daemon.pid, store), "the daemon to open the store")
            rig.write_policy(
                "alerts", {**RETRY_POLICY, "from": "Alerts <alerts@shop.example>"}, name="alerts"
            )
            daemon.signal(signal.SIGHUP)
            time.sleep(0.2)  # delivered while the open still waits
            assert daemon.alive() and "sendledger running" not in daemon.stderr_text()
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        _running(rig)
        rig.wait_for(
            lambda: "policies reloaded: alerts, receipts" in daemon.stderr_text(),
            "the SIGHUP of the start-up to reload the policies",
        )
        rig.submit([job("late-alert", channel="alerts")])
        rig.wait_state("late-alert", "confirmed")
        assert daemon.terminate() == 0, daemon.tail()
        assert rig.copies("late-alert") == 1


def test_systemd_notify_ready_status_watchdog_stopping(
    tmp_path: Path, notify_socket: NotifyListener
) -> None:
    """With NOTIFY_SOCKET and WATCHDOG_USEC=200000 (as systemd sets them for Type=notify
    with WatchdogSec): READY=1 with STATUS= and MAINPID=, WATCHDOG=1 every ~0.1s while ticks
    complete, and STOPPING=1 on SIGTERM, then exit 0."""
    with Rig(tmp_path) as rig:
        rig.submit([job("notify-1")])
        daemon = rig.start_daemon(
            {"NOTIFY_SOCKET": str(notify_socket.path), "WATCHDOG_USEC": "200000"}
        )
        rig.wait_for(lambda: notify_socket.count("READY=1") == 1, "READY=1")
        rig.wait_for(lambda: notify_socket.count("WATCHDOG=1") >= 3, "WATCHDOG=1 pings")
        rig.wait_state("notify-1", "confirmed")
        assert daemon.terminate() == 0, daemon.tail()
        rig.wait_for(
            lambda: notify_socket.count("STOPPING=1") == 1, "STOPPING=1", daemon_must_live=False
        )
        ready = next(m for m in notify_socket.messages if "READY=1" in m)
        assert f"MAINPID={daemon.pid}" in ready
        assert any(line.startswith("STATUS=jobs: ") for line in ready), ready
        statuses = [line for line in notify_socket.lines() if line.startswith("STATUS=")]
        assert len(statuses) >= 3, statuses  # ready, the first periodic one, stopping
        lines = notify_socket.lines()
        assert lines.index("READY=1") < lines.index("WATCHDOG=1") < lines.index("STOPPING=1")
        # Nothing after STOPPING=1 but its own STATUS= line.
        assert all(not line.startswith("WATCHDOG=1") for line in lines[lines.index("STOPPING=1") :])


def test_systemd_notify_without_watchdog(tmp_path: Path, notify_socket: NotifyListener) -> None:
    """Without WATCHDOG_USEC the daemon sends no WATCHDOG=1 (systemd did not ask)."""
    with Rig(tmp_path) as rig:
        daemon = rig.start_daemon({"NOTIFY_SOCKET": str(notify_socket.path)})
        rig.wait_for(lambda: notify_socket.count("READY=1") == 1, "READY=1")
        time.sleep(0.6)
        assert daemon.terminate() == 0, daemon.tail()
        rig.wait_for(
            lambda: notify_socket.count("STOPPING=1") == 1, "STOPPING=1", daemon_must_live=False
        )
        assert notify_socket.count("WATCHDOG=1") == 0


def test_sigterm_starts_no_new_sends(tmp_path: Path) -> None:
    """A drain finishes the calls in flight; it must not start new ones. 12 due jobs,
    concurrency 2, every send held past the 1s client timeout: after SIGTERM at most the
    2 calls already in flight may reach the relay, and the daemon exits in a few seconds.

    Found failing against the first engine (10 of the 12 sends started after SIGTERM: the
    running tick kept dispatching its whole batch); Engine.stop() now guards each step."""
    with Rig(
        tmp_path, plan=FaultPlan(send="hang"), hang_seconds=2.0, timeout="1s", concurrency=2
    ) as rig:
        keys = [f"drain-{n:02d}" for n in range(12)]
        rig.submit([job(key) for key in keys])
        daemon = rig.start_daemon()
        rig.wait_for(lambda: bool(rig.sends()), "the first send", interval=0.02)
        started = time.monotonic()
        daemon.signal(signal.SIGTERM)
        at_signal = len(rig.sends())
        rc = daemon.wait(60)
        took = time.monotonic() - started
        assert rc == 0, daemon.tail()
        sent_after = len(rig.sends()) - at_signal
        # Every claimed job got its outcome recorded (nothing left `attempted`).
        assert all(rig.state(key) != "attempted" for key in keys)
        assert sent_after <= 2, f"{sent_after} new provider calls started after SIGTERM"
        assert took < STOP_LIMIT / 2, f"drain took {took:.1f}s"
