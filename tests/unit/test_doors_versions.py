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
from tests.unit.test_api_routes import AUTH, api_context
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
