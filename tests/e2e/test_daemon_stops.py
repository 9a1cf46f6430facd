"""The daemon always stops, promptly and honestly (docs/operations.md "Stopping"): SIGINT,
SIGTERM and two SIGINTs, each sent 50 times while a send is in flight, and every time the
daemon exits within the documented bound with the documented code.

Each trial is a `sendledger run` of its own (its own folder, store and fault relay, the
Gmail emulator shared), forked from one process that imported sendledger once
(`tests/e2e/fork_server.py`), several at a time: 150 interpreter starts would cost minutes
of CPU. Found failing on the first runtime (1 stop in 12 hung for good: the handler called
`Event.set()` inside `Event.wait` in the main thread)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from tests.e2e.daemon_kit import (
    MAILBOX,
    RETRY_POLICY,
    ForkServer,
    policy_text,
    shared_fork_server,
)

from daemon.config.settings import load_settings
from ledger.application import Ledger
from ledger.content import parse_job
from ledger.event_format import EVENT_FORMAT
from ledger.stores.format_rows import format_rows_for
from ledger.vocabulary import Sender
from policies.loader import load_policy_dir
from testkit.credentials import write_service_account
from testkit.gmail_emulator import GmailEmulator
from testkit.relay import FaultPlan, FaultRelay

TRIALS = int(os.environ.get("STOP_TRIALS", "50"))
AT_ONCE = 10
#: The provider call the signals meet hangs (the relay holds the answer for 2 s) and
#: times out after 1 s; a stop waits for it at most STOP_TIMEOUT.
TIMEOUT, STOP_TIMEOUT = 1.0, 3.0
#: The bound docs/operations.md gives, plus what the process takes to end on a loaded
#: machine with ten daemons stopping at once.
MARGIN = 1.5


@dataclass
class Trial:
    kind: str  # "SIGINT", "SIGTERM", "SIGINT twice"
    code: int
    took: float  # from the signal that should end it to the exit
    state: str | None
    log: str


def _template(folder: Path, emulator: GmailEmulator) -> tuple[Path, Sender]:
    """A folder with the policy, the credentials and an empty store, and the channel's
    sender (each trial submits its own job: `_submit`)."""
    folder.mkdir()
    write_service_account(folder / "service-account.json", token_uri=emulator.token_uri)
    (folder / "policies").mkdir()
    (folder / "policies" / "receipts.toml").write_text(
        policy_text({"channel": "receipts", **RETRY_POLICY}), encoding="utf-8"
    )
    _config(folder, "http://127.0.0.1:1", emulator.token_uri)
    settings = load_settings(folder / "sendledger.toml")
    policies = load_policy_dir(settings.policies_dir, known_providers=settings.providers)
    with Ledger(settings.store.url, base_dir=settings.base_dir) as ledger:
        ledger.open_counts()  # the store's tables, so a trial's copy only adds its job
    return folder, policies["receipts"].sender


def _submit(folder: Path, sender: Sender) -> str:
    """The trial's one due job, under a key of its own: the trials share one emulator
    mailbox, and a job that found another trial's copy of its Message-ID (its history read
    after a timeout the signal came too late for) would be a duplicate."""
    key = f"stop-{folder.name}"
    with Ledger(f"sqlite:///{folder / 'ledger.sqlite'}") as ledger:
        job = {"channel": "receipts", "key": key, "to": "customer@example.com",
               "subject": "Your receipt", "body": "Thanks.\n"}  # fmt: skip
        ledger.submit(parse_job(job), sender)
    return key


def _config(
    folder: Path, relay: str, token_uri: str, timeout: float = TIMEOUT, stop: float = STOP_TIMEOUT
) -> None:
    (folder / "sendledger.toml").write_text(
        '[store]\nurl = "sqlite:///ledger.sqlite"\n\n'
        f'[daemon]\ntick = "50ms"\npolicies_dir = "policies"\nstop_timeout = "{stop}s"\n'
        'log_level = "info"\n\n'
        '[providers.gmail]\nkind = "gmail"\ncredentials_file = "service-account.json"\n'
        f'user = "{MAILBOX}"\napi_endpoint = "{relay}"\ntoken_uri = "{token_uri}"\n'
        f'timeout = "{timeout}s"\n',
        encoding="utf-8",
    )


def _one(
    server: ForkServer,
    template: tuple[Path, Sender],
    folder: Path,
    emulator: GmailEmulator,
    kind: str,
    *,
    timeout: float = TIMEOUT,
    stop: float = STOP_TIMEOUT,
) -> Trial:
    shutil.copytree(template[0], folder)
    key = _submit(folder, template[1])
    hang = timeout + 1.0
    relay = FaultRelay(emulator.url, plan=FaultPlan(send="hang"), hang_seconds=hang).start()
    try:
        _config(folder, relay.url, emulator.token_uri, timeout, stop)
        log = folder / "daemon.log"
        argv = ["--config", str(folder / "sendledger.toml"), "run"]
        pid = server.start(argv, folder, log, env=_env())
        deadline = time.monotonic() + 30
        while not relay.forwarded("send"):  # the send is in flight: Gmail has it
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.01)
        first = signal.SIGTERM if kind == "SIGTERM" else signal.SIGINT
        os.kill(pid, first)
        sent_at = time.monotonic()
        if kind == "SIGINT twice":
            # As a person does: Ctrl-C again once the first has said what it waits for. (Sent
            # sooner, the two may reach the process as one: the kernel keeps one pending
            # SIGINT, and on a loaded machine the process may not run in between.)
            while "stopping (SIGINT)" not in log.read_text(encoding="utf-8"):
                assert time.monotonic() < deadline, log.read_text(encoding="utf-8")
                time.sleep(0.005)
            os.kill(pid, signal.SIGINT)
            sent_at = time.monotonic()
        try:
            code, at = server.exited(pid, timeout=STOP_TIMEOUT + 30)
        except TimeoutError:
            os.kill(pid, signal.SIGKILL)
            code, at = server.exited(pid, timeout=30)
            code = -999
    finally:
        relay.stop()
    with Ledger(f"sqlite:///{folder / 'ledger.sqlite'}") as ledger:
        row = ledger.row(key)
    return Trial(kind, code, at - sent_at, row.state if row else None, log.read_text())


@pytest.fixture
def server() -> ForkServer:
    return shared_fork_server()


def _env() -> dict[str, str]:
    """The daemons' environment: the caller's, without settings or systemd's variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SENDLEDGER_")}
    for name in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "INVOCATION_ID", "JOURNAL_STREAM"):
        env.pop(name, None)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def test_sigint_sigterm_and_two_sigints_during_sends_stop_the_daemon_every_time(
    tmp_path: Path, server: ForkServer
) -> None:
    emulator = GmailEmulator(lag=0.1).start()
    try:
        template = _template(tmp_path / "template", emulator)
        kinds = ["SIGINT", "SIGTERM", "SIGINT twice"] * TRIALS
        with ThreadPoolExecutor(AT_ONCE) as pool:
            trials = list(
                pool.map(
                    lambda n: _one(server, template, tmp_path / f"t{n}", emulator, kinds[n]),
                    range(len(kinds)),
                )
            )
    finally:
        emulator.stop()
    by_kind: dict[str, list[Trial]] = {}
    for trial in trials:
        by_kind.setdefault(trial.kind, []).append(trial)
    report = {
        kind: {
            "within": sum(1 for t in done if t.took <= _bound(kind)),
            "of": len(done),
            "slowest": round(max(t.took for t in done), 2),
        }
        for kind, done in by_kind.items()
    }
    print(json.dumps(report))
    for kind, done in by_kind.items():
        expected = 0 if kind == "SIGTERM" else 130
        wrong = [t for t in done if t.code != expected or t.took > _bound(kind)]
        assert not wrong, _explain(kind, wrong, report)
    for trial in by_kind["SIGINT"] + by_kind["SIGTERM"]:
        # The call ended within the wait: its outcome is recorded, and said apart from sent.
        assert trial.state == "unknown", _explain(trial.kind, [trial], report)
        assert "waiting for 1 send in flight, at most 3s" in trial.log, trial.log
        assert "1 outcome unknown" in trial.log, trial.log
    in_flight = 0
    for trial in by_kind["SIGINT twice"]:
        if "stopped at once (SIGINT again)" not in trial.log:
            # On a loaded machine the whole stop (the call's 1 s timeout, then its outcome
            # saved) can end before the second Ctrl-C is sent: the first one's stop, whole.
            assert "1 outcome unknown" in trial.log, trial.log
            assert trial.state == "unknown", _explain(trial.kind, [trial], report)
            continue
        if "not waiting for no provider call in flight" in trial.log:
            # On a loaded machine the second Ctrl-C can come after the call's own timeout
            # (1 s) ended it: its outcome is then recorded, or left to the next start.
            assert trial.state in ("unknown", "attempted"), _explain(trial.kind, [trial], report)
            continue
        # Left as a crash leaves it: the claim is durable, the next start recovers it.
        assert trial.state == "attempted", _explain(trial.kind, [trial], report)
        in_flight += 1
    # Most second Ctrl-Cs must meet the call in flight, or this did not test that case.
    assert in_flight * 2 > len(by_kind["SIGINT twice"]), report


