"""docs/http-api.md "With curl": every line of the example runs as printed (bash, curl)
against `sendledger api` and succeeds, and every route has an example."""

from __future__ import annotations

import json
import os
import re
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import httpx
from tests.e2e.api_process import MAILBOX, sendledger_api
from tests.integration.api_kit import TOKEN, job
from tests.unit import docs_page

from daemon.api.roles import ROUTE_ROLES
from ledger.application import Ledger
from ledger.decision_types import Review
from ledger.vocabulary import EscalationReason, PolicyRef

PAGE = docs_page.DOCS / "http-api.md"


def example() -> list[str]:
    block = docs_page.section(str(PAGE), "### With curl").split("```sh\n", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line and not line.startswith("#")]


def test_every_route_has_an_example() -> None:
    lines = example()
    for method, path in [*ROUTE_ROLES, ("GET", "/v1/openapi.json"), ("GET", "/healthz"),
                         ("GET", "/metrics")]:  # fmt: skip
        pattern = re.sub(r"\\\{key\\\}", '[^/?"]+', re.escape(path)) + r"[?\"]"
        posts = [line for line in lines if " -X POST " in line]
        among = posts if method == "POST" else [line for line in lines if line not in posts]
        assert any(re.search(r"\$API" + pattern, line) for line in among), (method, path)


def test_the_examples_run_as_printed(tmp_path: Path) -> None:
    with sendledger_api(tmp_path) as (url, folder, emulator):
        auth = {"Authorization": f"Bearer {TOKEN}"}
        for key, extra in (("order-1002", {}), ("later-1", {"send_at": "2099-01-01T09:00:00Z"})):
            assert httpx.post(f"{url}/v1/jobs", json=job(key, **extra), headers=auth).is_success
        message_id = httpx.get(f"{url}/v1/jobs/order-1002", headers=auth).json()["message_id"]
        review = Review(PolicyRef("receipts", "f" * 16), EscalationReason.UNKNOWN_OUTCOME)
        with Ledger(f"sqlite:///{folder / 'ledger.sqlite'}") as ledger:
            ledger.update(
                "order-1002", lambda j: j.escalate(review, detail="t", at=datetime.now(UTC))
            )
        raw = (f"From: Support <support@example.com>\r\nTo: c@example.org\r\nSubject: Your receipt"
               f"\r\nMessage-ID: {message_id}\r\n\r\nThanks.\r\n").encode()  # fmt: skip
        emulator.inject(raw, user=MAILBOX)
        lines = example()
        assert lines[0].startswith("API=") and lines[1].startswith("TOKEN=")
        setup = "\n".join(lines[:2]).replace("http://127.0.0.1:8025", url)
        answers = []
        for line in lines[2:]:
            done = subprocess.run(
                ["bash", "-c", f"{setup}\n{line}"],
                cwd=folder,
                capture_output=True,
                text=True,
                timeout=60,
                env={k: v for k, v in os.environ.items() if k not in ("API", "TOKEN")},
            )
            assert done.returncode == 0, (line, done.stdout, done.stderr)
            answers.append(done.stdout)
    by_route = dict(zip(lines[2:], answers, strict=True))
    submitted = next(a for line, a in by_route.items() if "order-1001" in line and "-d" in line)
    assert json.loads(submitted)["created"] is True
    checked = next(a for line, a in by_route.items() if line.count("/check"))
    assert json.loads(checked)["count"] == 1
    resolved = next(a for line, a in by_route.items() if "/resolve" in line)
    assert json.loads(resolved)["state"] == "confirmed"
    cancelled = next(a for line, a in by_route.items() if "/cancel" in line)
    assert json.loads(cancelled)["state"] == "cancelled"
