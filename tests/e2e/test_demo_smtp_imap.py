"""`sendledger demo --provider smtp-imap` as a user runs it: the daemon on the smtp-imap
provider against private Postfix + Dovecot behind the SMTP fault relay, copies counted in
the real Sent folder's Maildir files; and the one-line refusal where the servers are missing.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from tests.e2e.conftest import forked_sendledger as sendledger
from tests.e2e.demo_kit import run_demo
from tests.integration.mailservers import require_mailservers

pytestmark = pytest.mark.xdist_group("mailservers")


def test_demo_against_real_servers_one_copy_per_confirmed_job(tmp_path: Path) -> None:
    require_mailservers()
    summary, result = run_demo("--provider", "smtp-imap", "--dir", str(tmp_path), timeout=120)
    assert "Postfix" in summary["against"]
    jobs = summary["jobs"]
    assert "sender@example.test" in result.stderr  # the commentary went to stderr
    assert summary["accepted_total"] == sum(job["copies"] for job in jobs)


def test_demo_without_the_servers_says_so_and_how_to_install(tmp_path: Path) -> None:
    empty = tmp_path / "empty-path"
    empty.mkdir()
    work = tmp_path / "work"
    result = sendledger(
        "demo",
        "--provider",
        "smtp-imap",
        "--json",
        "--dir",
        str(work),
        # No `postfix` on PATH: the check finds the servers missing, as on a bare machine.
        env={**os.environ, "PATH": str(empty)},
    )
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert "--provider smtp-imap" in lines[0]
    assert "postfix is not installed" in lines[0]
    assert "apt-get install postfix dovecot-imapd dovecot-lmtpd" in lines[0]
    assert "make test" in lines[0]
    assert not work.exists()  # nothing half-written


def test_lag_is_refused_with_smtp_imap(tmp_path: Path) -> None:
    result = sendledger("demo", "--provider", "smtp-imap", "--lag", "1s")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "sendledger: --lag: only with --provider gmail (Dovecot's search has no lag)"
    ]
