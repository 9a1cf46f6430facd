"""Doors that show a job and a decision taken on what they showed (docs/review.md "Two
people, one job"): whatever a door lists or shows a decision may be taken from, it gives
the version it showed, so that decision holds for that version only. Each interleaving
is driven deterministically on the engine rig (memory store, fake provider, injected
clock)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from tests.unit.engine_rig import EngineRig
from tests.unit.test_api_routes import AUTH, api_context, job
from tests.unit.test_human_races import LEGAL, door, in_review, resolutions

from daemon.api.app import create_app
from daemon.doubles.fake_provider import Scripted
from ledger.vocabulary import JobState, Resolution


@pytest.fixture
def rig() -> Iterator[EngineRig]:
    rig = EngineRig(LEGAL)
    yield rig
    rig.close()


def test_a_decision_taken_from_the_review_list_holds_for_the_version_listed(
    rig: EngineRig,
) -> None:
    """A script lists the jobs in review (`GET /v1/review`, `review list --json`) and
    abandons those it listed. Meanwhile Bob resent one and that attempt's request was lost
    too: in review again, for a send nobody looked at. The script's abandon carries the
    version its list gave, and is refused naming Bob's resend; the row had no version, so
    the script could only decide on whatever the job was by then."""
    in_review(rig, "k1")
    with TestClient(create_app(api_context(rig))) as client:
        [listed] = client.get("/v1/review", headers=AUTH).json()
        assert listed["version"] == rig.job("k1").version
        assert door(rig).review_list()[0]["version"] == listed["version"]
        door(rig).resolve("k1", Resolution.RESEND, note="", by="bob")
        rig.provider.script(Scripted.lost_request())
        rig.tick()
        assert rig.job("k1").state is JobState.REVIEW  # again, after attempt 2
        decided = client.post(
            "/v1/review/k1/resolve",
            json={"as": "abandon", "note": "", "expected_version": listed["version"]},
            headers=AUTH,
        )
    assert decided.status_code == 409, decided.text
    assert "resolved as resend by bob" in decided.json()["error"]
    assert rig.job("k1").state is JobState.REVIEW
    assert resolutions(rig, "k1") == ["resend"]


def test_a_decision_sent_back_with_the_status_s_etag_holds_for_that_version(
    rig: EngineRig,
) -> None:
    """An HTTP client that keeps what it read the way HTTP does (the status's `ETag`,
    sent back in `If-Match`) decides on that version only, as with `expected_version`:
    the status had no ETag and If-Match was ignored, so such a client's abandon landed on
    a job Bob had resent meanwhile and that was in review again."""
    in_review(rig, "k1")
    with TestClient(create_app(api_context(rig))) as client:
        read = client.get("/v1/jobs/k1", headers=AUTH)
        assert read.headers.get("etag") == f'"{read.json()["version"]}"'
        tag = read.headers["etag"]
        door(rig).resolve("k1", Resolution.RESEND, note="", by="bob")
        rig.provider.script(Scripted.lost_request())
        rig.tick()
        assert rig.job("k1").state is JobState.REVIEW
        abandon = {"as": "abandon", "note": ""}
        stale = client.post("/v1/review/k1/resolve", json=abandon, headers=AUTH | {"If-Match": tag})
        # A condition that does not hold is HTTP's 412 (RFC 9110), with the service's words.
        assert stale.status_code == 412, stale.text
        assert "resolved as resend by bob" in stale.json()["error"]
        never = client.post(
            "/v1/review/k1/resolve", json=abandon, headers=AUTH | {"If-Match": '"999"'}
        )
        assert never.status_code == 412 and "999" in never.json()["error"], never.text
        assert resolutions(rig, "k1") == ["resend"]
        # Two versions at once (either could be the one looked at), a weak tag (never
        # matched by If-Match), a list, two lines: 422 naming If-Match, nothing recorded.
        now = client.get("/v1/jobs/k1", headers=AUTH).headers["etag"]
        for header, body in [
            (now, {"expected_version": int(tag.strip('"'))}),
            (f"W/{now}", {}),
            (f"{now}, {tag}", {}),
        ]:
            bad = client.post(
                "/v1/review/k1/resolve", json=abandon | body, headers=AUTH | {"If-Match": header}
            )
            assert bad.status_code == 422, (header, bad.text)
            assert bad.json()["errors"][0]["field"] == "If-Match"
        twice = client.post(
            "/v1/review/k1/resolve",
            json=abandon,
            headers=[
                ("Authorization", AUTH["Authorization"]),
                ("If-Match", now),
                ("If-Match", tag),
            ],
        )
        assert twice.status_code == 422 and "given twice" in twice.json()["error"], twice.text
        assert resolutions(rig, "k1") == ["resend"]
        done = client.post("/v1/review/k1/resolve", json=abandon, headers=AUTH | {"If-Match": now})
        assert done.status_code == 200, done.text
        assert done.headers["etag"] == f'"{done.json()["version"]}"'
        # A cancel the same way; `*` asks only that the job exists.
        later = job("later", send_at="2099-01-01T00:00:00Z")
        assert client.post("/v1/jobs", json=later, headers=AUTH).status_code == 201
        seen = client.get("/v1/jobs/later", headers=AUTH).headers["etag"]
        door(rig).check("later", by="bob")  # another person's look moves `later` on
        moved = client.post("/v1/jobs/later/cancel", json={}, headers=AUTH | {"If-Match": seen})
        assert moved.status_code == 412 and "checked by bob" in moved.json()["error"]
        star = client.post("/v1/jobs/later/cancel", json={}, headers=AUTH | {"If-Match": "*"})
        assert star.status_code == 200 and star.json()["state"] == "cancelled"
