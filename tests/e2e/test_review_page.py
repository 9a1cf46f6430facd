"""The review page in a real browser: headless Chromium (Debian's package) driven by
Playwright against `sendledger api` running as a process. Signs in with a token, opens a
job in review, resolves it, and checks the job's state changed in the store."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.conftest import IN_CI
from tests.e2e.api_process import MAILBOX, sendledger_api
from tests.integration.api_kit import TOKEN, job

from ledger.application import Ledger
from ledger.decision_types import Duplicate, Review, SearchAt
from ledger.job import SendJob
from ledger.vocabulary import EscalationReason, JobState, PolicyRef
from testkit.gmail_emulator import GmailEmulator

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


SHOTS = {
    "queue": "review-queue.png",
    "job": "review-job.png",
    "job-unknown": "review-job-unknown.png",
    "job-duplicate": "review-job-duplicate.png",
    "triage": "review-triage.png",
    "overview": "review-overview.png",
}


#: The docs' screenshots are taken only when they are to be written (they check nothing;
#: six full-page captures were about two seconds of the test).
UPDATE_SHOTS = bool(os.environ.get("UPDATE_REVIEW_SCREENSHOT"))


def _shot(page: Any, shots: Path, name: str) -> None:
    if UPDATE_SHOTS:
        page.screenshot(path=str(shots / SHOTS[name]), full_page=True)


@pytest.fixture
def api_process(tmp_path: Path) -> Iterator[tuple[str, Path, GmailEmulator]]:
    """`sendledger api` as a process; its provider is the Gmail emulator, so the page's
    check button searches a real (emulated) mailbox."""
    with sendledger_api(tmp_path) as served:
        yield served


def _to_review(folder: Path, *keys: str) -> None:
    with Ledger(f"sqlite:///{folder / 'ledger.sqlite'}") as ledger:
        review = Review(
            policy=PolicyRef("receipts", "f" * 16), reason=EscalationReason.UNKNOWN_OUTCOME
        )
        for key in keys:
            ledger.update(key, lambda j: j.escalate(review, detail="test", at=datetime.now(UTC)))


def _to_duplicate(folder: Path, key: str, copies: list[str]) -> None:
    """The job as the daemon leaves it when a search finds two copies: claimed, unknown,
    then Duplicate and Escalated(duplicate)."""
    ref = PolicyRef("receipts", "f" * 16)
    now = datetime.now(UTC)

    def duplicate(job: SendJob) -> None:
        job.claim(provider="support", deadline=now + timedelta(minutes=1), at=now)
        job.record_unknown(reason="timed out", decision=SearchAt(ref, now), at=now)
        job.record_search(query="rfc822msgid:", copies=copies, decision=Duplicate(ref), at=now)

    with Ledger(f"sqlite:///{folder / 'ledger.sqlite'}") as ledger:
        ledger.update(key, duplicate)


def axe_violations(page: Any) -> list[str]:
    """axe-core's violations on the page now (the page's own CSP set aside for the
    script; the page itself runs none): `id (impact): nodes` each. The script (570 KB) is
    put in the page once per load: a second run on the same page (another width) reuses it,
    which costs as much as the run itself."""
    # axe-playwright-python ships no type hints.
    from axe_playwright_python.sync_playwright import DEFAULT_OPTIONS, Axe  # type: ignore[import-untyped]

    if page.evaluate("typeof window.axe === 'undefined'"):
        page.evaluate(Axe().axe_script)
    response = page.evaluate("options => axe.run(document, options)", DEFAULT_OPTIONS)
    return [
        f"{v['id']} ({v['impact']}): {', '.join(n['target'][0] for n in v['nodes'])}"
        for v in response["violations"]
    ]


def _copy(message_id: str, to: str, subject: str) -> bytes:
    return (
        f"From: Support <support@example.com>\r\nTo: {to}\r\nSubject: {subject}\r\n"
        f"Date: Tue, 01 Dec 2026 09:00:00 +0000\r\nMessage-ID: {message_id}\r\n\r\nThanks.\r\n"
    ).encode()


def test_sign_in_check_resolve_triage_and_cancel(
    api_process: tuple[str, Path, GmailEmulator], tmp_path: Path
) -> None:
    _require_browser()
    from playwright.sync_api import sync_playwright

    url, folder, emulator = api_process
    auth = {"Authorization": f"Bearer {TOKEN}"}
    key, other, later, dup = "order-4711", "order-4712", "later-1", "order-4713"
    message_ids = {}
    jobs: tuple[tuple[str, dict[str, str]], ...] = (
        (key, {}),
        (other, {}),
        (later, {"send_at": "2099-01-01T09:00:00Z"}),
        (dup, {}),
    )
    for name, extra in jobs:
        submitted = httpx.post(url + "/v1/jobs", json=job(name, **extra), headers=auth)
        assert submitted.status_code == 201
        message_ids[name] = submitted.json()["message_id"]
    _to_review(folder, key, other)
    # The first send of order-4711 did arrive: its copy is in the sender's Sent folder.
    emulator.inject(
        _copy(message_ids[key], "Customer <customer@example.org>", "Your receipt"), user=MAILBOX
    )
    # order-4713 reached the customer twice: the daemon's search found both copies.
    for _ in range(2):
        emulator.inject(
            _copy(message_ids[dup], "customer@example.org", "Your receipt"), user=MAILBOX
        )
    _to_duplicate(folder, dup, ["id-1", "id-2"])
    shots = tmp_path / "shots"
    shots.mkdir()

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
            queue = page.inner_text("#queue")
            assert "customer@example.org" in queue and "Your receipt" in queue
            assert "unknown-outcome" in queue and re.search(r"\t\d+ (s|min)\t", queue), queue
            assert "duplicate (duplicate)" not in queue  # the reason once, not twice
            _shot(page, shots, "queue")

            # An unknown outcome, never checked: what it means, and "sent" asks for a note.
            page.goto(f"{url}/ui/jobs/{other}")
            assert "may or may not have sent this message" in page.inner_text("#meaning")
            assert page.inner_text("#next").startswith("Next: Check the mailbox first")
            assert "the note must say how you know" in page.inner_text("#resolve")
            _shot(page, shots, "job-unknown")

            # A duplicate: how many copies the customer has, and what each action does.
            page.goto(f"{url}/ui/jobs/{dup}")
            assert page.inner_text("#customer-copies").startswith("The customer has 2 copies")
            resolve = page.inner_text("#resolve")
            assert "records that the customer has it (2 copies)" in resolve
            assert "the customer keeps the 2 copies it has" in resolve
            assert page.locator("input[name=as][value=resend]").count() == 0
            _shot(page, shots, "job-duplicate")

            # Check: the copy is found and shown; resend is no longer offered.
            page.goto(url + "/ui/")
            page.click(f"text={key}")
            assert page.inner_text("#state") == "review"
            page.click("#check button[type=submit]")
            assert "1 copy found" in page.inner_text("#check-result")
            assert "Your receipt" in page.inner_text("#copies")
            assert page.locator("input[name=as][value=resend]").count() == 0
            page.check("input[name=as][value=sent]")
            page.fill("#resolve textarea[name=note]", "one copy found in Sent")
            _shot(page, shots, "job")
            # axe-core on every page, wide and at 390 px, before anything is resolved.
            _no_axe_violations(browser, url, page.context.cookies(), [key, other, dup])
            page.click("#resolve button[type=submit]")
            assert page.inner_text("#state") == "confirmed"
            assert "Checked" in page.inner_text("#timeline")

            # Triage, dry run first: the other job has no copy and would be left.
            page.click("nav >> text=Triage")
            page.click("#triage button[value=dry-run]")
            results = page.inner_text("#triage-results")
            assert other in results and "none found: left in review" in results
            _shot(page, shots, "triage")

            # Find the scheduled job by its key and cancel it.
            page.goto(url + "/ui/")
            page.fill("input[name=q]", later)
            page.click("form[role=search] button")
            page.click(f"text={later}")
            page.fill("#cancel textarea[name=note]", "customer withdrew")
            page.click("#cancel button[type=submit]")
            assert page.inner_text("#state") == "cancelled"

            page.click("nav >> text=Overview")
            assert page.locator("#chart").count() == 1
            assert "review\n" in page.inner_text("#open-counts").lower()
            _shot(page, shots, "overview")

            # Readable at 390 px: nothing runs off the screen, and the chart is drawn at the
            # width it is shown, its labels at their size (measured with a script in a
            # second page; the pages themselves need none).
            narrow = browser.new_page(viewport={"width": 390, "height": 844})
            # playwright types what cookies() gives and what add_cookies() takes as two
            # TypedDicts that do not match (str against str | None), though one is the other.
            narrow.context.add_cookies(page.context.cookies())  # type: ignore[arg-type]
            for path in (
                "/ui/",
                f"/ui/jobs/{key}",
                f"/ui/jobs/{dup}",
                "/ui/triage",
                "/ui/overview",
            ):
                narrow.goto(url + path)
                width = narrow.evaluate("document.documentElement.scrollWidth")
                assert width <= 390, (path, width)
            shown = narrow.evaluate(
                "[...document.querySelectorAll('svg')].filter(s => s.getBoundingClientRect()"
                ".width > 0).map(s => [s.id, s.getBoundingClientRect().width, "
                "s.viewBox.baseVal.width, Math.min(...[...s.querySelectorAll('text')]"
                ".map(t => t.getBoundingClientRect().height))])"
            )
            assert [row[0] for row in shown] == ["chart-narrow"], shown
            _id, drawn, drawn_for, label = shown[0]
            assert drawn >= drawn_for * 0.95 and label >= 10, shown  # not scaled down
            icon = httpx.get(url + "/favicon.ico", follow_redirects=True)
            assert icon.status_code == 200 and icon.headers["content-type"] == "image/svg+xml"
            if UPDATE_SHOTS:
                for name in SHOTS.values():
                    shutil.copy(shots / name, REPO / "docs" / name)
                narrow.goto(url + "/ui/")
                narrow.screenshot(path=str(REPO / "docs" / "review-queue-390.png"), full_page=True)
                narrow.goto(url + "/ui/overview")
                narrow.screenshot(
                    path=str(REPO / "docs" / "review-overview-390.png"), full_page=True
                )
        finally:
            browser.close()

    assert httpx.get(f"{url}/v1/jobs/{key}", headers=auth).json()["state"] == JobState.CONFIRMED
    events = httpx.get(f"{url}/v1/jobs/{key}/events", headers=auth).json()
    checked = [e for e in events if e["type"] == "Checked"]
    assert checked[0]["by"] == "alice" and len(checked[0]["provider_message_ids"]) == 1
    resolved = [e for e in events if e["type"] == "Resolved"]
    assert resolved[0]["by"] == "alice" and resolved[0]["note"] == "one copy found in Sent"
    assert httpx.get(f"{url}/v1/jobs/{later}", headers=auth).json()["state"] == "cancelled"
    assert httpx.get(f"{url}/v1/jobs/{other}", headers=auth).json()["state"] == "review"
    assert emulator.copies(message_ids[key]) == 1 and emulator.copies(message_ids[later]) == 0


def _no_axe_violations(browser: Any, url: str, cookies: Any, keys: list[str]) -> None:
    """axe-core finds nothing on any page, signed out and in, at 1100 and 390 px: each
    page is loaded once and checked at both widths (the viewport resized in between, so
    its media queries and layout are the narrow ones, as when loaded at 390 px)."""
    paths = ["/ui/", *(f"/ui/jobs/{k}" for k in keys), "/ui/triage", "/ui/overview",
             "/ui/search?q=order"]  # fmt: skip
    found: dict[str, list[str]] = {}
    context = browser.new_context(bypass_csp=True)
    try:
        page = context.new_page()
        # Signed out first (the sign-in form), then every page signed in.
        for where, path in [("sign-in", "/ui/"), *((path, path) for path in paths)]:
            if where == path and not context.cookies():
                context.add_cookies(cookies)
            page.set_viewport_size({"width": 1100, "height": 900})
            page.goto(url + path)
            for width in (1100, 390):
                page.set_viewport_size({"width": width, "height": 900})
                found[f"{where}@{width}"] = axe_violations(page)
    finally:
        context.close()
    assert {where: v for where, v in found.items() if v} == {}, found
