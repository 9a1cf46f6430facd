"""The seed's matrix (pass, drop-response, fail-before-forward) end to end through the
daemon as a process (`sendledger run`), on the smtp-imap provider against real Postfix and
Dovecot, each channel behind its own SMTP fault relay. Copies are counted in the real
mailbox's Maildir files, never in the daemon's records.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.integration.mailservers import PASSWORD, RECIPIENT, SENDER, mail_servers

from testkit.smtp_relay import SmtpFaultRelay, SmtpMode

pytestmark = pytest.mark.xdist_group("mailservers")

MATRIX: dict[str, list[SmtpMode]] = {
    "pass": ["pass"],
    "drop": ["drop-response"],
    "fbf": ["fail-before-forward"],
}
# fail-before-forward: nothing queued, the search misses, the retry policy resends, and
# the resend's 250 confirms it.
EXPECTED_CONFIRMATION = {"pass": "response", "drop": "search", "fbf": "response"}


def _cli(folder: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "daemon", "--config", str(folder / "sendledger.toml"), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if not k.startswith("SENDLEDGER_")},
    )


def test_matrix_one_copy_each_in_the_real_mailbox(tmp_path: Path) -> None:
    with mail_servers() as servers:
        relays = {
            name: SmtpFaultRelay("127.0.0.1", servers.smtp_port, modes=modes)
            for name, modes in MATRIX.items()
        }
        for relay in relays.values():
            relay.__enter__()
        try:
            (tmp_path / "mail-password").write_text(PASSWORD + "\n")
            (tmp_path / "policies").mkdir()
            lines = ['[store]\nurl = "sqlite:///ledger.sqlite"\n', '[daemon]\ntick = "50ms"\n']
            for name, relay in relays.items():
                table = servers.config(Path("mail-password"), smtp_port=relay.port)
                lines.append(f"[providers.{name}]")
                lines += [f"{key} = {json.dumps(value)}" for key, value in table.items()]
                (tmp_path / "policies" / f"{name}.toml").write_text(
                    f'provider = "{name}"\nfrom = "{SENDER}"\n'
                    'message_id_domain = "mail.example.test"\non_unknown = "retry"\n'
                    'search_after = "300ms"\nsearch_interval = "300ms"\nconfirm_misses = 1\n'
                    'verify_after = "300ms"\n'
                )
            (tmp_path / "sendledger.toml").write_text("\n".join(lines) + "\n")
            jobs = [
                {
                    "channel": name,
                    "key": f"job-{name}",
                    "to": RECIPIENT,
                    "subject": name,
                    "body": "x",
                }
                for name in MATRIX
            ]
            submitted = _cli(tmp_path, "submit", "--json", "-", stdin=json.dumps(jobs))
            assert submitted.returncode == 0, submitted.stderr
            with (tmp_path / "daemon.err").open("wb") as err:
                daemon = subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "daemon",
                        "--config",
                        str(tmp_path / "sendledger.toml"),
                        "run",
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=err,
                )
            try:
                states: dict[str, dict[str, object]] = {}
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:
                    states = {
                        name: json.loads(_cli(tmp_path, "status", "--json", f"job-{name}").stdout)
                        for name in MATRIX
                    }
                    if all(s["state"] == "confirmed" for s in states.values()):
                        break
                    time.sleep(0.3)
                # A resent job is verified once more after verify_after: let that happen.
                time.sleep(1.0)
            finally:
                daemon.send_signal(signal.SIGTERM)
                daemon.wait(timeout=20)
            log = (tmp_path / "daemon.err").read_text()[-3000:]
            assert all(s["state"] == "confirmed" for s in states.values()), (states, log)
            servers.settle()
            for name in MATRIX:
                message_id = str(states[name]["message_id"])
                assert servers.copies(message_id) == 1, (name, log)
                assert servers.copies(message_id, user="rcpt", folder="INBOX") == 1, name
                history = json.loads(_cli(tmp_path, "history", "--json", f"job-{name}").stdout)
                confirmed = [e for e in history if e["type"] == "Confirmed"]
                assert confirmed and confirmed[0].get("via") == EXPECTED_CONFIRMATION[name], history
                requeued = [e for e in history if e["type"] == "Requeued"]
                assert len(requeued) == (1 if name == "fbf" else 0), history
            assert relays["drop"].applied[0] == "drop-response"
            assert relays["fbf"].applied[:2] == ["fail-before-forward", "pass"]  # the resend
        finally:
            for relay in relays.values():
                relay.close()
