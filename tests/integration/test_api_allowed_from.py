"""`POST /v1/jobs` with a job's own `from` (docs/policies.md "Who a job may send as"): a
mailbox the channel's `allowed_from` does not match is 422 naming `from`, and nothing is
written; one it matches, in any case, is accepted and sent as that mailbox."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.integration.api_kit import Api, job, running_api, write_config


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    settings = write_config(tmp_path, "sqlite:///ledger.sqlite")
    policy = tmp_path / "policies" / "receipts.toml"
    policy.write_text(
        policy.read_text(encoding="utf-8") + 'allowed_from = ["sales-?@example.com"]\n',
        encoding="utf-8",
    )
    with running_api(settings) as api:
        yield api


def post(api: Api, body: object) -> tuple[int, dict[str, object]]:
    answer = api.client.post("/v1/jobs", json=body, headers=api.auth())
    return answer.status_code, answer.json()


def test_a_from_outside_allowed_from_is_422_naming_from_and_writes_nothing(api: Api) -> None:
    for address in ("Other <other@example.com>", "sales-12@example.com"):
        status, body = post(api, job("refused", **{"from": address}))
        assert status == 422, body
        assert body["errors"][0]["field"] == "from"  # type: ignore[index]
        assert "allowed_from" in str(body["error"])
    assert api.client.get("/v1/jobs/refused", headers=api.auth()).status_code == 404


def test_a_matching_from_is_accepted_whatever_its_case(api: Api) -> None:
    status, body = post(api, job("taken", **{"from": "Sales <SALES-1@Example.com>"}))
    assert status == 201, body
    assert api.ledger.get_job("taken").from_addr == "Sales <SALES-1@Example.com>"
