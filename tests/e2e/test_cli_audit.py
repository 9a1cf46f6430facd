"""`sendledger audit` and `review list/resolve` through the console script."""

from __future__ import annotations

import csv
import io
import json
from typing import Any

from ledger.application import Ledger
from ledger.decision_types import Review
from ledger.vocabulary import EscalationReason, PolicyRef


def submit_three(cli: Any) -> None:
    jobs = [
        {
            "channel": "receipts",
            "key": f"audit-{i}",
            "to": "a@example.com",
            "subject": "s",
            "body": f"b{i}",
        }
        for i in range(3)
    ]
    result = cli.run("submit", "--json", "-", stdin=json.dumps(jobs))
    assert result.code == 0, result.stderr


def escalate(cli: Any, key: str) -> None:
    review = Review(PolicyRef("receipts", "f"), EscalationReason.UNKNOWN_OUTCOME)
    with Ledger(f"sqlite:///{cli.root / 'ledger.sqlite'}") as ledger:
        ledger.update(key, lambda j: j.escalate(review, detail="test", at=ledger.clock()))


def test_audit_filters_and_formats(cli: Any) -> None:
    submit_three(cli)
    escalate(cli, "audit-1")

    lines = cli.run("audit", "--format", "json", "--state", "requested").stdout.splitlines()
    assert [json.loads(line)["key"] for line in lines] == ["audit-0", "audit-2"]
    # --json, as every other read command takes it, is --format json.
    assert cli.run("audit", "--json", "--state", "requested").stdout.splitlines() == lines

    table = cli.run("audit").stdout
    assert all(f"audit-{i}" in table for i in range(3))

    rows = list(csv.DictReader(io.StringIO(cli.run("audit", "--format", "csv").stdout)))
    assert [r["state"] for r in rows] == ["requested", "review", "requested"]

    assert cli.run("audit", "--format", "json", "--channel", "other").stdout == ""
    assert cli.run("audit", "--format", "json", "--since", "1h").stdout.count("\n") == 3
    assert cli.run("audit", "--format", "json", "--until", "2000-01-01").stdout == ""

    events = cli.run("audit", "--event", "Escalated", "--format", "json").stdout.splitlines()
    assert [json.loads(e)["key"] for e in events] == ["audit-1"]
    requested = cli.run("audit", "--event", "Requested", "--format", "json", "--state", "review")
    assert [json.loads(e)["key"] for e in requested.stdout.splitlines()] == ["audit-1"]


def test_csv_lines_end_as_csv_lines_do(cli: Any) -> None:
    # The writer's CR LF met the guard under stdout, which escapes a CR: every line ended
    # with the four characters `\x0d`, and a spreadsheet's last column was `updated\x0d`.
    submit_three(cli)
    result = cli.run("audit", "--format", "csv")
    assert result.code == 0, result.stderr
    assert "\\x0d" not in result.stdout
    header, *lines = result.stdout.splitlines()
    assert header == "key,channel,state,attempts,reason,message_id,created,updated"
    assert [line.split(",")[0] for line in lines] == ["audit-0", "audit-1", "audit-2"]
    assert all(line.endswith("Z") for line in lines)


def test_audit_refuses_bad_times_with_one_line(cli: Any) -> None:
    submit_three(cli)
    bad = cli.run("audit", "--since", "yesterday")
    assert bad.code == 2 and len(bad.error_lines) == 1 and "--since" in bad.stderr
    backwards = cli.run("audit", "--since", "2026-02-01", "--until", "2026-01-01")
    assert backwards.code == 2 and "--since" in backwards.stderr
    # A number without a unit: "24" (hours in mind) was 24 seconds ago, and a date in ISO
    # 8601's basic form ("20991231") was read as that many seconds ago.
    bare = cli.run("audit", "--since", "24")
    assert (bare.code, bare.stdout) == (2, "") and bare.error_lines == [
        "sendledger: --since: '24' has no unit: write 24h for 24 hours ago (or 24d, 24m, 24s), "
        "or a date (2026-11-01)"
    ]
    assert cli.run("audit", "--since", "20991231").stdout == "no matching jobs\n"
    assert cli.run("audit", "--until", "20991231").stdout.count("audit-") == 3


def test_review_list_and_resolve(cli: Any) -> None:
    submit_three(cli)
    escalate(cli, "audit-1")
    listed = cli.run("review", "list", "--json").json()
    assert [(r["key"], r["reason"]) for r in listed] == [("audit-1", "unknown-outcome")]

    resolved = cli.run(
        "review",
        "resolve",
        "audit-1",
        "--as",
        "abandon",
        "--note",
        "dup order",
        "--by",
        "ana",
        "--json",
    )
    assert resolved.code == 0, resolved.stderr
    assert resolved.json()["state"] == "abandoned"
    history = cli.run("history", "audit-1", "--json").json()
    assert history[-1]["type"] == "Resolved"
    assert (history[-1]["decision"], history[-1]["by"], history[-1]["note"]) == (
        "abandon",
        "ana",
        "dup order",
    )
    assert cli.run("review", "list", "--json").json() == []

    # Resolving a job that is no longer in review conflicts with its state: exit 3.
    again = cli.run("review", "resolve", "audit-1", "--as", "resend")
    assert again.code == 3 and len(again.error_lines) == 1
    assert "abandoned, not in review" in again.stderr
    assert cli.run("review", "resolve", "nope", "--as", "sent").code == 4


def test_review_show(cli: Any) -> None:
    submit_three(cli)
    escalate(cli, "audit-2")
    shown = cli.run("review", "show", "audit-2", "--json").json()
    assert shown["status"]["state"] == "review"
    assert [e["type"] for e in shown["history"]] == ["Requested", "Escalated"]
    human = cli.run("review", "show", "audit-2").stdout
    assert "sendledger review check audit-2" in human
    assert cli.run("review", "show", "nope").code == 4


def test_a_channel_no_job_has_is_said_beside_the_empty_answer(cli: Any) -> None:
    # `reciepts` for `receipts`: an empty queue alone reads as "nothing to review".
    submit_three(cli)
    note = (
        "sendledger: no job in the store has channel 'reciepts': check its spelling "
        "(`sendledger policy check` lists the channels)\n"
    )
    for argv in (
        ["review", "list", "--channel", "reciepts"],
        ["review", "list", "--channel", "reciepts", "--json"],
        ["review", "triage", "--channel", "reciepts", "--dry-run"],
        ["audit", "--channel", "reciepts"],
        ["audit", "--channel", "reciepts", "--format", "json"],
    ):
        result = cli.run(*argv)
        assert (result.code, result.stderr) == (0, note), argv
    assert cli.run("review", "list", "--channel", "reciepts", "--json").json() == []
    # A channel with jobs, none of them matching: the empty answer alone, as before.
    for argv in (
        ["review", "list", "--channel", "receipts"],
        ["audit", "--channel", "receipts", "--state", "cancelled"],
    ):
        result = cli.run(*argv)
        assert (result.code, result.stderr) == (0, ""), argv
