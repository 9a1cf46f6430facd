"""The test kit as a user runs it: `sendledger emulator gmail`, `sendledger relay` and
`sendledger demo` as processes, with the real Gmail client going through them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.e2e.demo_kit import run_demo

from daemon.providers.base import SendKind
from daemon.providers.gmail import GmailProvider
from ledger.mime import build_message

SENDLEDGER = str(Path(sys.executable).parent / "sendledger")


def _start(args: list[str]) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [SENDLEDGER, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    url = proc.stdout.readline().strip()
    assert url.startswith("http://127.0.0.1:"), proc.stderr.read() if proc.stderr else url
    return proc, url


def _stop(proc: subprocess.Popen[str]) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.fixture
def kit(tmp_path: Path) -> Iterator[tuple[str, str, Path, Path]]:
    """(emulator URL, relay URL dropping the first send's response, service account, log)."""
    log = tmp_path / "accepted.jsonl"
    sa = tmp_path / "sa.json"
    emulator, emulator_url = _start(
        [
            "emulator",
            "gmail",
            "--port",
            "0",
            "--lag",
            "0",
            "--accept-log",
            str(log),
            "--write-service-account",
            str(sa),
        ]
    )
    relay, relay_url = _start(
        ["relay", "--upstream", emulator_url, "--port", "0", "--send", "drop-response"]
    )
    try:
        yield emulator_url, relay_url, sa, log
    finally:
        assert _stop(relay) == 0
        assert _stop(emulator) == 0


def test_a_dropped_response_through_the_cli_relay_is_one_copy_and_unknown(
    kit: tuple[str, str, Path, Path],
) -> None:
    from datetime import UTC, datetime

    emulator_url, relay_url, sa, log = kit
    provider = GmailProvider(
        "gmail",
        credentials_file=sa,
        user="support@example.com",
        api_endpoint=relay_url,
        token_uri=emulator_url + "/token",
        timeout=5.0,
    )
    raw = build_message(
        from_addr="Support <support@example.com>",
        to=["bob@example.com"],
        subject="Your receipt",
        body="Thanks.",
        message_id="<job-cli-kit@mail.example.com>",
        date=datetime(2026, 1, 1, tzinfo=UTC),
    )
    try:
        first = provider.send_raw(raw)
        found = provider.search("<job-cli-kit@mail.example.com>")
    finally:
        provider.close()
    assert first.kind is SendKind.UNKNOWN
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [line["message_id"] for line in lines] == ["<job-cli-kit@mail.example.com>"]
    assert found.copies == [lines[0]["id"]]
    assert found.query == "rfc822msgid:job-cli-kit@mail.example.com"


def test_demo_settles_every_job_with_at_most_one_copy(tmp_path: Path) -> None:
    summary, _ = run_demo("--lag", "1s", "--dir", str(tmp_path / "demo"), timeout=180)
    assert "emulator" in summary["against"]


def _interrupted_demo(folder: Path, moment: str) -> tuple[int, str, float]:
    """`sendledger demo` sent a Ctrl-C once it printed `moment`: its exit code, its
    stderr, and the seconds it took to end after the Ctrl-C."""
    proc = subprocess.Popen(
        [SENDLEDGER, "demo", "--keep", str(folder)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},  # each line as it is printed
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if moment in line:
                break
        proc.send_signal(signal.SIGINT)
        asked = time.monotonic()
        _, err = proc.communicate(timeout=60)
        return proc.returncode, err, time.monotonic() - asked
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_ctrl_c_in_the_demo_names_the_folder_it_keeps(tmp_path: Path) -> None:
    # The folder was named in the demo's first lines, long scrolled away by then.
    folder = tmp_path / "demo"
    # A job has settled: the daemon is sending the others.
    code, err, _ = _interrupted_demo(folder, "  t=")
    assert code == 130, err
    assert err.splitlines()[-1] == (
        f"sendledger: interrupted: the demo stopped; its work folder is kept: {folder} (the "
        "store ledger.sqlite, the config sendledger.toml and daemon.log)"
    )
    assert (folder / "ledger.sqlite").is_file() and (folder / "daemon.log").is_file(), (
        sorted(p.name for p in folder.iterdir()),
        err,
    )


@pytest.mark.parametrize(
    "moment",
    ["  work folder  ", " jobs submitted.", "  t="],
    ids=["emulator-starting", "daemon-starting", "daemon-sending"],
)
def test_a_ctrl_c_at_any_moment_stops_the_demo_s_daemon_and_ends(
    tmp_path: Path, moment: str
) -> None:
    """A Ctrl-C is acted on where the demo waits, not raised wherever its main thread is:
    the daemon it started is stopped as SIGTERM stops `run`, its calls in flight recorded,
    before the emulator it calls (docs/operations.md "What the demo shows")."""
    folder = tmp_path / "demo"
    code, err, took = _interrupted_demo(folder, moment)
    assert code == 130, err
    assert err.splitlines()[-1].startswith("sendledger: interrupted: the demo stopped"), err
    assert "Traceback" not in err, err
    assert took < 20, took
    log = (folder / "daemon.log").read_text(encoding="utf-8")
    if "sendledger running" in log:
        assert "sendledger.daemon: stopped;" in log, log
