"""`--expected-version N` from outside (docs/cli.md, docs/review.md): given twice it is
refused, one line, exit 2, nothing decided, as a JSON name given twice is; argparse kept
the last, and either of two versions typed could be the one looked at."""

from __future__ import annotations

from typing import Any

from tests.e2e.test_cli_copy_store import stored_jobs


def test_a_version_given_twice_is_refused_on_each_decision_command(cli: Any) -> None:
    stored_jobs(cli.root / "ledger.sqlite", 1)  # r-00000 at version 1
    for command in (
        ("cancel", "r-00000"),
        ("review", "resolve", "r-00000", "--as", "abandon"),
    ):
        # Before: the cancel went ahead on the second (1), the first (5) dropped unread.
        for versions in (("5", "1"), ("1", "1")):
            refused = cli.run(
                *command,
                "--expected-version",
                versions[0],
                f"--expected-version={versions[1]}",
            )
            assert refused.code == 2 and refused.stdout == "", refused.stderr
            assert refused.error_lines == [
                "sendledger: error: argument --expected-version: given twice "
                f"({versions[0]}, then {versions[1]}): give the one version you looked at"
            ]
    status = cli.run("status", "r-00000", "--json")
    assert status.json()["state"] == "requested" and status.json()["version"] == 1
