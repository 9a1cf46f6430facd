"""Review after an outage, end to end: the daemon (with its HTTP API) as a process, the
Gmail emulator behind the fault relay, the CLI as processes. Copies are counted in the
emulator's acceptance log only.

- A job in review whose first send in fact arrived cannot be resent by the page, the API
  or the CLI (each searches first and finds the copy).
- Triage after 20 jobs went to review through an outage resolves those with exactly one
  copy and leaves the rest; the rest resent afterwards arrive once; no message twice.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from tests.e2e.daemon_kit import Rig
from tests.integration.api_kit import TOKEN, free_port

from testkit.relay import FaultPlan, Mode

#: A channel whose unknown outcomes go straight to a human (an irreversible one).
LEGAL: dict[str, Any] = {
    "provider": "gmail",
    "from": "Legal <legal@shop.example>",
    "message_id_domain": "mail.shop.example",
    "on_unknown": "review",
    "irreversible": True,
    "max_attempts": 2,
    "search_after": "200ms",  # a resend searches no sooner than this after the attempt
    # These tests stage a backlog of reviews through a front end that answers no send
    # (and tests/e2e/test_races.py a run of 68): the pause of a scope's sends after ten
    # in a row (docs/policies.md) would hold the rest, one probe at a time.
    "pause_after_unanswered": 1000,
}
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def job(key: str) -> dict[str, Any]:
    return {
        "channel": "legal",
        "key": key,
        "to": f"{key}@customer.example",
        "subject": f"Notice {key}",
        "body": "Please read.\n",
    }


def with_api(rig: Rig) -> str:
    port = free_port()
    (rig.dir / "api-tokens").write_text(f"alice:{TOKEN}\n", encoding="utf-8")
    with rig.config.open("a", encoding="utf-8") as config:
        config.write(f'\n[api]\nlisten = "127.0.0.1:{port}"\ntoken_file = "api-tokens"\n')
    return f"http://127.0.0.1:{port}"


def wait_api(rig: Rig, url: str) -> None:
    def up() -> bool:
        try:
            return httpx.get(url + "/healthz", timeout=1).status_code in (200, 503)
        except httpx.TransportError:
            return False

    rig.wait_for(up, "the API to answer")


@pytest.fixture
def outage(tmp_path: Path) -> Iterator[tuple[Rig, str]]:
    # 12 sends arrive but their answers are lost; 8 never reach the provider.
    lost: list[Mode] = ["drop-response", "fail-before-forward"]
    dropped: list[Mode] = ["drop-response"]
    modes = lost * 8 + dropped * 4
    # No index lag: a copy is searchable once stored (the lag's rules are the engine's).
    rig = Rig(tmp_path, lag=0.0, plan=FaultPlan(send=modes), policies={"legal": LEGAL})
    url = with_api(rig)
    try:
        yield rig, url
    finally:
        rig.close()


def test_a_job_whose_copy_exists_cannot_be_resent_by_page_api_or_cli(
    outage: tuple[Rig, str],
) -> None:
    rig, url = outage
    key = "notice-1"
    rig.submit([job(key)])
    rig.start_daemon()
    wait_api(rig, url)
    rig.wait_state(key, "review")
    assert rig.copies(key) == 1  # the first send (answer dropped) arrived
    path = quote(key, safe="")
    time.sleep(0.3)  # past search_after: a resend's search is believed now

    api = httpx.post(f"{url}/v1/review/{path}/resolve", json={"as": "resend"}, headers=AUTH)
    assert api.status_code == 409 and "1 copy found: resolve as sent" in api.json()["error"]
    page = httpx.post(f"{url}/ui/jobs/{path}/resolve", data={"as": "resend"}, headers=AUTH)
    assert page.status_code == 409 and "1 copy found: resolve as sent" in page.text
    assert 'value="resend"' not in httpx.get(f"{url}/ui/jobs/{path}", headers=AUTH).text
    cli = rig.cli("review", "resolve", key, "--as", "resend", check=False)
    assert cli.returncode == 3 and "1 copy found: resolve as sent" in cli.stderr
    assert len(cli.stderr.strip().splitlines()) == 1

    checked = [e for e in rig.history(key) if e["type"] == "Checked"]
    assert len(checked) == 3 and {e["purpose"] for e in checked} == {"resend"}
    check = rig.cli_json("review", "check", key)
    assert check["count"] == 1 and "--as sent" in check["advice"]
    assert rig.state(key) == "review" and rig.copies(key) == 1


def test_triage_after_an_outage_resolves_one_copy_jobs_and_sends_nothing_twice(
    outage: tuple[Rig, str],
) -> None:
    rig, url = outage
    keys = [f"notice-{n:02d}" for n in range(20)]
    rig.submit([job(key) for key in keys])
    rig.start_daemon()
    wait_api(rig, url)
    rig.wait_for(lambda: all(rig.state(k) == "review" for k in keys), "20 jobs in review")
    arrived = {key for key in keys if rig.copies(key) == 1}
    assert len(arrived) == 12 and all(rig.copies(k) == 0 for k in set(keys) - arrived)

    dry = rig.cli_json("review", "triage", "--dry-run")
    assert {i["key"] for i in dry if i["action"] == "would-resolve-sent"} == arrived
    assert all(rig.state(k) == "review" for k in keys)

    answer = httpx.post(f"{url}/v1/review/triage", json={"channel": "legal"}, headers=AUTH)
    assert answer.status_code == 200, answer.text
    done = {item["key"]: item for item in answer.json()}
    assert {k for k, i in done.items() if i["action"] == "resolved-sent"} == arrived
    assert {k for k, i in done.items() if i["action"] == "left"} == set(keys) - arrived
    for key in arrived:
        assert rig.state(key) == "confirmed"
        resolved = [e for e in rig.history(key) if e["type"] == "Resolved"]
        assert resolved[-1]["note"] == "triage: one copy found" and resolved[-1]["by"] == "alice"
    for key in set(keys) - arrived:
        assert rig.state(key) == "review" and rig.types(key)[-1] == "Checked"

    # What was left had no copy: resending it is allowed and each arrives once.
    for key in sorted(set(keys) - arrived):
        resent = rig.cli("review", "resolve", key, "--as", "resend", "--json")
        assert json.loads(resent.stdout)["state"] == "requested"
    rig.wait_for(lambda: all(rig.state(k) == "confirmed" for k in keys), "all confirmed")
    assert all(rig.copies(k) == 1 for k in keys), {k: rig.copies(k) for k in keys}
    accepted = [json.loads(line)["message_id"] for line in rig.acceptance_log.open()]
    assert len(accepted) == len(set(accepted)) == 20
