"""The relay-mode matrix end to end through the daemon as a process (`sendledger run`), on
the smtp-imap provider against real Postfix and Dovecot, each channel behind its own SMTP
fault relay: the seed's matrix (pass, drop-response, fail-before-forward, one job each), and
the faults (drop, fail-before-forward, hang, 421, 4xx and 5xx) on the 1st, 2nd or nth message
of a kept connection (docs/providers.md "Connections kept between sends"). Copies are
counted in the real mailbox's Maildir files, never in the daemon's records. The jobs'
states are read from the store in this process (as tests/e2e/daemon_kit.py reads them):
an interpreter started every 0.3 s to poll would take the CPU the daemon is measured on.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from tests.e2e.daemon_kit import shared_fork_server
from tests.integration.mailservers import PASSWORD, RECIPIENT, SENDER, MailServers, mail_servers

from daemon.service_layer.read_models import event_record
from ledger.application import Ledger
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
    """`sendledger ARGS` forked from the worker's fork server (tests/e2e/fork_server.py)."""
    argv = ["--config", str(folder / "sendledger.toml"), *args]
    code, out, err = shared_fork_server().call(argv, folder, stdin or "", _env(), timeout=60)
    return subprocess.CompletedProcess(argv, code, out, err)


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("SENDLEDGER_")}


@dataclass
class Channel:
    """One channel behind its own relay: the relay's modes and own answers, its jobs."""

    modes: list[SmtpMode]
    jobs: int = 1
    answers: list[tuple[str, str, int]] = field(default_factory=list)  # verb, reply, skip


def _run_daemon(
    tmp_path: Path, servers: MailServers, channels: dict[str, Channel], *, concurrency: int
) -> tuple[dict[str, SmtpFaultRelay], dict[str, dict[str, object]], str]:
    """Every job of every channel submitted, the daemon run until each is confirmed or in
    review (or 40 s), then stopped: the relays, each job's status and the daemon's log."""
    relays = {
        name: SmtpFaultRelay("127.0.0.1", servers.smtp_port, modes=c.modes, hang_seconds=3.0)
        for name, c in channels.items()
    }
    for name, relay in relays.items():
        for verb, reply, skip in channels[name].answers:
            relay.answer(verb, reply, skip=skip)
        relay.__enter__()
    try:
        (tmp_path / "mail-password").write_text(PASSWORD + "\n")
        (tmp_path / "policies").mkdir()
        lines = [
            '[store]\nurl = "sqlite:///ledger.sqlite"\n',
            f'[daemon]\ntick = "50ms"\nconcurrency = {concurrency}\n',
        ]
        for name, relay in relays.items():
            table = servers.config(Path("mail-password"), smtp_port=relay.port)
            lines.append(f"[providers.{name}]")
            lines += [f"{key} = {json.dumps(value)}" for key, value in table.items()]
            (tmp_path / "policies" / f"{name}.toml").write_text(
                f'provider = "{name}"\nfrom = "{SENDER}"\n'
                'message_id_domain = "mail.example.test"\non_unknown = "retry"\n'
                'search_after = "300ms"\nsearch_interval = "300ms"\nconfirm_misses = 1\n'
                'verify_after = "300ms"\nretry_backoff = "200ms"\n'
            )
        (tmp_path / "sendledger.toml").write_text("\n".join(lines) + "\n")
        keys = [f"job-{name}-{i}" for name, c in channels.items() for i in range(c.jobs)]
        jobs = [
            {"channel": key.split("-")[1], "key": key, "to": RECIPIENT, "subject": key, "body": "x"}
            for key in keys
        ]
        submitted = _cli(tmp_path, "submit", "--json", "-", stdin=json.dumps(jobs))
        assert submitted.returncode == 0, submitted.stderr
        server = shared_fork_server()
        daemon = server.start(
            ["--config", str(tmp_path / "sendledger.toml"), "run"],
            tmp_path,
            tmp_path / "daemon.err",
            stdout=os.devnull,
            env=_env(),
        )
        try:
            states: dict[str, dict[str, object]] = {}
            deadline = time.monotonic() + 40
            with Ledger(f"sqlite:///{tmp_path / 'ledger.sqlite'}") as ledger:
                while time.monotonic() < deadline:
                    states = {
                        row.key: {"state": row.state, "message_id": row.message_id}
                        for row in ledger.jobs()
                    }
                    # Review is settled too (a refusal for good): the caller counts them.
                    if len(states) == len(keys) and all(
                        s["state"] in ("confirmed", "review") for s in states.values()
                    ):
                        break
                    time.sleep(0.3)
            # A resent job is verified once more after verify_after: let that happen.
            time.sleep(1.0)
        finally:
            os.kill(daemon, signal.SIGTERM)
            server.exited(daemon, timeout=20)
        log = (tmp_path / "daemon.err").read_text()[-3000:]
        servers.settle()
        return relays, states, log
    finally:
        for relay in relays.values():
            relay.close()


