"""What docs/cli.md says of the commands as processes, where no other e2e test says it
(docs/cli.md "Reading without a store")."""

from __future__ import annotations

from typing import Any

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
