"""The FastAPI application: routes, errors, the body limit, /healthz and /metrics."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import anyio.to_thread
import swagger_ui_bundle
from anyio import CapacityLimiter
from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles

from daemon.api import errors, favicon, jobs, review, ui
from daemon.api.auth import bearer
from daemon.api.context import ApiContext
from daemon.api.guards import (
    HeadAsGet,
    KeysInUtf8,
    MethodsAllowed,
    NoNulInQuery,
    QueryInUtf8,
    TrustedHosts,
)
from daemon.api.health import check_health
from daemon.api.limits import BodyLimit
from daemon.api.metrics import CONTENT_TYPE
from daemon.api.models import Health, HealthBrief
from daemon.api.paths import KeyPaths

OPENAPI_URL = "/v1/openapi.json"
DOCS_URL = "/v1/docs"
#: Swagger UI's files, from the `swagger-ui-bundle` package (Apache-2.0): the docs page
#: loads nothing from the internet.
DOCS_ASSETS = DOCS_URL + "/assets"
#: Worker threads of their own for /healthz and /metrics (see `_monitoring`).
MONITORING_THREADS = 4
T = TypeVar("T")


def create_app(ctx: ApiContext) -> FastAPI:
    app = FastAPI(
        title="sendledger",
        summary="Email sends that are safe to retry: intake, job state, review.",
        version="1",
        openapi_url=OPENAPI_URL,
        docs_url=None,
        redoc_url=None,
        # A slash redirect is built from the Host header: off, every route is explicit.
        redirect_slashes=False,
    )
    app.state.ctx = ctx
    monitoring: list[CapacityLimiter] = []

    async def _monitoring(call: Callable[..., T], *args: Any) -> T:
        # Not the worker threads the routes share: checks, resends and triage wait on the
        # mailbox there, and a slow provider, healthy, can hold every one of them; the
        # probe then timed out and a restart followed while this process was well.
        if not monitoring:
            monitoring.append(CapacityLimiter(MONITORING_THREADS))  # in the loop: anyio's rule
        return await anyio.to_thread.run_sync(call, *args, limiter=monitoring[0])

    errors.install(app)
    app.include_router(jobs.router)
    app.include_router(review.router)
    app.include_router(ui.router)
    # Outermost last: the Host check, HEAD as GET, a keyed path's key in UTF-8, the methods
    # a path is served for, the query's text (UTF-8, no NUL), keyed paths, then the body
    # limit.
    app.add_middleware(BodyLimit, max_body=ctx.max_body)
    app.add_middleware(KeyPaths)
    app.add_middleware(NoNulInQuery)
    app.add_middleware(QueryInUtf8)
    app.add_middleware(MethodsAllowed, routes=app.router.routes)
    app.add_middleware(KeysInUtf8)
    app.add_middleware(HeadAsGet)
    app.add_middleware(TrustedHosts, trusted=ctx.trusted_hosts)

    @app.get(
        "/healthz",
        response_model=Health | HealthBrief,
        responses={
            200: {"description": "every check passed (details with a valid token)"},
            503: {
                "model": Health | HealthBrief,
                "description": "a check failed; with a valid token, reasons say which",
            },
        },
        summary="Store, scheduler, policies, provider handles (details need a token)",
    )
    async def healthz(request: Request) -> JSONResponse:
        ok, reasons, checks = await _monitoring(check_health, ctx.health)
        status = 200 if ok else 503
        if ctx.tokens.who(bearer(request.headers.get("authorization"))) is None:
            # Without a token, no detail: error texts may name paths and field values.
            return JSONResponse({"ok": ok, "checks": brief(checks)}, status_code=status)
        return JSONResponse({"ok": ok, "reasons": reasons, "checks": checks}, status)

    @app.get(
        "/metrics",
        response_class=Response,
        responses={
            200: {"content": {CONTENT_TYPE: {}}, "description": "Prometheus text"},
        },
        summary="Prometheus metrics (no token: bind the API to a trusted network)",
    )
    async def metrics() -> Response:
        text = await _monitoring(ctx.metrics.render)
        return Response(text, media_type=CONTENT_TYPE)

    def openapi() -> dict[str, Any]:
        # Every route may answer 400 (api.trusted_hosts) and 422 (a NUL, or bytes that are
        # not UTF-8, in its query);
        # every route with a body 413 (api.max_body).
        if app.openapi_schema is None:
            schema = FastAPI.openapi(app)
            for item in schema["paths"].values():
                for method, operation in item.items():
                    statuses = [400, 422] if method in ("get", "head") else [400, 413, 422]
                    for status, answer in errors.documented(*statuses).items():
                        model = "Invalid" if status == 422 else "Problem"
                        found = operation["responses"].get(str(status))
                        if found is None or "HTTPValidationError" in str(found):
                            # FastAPI's own 422 is `{"detail"}`, which this API never answers.
                            doc = _answer_doc(answer["description"], model)
                            operation["responses"][str(status)] = doc
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

    app.mount(
        DOCS_ASSETS,
        StaticFiles(directory=Path(swagger_ui_bundle.swagger_ui_path)),
        name="docs-assets",
    )

    @app.get(DOCS_URL, include_in_schema=False)
    def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=OPENAPI_URL,
            title="sendledger API",
            swagger_js_url=f"{DOCS_ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{DOCS_ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{DOCS_ASSETS}/favicon-32x32.png",
            # The online validator's badge would be a request to swagger.io.
            swagger_ui_parameters={"validatorUrl": None},
        )

    @app.get("/ui", include_in_schema=False)
    def ui_root() -> RedirectResponse:
        return RedirectResponse("/ui/", status_code=308)

    favicon.install(app)

    return app


def _answer_doc(description: str, model: str) -> dict[str, Any]:
    schema = {"$ref": f"#/components/schemas/{model}"}
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def brief(checks: dict[str, Any]) -> dict[str, bool]:
    """Each check's pass or fail, nothing else (the providers as one check). Open circuits
    are not a check (an outage is waited out, docs/operations.md "Outages and quotas") and
    their scopes may name mailboxes: they are details, for a token only."""
    found: dict[str, bool] = {}
    for name, check in checks.items():
        if name == "circuits":
            continue
        if name == "providers":
            found[name] = all(bool(one.get("ok")) for one in check.values())
        else:
            found[name] = bool(check.get("ok"))
    return found
