"""The FastAPI application: routes, errors, the body limit, /healthz and /metrics."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, RedirectResponse, Response
from fastapi.routing import APIRoute

from daemon.api import errors, jobs, review, ui
from daemon.api.context import ApiContext
from daemon.api.health import check_health
from daemon.api.limits import BodyLimit
from daemon.api.metrics import CONTENT_TYPE
from daemon.api.models import Health

OPENAPI_URL = "/v1/openapi.json"


def create_app(ctx: ApiContext) -> FastAPI:
    app = FastAPI(
        title="sendledger",
        summary="Email sends that are safe to retry: intake, job state, review.",
        version="1",
        openapi_url=OPENAPI_URL,
        docs_url="/v1/docs",
        redoc_url=None,
    )
    app.state.ctx = ctx
    errors.install(app)
    app.include_router(jobs.router)
    app.include_router(review.router)
    app.include_router(ui.router)
    app.add_middleware(BodyLimit, max_body=ctx.max_body)

    @app.get(
        "/healthz",
        response_model=Health,
        responses={503: {"model": Health, "description": "a check failed; reasons say which"}},
        summary="Store, scheduler, policies, provider handles (no token)",
    )
    async def healthz() -> JSONResponse:
        ok, reasons, checks = await run_in_threadpool(check_health, ctx.health)
        body = {"ok": ok, "reasons": reasons, "checks": checks}
        return JSONResponse(body, status_code=200 if ok else 503)

    @app.get(
        "/metrics",
        response_class=Response,
        responses={200: {"content": {CONTENT_TYPE: {}}, "description": "Prometheus text"}},
        summary="Prometheus metrics (no token: bind the API to a trusted network)",
    )
    async def metrics() -> Response:
        text = await run_in_threadpool(ctx.metrics.render)
        return Response(text, media_type=CONTENT_TYPE)

    def openapi() -> dict[str, Any]:
        # FastAPI documents a 422 for every route with parameters; a route whose inputs
        # cannot be invalid (a path key) never answers it, so only declared ones stay.
        if app.openapi_schema is None:
            schema = FastAPI.openapi(app)
            for route in [*jobs.router.routes, *review.router.routes]:
                if isinstance(route, APIRoute) and 422 not in route.responses:
                    for method in route.methods or ():
                        operation = schema["paths"].get(route.path_format, {})
                        operation.get(method.lower(), {}).get("responses", {}).pop("422", None)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

    @app.get("/ui", include_in_schema=False)
    def ui_root() -> RedirectResponse:
        return RedirectResponse("/ui/", status_code=308)

    return app
