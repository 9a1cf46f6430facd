"""Fast recovery after a restart: a daemon's name (`daemon.name`) is held in the store
while it lives; at start-up it treats its own earlier claims as Unknown at once (on
PostgreSQL, whose name lock can end under a live daemon, at their deadline), while
another daemon's claims wait for their deadline (docs/architecture.md, invariant 6).

The daemons are `sendledger run` processes; copies are counted in the emulator's
acceptance log only (emulator results, not Gmail's).
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
from tests.e2e.daemon_kit import PostgresRig, Rig, events_of, job

from daemon.engine.recover import OWN_REASON, REASON
from ledger.display import iso
from testkit.relay import FaultPlan


def _killed_during_a_hung_send(rig: Rig, key: str, name: str) -> None:
    """Submit `key`, start a daemon named `name`, kill -9 it while the relay holds the reply
    to its send (the emulator has the message), then let the relay pass everything."""
    rig.submit([job(key)])
    daemon = rig.start_daemon({"SENDLEDGER_DAEMON__NAME": name})
    rig.wait_for(
        lambda: any(e["upstream_status"] == 200 for e in rig.sends(forwarded=True)),
        "the hung send to reach the emulator",
    )
    assert daemon.kill9() == -signal.SIGKILL
    assert rig.types(key) == ["Requested", "Attempted"]
    rig.relay.set_plan(FaultPlan())


def test_kill9_during_a_hung_send_is_confirmed_within_seconds_of_the_restart(
    tmp_path: Path,
) -> None:
    """The deadline is 50 s away (timeout 20 s + grace 30 s); the restarted daemon of the
    same name does not wait for it."""
    key = "hung-1"
    name = {"SENDLEDGER_DAEMON__NAME": "host-a"}
    with Rig(
        tmp_path,
        plan=FaultPlan(send=["hang"]),
        hang_seconds=60.0,
        timeout="20s",
        deadline_grace="30s",
    ) as rig:
        _killed_during_a_hung_send(rig, key, "host-a")
        assert rig.history(key)[1]["daemon"] == "host-a"
        took = _recovered_at_once(rig, key, name)
        assert events_of(rig.history(key), "Confirmed")[0]["via"] == "search"
        assert rig.copies_in_log_file(rig.message_id(key)) == 1
        assert took < 20, f"confirmed {took:.1f}s after the restart"
        print(f"\nrecovery: confirmed {took:.1f}s after the restart (deadline was 50s away)")


@pytest.mark.postgres
def test_kill9_then_a_restart_on_postgresql_on_this_host_recovers_the_claim_at_once(
    tmp_path: Path, pg_url: str
) -> None:
    """The deadline is 10 s after the claim (timeout 5 s + grace 5 s), but the name's
    heartbeat names the killed process, gone from this host: the restarted daemon of the
    same name takes its claim at once, as on SQLite (docs/configuration.md "Daemon
    names"), and one copy is sent. Before the heartbeat named its process, the restart
    waited for the deadline (about 11 s to Confirmed)."""
    key = "hung-pg"
    hung = {"plan": FaultPlan(send=["hang"]), "hang_seconds": 60.0}
    with PostgresRig(tmp_path, pg_url, timeout="5s", deadline_grace="5s", **hung) as rig:
        _killed_during_a_hung_send(rig, key, "host-a")
        took = _recovered_at_once(rig, key, {"SENDLEDGER_DAEMON__NAME": "host-a"})
        assert took < 9, f"confirmed {took:.1f}s after the restart (deadline 10s away)"
        print(f"\nrecovery on PostgreSQL: confirmed {took:.1f}s after the restart")


def _recovered_at_once(rig: Rig, key: str, name: dict[str, str]) -> float:
    """A daemon of the killed one's name restarted: it takes the claim as its own at
    once, and the search settles it with one copy. The seconds from its start to the
    job settled."""
    restarted = time.monotonic()
    second = rig.start_daemon(name)
    rig.wait_settled([key], timeout=40)
    took = time.monotonic() - restarted
    assert second.terminate() == 0, second.tail()
    history = rig.history(key)
    assert [r["type"] for r in history] == ["Requested", "Attempted", "Unknown", "Confirmed"]
    assert events_of(history, "Unknown")[0]["reason"] == OWN_REASON
    assert rig.copies(key) == 1 and len(rig.sends()) == 1
    return took


def _recovered_at_the_deadline(rig: Rig, key: str, name: str) -> float:
    """A daemon named `name` started after `key`'s claimant was killed: the claim is
    recovered at its deadline, as another daemon's, and one copy is sent. The seconds
    from its start to the job settled."""
    deadline = rig.ledger.get_job(key).due_at
    assert deadline is not None
    started = time.monotonic()
    second = rig.start_daemon({"SENDLEDGER_DAEMON__NAME": name})
    rig.wait_settled([key], timeout=40)
    took = time.monotonic() - started
    assert second.terminate() == 0, second.tail()
    history = rig.history(key)
    assert [r["type"] for r in history][-2:] == ["Unknown", "Confirmed"]
    unknown = events_of(history, "Unknown")[0]
    assert unknown["reason"] == REASON  # at the deadline, not at the start-up
    assert unknown["at"] >= iso(deadline)
    assert rig.copies(key) == 1
    return took


def test_another_daemons_claim_waits_for_its_deadline(tmp_path: Path) -> None:
    key = "hung-2"
    with Rig(
        tmp_path,
        plan=FaultPlan(send=["hang"]),
        hang_seconds=30.0,
        # The deadline is 3 s after the claim: host-a is killed well within the timeout
        # (once the send reached the emulator), host-b starts at once, well before it.
        timeout="2s",
        deadline_grace="1s",
    ) as rig:
        _killed_during_a_hung_send(rig, key, "host-a")
        _recovered_at_the_deadline(rig, key, "host-b")


def test_two_live_daemons_with_one_name_are_refused(tmp_path: Path) -> None:
    name = {"SENDLEDGER_DAEMON__NAME": "host-a"}
    with Rig(tmp_path) as rig:
        first = rig.start_daemon(name)
        rig.wait_for(lambda: "sendledger running" in first.stderr_text(), "the daemon to run")
        refused = rig.cli("run", env=name, check=False, timeout=30)
        assert refused.returncode == 3, refused.stderr
        assert "daemon.name 'host-a' is held by another running daemon" in refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1
        assert first.terminate() == 0, first.tail()
        # Another name, or the same name once its holder is gone (even by kill -9): see
        # tests/integration/test_store_hardening.py.
