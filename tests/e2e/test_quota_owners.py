"""Two daemons on one PostgreSQL store share a mailbox's quota (docs/performance.md "Several
daemons"): the emulator refuses every request over the mailbox's quota with 429, and none
is answered 429, also when the daemon that owns the mailbox is stopped (SIGSTOP) past its
lease, the other takes over, and the first resumes."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from tests.e2e.daemon_kit import PostgresRig, job

from testkit.gmail_emulator import GmailEmulator

#: Gmail's units per user per second, for the emulator's meter and the provider's bucket.
QUOTA = 250.0
JOBS = 15
SCOPE = "gmail/receipts@shop.example"  # the policy's From, as `user = "{from}"` acts


@pytest.mark.postgres
def test_two_daemons_never_send_one_mailbox_over_its_quota(tmp_path: Path, pg_url: str) -> None:
    emulator = GmailEmulator(lag=0.3, user_quota=QUOTA, acceptance_log=tmp_path / "accepted")
    with PostgresRig(tmp_path, pg_url, emulator=emulator, quota=QUOTA) as rig:
        text = rig.config.read_text().replace('user = "shop@shop.example"', 'user = "{from}"')
        rig.config.write_text(text)
        keys = [f"q-{n:02d}" for n in range(JOBS)]
        rig.submit([job(key) for key in keys])
        names = ("alpha", "beta")
        daemons = {name: rig.start_daemon({"SENDLEDGER_DAEMON__NAME": name}) for name in names}
        # Two interpreters start at once: allow for a loaded machine.
        rig.wait_for(
            lambda: sum(rig.copies(key) for key in keys) >= JOBS // 3, "a third sent", timeout=60
        )
        (row,) = [r for r in rig.ledger.scope_leases().leases() if r.scope == SCOPE]
        owner, other = row.owner, next(n for n in names if n != row.owner)
        # The owner stops mid-run, with jobs queued for the mailbox, and stays stopped
        # past its lease: the other daemon takes the mailbox.
        daemons[owner].signal(signal.SIGSTOP)
        rig.wait_for(
            lambda: any(
                r.scope == SCOPE and r.owner == other for r in rig.ledger.scope_leases().leases()
            ),
            f"{other} to take the mailbox",
            daemon_must_live=False,
        )
        sent_at_takeover = sum(rig.copies(key) for key in keys)
        daemons[owner].signal(signal.SIGCONT)
        rig.wait_settled(keys, timeout=60)
        attempts = [
            event
            for key in keys
            for event in rig.ledger.history(key)
            if type(event).__name__ == "Attempted"
        ]
        for daemon in daemons.values():
            assert daemon.terminate() == 0, daemon.tail()
    assert emulator.quota_refusals == 0
    assert all(rig.copies(key) == 1 for key in keys)
    assert all(rig.state(key) == "confirmed" for key in keys)
    # The resumed daemon sent nothing more for the mailbox it lost: at most the one
    # call a worker of its had already been handed before it stopped.
    assert sent_at_takeover < JOBS
    assert sum(1 for e in attempts if e.daemon == owner) <= sent_at_takeover + 1
    assert any(e.daemon == other for e in attempts)
