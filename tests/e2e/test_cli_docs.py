"""What docs/cli.md and docs/review.md say of the commands, run as processes where no other
e2e test runs it: the commands that never create a store (docs/cli.md "Reading without a
store"), the refusals the page quotes, purging a cancelled job (docs/review.md "Cancel") and
the triage example as written (docs/review.md "Triage")."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest
from tests.e2e.test_cli_audit import escalate

#: Every command that opens the store and is not `submit`, `run` or `api`.
OPENS_A_STORE = [
    ["status", "x"],
    ["history", "x"],
    ["review", "list"],
    ["review", "show", "x"],
    ["review", "check", "x"],
    ["review", "resolve", "x", "--as", "sent"],
    ["review", "triage", "--dry-run"],
    ["cancel", "x"],
    ["audit"],
    ["admin", "rebuild-index"],
    ["admin", "purge", "--older-than", "30d", "--dry-run"],
    ["admin", "purge", "--key", "x"],
    ["webhooks", "status"],
]


def test_only_submit_creates_a_store(cli: Any) -> None:
    store = cli.root / "ledger.sqlite"
    for argv in OPENS_A_STORE:
        result = cli.run(*argv)
        assert result.code == 2, (argv, result.stderr)
        assert len(result.error_lines) == 1, (argv, result.stderr)
        assert f"no store at sqlite:{store} " in result.stderr, (argv, result.stderr)
    assert not store.exists()
    job = {"channel": "receipts", "key": "k", "to": "a@example.com", "subject": "s", "body": "b"}
    assert cli.submit(job).code == 0
    assert store.exists()


def test_a_cancelled_job_is_purged(cli: Any) -> None:
    """docs/review.md "Cancel": a cancelled job is settled for good, so `admin purge` takes
    it (by key, and by age); one still requested is refused naming what can be purged."""
    for key in ("withdrawn", "aged", "open"):
        job = {"channel": "receipts", "key": key, "to": "a@example.com", "subject": "s",
               "body": "b", "send_at": "2099-01-01T00:00:00Z"}  # fmt: skip
        assert cli.submit(job).code == 0
    for key in ("withdrawn", "aged"):
        assert cli.run("cancel", key).code == 0
    refused = cli.run("admin", "purge", "--key", "open")
    assert (
        refused.code == 3 and "(confirmed, abandoned or cancelled, nothing due)" in refused.stderr
    )
    done = cli.run("admin", "purge", "--key", "withdrawn", "--json")
    assert done.code == 0, done.stderr
    assert done.json()["purged"] == 1
    assert cli.run("status", "withdrawn", "--json").json()["state"] == "cancelled"
    assert "to" not in cli.run("status", "withdrawn", "--json").json()
    aged = cli.run("admin", "purge", "--older-than", "0s", "--dry-run", "--json")
    assert aged.code == 0, aged.stderr
    assert aged.json()["keys"] == ["aged"]


PAGE = " ".join((Path(__file__).resolve().parents[2] / "docs" / "cli.md").read_text().split())
JOB = '{"channel": "receipts", "key": "k", "to": "a@example.com", "subject": "s", "body": "b"'


@pytest.mark.parametrize(
    ("text", "quoted"),
    [
        (JOB.replace('"k"', '"k\\u001b"') + "}",
         "job.key: must not contain a control character (U+001B)"),
        (JOB + ', "headers": {"Message-ID": "<x@y.example>"}}',
         "headers.Message-ID: Message-ID is written by sendledger and cannot be set"),
        (JOB + ', "to": "b@example.com"}', "job.to: given twice in one JSON object"),
        (f'[{JOB}}}, {JOB.replace(chr(34) + "k" + chr(34), chr(34) + "k2" + chr(34))},'
         ' "headers": {"X-Tag": "a", "X-Tag": "b"}}]', "job[1].headers.X-Tag: "),
        (JOB + ', "attachments": [{"filename": "a", "filename": "b"}]}',
         "job.attachments[0].filename: "),
    ],
)  # fmt: skip
def test_the_refusals_the_page_quotes_are_what_submit_says(
    cli: Any, text: str, quoted: str
) -> None:
    assert f"`{quoted}" in PAGE
    result = cli.run("submit", "-", stdin=text)
    assert result.code == 2 and result.error_lines == [result.stderr.strip()], result.stderr
    assert quoted in result.stderr
    assert not (cli.root / "ledger.sqlite").exists()


def test_the_triage_example_runs_as_written(cli: Any) -> None:
    """docs/review.md "Triage": the block, line by line, on a site with jobs in review and
    a mailbox that cannot be reached (the config's credentials file is not there): every
    line exits 0, the dry run and the triage report each job, and nothing is decided."""
    review = (Path(__file__).resolve().parents[2] / "docs" / "review.md").read_text()
    block = review.split("\n### Triage\n", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    lines = [shlex.split(line) for line in block.splitlines()]
    assert lines and all(words[0] == "sendledger" for words in lines)
    for key in ("t1", "t2"):
        job = {"channel": "receipts", "key": key, "to": "a@example.com", "subject": "s",
               "body": "b"}  # fmt: skip
        assert cli.submit(job).code == 0
        escalate(cli, key)
    outputs = []
    for words in lines:
        result = cli.run(*words[1:])
        assert result.code == 0, (words, result.stderr)
        outputs.append(result.stdout)
    assert "t1" in outputs[0] and "t2" in outputs[0]
    assert "dry run: 0 would be resolved as sent, 2 left in review" in outputs[1]
    assert "0 resolved as sent, 2 left in review" in outputs[2]
    assert "t1" in outputs[3] and "t2" in outputs[3]
