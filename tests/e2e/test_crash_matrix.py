"""The crash points x relay modes matrix: for each point where a daemon can die
(`daemon/crashpoints.py`: after-claim, after-send, after-search) and each way the send
can fail at the relay (`testkit.relay`), one job: the daemon is killed with SIGKILL at
the point, a daemon of the same name starts again, and the job must end confirmed with
exactly one copy in the emulator's acceptance log.

The deadline grace is a minute, so every cell also proves that a restarted daemon
recovers its own claim at once (no cell may wait for a deadline). Cells where the point
is never reached (after-search when the send's outcome was known) run without a crash.

Each daemon is forked from the worker's fork server (`tests/e2e/fork_server.py`, which
imported sendledger once): a real process that SIGKILL ends, without paying an
interpreter start or its imports per daemon (42 of them). Emulator results, not Gmail's.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Collection, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from tests.e2e.daemon_kit import RETRY_POLICY, DaemonProcess, Rig, events_of, job

from daemon.crashpoints import ENV as CRASH_ENV
from daemon.engine.recover import OWN_REASON
from ledger.content import parse_job
from policies.loader import load_policy_dir
from testkit.relay import FaultPlan, Mode

POINTS = ("after-claim", "after-send", "after-search")
MODES: tuple[Mode, ...] = (
    "pass",
    "drop-response",
    "fail-before-forward",
    "500-after-forward",
    "503",
    "429",
    "hang",
)
# Modes after which the send's outcome is unknown (docs/architecture.md, "Outcome
# classification": a connection closed after the request, a 5xx, a timeout): only they
# lead to a search. "fail-before-forward" is among them: the client cannot tell it from a
# lost reply. 429 is a known refusal, "pass" a known success.
UNKNOWN_OUTCOME = {"drop-response", "fail-before-forward", "500-after-forward", "503", "hang"}
POLICY: dict[str, Any] = {
    **RETRY_POLICY,
    "search_after": "500ms",
    "search_interval": "300ms",
    "retry_backoff": "100ms",
    "retry_backoff_max": "300ms",
}
#: The matrices' index lag and windows: a search runs no sooner than `search_after` after
#: the Unknown, which comes after the emulator took the copy, so every search is past the
#: lag whatever the machine's load; a cell waits out two to five such windows.
LAG = 0.1
MATRIX_POLICY: dict[str, Any] = {**POLICY, "search_after": "250ms", "search_interval": "150ms"}
#: A send refused as unavailable (a 429; on Graph a 503 with Retry-After) is due again after
#: the circuit's probe wait or the relay's Retry-After (0.3 s), the longer: the default
#: wait (1 s) would only idle the 429 cells.
MATRIX_DAEMON = 'circuit_probe_after = "300ms"\n'
CELL_LIMIT = 20.0


@pytest.fixture(scope="module")
def results() -> Iterator[dict[tuple[str, str], str]]:
    table: dict[tuple[str, str], str] = {}
    yield table
    if table:
        print("\ncrash point x relay mode -> copies, final state (crashed?)")
        for (point, mode), cell in sorted(table.items()):
            print(f"  {point:<13} {mode:<20} {cell}")


def run_cell(
    rig: Rig, point: str, mode: Mode, *, env: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """One job through one crash point and one relay mode; `env` is added to the
    daemons' environment (a provider's own variables)."""
    key = f"{point}-{mode}"
    rig.relay.set_plan(FaultPlan(send=[mode]))  # this job's first send; later sends pass
    policies = load_policy_dir(rig.policies_dir)
    sender = policies.get("receipts")
    assert sender is not None
    rig.ledger.submit(parse_job(job(key)), sender.sender)
    name = {"SENDLEDGER_DAEMON__NAME": "matrix", **(env or {})}
    first = DaemonProcess(rig, f"{key}.1", {**name, CRASH_ENV: point})
    daemons = [first]
    try:
        end = time.monotonic() + CELL_LIMIT
        while first.poll() is None and rig.state(key) not in ("confirmed", "review"):
            assert time.monotonic() < end, f"{key}: neither crashed nor settled\n{first.tail()}"
            time.sleep(0.05)
        crashed = first.poll() == -signal.SIGKILL
        if not crashed:
            assert first.terminate() == 0, first.tail()
        else:
            second = DaemonProcess(rig, f"{key}.2", name)
            daemons.append(second)
            while rig.state(key) not in ("confirmed", "review"):
                assert time.monotonic() < end, f"{key}: not settled\n{second.tail()}"
                time.sleep(0.05)
            assert second.terminate() == 0, second.tail()
    finally:
        for daemon in daemons:
            if daemon.alive():
                daemon.kill9()
    history = rig.history(key)
    return {
        "key": key,
        "crashed": crashed,
        "state": rig.state(key),
        "copies": rig.copies_in_log_file(rig.message_id(key)),
        "history": history,
    }


@pytest.mark.parametrize("point", POINTS)
def test_crash_point_by_relay_mode(
    point: str, tmp_path: Path, results: dict[tuple[str, str], str]
) -> None:
    with Rig(
        tmp_path,
        lag=LAG,
        hang_seconds=1.5,
        timeout="1s",
        deadline_grace="60s",  # recovery must not wait for a deadline
        daemon_extra=MATRIX_DAEMON,
        policies={"receipts": MATRIX_POLICY},
    ) as rig:
        wrong = matrix_row(rig, point, MODES, UNKNOWN_OUTCOME, results)
        assert wrong == [], "\n".join(wrong)


def matrix_row(
    rig: Rig,
    point: str,
    modes: Iterable[Mode],
    unknown_outcome: Collection[str],
    results: dict[tuple[str, str], str],
    *,
    env: Mapping[str, str] | None = None,
) -> list[str]:
    """Every mode's cell at one crash point: what went wrong, one line each (none: each
    job confirmed with one copy, crashed exactly where the point is reached, and a crashed
    daemon's own claim recovered at start-up). `unknown_outcome`: the modes after which the
    provider cannot tell the send's outcome (only they reach after-search)."""
    wrong: list[str] = []
    for mode in modes:
        cell = run_cell(rig, point, mode, env=env)
        types = [r["type"] for r in cell["history"]]
        via = [str(e["via"]) for e in events_of(cell["history"], "Confirmed")]
        results[(point, mode)] = (
            f"{cell['copies']} copy, {cell['state']} via {'/'.join(via)}, "
            f"{types.count('Attempted')} attempts"
            f"{' (crashed)' if cell['crashed'] else ' (point not reached)'}"
        )
        expect_crash = point != "after-search" or mode in unknown_outcome
        if cell["state"] != "confirmed" or cell["copies"] != 1:
            wrong.append(f"{cell['key']}: {cell['state']}, {cell['copies']} copies {types}")
        if cell["crashed"] != expect_crash:
            wrong.append(f"{cell['key']}: crashed={cell['crashed']} {types}")
        unknowns = [str(e["reason"]) for e in events_of(cell["history"], "Unknown")]
        if cell["crashed"] and point != "after-search" and OWN_REASON not in unknowns:
            wrong.append(f"{cell['key']}: own claim not recovered at start-up: {unknowns}")
    return wrong
