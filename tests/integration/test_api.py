"""The HTTP API through the real server (uvicorn on loopback, SQLite store): every status
docs/http-api.md "HTTP API" lists, nothing written on any error, the token's name recorded."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from tests.integration.api_kit import Api, job, running_api, write_config

from ledger.decision_types import Review
from ledger.vocabulary import EscalationReason, JobState, PolicyRef


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    settings = write_config(tmp_path, f"sqlite:///{tmp_path / 'ledger.sqlite'}", max_body="4KB")
    with running_api(settings) as running:
        yield running


def jobs_in(api: Api) -> list[str]:
    return [row.key for row in api.ledger.jobs()]


def to_review(api: Api, key: str) -> None:
    review = Review(policy=PolicyRef("receipts", "f" * 16), reason=EscalationReason.UNKNOWN_OUTCOME)
    api.ledger.update(key, lambda j: j.escalate(review, detail="test", at=datetime.now(UTC)))


def test_submit_201_then_200_for_the_same_content_then_409(api: Api) -> None:
    first = api.client.post("/v1/jobs", json=job(), headers=api.auth())
    assert first.status_code == 201, first.text
    assert first.json()["created"] is True
    assert first.json()["message_id"].startswith("<job-")
    again = api.client.post("/v1/jobs", json=job(), headers=api.auth())
    assert again.status_code == 200
    assert again.json()["created"] is False
    other = api.client.post("/v1/jobs", json=job(subject="Other"), headers=api.auth())
    assert other.status_code == 409
    assert "other content" in other.json()["error"]
    assert api.ledger.get_job("order-1").content.subject == "Your receipt"


def test_a_batch_is_all_or_nothing(api: Api) -> None:
    assert api.client.post("/v1/jobs", json=job("a"), headers=api.auth()).status_code == 201
    bad = [job("b"), job("c", to="not an address")]
    answer = api.client.post("/v1/jobs", json=bad, headers=api.auth())
    assert answer.status_code == 422
    assert answer.json()["errors"][0] == {
        "index": 1,
        "field": "to",
        "reason": answer.json()["errors"][0]["reason"],
    }
    conflicting = [job("d"), job("a", subject="changed")]
    assert api.client.post("/v1/jobs", json=conflicting, headers=api.auth()).status_code == 409
    assert jobs_in(api) == ["a"]
    ok = api.client.post("/v1/jobs", json=[job("b"), job("c")], headers=api.auth())
    assert ok.status_code == 201
    assert [r["key"] for r in ok.json()] == ["b", "c"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b"{not json", "job"),
        (b"[]", "job"),
        (json.dumps({**job(), "color": "red"}).encode(), "color"),
        (json.dumps(job(subject="a\r\nBcc: x@example.com")).encode(), "subject"),
        (json.dumps(job(channel="nope")).encode(), "channel"),
        (json.dumps(job(headers={"From": "eve@example.com"})).encode(), "headers.From"),
        (json.dumps({**job(), "from": "eve@example.com"}).encode(), "from"),
        (json.dumps({**job(), "thread_id": "a b"}).encode(), "thread_id"),
        (b"\xff\xfe", "job"),
    ],
)
def test_invalid_jobs_are_422_per_field_and_nothing_is_written(
    api: Api, body: bytes, field: str
) -> None:
    answer = api.client.post(
        "/v1/jobs", content=body, headers={**api.auth(), "Content-Type": "application/json"}
    )
    assert answer.status_code == 422, answer.text
    assert answer.json()["errors"][0]["field"] == field
    assert jobs_in(api) == []


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong-token-0123456789"}])
def test_no_valid_token_is_401_everywhere(api: Api, headers: dict[str, str]) -> None:
    assert api.client.post("/v1/jobs", json=job(), headers=headers).status_code == 401
    for path in ("/v1/jobs/order-1", "/v1/jobs/order-1/events", "/v1/review"):
        answer = api.client.get(path, headers=headers)
        assert answer.status_code == 401
        assert answer.headers["www-authenticate"] == "Bearer"
    resolve = api.client.post("/v1/review/x/resolve", json={"as": "sent"}, headers=headers)
    assert resolve.status_code == 401
    assert jobs_in(api) == []


def test_a_body_over_max_body_is_413_and_nothing_is_written(api: Api) -> None:
    big = job(body="x" * 5000)
    assert api.client.post("/v1/jobs", json=big, headers=api.auth()).status_code == 413

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it arrives
        yield json.dumps(big).encode()

    answer = api.client.post("/v1/jobs", content=chunks(), headers=api.auth())
    assert answer.status_code == 413
    assert jobs_in(api) == []


def test_status_events_404_and_review_resolve(api: Api) -> None:
    assert api.client.get("/v1/jobs/nope", headers=api.auth()).status_code == 404
    assert api.client.get("/v1/jobs/nope/events", headers=api.auth()).status_code == 404
    key = "shop/order 7"  # a slash and a space in a key
    api.client.post("/v1/jobs", json=job(key), headers=api.auth())
    status = api.client.get(f"/v1/jobs/{key}", headers=api.auth()).json()
    assert (status["key"], status["state"]) == (key, "requested")
    events = api.client.get(f"/v1/jobs/{key}/events", headers=api.auth()).json()
    assert [e["type"] for e in events] == ["Requested"]
    # Not in review: 409, the job is left as it was.
    answer = api.client.post(f"/v1/review/{key}/resolve", json={"as": "sent"}, headers=api.auth())
    assert answer.status_code == 409
    assert (
        api.client.post(
            "/v1/review/nope/resolve", json={"as": "sent"}, headers=api.auth()
        ).status_code
        == 404
    )
    assert (
        api.client.post(
            f"/v1/review/{key}/resolve", json={"as": "maybe"}, headers=api.auth()
        ).status_code
        == 422
    )
    to_review(api, key)
    queue = api.client.get("/v1/review", headers=api.auth()).json()
    assert [(r["key"], r["reason"]) for r in queue] == [(key, "unknown-outcome")]
    done = api.client.post(
        f"/v1/review/{key}/resolve", json={"as": "abandon", "note": "dup"}, headers=api.auth()
    )
    assert done.status_code == 200, done.text
    assert done.json()["state"] == "abandoned"
    resolved = api.ledger.history(key)[-1]
    assert (type(resolved).__name__, resolved.by, resolved.note) == ("Resolved", "alice", "dup")
    # Who submitted is recorded too: the name of the token the job came with.
    requested = api.ledger.history(key)[0]
    assert (type(requested).__name__, requested.submitted_by) == ("Requested", "alice")
    assert api.ledger.get_job(key).state is JobState.ABANDONED


def test_healthz_and_metrics_need_no_token(api: Api) -> None:
    health = api.client.get("/healthz")
    assert health.status_code == 200, health.text
    # Without a token: pass or fail per check, nothing else.
    assert health.json() == {
        "ok": True,
        "checks": {"store": True, "scheduler": True, "policies": True, "providers": True},
    }
    detailed = api.client.get("/healthz", headers=api.auth())
    assert detailed.json()["checks"]["policies"]["channels"] == ["receipts"]
    api.client.post("/v1/jobs", json=job(), headers=api.auth())
    metrics = api.client.get("/metrics")
    assert metrics.status_code == 200
    assert metrics.headers["content-type"].startswith("text/plain")
    assert 'sendledger_jobs{state="requested"} 1.0' in metrics.text
    assert 'sendledger_jobs{state="review"} 0.0' in metrics.text  # empty, still a series
    assert 'sendledger_open_jobs{channel="receipts",state="requested"} 1.0' in metrics.text
    assert 'sendledger_provider_handle_reliable{provider="support"} 1.0' in metrics.text


def test_healthz_is_503_with_the_reason_when_a_handle_is_unreliable(api: Api) -> None:
    api.ledger.mark_handle(
        "support",
        lambda h: h.mark_unreliable(
            expected="<a@b>",
            observed="<c@d>",
            provider_message_id="m1",
            job_key="k",
            at=datetime.now(UTC),
        ),
    )
    health = api.client.get("/healthz", headers=api.auth())
    assert health.status_code == 503
    assert health.json()["reasons"] == [
        "provider support: handle unreliable (its Message-IDs were replaced)"
    ]
    brief = api.client.get("/healthz")
    assert brief.status_code == 503
    assert brief.json() == {
        "ok": False,
        "checks": {"store": True, "scheduler": True, "policies": True, "providers": False},
    }


def test_openapi_documents_every_route_and_status(api: Api) -> None:
    doc = api.client.get("/v1/openapi.json").json()
    statuses = {
        (path, method): sorted(op["responses"])
        for path, item in doc["paths"].items()
        for method, op in item.items()
    }
    assert statuses[("/v1/jobs", "post")] == [
        "200",
        "201",
        "400",
        "401",
        "403",
        "409",
        "413",
        "422",
    ]
    assert statuses[("/v1/review/{key}/resolve", "post")] == [
        "200",
        "400",
        "401",
        "403",
        "404",
        "409",
        "412",
        "413",
        "422",
        "503",
    ]
    assert statuses[("/v1/jobs/{key}", "get")] == ["200", "400", "401", "403", "404", "422"]
    assert statuses[("/v1/jobs", "get")] == ["200", "400", "401", "403", "422"]
    assert statuses[("/healthz", "get")] == ["200", "400", "422", "503"]
    body = doc["paths"]["/v1/jobs"]["post"]["requestBody"]["content"]["application/json"]
    assert body["schema"]["anyOf"][0]["required"] == ["channel", "key", "to", "subject", "body"]


def test_the_daemon_serves_the_api_and_stops_it_on_shutdown(tmp_path: Path) -> None:
    import threading

    import httpx
    from tests.integration.api_kit import TOKEN

    from daemon.bootstrap import bootstrap
    from daemon.doubles.fake_provider import FakeProvider
    from daemon.from_settings import load_policies
    from daemon.runtime import Daemon
    from ledger.application import Ledger

    settings = write_config(tmp_path, f"sqlite:///{tmp_path / 'ledger.sqlite'}")
    settings = settings.model_copy(
        update={"daemon": settings.daemon.model_copy(update={"tick": 0.05})}
    )
    with Ledger(settings.store.url) as ledger:
        service = bootstrap(
            settings,
            ledger=ledger,
            policy_loader=lambda: load_policies(settings),
            providers={"support": FakeProvider("support", clock=ledger.clock)},
        )
        daemon = Daemon(service, settings.daemon.tick)
        runner = threading.Thread(target=daemon.serve)
        runner.start()
        url = f"http://{settings.api.listen}"
        try:
            for _ in range(200):
                try:
                    health = httpx.get(url + "/healthz")
                    break
                except httpx.TransportError:
                    threading.Event().wait(0.05)
            assert health.status_code == 200, health.text
            auth = {"Authorization": f"Bearer {TOKEN}"}
            health = httpx.get(url + "/healthz", headers=auth)
            assert health.json()["checks"]["scheduler"]["running"] is True
            assert httpx.post(url + "/v1/jobs", json=job(), headers=auth).status_code == 201
            for _ in range(100):  # the daemon sends it: the engine's counters move
                metrics = httpx.get(url + "/metrics").text
                if 'outcome="confirmed"' in metrics:
                    break
                threading.Event().wait(0.05)
            assert 'sendledger_sends_total{outcome="confirmed",provider="support"} 1.0' in metrics
        finally:
            daemon.request_stop()
            runner.join(timeout=20)
        assert not runner.is_alive()
        with pytest.raises(httpx.TransportError):
            httpx.get(url + "/healthz")


def test_trusted_hosts_and_public_url_reach_the_served_api(tmp_path: Path) -> None:
    settings = write_config(tmp_path, f"sqlite:///{tmp_path / 'ledger.sqlite'}")
    api_settings = settings.api.model_copy(
        update={"trusted_hosts": ["127.0.0.1"], "public_url": "https://mail.example.com"}
    )
    settings = settings.model_copy(update={"api": api_settings})
    with running_api(settings) as api:
        assert api.client.get("/healthz", headers={"host": "evil.example"}).status_code == 400
        assert api.client.head("/healthz").status_code == 200
        form = api.client.get("/ui/")
        assert "Secure" in form.headers["set-cookie"]  # public_url is https
        found = re.search(r'name="csrf" value="([^"]+)"', form.text)
        assert found is not None