def _history(tmp_path: Path, key: str) -> list[dict[str, object]]:
    """The job's events as `sendledger history --json` prints them."""
    with Ledger(f"sqlite:///{tmp_path / 'ledger.sqlite'}") as ledger:
        return [event_record(event) for event in ledger.history(key)]


def _one_copy_each(
    servers: MailServers, states: dict[str, dict[str, object]], log: str, *, reviewed: int = 0
) -> None:
    """Every job confirmed with one copy in the sent folder and the inbox, but `reviewed`
    jobs refused for good (in review, no copy anywhere)."""
    unsettled = {k: s["state"] for k, s in states.items() if s["state"] != "confirmed"}
    assert list(unsettled.values()) == ["review"] * reviewed, (unsettled, log)
    for key, state in states.items():
        message_id = str(state["message_id"])
        copies = 0 if key in unsettled else 1
        assert servers.copies(message_id) == copies, (key, log)
        assert servers.copies(message_id, user="rcpt", folder="INBOX") == copies, key


def test_matrix_one_copy_each_in_the_real_mailbox(tmp_path: Path) -> None:
    with mail_servers() as servers:
        channels = {name: Channel(modes) for name, modes in MATRIX.items()}
        relays, states, log = _run_daemon(tmp_path, servers, channels, concurrency=4)
        _one_copy_each(servers, states, log)
        for name in MATRIX:
            history = _history(tmp_path, f"job-{name}-0")
            confirmed = [e for e in history if e["type"] == "Confirmed"]
            assert confirmed and confirmed[0].get("via") == EXPECTED_CONFIRMATION[name], history
            requeued = [e for e in history if e["type"] == "Requeued"]
            assert len(requeued) == (1 if name == "fbf" else 0), history
        assert relays["drop"].applied[0] == "drop-response"
        assert relays["fbf"].applied[:2] == ["fail-before-forward", "pass"]  # the resend


#: Faults on the 1st, 2nd or nth message of a kept connection: 5 jobs per channel on one
#: send worker, so they go one after the other on each channel's connection.
KEPT: dict[str, Channel] = {
    "drop1st": Channel(["drop-response"], jobs=5),
    "drop2nd": Channel(["pass", "drop-response"], jobs=5),
    "drop5th": Channel(["pass", "pass", "pass", "pass", "drop-response"], jobs=5),
    "fbf2nd": Channel(["pass", "fail-before-forward"], jobs=5),
    "hang2nd": Channel(["pass", "hang"], jobs=5),
    # A kept connection's MAIL answered 421: sent at once on a fresh one.
    "mail421": Channel([], jobs=5, answers=[("MAIL", "421 4.3.2 Shutting down", 1)]),
    # The server's answer about one message, on a kept connection: retried after backoff.
    "rcpt451": Channel([], jobs=5, answers=[("RCPT", "451 4.3.0 Try later", 1)]),
    # Refused for good: that job goes to review, the others on the same connection.
    "data554": Channel([], jobs=5, answers=[("DATA", "554 5.3.4 Not now", 1)]),
}


def test_faults_on_the_nth_message_of_a_kept_connection_one_copy_each(tmp_path: Path) -> None:
    with mail_servers() as servers:
        relays, states, log = _run_daemon(tmp_path, servers, KEPT, concurrency=1)
        _one_copy_each(servers, states, log, reviewed=1)
        reviewed = [k for k, s in states.items() if s["state"] == "review"]
        assert len(reviewed) == 1 and reviewed[0].startswith("job-data554-"), reviewed
        assert len(states) == sum(c.jobs for c in KEPT.values())
        for name in ("drop1st", "drop2nd", "drop5th", "fbf2nd", "hang2nd"):
            relay = relays[name]
            assert relay.applied[: len(KEPT[name].modes)] == KEPT[name].modes, name
            # One connection until the fault, a fresh one after it (and after resends).
            assert relay.sessions <= 3 and relay.verbs["AUTH"] == relay.sessions, name
        assert relays["mail421"].sessions == 2 and relays["mail421"].verbs["MAIL"] == 6
        for name in ("rcpt451", "data554"):
            # The connection was reset after the refusal and kept for the next message (and
            # for rcpt451's retry after its backoff).
            assert relays[name].verbs["RSET"] >= 1 and relays[name].sessions == 1, name
        # The first message of drop1st and the second of drop2nd went Unknown, and the
        # search found their one copy: confirmed via search, never resent.
        vias = {
            name: sorted(
                str(
                    next(
                        e for e in _history(tmp_path, f"job-{name}-{i}") if e["type"] == "Confirmed"
                    ).get("via")
                )
                for i in range(5)
            )
            for name in ("drop1st", "drop2nd", "drop5th")
        }
        assert all(v == ["response"] * 4 + ["search"] for v in vias.values()), vias