def test_a_call_longer_than_the_stop_timeout_is_not_waited_for(
    tmp_path: Path, server: ForkServer
) -> None:
    """The provider's timeout (20 s) is longer than `daemon.stop_timeout` (1 s): SIGTERM
    exits 0 after the stop timeout, says so, and leaves the claim to the next start."""
    emulator = GmailEmulator(lag=0.1).start()
    try:
        template = _template(tmp_path / "template", emulator)
        trial = _one(server, template, tmp_path / "t", emulator, "SIGTERM", timeout=20, stop=1)
    finally:
        emulator.stop()
    assert trial.code == 0 and 1.0 <= trial.took <= 1.0 + MARGIN, (trial.took, trial.log)
    assert "waiting for 1 send in flight, at most 1s" in trial.log
    assert "stopped at once (still waiting after 1s)" in trial.log
    assert trial.state == "attempted"


def _bound(kind: str) -> float:
    """docs/operations.md "Stopping": a first signal, at most `daemon.stop_timeout`; a
    second one, at once."""
    return (0.0 if kind == "SIGINT twice" else STOP_TIMEOUT) + MARGIN


def _explain(kind: str, wrong: list[Trial], report: dict[str, Any]) -> str:
    first = wrong[0]
    return (
        f"{len(wrong)} {kind} trials wrong ({report}): first exit {first.code} after "
        f"{first.took:.2f}s, state {first.state}\n{first.log[-3000:]}"
    )


