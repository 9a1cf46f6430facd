"""Soak: 200 jobs through one daemon process while the relay draws a random fault for every
send. Every job must settle, every confirmed job must have exactly one copy in the
emulator's acceptance log, and no Message-ID may ever appear twice there.

Emulator results, not Gmail's: the mailbox here is the bundled emulator.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from tests.e2e.daemon_kit import RETRY_POLICY, Rig, events_of, job

from testkit.relay import FaultPlan, Mode

SEED = 20260101
JOBS = 200
SEND_WEIGHTS: dict[Mode, float] = {
    "pass": 5,
    "drop-response": 2,
    "fail-before-forward": 2,
    "500-after-forward": 1,
    "503": 1,
    "429": 1,
    "hang": 1,
}
# Windows kept small but always longer than the 0.3s index lag (0.6s + 0.3s > 0.3s).
SOAK_POLICY: dict[str, Any] = {
    **RETRY_POLICY,
    "search_after": "600ms",
    "search_interval": "300ms",
    "confirm_misses": 2,
    "max_attempts": 5,
    "retry_backoff": "100ms",
    "retry_backoff_max": "500ms",
}
SETTLE_LIMIT = 90.0


@pytest.mark.slow
def test_soak_random_faults_every_job_settles_with_one_copy(tmp_path: Path) -> None:
    plan = FaultPlan.random(SEED, SEND_WEIGHTS)
    with Rig(
        tmp_path,
        lag=0.3,
        plan=plan,
        hang_seconds=1.0,  # longer than the client's timeout: a real hang
        timeout="700ms",
        retry_after=0.2,
        concurrency=8,
        quota=100_000.0,
        policies={"receipts": SOAK_POLICY},
    ) as rig:
        keys = [f"soak-{n:03d}" for n in range(JOBS)]
        created = rig.submit(
            [job(key, to=f"customer{n}@example.com") for n, key in enumerate(keys)]
        )
        assert len(created) == JOBS and all(c["created"] for c in created)
        started = time.monotonic()
        daemon = rig.start_daemon()
        rig.wait_for(
            lambda: sum(rig.ledger.counts(("confirmed", "review")).values()) == JOBS,
            f"all {JOBS} jobs to settle",
            timeout=SETTLE_LIMIT,
            interval=0.25,
        )
        elapsed = time.monotonic() - started
        assert daemon.terminate() == 0, daemon.tail()

        rows = {row.key: row for row in rig.rows()}
        assert sorted(rows) == keys, "jobs lost or invented"
        copies = Counter(entry["message_id"] for entry in rig.emulator.accepted())
        histories = {key: rig.history(key) for key in keys}

        duplicates = {mid: n for mid, n in copies.items() if n > 1}
        assert duplicates == {}, f"DUPLICATES in the acceptance log: {duplicates}"
        assert set(copies) <= {row.message_id for row in rows.values()}

        wrong: list[str] = []
        for key, row in rows.items():
            n = copies.get(row.message_id, 0)
            if row.state == "confirmed" and n != 1:
                wrong.append(f"{key}: confirmed with {n} copies")
            elif row.state == "review":
                reasons = [e["reason"] for e in events_of(histories[key], "Escalated")]
                if reasons != ["max-attempts"] or n > 1:
                    wrong.append(f"{key}: review {reasons} with {n} copies")
            elif row.state not in ("confirmed", "review"):
                wrong.append(f"{key}: {row.state}")
        assert wrong == [], "\n".join(wrong)

        # Invariant 1 in the large: one provider call per Attempted event, no more.
        attempted = sum(
            1 for history in histories.values() for e in history if e["type"] == "Attempted"
        )
        send_modes = Counter(entry["mode"] for entry in rig.sends())
        outcomes = Counter(
            f"{e['type']}: {str(e['reason'])[:60]}"
            for history in histories.values()
            for e in history
            if e["type"] in ("Unknown", "Rejected")
        )
        # A call can fail before the relay logs it (e.g. a connection refused under load);
        # what may never happen is a call the ledger has no Attempted event for.
        assert sum(send_modes.values()) <= attempted, outcomes
        assert set(send_modes) == set(SEND_WEIGHTS), send_modes  # every fault was exercised

        via = Counter(
            str(e["via"]) for history in histories.values() for e in events_of(history, "Confirmed")
        )
        states = Counter(row.state for row in rows.values())
        searches = sum(len(events_of(h, "SearchedMiss")) for h in histories.values())
        print(
            f"\nsoak: {JOBS} jobs settled in {elapsed:.1f}s (seed {SEED}); states {dict(states)}; "
            f"confirmed via {dict(via)}; {attempted} provider calls, send faults "
            f"{dict(send_modes)}; {searches} empty searches; outcomes {dict(outcomes)}; "
            f"{sum(copies.values())} copies accepted, 0 duplicates"
        )
        assert elapsed < SETTLE_LIMIT
