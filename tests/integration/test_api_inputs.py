"""Issue 16 over HTTP: a new key with a control, bidi or invisible character is a 422
naming `key`; a job key stored before that rule is still read; a JSON name given twice is
a 422 naming its path; a resolve's note that cannot be stored is a 422 naming `note`.
Nothing is written on any refusal (docs/cli.md "Keys", docs/http-api.md "HTTP API")."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
from tests.integration.api_kit import Api, job, running_api, write_config
from tests.integration.test_api import to_review

from ledger.content import JobContent
from ledger.vocabulary import PolicyRef, Sender

OLD_KEY = "old\x1b[2J\u202einvoice\x07"


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    settings = write_config(tmp_path, f"sqlite:///{tmp_path / 'ledger.sqlite'}")
    with running_api(settings) as running:
        yield running


def jobs_in(api: Api) -> list[str]:
    return [row.key for row in api.ledger.jobs()]


@pytest.mark.parametrize("key", ["k\x1b[31m", "k\x9b", "k\u202e", "k\u200f", "k\u200b", "k\x7f"])
def test_a_new_key_with_controls_is_422_naming_key(api: Api, key: str) -> None:
    answer = api.client.post("/v1/jobs", json=job(key), headers=api.auth())
    assert answer.status_code == 422, answer.text
    assert answer.json()["errors"][0]["field"] == "key"
    assert jobs_in(api) == []


def test_a_name_given_twice_is_422_naming_its_path(api: Api) -> None:
    one = json.dumps(job("dup"))[:-1] + ', "to": "mallory@example.com"}'
    answer = api.client.post("/v1/jobs", content=one, headers=api.auth())
    assert answer.status_code == 422, answer.text
    assert answer.json()["errors"][0]["field"] == "to"
    assert "given twice" in answer.json()["error"]
    batch = "[" + json.dumps(job("fine")) + ", " + one + "]"
    answer = api.client.post("/v1/jobs", content=batch, headers=api.auth())
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"].startswith("job[1].to: given twice")
    assert jobs_in(api) == []


def test_a_key_stored_before_the_rule_is_still_read(api: Api) -> None:
    sender = Sender("support@example.com", "mail.example.com", PolicyRef("receipts", "f" * 16))
    content = JobContent(
        channel="receipts", key=OLD_KEY, to=("bob@example.com",), subject="s", body="b"
    )
    api.ledger.submit(content, sender)
    path = quote(OLD_KEY, safe="")
    status = api.client.get(f"/v1/jobs/{path}", headers=api.auth())
    assert status.status_code == 200, status.text
    assert status.json()["key"] == OLD_KEY
    events = api.client.get(f"/v1/jobs/{path}/events", headers=api.auth())
    assert events.status_code == 200
    to_review(api, OLD_KEY)
    listed = api.client.get("/v1/review", headers=api.auth()).json()
    assert [item["key"] for item in listed] == [OLD_KEY]
    # A note that cannot be stored as text is refused naming it; a free-text one is kept.
    bad = api.client.post(
        f"/v1/review/{path}/resolve", json={"as": "abandon", "note": "a\x00b"}, headers=api.auth()
    )
    assert bad.status_code == 422, bad.text
    assert bad.json()["errors"][0]["field"] == "note"
    assert api.ledger.get_job(OLD_KEY).state.value == "review"
    good = api.client.post(
        f"/v1/review/{path}/resolve",
        json={"as": "abandon", "note": "checked\nthe mailbox"},
        headers=api.auth(),
    )
    assert good.status_code == 200, good.text
    assert good.json()["state"] == "abandoned"
