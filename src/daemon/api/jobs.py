"""`/v1/jobs`: intake (the job JSON of `submit`, or a list) and reading a job back."""

from __future__ import annotations

import json
import logging
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from daemon.api.context import ApiContext, context_of
from daemon.api.errors import ApiError, documented, unauthorized
from daemon.api.models import EventOut, JobIn, JobOut, JobStatus
from daemon.commands import event_record, job_status
from daemon.intake import (
    FieldProblem,
    IntakeError,
    check_messages,
    decode_jobs,
    parse_jobs,
    senders_for,
    submit_jobs,
)
from ledger.application import KeyConflict, UnknownJob, utcnow

log = logging.getLogger("sendledger.api")
router = APIRouter(prefix="/v1")
Ctx = Annotated[ApiContext, Depends(context_of)]


def caller(request: Request) -> str:
    """The token's name (Authorization: Bearer TOKEN), else 401."""
    from daemon.api.auth import bearer

    name = context_of(request).tokens.who(bearer(request.headers.get("authorization")))
    if name is None:
        raise unauthorized()
    return name


Caller = Annotated[str, Depends(caller)]

_JOB_SCHEMA = JobIn.model_json_schema(ref_template="#/components/schemas/{model}")
_REQUEST_BODY = {
    "required": True,
    "content": {
        "application/json": {
            "schema": {"anyOf": [_JOB_SCHEMA, {"type": "array", "items": _JOB_SCHEMA}]}
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
        data = decode_jobs(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        reason = exc.msg if isinstance(exc, json.JSONDecodeError) else "not UTF-8"
        return _problems([FieldProblem(None, "job", f"not valid JSON: {reason}")])
    try:
        jobs = parse_jobs(data)
        policies, batch = ctx.policies(), isinstance(data, list)
        senders = senders_for(policies, jobs, batch=batch, thread_providers=ctx.thread_providers)
        # The message each job would be, built and held against its provider's limits.
        await run_in_threadpool(
            check_messages, policies, jobs, senders, ctx.limits, batch=batch, at=utcnow()
        )
    except IntakeError as exc:
        return _problems(exc.problems)
    try:
        results = await run_in_threadpool(submit_jobs, ctx.ledger, jobs, senders, by=who)
    except KeyConflict as exc:
        raise ApiError(409, str(exc)) from None
    created = any(result.created for result in results)
    if created:
        log.info("submitted by %s: %s", who, ", ".join(r.key for r in results if r.created))
    body: Any = [r.as_dict() for r in results] if isinstance(data, list) else results[0].as_dict()
    return JSONResponse(body, status_code=201 if created else 200)


def _problems(problems: list[FieldProblem]) -> JSONResponse:
    errors = [{"index": p.index, "field": p.field, "reason": p.reason} for p in problems]
    return JSONResponse({"error": str(problems[0]), "errors": errors}, status_code=422)


def load_job(ctx: ApiContext, key: str) -> Any:
    try:
        return ctx.ledger.get_job(key)
    except UnknownJob as exc:
        raise ApiError(404, str(exc)) from None


@router.get(
    "/jobs/{key:path}/events",
    response_model=list[EventOut],
    responses=documented(401, 404),
    summary="A job's events, oldest first (as `history --json`)",
)
def events(key: str, ctx: Ctx, who: Caller) -> list[dict[str, Any]]:
    try:
        return [event_record(e) for e in ctx.ledger.history(key)]
    except UnknownJob as exc:
        raise ApiError(404, str(exc)) from None


@router.get(
    "/jobs/{key:path}",
    response_model=JobStatus,
    responses=documented(401, 404),
    summary="A job's state (as `status --json`)",
)
def status(key: str, ctx: Ctx, who: Caller) -> dict[str, Any]:
    return job_status(load_job(ctx, key))
