"""Property tests against the OpenAPI document: for generated inputs the real server never
answers 5xx nor a status its document does not list; the documented job model and
parse_job (the validation intake uses) agree on every generated job."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from tests.integration.api_kit import TOKEN, Api, job, running_api, write_config

from daemon.api.models import JobIn
from daemon.api.paths import key_segment
from ledger.content import OPTIONAL_FIELDS, REQUIRED_FIELDS, JobInputError, parse_job

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=6,
)
addresses = st.sampled_from(
    ["a@example.com", "Name <b@example.org>", "bad", "", "x@y", "a@b.c\r\nBcc: z@z.z"]
)
field_values = st.one_of(
    json_values, addresses, st.lists(addresses, max_size=3), st.text(max_size=30)
)
jobs = st.builds(
    lambda base, drop, extra: {
        **{k: v for k, v in base.items() if k not in drop},
        **extra,
    },
    st.fixed_dictionaries(
        {name: field_values for name in REQUIRED_FIELDS},
        optional={name: field_values for name in OPTIONAL_FIELDS},
    ),
    st.sets(st.sampled_from(REQUIRED_FIELDS), max_size=2),
    st.dictionaries(st.sampled_from(["color", "from", "key"]), field_values, max_size=1),
) | st.builds(
    lambda changes: job(**changes),
    st.dictionaries(
        st.sampled_from([*REQUIRED_FIELDS, *OPTIONAL_FIELDS]), field_values, max_size=2
    ),
)


def _model_accepts(data: Any) -> bool:
    try:
        JobIn.model_validate(data)
    except ValidationError:
        return False
    return True


def _parse_accepts(data: Any) -> bool:
    try:
        parse_job(data)
    except JobInputError:
        return False
    return True


def test_the_model_has_parse_jobs_fields() -> None:
    schema = JobIn.model_json_schema()
    assert list(schema["properties"]) == [*REQUIRED_FIELDS, *OPTIONAL_FIELDS]
    assert schema["required"] == list(REQUIRED_FIELDS)
    assert schema["additionalProperties"] is False


@given(jobs | json_values)
@settings(max_examples=400, deadline=None)
def test_whatever_parse_job_accepts_the_documented_model_accepts(data: Any) -> None:
    # The model documents shapes, parse_job checks more (addresses, CR/LF): it may refuse
    # what the model allows, never the reverse.
    if _parse_accepts(data):
        assert _model_accepts(data)


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    tmp: Path = tmp_path_factory.mktemp("api")
    settings_ = write_config(tmp, f"sqlite:///{tmp / 'ledger.sqlite'}", max_body="2KB")
    with running_api(settings_) as running:
        yield running


def _documented(api: Api) -> dict[tuple[str, str], set[int]]:
    doc = api.client.get("/v1/openapi.json").json()
    return {
        (path, method): {int(status) for status in op["responses"]}
        for path, item in doc["paths"].items()
        for method, op in item.items()
    }


keys = st.text(st.characters(codec="utf-8", exclude_characters="/?#%"), min_size=1, max_size=20)
tokens = st.sampled_from([None, TOKEN, "wrong-token-0123456789"])


@given(body=jobs | json_values | st.lists(jobs, max_size=3), token=tokens, big=st.booleans())
@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_submit_answers_only_documented_statuses(
    api: Api, body: Any, token: str | None, big: bool
) -> None:
    documented = _documented(api)[("/v1/jobs", "post")]
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if big:
        body = {"pad": "x" * 3000, "job": body}
    answer = api.client.post("/v1/jobs", json=body, headers=headers)
    assert answer.status_code in documented, answer.text
    assert answer.status_code < 500


@given(
    key=keys, decision=json_values | st.sampled_from(["sent", "resend", "abandon"]), token=tokens
)
@example(key=".", decision="sent", token=TOKEN)
@example(key="..", decision="sent", token=TOKEN)
@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_reads_and_resolve_answer_only_documented_statuses(
    api: Api, key: str, decision: Any, token: str | None
) -> None:
    documented = _documented(api)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    key = quote(key, safe="")
    if key in (".", ".."):
        # Dot segments are removed by URL normalization (RFC 3986 5.2.4) before a request
        # leaves the client: such a key is addressed with its dots percent-encoded.
        key = key.replace(".", "%2E")
    for path, route in (
        (f"/v1/jobs/{key}", "/v1/jobs/{key}"),
        (f"/v1/jobs/{key}/events", "/v1/jobs/{key}/events"),
    ):
        answer = api.client.get(path, headers=headers)
        assert answer.status_code in documented[(route, "get")], (path, answer.text)
    answer = api.client.post(f"/v1/review/{key}/resolve", json={"as": decision}, headers=headers)
    assert answer.status_code in documented[("/v1/review/{key}/resolve", "post")], answer.text


# -- every route of the document --------------------------------------------------------

any_keys = st.text(
    st.characters(codec="utf-8", exclude_categories=["Cs"]) | st.sampled_from(["/", "%", "."]),
    min_size=1,
    max_size=12,
) | st.sampled_from(["solo/events", "a/cancel", "x%2Fy", "..", "%", "a/../b"])
raw_bodies = st.one_of(
    json_values.map(lambda value: json.dumps(value).encode()),
    st.binary(max_size=40),
    st.sampled_from(
        [
            b"[" * 100_000 + b"]" * 100_000,
            b'{"as": ' + b"7" * 5000 + b"}",
            b'{"as": "sent", "as": "abandon"}',
            b'{"channel": "a\\u0000", "reason": "\\u0000", "as": "sent", "note": "\\u0000"}',
            b"[" + b"{}," * 500 + b"{}]",
            b"",
        ]
    ),
)


def _operations(api: Api) -> list[tuple[str, str, dict[str, Any]]]:
    doc = api.client.get("/v1/openapi.json").json()
    return [
        (path, method, op)
        for path, item in sorted(doc["paths"].items())
        for method, op in sorted(item.items())
    ]


@given(data=st.data(), token=tokens)
@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_every_documented_route_answers_only_documented_statuses(
    api: Api, data: st.DataObject, token: str | None
) -> None:
    _any_request(api, data, token)


@pytest.fixture
def pg_api(tmp_path: Path, pg_url: str) -> Iterator[Api]:
    with running_api(write_config(tmp_path, pg_url, max_body="2KB")) as running:
        yield running


@pytest.mark.postgres
@given(data=st.data(), token=st.just(TOKEN))
@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_every_route_on_postgresql_too(pg_api: Api, data: st.DataObject, token: str) -> None:
    # PostgreSQL refuses NUL in text: a key or a filter with one must not reach it as a 500.
    _any_request(pg_api, data, token)


def _any_request(api: Api, data: st.DataObject, token: str | None) -> None:
    path, method, op = data.draw(st.sampled_from(_operations(api)), label="operation")
    url = path
    query: dict[str, str] = {}
    for param in op.get("parameters", []):
        if param["in"] == "path":
            key = key_segment(data.draw(any_keys, label=param["name"]))
            url = url.replace("{" + param["name"] + "}", key)
        elif param["in"] == "query" and data.draw(st.booleans()):
            text = st.text(max_size=10) | st.sampled_from(["a\x00", "\x00", "legal"])
            query[param["name"]] = data.draw(text, label=param["name"])
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    content = None
    if method in ("post", "put", "patch"):
        content = data.draw(raw_bodies, label="body")
        headers["content-type"] = data.draw(
            st.sampled_from(["application/json", "text/plain", "application/x-www-form-urlencoded"])
        )
    for verb in [method.upper(), *(["HEAD"] if method == "get" else [])]:
        answer = api.client.request(verb, url, params=query, content=content, headers=headers)
        documented = {int(status) for status in op["responses"]}
        assert answer.status_code in documented, (verb, url, answer.status_code, answer.text)
        if verb != "HEAD" and answer.status_code >= 400:
            assert "error" in answer.json(), answer.text


def test_the_document_covers_every_api_route(api: Api) -> None:
    paths = {path for path, _, _ in _operations(api)}
    assert {"/v1/jobs", "/v1/jobs/{key}", "/v1/jobs/{key}/events", "/v1/jobs/{key}/cancel",
            "/v1/review", "/v1/review/triage", "/v1/review/{key}/check",
            "/v1/review/{key}/resolve", "/healthz", "/metrics"} <= paths  # fmt: skip
