"""The HTTP API's routes and pages in process (ASGI, no socket) on the memory store with
the fake provider: each door only parses and formats, so these check the mapping of the
service layer's answers and refusals to statuses and pages."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import nullcontext
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from tests.unit.engine_rig import EngineRig, policy

from daemon.api.app import create_app
from daemon.api.auth import TokenBook
from daemon.api.context import ApiContext
from daemon.api.health import HealthSources
from daemon.api.metrics import Metrics, Sources
from daemon.doubles.fake_provider import Scripted
from daemon.service_layer.services import ChannelPolicies

TOKEN = "alice-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def rig() -> Iterator[EngineRig]:
    rig = EngineRig(policy("legal", on_unknown="review"), policy("other", on_unknown="review"))
    yield rig
    rig.close()


def api_context(rig: EngineRig, policy_error: str | None = None, **changes: Any) -> ApiContext:
    """The API over the rig's ledger and fake provider (`changes`: other ApiContext fields)."""
    return ApiContext(
        ledger=rig.ledger,
        policies=lambda: rig.policies,
        tokens=changes.pop("tokens", TokenBook({TOKEN: "alice"})),
        max_body=changes.pop("max_body", 1_000_000),
        health=HealthSources(rig.ledger, lambda: rig.policies, lambda: policy_error, ["fake"]),
        metrics=Metrics(Sources(rig.ledger, {"fake": rig.provider})),
        providers=lambda name: nullcontext(rig.provider),
        **changes,
    )


@pytest.fixture
def client(rig: EngineRig) -> Iterator[TestClient]:
    broken = {"other": "other.toml:-: broken"}
    ctx = api_context(rig, intake_policies=lambda: ChannelPolicies(rig.policies, broken))
    with TestClient(create_app(ctx)) as client:
        yield client


def job(key: str, channel: str = "legal", **extra: Any) -> dict[str, Any]:
    return {"channel": channel, "key": key, "to": "c@example.net", "subject": "S", "body": "b"} | (
        extra
    )


def in_review(rig: EngineRig, client: TestClient, key: str, *, copy: bool) -> None:
    assert client.post("/v1/jobs", json=job(key), headers=AUTH).status_code == 201
    rig.provider.script(Scripted.dropped_response() if copy else Scripted.lost_request())
    rig.tick()
    rig.clock.advance(61)  # past search_after: a resend may search


def test_intake_statuses_and_the_broken_channel(client: TestClient) -> None:
    assert client.post("/v1/jobs", json=job("k1"), headers=AUTH).status_code == 201
    assert client.post("/v1/jobs", json=job("k1"), headers=AUTH).status_code == 200
    assert client.post("/v1/jobs", json=job("k1", subject="x"), headers=AUTH).status_code == 409
    broken = client.post("/v1/jobs", json=job("k2", "other"), headers=AUTH)
    assert broken.status_code == 422 and broken.json()["errors"][0]["field"] == "channel"
    assert client.post("/v1/jobs", content=b"{", headers=AUTH).status_code == 422
    assert client.post("/v1/jobs", json=job("k3")).status_code == 401
    assert client.get("/v1/jobs/k1", headers=AUTH).json()["state"] == "requested"
    assert client.get("/v1/jobs/nope", headers=AUTH).status_code == 404
    assert client.get("/v1/jobs/nope/events", headers=AUTH).status_code == 404


def test_check_resolve_triage_cancel_statuses(rig: EngineRig, client: TestClient) -> None:
    in_review(rig, client, "found", copy=True)
    in_review(rig, client, "lost", copy=False)
    check = client.post("/v1/review/found/check", headers=AUTH)
    assert check.status_code == 200 and check.json()["count"] == 1
    resend = client.post("/v1/review/found/resolve", json={"as": "resend"}, headers=AUTH)
    assert resend.status_code == 409 and "1 copy found" in resend.json()["error"]
    rig.provider.fail_searches(1)
    failed = client.post("/v1/review/lost/resolve", json={"as": "resend"}, headers=AUTH)
    assert failed.status_code == 503 and "nothing was sent" in failed.json()["error"]
    listed = client.get("/v1/review?reason=unknown-outcome", headers=AUTH).json()
    assert [row["key"] for row in listed] == ["found", "lost"]
    assert listed[0]["to"] == ["c@example.net"] and listed[0]["state"] == "review"
    triage = client.post("/v1/review/triage", json={"dry_run": True}, headers=AUTH).json()
    assert [(i["key"], i["action"]) for i in triage] == [
        ("found", "would-resolve-sent"),
        ("lost", "left"),
    ]
    assert client.post("/v1/jobs", json=job("fresh"), headers=AUTH).status_code == 201
    cancelled = client.post("/v1/jobs/fresh/cancel", json={"note": "n"}, headers=AUTH)
    assert cancelled.status_code == 200 and cancelled.json()["state"] == "cancelled"
    later = client.post("/v1/jobs/found/cancel", headers=AUTH)
    assert later.status_code == 409 and "is in review" in later.json()["error"]
    assert client.post("/v1/review/nope/check", headers=AUTH).status_code == 404


