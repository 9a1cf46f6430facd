"""A search's copies are bounded wherever they go (docs/how-it-works.md "Counting copies"):
a mailbox can hold any number of messages with a job's Message-ID (any inbound mail can
carry it; a provider can list many), and every copy found was kept in the recorded
events, the check's answer, the review page, the command line and the log. Each now
keeps the first `COPIES_KEPT` and the count of all, which still decides one, none or two
or more; a provider's search stops reading once it has found `SEARCH_STOPS_AT`.

Measured with 10,000 copies in the fake provider's mailbox (bytes; before -> after):
the job's stored events after the duplicate 172,429 -> 2,142; `GET /v1/jobs/{key}/events`
172,207 -> 1,920; `GET /v1/jobs/{key}` 169,315 -> 717; a check's answer 2,328,107 ->
4,907; the stored events after the check 341,524 -> 2,669; the review page 687,957 ->
10,982, with a check 2,956,467 -> 16,365; `review check` 619,144 -> 1,478 characters,
with `--json` 2,468,123 -> 5,205."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from tests.unit.engine_rig import EngineRig, policy
from tests.unit.test_api_routes import AUTH, api_context, job
from tests.unit.test_served_text import cli_check

from daemon.api.app import create_app
from daemon.doubles.fake_provider import Copy, Scripted
from daemon.providers.outcomes import (
    SEARCH_READS_MAX,
    SEARCH_STOPS_AT,
    ProviderError,
    SearchHit,
    SearchResult,
    first_copies,
)
from daemon.service_layer.guidance import copies_known, guidance_for
from ledger import decision_types as decide
from ledger.copies import COPIES_KEPT
from ledger.job import SendJob, job_id_for
from ledger.vocabulary import PolicyRef, Resolution

#: An attacker's, or a provider's, pile of copies.
MANY = 10_000
NOT_LISTED = MANY - COPIES_KEPT


@pytest.fixture
def rig() -> Iterator[EngineRig]:
    with EngineRig(policy("receipts")) as rig:  # on_unknown "search": a duplicate is found
        yield rig


@pytest.fixture
def client(rig: EngineRig) -> Iterator[TestClient]:
    with TestClient(create_app(api_context(rig))) as client:
        yield client


def _duplicate_of_many(rig: EngineRig, client: TestClient, key: str) -> None:
    """Job `key` sent once with its answer lost; MANY - 1 more messages with its
    Message-ID land in the mailbox; its search finds them all: a duplicate, in review."""
    assert client.post("/v1/jobs", json=job(key, "receipts"), headers=AUTH).status_code == 201
    rig.provider.script(Scripted.dropped_response())
    rig.tick()
    message_id = rig.job(key).message_id
    at = rig.clock() - timedelta(hours=1)
    rig.provider.copies.extend(
        Copy(f"fake-more-{n}", message_id, at, to="c@example.net", subject="S")
        for n in range(MANY - 1)
    )
    rig.advance_and_tick(61)
    assert rig.job(key).state.value == "review" and rig.job(key).duplicate


def _stored_bytes(rig: EngineRig, key: str) -> int:
    return sum(len(e.state) for e in rig.ledger.recorder.select_events(job_id_for(key)))


def _events(client: TestClient, key: str, kind: str) -> list[dict[str, Any]]:
    events = client.get(f"/v1/jobs/{key}/events", headers=AUTH).json()
    return [e for e in events if e["type"] == kind]


def test_a_duplicate_of_many_copies_records_the_first_ones_and_counts_them_all(
    rig: EngineRig, client: TestClient
) -> None:
    _duplicate_of_many(rig, client, "k1")
    [duplicate] = _events(client, "k1", "Duplicate")
    assert duplicate["hits"] == MANY and duplicate["complete"] is True
    assert len(duplicate["provider_message_ids"]) == COPIES_KEPT
    [escalated] = _events(client, "k1", "Escalated")
    assert escalated["detail"].startswith(f"{MANY} copies: fake-")
    assert escalated["detail"].endswith(f" and {NOT_LISTED} more")
    assert rig.job("k1").duplicate_count == MANY
    # Before: 172,429 bytes stored, and as many in every answer that lists the events.
    assert _stored_bytes(rig, "k1") < 5_000, _stored_bytes(rig, "k1")
    assert len(client.get("/v1/jobs/k1/events", headers=AUTH).content) < 5_000
    assert len(client.get("/v1/jobs/k1", headers=AUTH).content) < 2_000


def test_a_check_of_many_copies_lists_the_first_ones_and_counts_them_all(
    rig: EngineRig, client: TestClient
) -> None:
    _duplicate_of_many(rig, client, "k1")
    before = _stored_bytes(rig, "k1")
    answer = client.post("/v1/review/k1/check", headers=AUTH)
    assert answer.status_code == 200
    body = answer.json()
    assert body["count"] == MANY and body["complete"] is True and body["recorded"] is True
    assert len(body["copies"]) == len(body["hits"]) == COPIES_KEPT
    assert body["advice"].startswith(f"{MANY} copies (a duplicate)")
    assert len(answer.content) < 10_000, len(answer.content)  # before: 2,328,107
    [checked] = _events(client, "k1", "Checked")
    assert checked["count"] == MANY and len(checked["provider_message_ids"]) == COPIES_KEPT
    assert _stored_bytes(rig, "k1") - before < 1_000  # before: 169,095


def test_the_review_page_lists_the_first_copies_and_says_how_many_more(
    rig: EngineRig, client: TestClient
) -> None:
    _duplicate_of_many(rig, client, "k1")
    page = client.get("/ui/jobs/k1", headers=AUTH)
    assert f"The customer has {MANY} copies" in page.text
    assert len(page.content) < 20_000, len(page.content)  # before: 687,957
    checked = client.post("/ui/jobs/k1/check", headers=AUTH)
    assert f"{MANY} copies found" in checked.text
    assert f"The first {COPIES_KEPT} are listed; {NOT_LISTED} more are counted" in checked.text
    assert checked.text.count('<td data-label="Provider id">') == COPIES_KEPT
    assert len(checked.content) < 30_000, len(checked.content)  # before: 2,956,467
    again = client.get("/ui/jobs/k1", headers=AUTH)
    assert f": {MANY} found." in again.text


def test_the_command_line_lists_the_first_copies_and_says_how_many_more(
    rig: EngineRig,
    client: TestClient,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _duplicate_of_many(rig, client, "k1")
    text = cli_check(rig, monkeypatch, capsys, "k1", as_json=False)
    assert f"{MANY} copies found" in text
    assert f"  ... and {NOT_LISTED} more, not listed" in text
    assert len(text) < 3_000, len(text)  # before: 619,144
    answer = json.loads(printed := cli_check(rig, monkeypatch, capsys, "k1", as_json=True))
    assert answer["count"] == MANY and len(answer["copies"]) == COPIES_KEPT
    assert len(printed) < 10_000, len(printed)  # before: 2,468,123


# -- the one place they are cut, and a provider's read -----------------------------------


def _hits(n: int) -> tuple[SearchHit, ...]:
    return tuple(SearchHit(f"p{i}", "<m@x>") for i in range(n))


def test_a_search_result_keeps_the_first_copies_and_counts_the_rest() -> None:
    result = SearchResult("q", _hits(MANY))
    assert result.copies == [f"p{i}" for i in range(COPIES_KEPT)]
    assert result.count == MANY and result.more == NOT_LISTED and result.complete
    assert SearchResult("q", _hits(2)).count == 2
    with pytest.raises(ValueError, match="two copies"):
        SearchResult("q", _hits(1), complete=False)


def test_a_search_stops_reading_once_it_has_one_copy_more_than_it_keeps() -> None:
    pulled = 0

    def read() -> Iterator[SearchHit | None]:
        nonlocal pulled
        for hit in _hits(MANY):
            pulled += 1
            yield hit

    hits, complete = first_copies(read(), "search")
    assert len(hits) == pulled == SEARCH_STOPS_AT == COPIES_KEPT + 1 and not complete
    result = SearchResult("q", tuple(hits), complete=complete)
    assert result.count == SEARCH_STOPS_AT and len(result.copies) == COPIES_KEPT
    assert first_copies(iter(_hits(COPIES_KEPT)), "search") == (list(_hits(COPIES_KEPT)), True)


def test_a_search_reading_only_near_misses_gives_up_unless_two_copies_decided() -> None:
    near_misses: list[SearchHit | None] = [None] * MANY
    with pytest.raises(ProviderError, match="too many to read"):
        first_copies(iter([_hits(1)[0], *near_misses]), "search")
    hits, complete = first_copies(iter([*_hits(2), *near_misses]), "search")
    assert len(hits) == 2 and not complete
    # Fewer near misses than the bound: every message is read, and 0 or 1 is an answer.
    assert first_copies(iter(near_misses[: SEARCH_READS_MAX - 1]), "search") == ([], True)


# -- the aggregate and the guidance -------------------------------------------------------


def _unknown(rig: EngineRig, key: str) -> SendJob:
    rig.submit("receipts", key)
    rig.provider.script(Scripted.lost_request())
    rig.tick()
    rig.clock.advance(61)
    return rig.job(key)


def test_the_events_refuse_more_copies_than_are_kept_and_a_count_below_them(
    rig: EngineRig,
) -> None:
    job = _unknown(rig, "k1")
    duplicate = decide.Duplicate(PolicyRef("receipts", "f"))
    ids = [f"p{i}" for i in range(COPIES_KEPT + 1)]
    with pytest.raises(ValueError, match="at most 20"):
        job.record_search(query="q", copies=ids, decision=duplicate, at=rig.clock())
    with pytest.raises(ValueError, match="a count of 2 for 3"):
        job.record_search(query="q", copies=ids[:3], count=2, decision=duplicate, at=rig.clock())
    assert not job.pending_events


def test_a_duplicate_from_a_search_that_stopped_reading_says_at_least(rig: EngineRig) -> None:
    job = _unknown(rig, "k1")
    duplicate = decide.Duplicate(PolicyRef("receipts", "f"))
    ids = [f"p{i}" for i in range(COPIES_KEPT)]
    job.record_search(
        query="q", copies=ids, count=SEARCH_STOPS_AT, complete=False, decision=duplicate,
        at=rig.clock(),
    )  # fmt: skip
    assert job.duplicate_count == SEARCH_STOPS_AT and not job.duplicate_complete
    guidance = guidance_for(job, None, [Resolution.SENT, Resolution.ABANDON])
    assert guidance is not None and guidance.copies == SEARCH_STOPS_AT
    assert f"at least {SEARCH_STOPS_AT} copies" in guidance.meaning
    assert not guidance.copies_complete and guidance.as_dict()["copies_complete"] is False
    escalated = job.pending_events[-1]
    assert isinstance(escalated, SendJob.Escalated)
    detail = escalated.detail
    assert detail.startswith(f"at least {SEARCH_STOPS_AT} copies: p0, ") and detail.endswith(
        " and 1 more"
    )


def test_a_check_recorded_before_the_bound_counts_its_ids(rig: EngineRig) -> None:
    job = _unknown(rig, "k1")
    assert copies_known(job, {"provider_message_ids": ["a", "b"]}) == 2
    assert copies_known(job, {"provider_message_ids": ["a"], "count": 30}) == 30
