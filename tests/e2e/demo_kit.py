"""Running `sendledger demo --json` as a process and checking what every demo promises,
whatever the provider: every job settled with its verdict ok, one copy per confirmed job,
the irreversible payouts never sent twice, a job in review shown as waiting for a human, one
taken out of review by the scripted operator, a story that tells the method (each job's
line what was observed and what was done, its final state said once, no log line among
them: those are in the daemon.log it names), and a kept folder on which every command the
demo suggests runs.

The demo and the commands it suggests are forked from the test worker's fork server
(tests/e2e/fork_server.py), which imported sendledger once: each a process of its own
with its own environment, stdout, stderr and exit code, as the console script would be,
without an interpreter's start and a second or more of imports each."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.e2e.conftest import forked_sendledger as sendledger

SENDLEDGER = str(Path(sys.executable).parent / "sendledger")


def run_demo(*args: str, timeout: float) -> tuple[dict[str, Any], subprocess.CompletedProcess[str]]:
    """The demo's JSON summary (checked) and the finished process."""
    result = sendledger("demo", "--json", *args, timeout=timeout)
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
    # which job meets which of the relay's faults depends on the order of concurrent sends;
    # the one a human resent may have one attempt more.)
    resent = summary["operator"]["key"] if summary["operator"] else None
    payouts = [job for job in jobs if job["channel"] == "payouts"]
    for job in payouts:
        assert job["copies"] <= 1, payouts
        assert job["attempts"] <= (3 if job["key"] == resent else 2), payouts
    _check_humans(jobs, summary["operator"])
    _check_story(summary, result.stderr)
    _check_kept_folder(Path(summary["folder"]), summary["commands"])
    return summary, result


#: A log line (`2026-12-01T09:00:00 WARNING sendledger.engine: ...`): never in the story.
LOG_LINE = re.compile(r"^\S+ (DEBUG|INFO|WARNING|ERROR|CRITICAL) +[\w.]+: ", re.M)


def _check_story(summary: dict[str, Any], commentary: str) -> None:
    """Each job told once it settled, its final state said once: a confirmed job's lines
    say `confirmed` once, a job in review ends waiting for a human; the steps are joined
    by `->`; the log lines are in the file the intro names, not in the story."""
    stories: dict[str, list[str]] = summary["stories"]
    resent = summary["operator"]["key"] if summary["operator"] else None
    for job in summary["jobs"]:
        lines = stories[job["key"]]
        assert lines and len(lines) <= (2 if job["key"] == resent else 1), (job, lines)
        told = " ".join(lines)
        if job["state"] == "confirmed":
            assert told.count("confirmed") == 1, lines  # once, however it was confirmed
        else:
            assert lines[-1].endswith("waiting for a human"), lines
        assert "copies to be counted again" not in told
    # A lost answer in the receipts channel: on Gmail the mailbox's history is read at
    # once; on the others the daemon waits out the search index.
    told_unknown = ("outcome unknown -> read the mailbox's history", "outcome unknown -> waited")
    gmail = summary["against"].startswith("bundled Gmail")
    assert any(told_unknown[0 if gmail else 1] in " ".join(v) for v in stories.values()), stories
    assert not LOG_LINE.search(commentary), LOG_LINE.search(commentary)
    log = Path(summary["folder"]) / "daemon.log"
    assert f"log           {log}" in commentary
    assert LOG_LINE.search(log.read_text(encoding="utf-8")), "daemon.log holds the log lines"


def _check_humans(jobs: list[dict[str, Any]], operator: dict[str, Any] | None) -> None:
    """Waiting for a human is never shown as done; the operator's job shows who settled it."""
    for job in jobs:
        if job["state"] == "review":
            assert job["outcome"] == "WAITING FOR A HUMAN", job
        else:
            assert job["outcome"].startswith("confirmed"), job
    if operator is None:  # only when no job needed a human this run
        assert not any(job["state"] == "review" for job in jobs), jobs
        return
    assert operator["check"] in (0, 1) and operator["decision"] in ("sent", "resend"), operator
    resolved = next(job for job in jobs if job["key"] == operator["key"])
    assert resolved["state"] == "confirmed" and resolved["copies"] == 1, resolved
    expected = {"sent": "confirmed by a human", "resend": "confirmed, resent by a human"}
    assert resolved["outcome"] == expected[operator["decision"]], resolved


def _check_kept_folder(folder: Path, commands: list[str]) -> None:
    """The store and config are left behind, and every suggested command runs on them."""
    assert (folder / "ledger.sqlite").is_file() and (folder / "sendledger.toml").is_file()
    assert commands
    for command in commands:
        argv = shlex.split(command)
        assert argv[0] == SENDLEDGER, command
        done = sendledger(*argv[1:])
        assert done.returncode == 0, f"{command}: {done.stderr}"
