"""`sendledger probe` as a process (forked from the worker's fork server, as the console
script would run it, without an interpreter's start and imports each): against the Gmail
emulator (with an index lag) and against the real Postfix + Dovecot pair. It must refuse
without --yes."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from tests.e2e.conftest import forked_sendledger
from tests.integration.mailservers import PASSWORD, RECIPIENT, mail_servers

from testkit.credentials import write_service_account
from testkit.gmail_emulator import GmailEmulator

pytestmark = pytest.mark.xdist_group("mailservers")


def probe(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return forked_sendledger(
        "--config",
        str(folder / "sendledger.toml"),
        "probe",
        *args,
        env={k: v for k, v in os.environ.items() if not k.startswith("SENDLEDGER_")},
    )


def test_probe_against_the_gmail_emulator(tmp_path: Path) -> None:
    with GmailEmulator(lag=0.6) as emulator:
        write_service_account(tmp_path / "sa.json", token_uri=emulator.token_uri)
        (tmp_path / "sendledger.toml").write_text(
            f'[providers.support]\ncredentials_file = "sa.json"\nuser = "support@example.com"\n'
            f'api_endpoint = "{emulator.url}"\ntimeout = "2s"\n'
        )
        refused = probe(tmp_path, "--provider", "support", "--to", "a@example.net")
        assert refused.returncode == 2 and "--yes" in refused.stderr
        assert emulator_sent(emulator) == 0
        args = ["--provider", "support", "--to", "a@example.net", "--yes", "--interval", "100ms"]
        text = probe(tmp_path, *args)
        assert text.returncode == 0, text.stderr
        assert "Message-ID kept:  yes" in text.stdout and 'search_after = "1m"' in text.stdout
        print(text.stdout)
        done = probe(tmp_path, *args, "--json")
        result = json.loads(done.stdout)
        assert result["send_outcome"] == "unknown"  # the relay dropped the reply
        assert result["found"] and result["copies"] == 1 and result["kept_message_id"]
        assert result["index_lag_seconds"] >= 0.6
        print(done.stdout)


def emulator_sent(emulator: GmailEmulator) -> int:
    log = getattr(emulator, "acceptance_log", None)
    if isinstance(log, Path) and log.exists():
        return len(log.read_text().splitlines())
    return 0


def test_probe_against_real_postfix_and_dovecot(tmp_path: Path) -> None:
    with mail_servers() as servers:
        (tmp_path / "pw").write_text(PASSWORD + "\n")
        table = servers.config(Path("pw"))
        (tmp_path / "sendledger.toml").write_text(
            "[providers.mail]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in table.items())
        )
        args = ["--provider", "mail", "--to", RECIPIENT, "--interval", "50ms"]
        refused = probe(tmp_path, *args)
        assert refused.returncode == 2 and "--yes" in refused.stderr
        text = probe(tmp_path, *args, "--yes")
        assert text.returncode == 0, text.stderr
        print(text.stdout)
        done = probe(tmp_path, *args, "--yes", "--json")
        assert done.returncode == 0, done.stderr
        result = json.loads(done.stdout)
        print(done.stdout)
        assert result["send_outcome"] == "unknown" and result["found"]
        assert result["copies"] == 1 and result["kept_message_id"]
        servers.settle()
        assert servers.copies(result["message_id"]) == 1  # the one probe, in the real mailbox
        assert servers.copies(result["message_id"], user="rcpt", folder="INBOX") == 1
        bad = probe(tmp_path, "--provider", "nope", "--to", RECIPIENT, "--yes")
        assert bad.returncode == 2 and "--provider" in bad.stderr
