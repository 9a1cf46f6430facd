"""Running `sendledger demo --json` as a process and checking what every demo promises,
whatever the provider: every job settled with its verdict ok, one copy per confirmed job,
and the irreversible payouts never sent twice."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

SENDLEDGER = str(Path(sys.executable).parent / "sendledger")


def run_demo(*args: str, timeout: float) -> tuple[dict[str, Any], subprocess.CompletedProcess[str]]:
    """The demo's JSON summary (checked) and the finished process."""
    result = subprocess.run(
        [SENDLEDGER, "demo", "--json", *args], capture_output=True, text=True, timeout=timeout
    )
    assert result.returncode == 0, result.stderr[-3000:]
    # --json: stdout is the JSON summary and nothing else (the commentary is on stderr).
    summary: dict[str, Any] = json.loads(result.stdout)
    jobs = summary["jobs"]
    assert len(jobs) == 12
    assert all(job["verdict"] == "ok" for job in jobs), jobs
    assert all(job["state"] in ("confirmed", "review") for job in jobs), jobs
    assert all(job["copies"] == 1 for job in jobs if job["state"] == "confirmed"), jobs
    # The irreversible channel never resends on its own: at most one copy each. (A second
    # attempt is allowed only after a definite refusal such as a 429, when nothing was sent;
    # which job meets which of the relay's faults depends on the order of concurrent sends.)
    payouts = [job for job in jobs if job["channel"] == "payouts"]
    assert all(job["copies"] <= 1 and job["attempts"] <= 2 for job in payouts), payouts
    return summary, result