def test_a_daemon_stopping_on_a_newer_event_format_does_not_wait_past_its_stop_timeout(
    tmp_path: Path,
) -> None:
    """A daemon that finds the store's format raised under it stops by itself, exit 2 and
    the start's line. With a search longer than `daemon.stop_timeout` in flight its stop
    is abandoned as a signal's is, and ends at once: before, the process ended only when
    the search did (the provider's 20 s timeout: the interpreter's exit waits for the
    check workers), where a signal's stop ended at once."""
    emulator = GmailEmulator(lag=0.1).start()
    folder, sender = _template(tmp_path / "template", emulator)
    key = _submit(folder, sender)
    # The send's answer lost (Unknown), then its search hangs past the stop's wait.
    plan = FaultPlan(send="drop-response", search="hang", history="hang")
    relay = FaultRelay(emulator.url, plan=plan, hang_seconds=21).start()
    try:
        _config(folder, relay.url, emulator.token_uri, timeout=20, stop=1)
        log = folder / "daemon.log"
        argv = ["--config", str(folder / "sendledger.toml"), "run"]
        # The command as systemd runs it, not from the fork server (whose child ends with
        # os._exit): the interpreter's own exit is what waited.
        with log.open("wb") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "daemon", *argv], cwd=folder, env=_env(),
                stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        pid = process.pid
        deadline = time.monotonic() + 30
        while not relay.forwarded("search") + relay.forwarded("history"):
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.01)
        with Ledger(f"sqlite:///{folder / 'ledger.sqlite'}") as ledger:
            # A newer release's raise, as under a daemon whose heartbeat lapsed.
            format_rows_for(ledger.recorder).raise_to(EVENT_FORMAT + 1, time.time())
        os.kill(pid, signal.SIGHUP)  # the reload wakes the heartbeat, which reads the format
        while "stopping: this store holds" not in log.read_text(encoding="utf-8"):
            assert time.monotonic() < deadline, log.read_text(encoding="utf-8")
            time.sleep(0.01)
        stopping = time.monotonic()
        try:
            code = process.wait(timeout=40)
        finally:
            process.kill()
            process.wait()
        at = time.monotonic()
    finally:
        relay.stop()
        emulator.stop()
    text = log.read_text(encoding="utf-8")
    assert code == 2, text
    assert at - stopping <= 1.0 + MARGIN, (at - stopping, text)
    assert "stopped at once (still waiting after 1s)" in text
    assert text.rstrip().endswith(
        f"this store holds events of format {EVENT_FORMAT + 1}, this release reads up to "
        f"{EVENT_FORMAT}: upgrade sendledger on this host"
    ), text
    with Ledger(f"sqlite:///{folder / 'ledger.sqlite'}") as ledger:
        row = ledger.row(key)
    assert row is not None and row.state == "unknown"  # searched again at the next start
