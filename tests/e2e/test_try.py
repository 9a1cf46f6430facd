"""`sendledger try` as a person runs it (README "Try it without a mailbox"): the printed
curl and `sendledger submit` lines work as printed (run by a shell), the submitted job is
confirmed, a real browser (headless Chromium, as tests/e2e/test_review_page.py) opens the
printed URL and signs in with the printed token and finds the three jobs `try` put in
review, and Ctrl-C ends it with 130, the folder kept."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from pathlib import Path

import httpx
from tests.e2e.conftest import sendledger_command
from tests.e2e.test_review_page import CHROMIUM, _require_browser

from daemon.tools.try_it import CONFIRMED_KEYS, REVIEW_KEYS


def _printed(proc: subprocess.Popen[str], until: str, limit: float = 120.0) -> list[str]:
    assert proc.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + limit
    for line in proc.stdout:
        lines.append(line.rstrip("\n"))
        if until in line:
            return lines
        assert time.monotonic() < deadline, "\n".join(lines)
    raise AssertionError("try ended early:\n" + "\n".join(lines))


def start_try(folder: Path, lag: str, *, sigint_ignored: bool = False) -> subprocess.Popen[str]:
    """`sendledger try` on `folder` and a free port, its output (stderr too) read as text;
    `sigint_ignored`: started as a script starts a job in the background."""
    return subprocess.Popen(
        [*sendledger_command(), "try", "--dir", str(folder), "--port", "0", "--lag", lag],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
        if sigint_ignored
        else None,
    )


def _field(lines: list[str], name: str) -> str:
    found = next(line for line in lines if line.startswith(f"  {name} "))
    return found.split(None, len(name.split()))[-1]


def test_try_prints_lines_that_work_and_a_page_that_signs_in(tmp_path: Path) -> None:
    _require_browser()
    from playwright.sync_api import sync_playwright

    folder = tmp_path / "try"
    started = time.monotonic()
    proc = start_try(folder, "300ms")
    try:
        lines = _printed(proc, "Ctrl-C stops")
        url = _field(lines, "review page")
        token = _field(lines, "token")
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/ui/", url), lines
        commands = [line[4:] for line in lines if line.startswith("  $ ")]
        curl, submit, status, _review = commands
        assert curl.startswith("curl ") and " submit " in submit and " status " in status
        for key in (*REVIEW_KEYS, *CONFIRMED_KEYS):
            assert any(key in line for line in lines), key

        # The lines work as printed, through a shell.
        answer = subprocess.run(curl, shell=True, capture_output=True, text=True, timeout=60)
        assert answer.returncode == 0, answer.stderr
        assert json.loads(answer.stdout)["created"] is True
        submitted = subprocess.run(submit, shell=True, capture_output=True, text=True, timeout=60)
        assert submitted.returncode == 0, submitted.stderr
        api = url.removesuffix("/ui/")
        auth = {"Authorization": f"Bearer {token}"}
        for key in ("try-curl-1", "first-job-1"):
            deadline = time.monotonic() + 60
            while httpx.get(f"{api}/v1/jobs/{key}", headers=auth).json()["state"] != "confirmed":
                assert time.monotonic() < deadline, key
                time.sleep(0.1)
        first_confirmed = time.monotonic() - started
        shown = subprocess.run(status, shell=True, capture_output=True, text=True, timeout=60)
        assert re.search(r"^state\s+confirmed$", shown.stdout, re.M), shown.stdout

        with sync_playwright() as p:
            browser = p.chromium.launch(
                executable_path=CHROMIUM, headless=True, args=["--disable-dev-shm-usage"]
            )
            try:
                page = browser.new_page(java_script_enabled=False)
                page.goto(url)
                page.fill("input[name=token]", token)
                page.click("button[type=submit]")
                queue = page.inner_text("#queue")
                assert all(key in queue for key in REVIEW_KEYS), queue
                page.click(f"text={REVIEW_KEYS[0]}")
                page.click("#check button[type=submit]")
                assert "2 copies found" in page.inner_text("#check-result")
                assert page.inner_text("#customer-copies").startswith("The customer has 2")
            finally:
                browser.close()
        print(f"try: first confirmed job {first_confirmed:.1f}s after the command started")
    finally:
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, rest
    assert "The folder is kept" in rest
    assert (folder / "ledger.sqlite").is_file() and (folder / "daemon.log").is_file()
    assert "WARNING" not in "\n".join(lines)  # log lines go to daemon.log, not the story
