"""The review page in a real browser: headless Chromium (Debian's package) driven by
Playwright against `sendledger api` running as a process. Signs in with a token, opens a
job in review, resolves it, and checks the job's state changed in the store."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from tests.conftest import IN_CI
from tests.e2e.conftest import sendledger_command
from tests.integration.api_kit import TOKEN, free_port, job

from ledger.application import Ledger
from ledger.decisions import Review
from ledger.vocabulary import EscalationReason, JobState, PolicyRef

CHROMIUM = os.environ.get("TEST_CHROMIUM", "/usr/bin/chromium")
REPO = Path(__file__).resolve().parents[2]


def _require_browser() -> None:
    reason = None
    if not Path(CHROMIUM).exists():
        reason = f"Chromium not installed at {CHROMIUM} (apt-get install chromium)"
    else:
        try:
            import playwright.sync_api  # noqa: F401
        except ImportError:
            reason = "playwright is not installed (pip install -e '.[test]')"
    if reason is None:
        return
    if IN_CI:
        pytest.fail(f"CI is set, the browser test must run: {reason}")
    pytest.skip(reason)


@pytest.fixture
def api_process(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    port = free_port()
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "receipts.toml").write_text(
        'provider = "support"\nfrom = "Support <support@example.com>"\n'
        'message_id_domain = "mail.example.com"\non_unknown = "review"\n'
    )
    (tmp_path / "api-tokens").write_text(f"alice:{TOKEN}\n")
    (tmp_path / "sa.json").write_text("{}")
    (tmp_path / "sendledger.toml").write_text(
        '[store]\nurl = "sqlite:///ledger.sqlite"\n[daemon]\npolicies_dir = "policies"\n'
        '[providers.support]\ncredentials_file = "sa.json"\n'
        f'[api]\nlisten = "127.0.0.1:{port}"\ntoken_file = "api-tokens"\n'
    )
    log = (tmp_path / "api.log").open("wb")
    process = subprocess.Popen(
        [*sendledger_command(), "--config", str(tmp_path / "sendledger.toml"), "api"],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert process.poll() is None, (tmp_path / "api.log").read_text()
            assert time.monotonic() < deadline, "sendledger api did not start"
            time.sleep(0.05)
        yield url, tmp_path
    finally:
        process.terminate()
        assert process.wait(timeout=15) == 0
        log.close()


def test_sign_in_open_a_job_in_review_and_resolve_it(
    api_process: tuple[str, Path], tmp_path: Path
) -> None:
    _require_browser()
    from playwright.sync_api import sync_playwright

    url, folder = api_process
    auth = {"Authorization": f"Bearer {TOKEN}"}
    key = "order-4711"
    submitted = httpx.post(url + "/v1/jobs", json=job(key), headers=auth)
    assert submitted.status_code == 201
    with Ledger(f"sqlite:///{folder / 'ledger.sqlite'}") as ledger:
        review = Review(
            policy=PolicyRef("receipts", "f" * 16), reason=EscalationReason.UNKNOWN_OUTCOME
        )
        ledger.update(key, lambda j: j.escalate(review, detail="test", at=datetime.now(UTC)))

    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=["--disable-dev-shm-usage"]
        )
        try:
            page = browser.new_page(
                java_script_enabled=False, viewport={"width": 1100, "height": 800}
            )
            # Without a token nothing of a job is shown.
            page.goto(f"{url}/ui/jobs/{key}")
            assert key not in page.content()
            page.goto(url + "/ui/")
            page.fill("input[name=token]", TOKEN)
            page.click("button[type=submit]")
            cookie = next(c for c in page.context.cookies() if c["name"] == "sendledger_session")
            assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
            page.click(f"text={key}")
            assert page.inner_text("#state") == "review"
            page.check("input[name=as][value=sent]")
            page.fill("textarea[name=note]", "one copy found in Sent")
            page.screenshot(path=str(tmp_path / "review-page-before.png"), full_page=True)
            page.click("form.box button[type=submit]")
            assert page.inner_text("#state") == "confirmed"
            page.screenshot(path=str(tmp_path / "review-page.png"), full_page=True)
            if os.environ.get("UPDATE_REVIEW_SCREENSHOT"):
                shutil.copy(tmp_path / "review-page-before.png", REPO / "docs" / "review-page.png")
        finally:
            browser.close()

    status = httpx.get(f"{url}/v1/jobs/{key}", headers=auth).json()
    assert status["state"] == JobState.CONFIRMED
    events = httpx.get(f"{url}/v1/jobs/{key}/events", headers=auth).json()
    resolved = [e for e in events if e["type"] == "Resolved"]
    assert resolved[0]["by"] == "alice" and resolved[0]["note"] == "one copy found in Sent"
