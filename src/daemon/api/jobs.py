"""`/v1/jobs`: intake (the job JSON of `submit`, or a list) and reading a job back."""

from __future__ import annotations

import json
import logging
from typing import Annotated, Any

from fastapi import APIRouter, Body, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

import daemon.api.paths  # noqa: F401  (registers `{key:key}`: every key addressable)
from daemon.api.bodies import decode_jobs_off_loop
from daemon.api.context import Ctx
from daemon.api.errors import documented, invalid
from daemon.api.models import NO_NUL, CancelIn, EventOut, JobIn, JobList, JobOut, JobStatus, exactly
from daemon.api.preconditions import IfMatch, etag, expected_version, held_to
from daemon.api.roles import Caller, V1Route
from daemon.service_layer.listing import LIMIT_MAX, STATES
from daemon.service_layer.problems import MAX_BATCH, FieldProblem, ServiceError, batch_too_long
from daemon.service_layer.read_models import job_status
from ledger.display import printable

log = logging.getLogger("sendledger.api")
router = APIRouter(prefix="/v1", route_class=V1Route)

_JOB_SCHEMA = JobIn.model_json_schema(ref_template="#/components/schemas/{model}")
_REQUEST_BODY = {
    "required": True,
    "content": {
        "application/json": {
            "schema": {
                "anyOf": [
                    _JOB_SCHEMA,
                    {
                        "type": "array",
                        "items": _JOB_SCHEMA,
                        "minItems": 1,
                        "maxItems": MAX_BATCH,
                    },
                ]
            }
        }
    },
}
_SUBMITTED = {
    "content": {
        "application/json": {
            "schema": {
                "anyOf": [
                    {"$ref": "#/components/schemas/JobOut"},
                    {"type": "array", "items": {"$ref": "#/components/schemas/JobOut"}},
                ]
            }
        }
    }
}


@router.post(
    "/jobs",
    status_code=201,
    response_model=JobOut | list[JobOut],
    openapi_extra={"requestBody": _REQUEST_BODY},
    responses={
        200: {"description": "every key was known with the same content: nothing written"},
        201: {"description": "at least one job was created", **_SUBMITTED},
        **documented(401, 409, 413, 422),
    },
    summary="Submit a job, or a list of jobs (all or nothing)",
)
async def submit(request: Request, ctx: Ctx, who: Caller) -> JSONResponse:
    raw = await request.body()
    try:
        data = await decode_jobs_off_loop(raw)
    except json.JSONDecodeError as exc:
        reason = f"not valid JSON: {exc.msg}"
        return invalid([FieldProblem(None, "job", reason)], sentence=f"job: {reason}")
    if isinstance(data, list) and len(data) > MAX_BATCH:
        too_long = batch_too_long(len(data))  # refused before any job is looked at
        return invalid([too_long], sentence=f"job: {too_long.reason}")
    try:
        submitted = await run_in_threadpool(ctx.services.submit, data, by=who)
    except ServiceError as exc:
        # A submission's 422 opens with its first problem, not the count of the others.
        if exc.problems:
            return invalid(exc.problems, exc.total)
        raise
    for warning in submitted.warnings:
        log.warning("submitted by %s: %s", printable(who), printable(warning))
    if submitted.created:
        created = ", ".join(printable(r.key) for r in submitted.results if r.created)
        log.info("submitted by %s: %s", printable(who), created)
    return JSONResponse(submitted.body(), status_code=201 if submitted.created else 200)


def _param(about: str, schema: dict[str, Any]) -> Any:
    # What the listing's parameter accepts (`daemon/service_layer/listing.py` checks each).
    return Query(description=about, json_schema_extra=exactly({"type": "string", **schema}))


_SINCE_RULES = "an ISO 8601 date or time (2026-11-01, 2026-11-01T12:00Z) or a duration ago (24h)"
_STATE = _param("one job state", {"enum": list(STATES)})
_CHANNEL = _param("one channel", {"pattern": r"^[^\x00]*\S[^\x00]*$"})
_SINCE = _param(
    "last change stored at or after (UTC when no zone is given)",
    {"pattern": NO_NUL, "x-rules": _SINCE_RULES},
)
_LIMIT = _param("jobs per page (100)", {"type": "integer", "minimum": 1, "maximum": LIMIT_MAX})
_CURSOR = _param(
    "the last page's next_cursor", {"pattern": NO_NUL, "x-rules": "a next_cursor this API gave"}
)


@router.get(
    "/jobs",
    response_model=JobList,
    responses=documented(401, 422),
    summary="Jobs from the index, least recently changed first, a page at a time",
)
def list_jobs(
    ctx: Ctx,
    who: Caller,
    state: Annotated[str | None, _STATE] = None,
    channel: Annotated[str | None, _CHANNEL] = None,
    since: Annotated[str | None, _SINCE] = None,
    limit: Annotated[str | None, _LIMIT] = None,
    cursor: Annotated[str | None, _CURSOR] = None,
) -> Any:
    # Every parameter arrives as text: the service names each bad one
    # (`daemon/service_layer/listing.py`).
    page = ctx.services.list_jobs(
        state=state, channel=channel, since=since, limit=limit, cursor=cursor
    )
    return page.body()


@router.get(
    "/jobs/{key:key}/events",
    response_model=list[EventOut],
    responses=documented(401, 404),
    summary="A job's events, oldest first (as `history --json`)",
)
def events(key: str, ctx: Ctx, who: Caller) -> list[dict[str, Any]]:
    return ctx.services.history(key)


@router.post(
    "/jobs/{key:key}/cancel",
    response_model=JobStatus,
    responses=documented(401, 404, 409, 412, 413, 422),
    summary="Cancel a job not yet attempted (409 naming its state otherwise)",
)
def cancel(
    key: str,
    ctx: Ctx,
    who: Caller,
    response: Response,
    body: Annotated[CancelIn | None, Body()] = None,
    if_match: IfMatch = None,
) -> dict[str, Any]:
    note = body.note if body is not None else ""
    expected = expected_version(if_match, body.expected_version if body is not None else None)
    with held_to(if_match):
        job = ctx.services.cancel(key, note=note, by=who, expected_version=expected)
    log.info("cancelled by %s: %s", printable(who), printable(key))
    response.headers["ETag"] = etag(job.version)
    return job_status(job)


@router.get(
    "/jobs/{key:key}",
    response_model=JobStatus,
    responses=documented(401, 404),
    summary="A job's state (as `status --json`)",
)
def status(key: str, ctx: Ctx, who: Caller, response: Response) -> dict[str, Any]:
    found = ctx.services.status(key)
    # The version as HTTP says it: a decision sent back with it in If-Match holds for it.
    response.headers["ETag"] = etag(found["version"])
    return found