def test_pages_render_and_act(rig: EngineRig, client: TestClient) -> None:
    in_review(rig, client, "found", copy=True)
    queue = client.get("/ui/", headers=AUTH)
    assert queue.status_code == 200 and "found" in queue.text and "c@example.net" in queue.text
    checked = client.post("/ui/jobs/found/check", headers=AUTH)
    assert "1 copy found" in checked.text and 'value="resend"' not in checked.text
    done = client.post(
        "/ui/jobs/found/resolve", data={"as": "sent"}, headers=AUTH, follow_redirects=False
    )
    assert done.status_code == 303
    notice = client.get(done.headers["location"], headers=AUTH).text
    assert "Done: resolved as sent." in notice
    crafted = client.get("/ui/jobs/found?done=call+555-0100+now", headers=AUTH).text
    assert "555-0100" not in crafted
    assert client.get("/v1/jobs/found", headers=AUTH).json()["state"] == "confirmed"
    triage = client.post("/ui/triage", data={"mode": "dry-run"}, headers=AUTH)
    assert triage.status_code == 200 and "Dry run: nothing recorded" in triage.text
    overview = client.get("/ui/overview", headers=AUTH)
    assert "<svg" in overview.text and "sends (1)" in overview.text
    assert client.get("/ui/search?q=found", headers=AUTH).status_code == 200
    assert client.get("/ui/jobs/nope", headers=AUTH).status_code == 404
    # Without a token: the sign-in form, nothing of a job.
    assert "found" not in client.get("/ui/jobs/found").text


def test_every_template_escapes_and_shows_controls_as_escapes(client: TestClient) -> None:
    from daemon.api import ui

    templates = ui._templates
    for name in templates.list_templates():
        templates.get_template(name)  # loads: a template that does not compile raises
    escape = templates.autoescape
    assert escape is True or (callable(escape) and escape("x.html"))
    hostile = "<img src=x onerror=alert(1)>\x1b[31m"
    rendered = templates.get_template("message.html").render(title="t", message=hostile)
    assert "<img" not in rendered and "&lt;img" in rendered
    assert "\x1b" not in rendered and "\\x1b[31m" in rendered


def test_an_unknown_review_reason_is_422_naming_it(rig: EngineRig, client: TestClient) -> None:
    # `reason=unknown` (for unknown-outcome) answered [] with 200: an empty queue for a
    # typo, and a triage of nothing reported as done.
    in_review(rig, client, "lost", copy=False)
    listed = client.get("/v1/review?reason=unknown", headers=AUTH)
    triage = client.post("/v1/review/triage", json={"reason": "unknown"}, headers=AUTH)
    for answer in (listed, triage):
        assert answer.status_code == 422, answer.text
        assert answer.json()["error"].startswith("reason: one of unknown-outcome")
        assert [e["field"] for e in answer.json()["errors"]] == ["reason"]
    assert client.get("/v1/review?reason=unknown-outcome", headers=AUTH).json()[0]["key"] == "lost"


def test_searches_made_through_the_doors_are_counted(rig: EngineRig, client: TestClient) -> None:
    """docs/http-api.md "Metrics": a check (API and page), a triage and a resend's search
    are searches of the mailbox like the engine's, each counted once by its result and
    timed as a provider call; none counted under `sendledger_searches_total` before."""
    in_review(rig, client, "found", copy=True)
    in_review(rig, client, "lost", copy=False)
    assert client.post("/v1/review/found/check", headers=AUTH).json()["count"] == 1
    assert client.post("/v1/review/lost/check", headers=AUTH).json()["count"] == 0
    triage = client.post("/v1/review/triage", json={"dry_run": True}, headers=AUTH)
    assert [item["count"] for item in triage.json()] == [1, 0]
    resend = client.post("/v1/review/lost/resolve", json={"as": "resend"}, headers=AUTH)
    assert resend.status_code == 200
    metrics: Metrics = client.app.state.ctx.metrics  # type: ignore[attr-defined]
    found = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(metrics.render().decode())
        for s in family.samples
    }
    assert found[("sendledger_searches_total", (("result", "hit"),))] == 2
    assert found[("sendledger_searches_total", (("result", "miss"),))] == 3
    assert ("sendledger_searches_total", (("result", "duplicate"),)) not in found
    timed = (
        "sendledger_provider_call_duration_seconds_count",
        (("operation", "search"), ("provider", "fake")),
    )
    assert found[timed] == 5
