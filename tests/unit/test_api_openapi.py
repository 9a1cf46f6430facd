"""The HTTP API holds to its own OpenAPI document (issue 28; docs/http-api.md "Errors and
statuses"): schemathesis generates requests valid by the document for every operation,
and none is answered 422 for a reason the document does not state. A 422 may only name
fields whose schema carries `x-rules`, the sentence of what intake checks beyond the
schema (an address's grammar, a channel the server has, ...); everything JSON Schema can
say (lengths, list sizes, ranges, the states, a NUL in a query) is in the schema itself.
Bounded: a few dozen requests per operation, in process (ASGI), on the memory store.

On 127b519 `limit`, `state`, the channel's minimum length and the size of a list were
missing from the document, so requests valid by it were 422; triage's `dry_run` took
`0`, `1`, `"yes"` and `"no"` (`{"dry_run": "no"}` ran a live triage)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from schemathesis import APIOperation, GenerationMode
from schemathesis.core.errors import InvalidSchema
from schemathesis.core.result import Err, Ok
from tests.unit.engine_rig import EngineRig, policy
from tests.unit.test_api_methods import served
from tests.unit.test_api_routes import AUTH, api_context, in_review, job

from daemon.api.app import OPENAPI_URL, create_app
from daemon.service_layer.listing import LIMIT_MAX, STATES

RIG = EngineRig(policy("legal", on_unknown="review"))
# The API serves the store alone: no send workers left waiting for the rest of the session
# in every process that imports this module (each xdist worker does, to collect it).
RIG.engine.close()
APP = create_app(api_context(RIG))
SCHEMA = schemathesis.openapi.from_asgi(OPENAPI_URL, APP)


def loaded(
    result: Ok[APIOperation[Any, Any, Any, Any]] | Err[InvalidSchema],
) -> APIOperation[Any, Any, Any, Any]:
    """An operation of the document (one the schema cannot load fails here)."""
    assert isinstance(result, Ok), result.err()
    return result.ok()


OPERATIONS = [loaded(result) for result in SCHEMA.get_all_operations()]
DOCUMENT: dict[str, Any] = APP.openapi()


def stated_rules(method: str, path: str) -> dict[str, bool]:
    """Each field of the operation (query parameter or body property) -> whether the
    document states rules beyond its schema (`x-rules`)."""
    operation = DOCUMENT["paths"][path][method]
    found = {p["name"]: "x-rules" in p["schema"] for p in operation.get("parameters", [])}
    body = operation.get("requestBody", {}).get("content", {}).get("application/json", {})
    schema = body.get("schema", {})
    for option in schema.get("anyOf", [schema]):
        item = option.get("items", option)
        if "$ref" in item:
            item = DOCUMENT["components"]["schemas"][item["$ref"].rsplit("/", 1)[1]]
        for name, prop in item.get("properties", {}).items():
            found[name] = "x-rules" in prop
    return found


def root(field: str) -> str:
    # "job[1].to[0]" -> "to"; "headers.X-A" -> "headers"; "job" -> "job".
    field = re.sub(r"^job\[\d+\]\.", "", field)
    return re.split(r"[.\[]", field)[0]


# For POST /v1/jobs and GET /v1/jobs/{key}/events one of anyio's worker threads, idle on
# its queue, outlives the client schemathesis opens and closes (`with`) for each call (still
# there 30 s after): not a thread of ours to stop.
@pytest.mark.leaves_threads("an idle anyio worker of schemathesis's ASGI client")
@pytest.mark.parametrize(
    "operation", OPERATIONS, ids=[f"{op.method.upper()} {op.path}" for op in OPERATIONS]
)
def test_no_request_valid_by_the_document_is_refused_for_an_unstated_reason(
    operation: Any,
) -> None:
    rules = stated_rules(operation.method, operation.path)
    documented = set(DOCUMENT["paths"][operation.path][operation.method]["responses"])

    @settings(
        max_examples=25, deadline=None, database=None, suppress_health_check=list(HealthCheck)
    )
    @given(operation.as_strategy(generation_mode=GenerationMode.POSITIVE))
    def check(case: Any) -> None:
        answer = case.call(headers=AUTH)
        assert answer.status_code < 500, answer.text
        assert str(answer.status_code) in documented, (answer.status_code, answer.text)
        if answer.status_code == 422:
            fields = [root(error["field"]) for error in answer.json()["errors"]]
            unstated = [field for field in fields if not rules.get(field, False)]
            assert not unstated, (case.query, case.body, answer.text)

    check()


def test_the_listing_parameters_are_in_the_document() -> None:
    parameters = {
        p["name"]: p["schema"] for p in DOCUMENT["paths"]["/v1/jobs"]["get"]["parameters"]
    }
    assert parameters["limit"] == {
        "type": "integer",
        "minimum": 1,
        "maximum": LIMIT_MAX,
        "title": "Limit",
    }
    assert parameters["state"]["enum"] == list(STATES)
    job_schema = DOCUMENT["paths"]["/v1/jobs"]["post"]["requestBody"]["content"][
        "application/json"
    ]["schema"]["anyOf"]
    assert job_schema[0]["properties"]["channel"]["minLength"] == 1
    assert job_schema[1]["minItems"] == 1


@pytest.fixture
def client() -> Iterator[TestClient]:
    with served() as client:
        yield client


def test_the_limits_the_document_states_are_the_servers(client: TestClient) -> None:
    assert client.get(f"/v1/jobs?limit={LIMIT_MAX}", headers=AUTH).status_code == 200
    assert client.get(f"/v1/jobs?limit={LIMIT_MAX + 1}", headers=AUTH).status_code == 422
    for state in STATES:
        assert client.get(f"/v1/jobs?state={state}", headers=AUTH).status_code == 200
    assert client.post("/v1/jobs", json=[], headers=AUTH).status_code == 422
    assert client.post("/v1/jobs", json=job("k", channel=""), headers=AUTH).status_code == 422


@pytest.mark.parametrize("value", [0, 1, "yes", "no", "true", "false", None, [], {}])
def test_dry_run_takes_a_json_boolean_only(client: TestClient, value: object) -> None:
    refused = client.post("/v1/review/triage", json={"dry_run": value}, headers=AUTH)
    assert refused.status_code == 422
    assert refused.json()["errors"][0]["field"] == "dry_run"


def test_a_dry_run_of_no_is_refused_not_run_live() -> None:
    with (
        EngineRig(policy("legal", on_unknown="review")) as rig,
        TestClient(create_app(api_context(rig))) as client,
    ):
        in_review(rig, client, "k1", copy=True)
        assert (
            client.post("/v1/review/triage", json={"dry_run": "no"}, headers=AUTH).status_code
            == 422
        )
        assert client.get("/v1/jobs/k1", headers=AUTH).json()["state"] == "review"
        for value in (True, False):
            answer = client.post("/v1/review/triage", json={"dry_run": value}, headers=AUTH)
            assert answer.status_code == 200


def test_every_v1_route_documents_401_and_403_and_others_need_no_token() -> None:
    operations = {
        f"{method.upper()} {path}": {int(s) for s in op["responses"]}
        for path, item in DOCUMENT["paths"].items()
        for method, op in item.items()
    }
    for route, statuses in operations.items():
        if " /v1/" in route:
            assert {401, 403} <= statuses, route
        else:
            assert not {401, 403} & statuses, route
