"""An 8 MB list of `{}` against the real server (docs/http-api.md "HTTP API", "Errors and
statuses"): refused whole for its length before any job is looked at (it was validated
item by item: 13 million problems counted, minutes under load, past a client's 120 s), a
small 422, and `/healthz` keeps answering while the body is decoded off the event loop.
A list at the limit is validated: the 422 lists 100 errors and counts them all."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from tests.integration.api_kit import Api, running_api, write_config

from daemon.service_layer.problems import MAX_BATCH, MAX_LISTED, batch_too_long


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    settings = write_config(tmp_path, f"sqlite:///{tmp_path / 'ledger.sqlite'}")
    with running_api(settings) as running:
        yield running


def test_an_8mb_batch_of_empty_jobs_is_a_small_422_and_healthz_answers(api: Api) -> None:
    items = 8_000_000 // 3
    body = b"[" + b"{}," * (items - 1) + b"{}]"
    answer: list[httpx.Response] = []

    def submit() -> None:
        with httpx.Client(base_url=api.url, timeout=120) as client:
            headers = {**api.auth(), "content-type": "application/json"}
            answer.append(client.post("/v1/jobs", content=body, headers=headers))

    poster = threading.Thread(target=submit)
    latencies: list[float] = []
    started = time.monotonic()
    poster.start()
    with httpx.Client(base_url=api.url, timeout=60) as health:
        while poster.is_alive():
            before = time.monotonic()
            assert health.get("/healthz").status_code == 200
            latencies.append(time.monotonic() - before)
            time.sleep(0.05)
    poster.join()
    took = time.monotonic() - started
    (response,) = answer
    assert response.status_code == 422
    reason = batch_too_long(items).reason
    assert response.json() == {
        "error": f"job: {reason}",
        "errors": [{"index": None, "field": "job", "reason": reason}],
        "count": 1,
    }
    worst = max(latencies, default=0.0)
    print(f"8 MB batch: {took:.1f} s, response {len(response.content)} bytes, "
          f"/healthz {len(latencies)} answers, worst {worst * 1000:.0f} ms")  # fmt: skip
    assert worst < 3.0  # blocked for the whole request (11 s) when decoded on the loop


def test_a_batch_at_the_limit_lists_100_errors_and_counts_them_all(api: Api) -> None:
    body = b"[" + b"{}," * (MAX_BATCH - 1) + b"{}]"
    headers = {**api.auth(), "content-type": "application/json"}
    started = time.monotonic()
    response = api.client.post("/v1/jobs", content=body, headers=headers, timeout=120)
    took = time.monotonic() - started
    assert response.status_code == 422
    found = response.json()
    # Every problem of every item is counted (an empty job lacks five required fields),
    # and the first MAX_LISTED of them are listed.
    per_item = 5
    assert found["count"] == MAX_BATCH * per_item
    assert len(found["errors"]) == MAX_LISTED
    assert found["errors"][-1]["index"] == MAX_LISTED // per_item - 1
    assert len(response.content) < 20_000, len(response.content)
    print(f"{MAX_BATCH} empty jobs: {took:.1f} s, response {len(response.content)} bytes")
