"""Every wrong method on a path the API serves is 405 with the one right `Allow`
(docs/http-api.md "Errors and statuses"; `daemon/api/guards.py: MethodsAllowed`): the
methods the path is served for, HEAD beside GET, whatever route comes first. On 127b519
`DELETE /v1/jobs` said `Allow: POST` (without GET and HEAD) and `GET /v1/review/x/check`
was 404 where the other routes gave 405."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient
from starlette.routing import Mount
from tests.unit.engine_rig import EngineRig, policy
from tests.unit.test_api_routes import AUTH, api_context

from daemon.api.app import DOCS_ASSETS, create_app

ASKED = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


@contextmanager
def served() -> Iterator[TestClient]:
    """The API in process over a fresh rig (a `legal` channel whose unknowns go to review)."""
    rig = EngineRig(policy("legal", on_unknown="review"))
    with TestClient(create_app(api_context(rig))) as client:
        yield client
    rig.close()


@pytest.fixture
def client() -> Iterator[TestClient]:
    with served() as client:
        yield client


def served_paths(routes: list[Any]) -> list[str]:
    """One path per route of the app (included routers too), its parameters filled in."""
    paths = []
    for route in routes:
        if isinstance(route, Mount):
            paths.append(DOCS_ASSETS + "/swagger-ui.css")
        elif hasattr(route, "original_router"):  # FastAPI's included router
            paths += served_paths(route.original_router.routes)
        elif isinstance(route, APIRoute) or hasattr(route, "path_format"):
            paths.append(re.sub(r"\{[^}]+\}", "x", route.path_format))
    return sorted(set(paths))


def test_every_wrong_method_is_405_with_the_methods_the_path_serves(client: TestClient) -> None:
    paths = served_paths(client.app.routes)  # type: ignore[attr-defined]
    assert "/v1/review/x/check" in paths and "/v1/jobs" in paths and len(paths) > 15
    for path in paths:
        answers = {method: client.request(method, path, headers=AUTH) for method in ASKED}
        allowed = {method for method, answer in answers.items() if answer.status_code != 405}
        assert allowed, path
        assert ("GET" in allowed) is ("HEAD" in allowed), path
        for method, answer in answers.items():
            if answer.status_code == 405:
                assert set(answer.headers["allow"].split(", ")) == allowed, (path, method)
                if method != "HEAD":
                    assert answer.json() == {"error": "method not allowed"}
            else:
                assert answer.text != '{"error":"no such route"}', (path, method)


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("DELETE", "/v1/jobs", "GET, HEAD, POST"),  # 127b519: "POST"
        ("GET", "/v1/review/x/check", "POST"),  # 127b519: 404
        ("GET", "/v1/review/x/resolve", "POST"),
        ("GET", "/v1/review/triage", "POST"),
        ("PUT", "/v1/jobs/x/cancel", "GET, HEAD, POST"),  # GET reads job "x/cancel"
        ("POST", "/v1/jobs/x/events", "GET, HEAD"),
        ("POST", "/healthz", "GET, HEAD"),  # 127b519: "GET"
        ("HEAD", "/v1/review/x/check", "POST"),
    ],
)
def test_the_quoted_cases(client: TestClient, method: str, path: str, allow: str) -> None:
    answer = client.request(method, path, headers=AUTH)
    assert answer.status_code == 405 and answer.headers["allow"] == allow


def test_an_unknown_path_is_still_404(client: TestClient) -> None:
    for method in ASKED:
        answer = client.request(method, "/v1/nope", headers=AUTH)
        assert answer.status_code == 404 and "allow" not in answer.headers
