"""`sendledger probe` on a Gmail provider tries both paths: messages.send and a draft, each
with the reply to its send dropped by the probe's relay, against the Gmail emulator with
and without `--rewrite-message-id`. Emulator results, not Google's: the probe exists to
check the same against the user's own mailbox.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from tests.e2e.daemon_kit import SENDLEDGER, shared_fork_server

from testkit.credentials import write_service_account
from testkit.gmail_emulator import GmailEmulator

MAILBOX = "probe@example.com"
LAG = 0.3


def probe(tmp_path: Path, emulator: GmailEmulator, *extra: str) -> subprocess.CompletedProcess[str]:
    write_service_account(tmp_path / "sa.json", token_uri=emulator.token_uri)
    (tmp_path / "policies").mkdir(exist_ok=True)
    config = tmp_path / "sendledger.toml"
    config.write_text(
        f"""[store]
url = "sqlite:///ledger.sqlite"

[daemon]
policies_dir = "policies"

[providers.support]
kind = "gmail"
credentials_file = "sa.json"
user = "{MAILBOX}"
api_endpoint = "{emulator.url}"
timeout = "2s"
""",
        encoding="utf-8",
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("SENDLEDGER_")}
    argv = [
        *("--config", str(config), "probe", "--provider", "support"),
        *("--to", "you@example.net", "--yes", "--max-wait", "3s", "--interval", "100ms"),
        *extra,
    ]
    # Forked from the worker's fork server (tests/e2e/fork_server.py): a process of its own
    # as the console script would be, without an interpreter start and its imports.
    code, out, err = shared_fork_server().call(argv, tmp_path, "", env, timeout=120)
    return subprocess.CompletedProcess([SENDLEDGER, *argv], code, out, err)


@pytest.mark.parametrize("rewrite", [False, True], ids=["kept", "rewritten"])
def test_probe_tries_both_paths_and_recommends_send_via(tmp_path: Path, rewrite: bool) -> None:
    log = tmp_path / "accepted.jsonl"
    with GmailEmulator(lag=LAG, acceptance_log=log, rewrite_message_id=rewrite) as emulator:
        done = probe(tmp_path, emulator, "--json")
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        # One message per path, each sent exactly once although both replies were lost.
        assert [entry["via"] for entry in emulator.accepted()] == ["send", "drafts.send"]
        assert emulator.drafts(MAILBOX) == {}
    assert report["kind"] == "gmail" and report["send_outcome"] == "unknown"
    drafts = report["drafts"]
    assert drafts["send_outcome"] == "unknown"
    assert drafts["pending_before_send"] is True
    assert drafts["gone_after_send"] is True
    assert drafts["found_by_message_id"] is True
    assert report["recommended"]["send_via"] == "drafts"
    history = report["history"]  # read beside the searches, from the historyId before the send
    if rewrite:
        assert (report["found"], report["kept_message_id"]) == (False, None)
        assert drafts["kept_message_id"] is False
        assert drafts["index_lag_seconds"] is None
        assert report["recommended"]["search_after"] is None
        assert history["found"] is False and history["reads"] >= 1
        assert (report["rely_on"], report["recommended_history_after"]) == (None, None)
    else:
        assert (report["found"], report["kept_message_id"]) == (True, True)
        assert drafts["kept_message_id"] is True
        assert LAG <= drafts["index_lag_seconds"] < 3
        assert LAG <= report["index_lag_seconds"] < 3
        assert report["recommended"]["search_after"] == "1m"
        # The emulator's history has no lag: it lists the copy before the index shows it.
        assert history["found"] is True and history["lag_seconds"] < report["index_lag_seconds"]
        assert (report["rely_on"], report["recommended_history_after"]) == ("history", "1s")


def test_probe_text_report_names_every_finding(tmp_path: Path) -> None:
    with GmailEmulator(lag=LAG, rewrite_message_id=True) as emulator:
        done = probe(tmp_path, emulator)
    assert done.returncode == 0, done.stderr
    text = done.stdout
    for line in (
        "drafts path",
        "consumed draft answered as gone:         yes",
        "sent message found under its message id: yes",
        "Message-ID kept on drafts.send:          NO",
        'recommended: send_via = "drafts" (now "messages")',
    ):
        assert line in text, text
    print(text)  # the report quotes it (pytest -s)
    # While it searches, it says so on stderr (the drafts path searches only for a kept
    # Message-ID, which this mailbox replaces).
    [searching] = [line for line in done.stderr.splitlines() if "searching" in line]
    assert searching.startswith("probe: searching the sent mail for <sendledger-probe-")
    assert searching.endswith("> every 100ms, for at most 3s: not found yet"), searching


def test_probe_without_the_compose_scope_says_so_and_keeps_messages(tmp_path: Path) -> None:
    from daemon.providers.gmail import SCOPES

    with GmailEmulator(lag=LAG, grantable_scopes=SCOPES) as emulator:
        done = probe(tmp_path, emulator, "--json")
        assert [entry["via"] for entry in emulator.accepted()] == ["send"]
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert "gmail.compose" in report["drafts"]["error"]
    assert report["recommended"]["send_via"] == "messages"


def test_the_docs_example_is_what_the_probe_prints(tmp_path: Path) -> None:
    """docs/providers.md "The probe on a gmail provider" quotes this run's report: each of
    its lines is in the output, the Message-ID and the relay's port aside."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "providers.md").read_text("utf-8")
    section = page.split("### The probe on a gmail provider", 1)[1].split("\n### ", 1)[0]
    example = section.split("```\n", 2)[1]

    def masked(text: str) -> str:
        text = re.sub(r"<sendledger-probe-[0-9a-f]{32}@example\.com>", "<ID>", text)
        return re.sub(r"127\.0\.0\.1:\d+", "127.0.0.1:PORT", text)

    with GmailEmulator(lag=LAG, rewrite_message_id=True) as emulator:
        done = probe(tmp_path, emulator)
    assert done.returncode == 0, done.stderr
    printed = masked(done.stdout).splitlines()
    lines = masked(example).splitlines()
    assert len(lines) >= 8
    assert [line for line in lines if line not in printed] == []
