"""`/v1/review`: the jobs waiting for a human, a search of the mailbox, a human's
decision on one, and triage after an outage (docs/review.md "Review")."""

from __future__ import annotations

import logging
from typing import Annotated, Any

from fastapi import APIRouter, Body, Query, Response
from fastapi.concurrency import run_in_threadpool

import daemon.api.paths  # noqa: F401  (registers `{key:key}`: every key addressable)
from daemon.api.context import Ctx
from daemon.api.errors import documented
from daemon.api.models import (
    NO_NUL,
    REASONS,
    CheckOut,
    JobStatus,
    ResolveIn,
    ReviewItem,
    TriageIn,
    TriageItemOut,
    exactly,
)
from daemon.api.preconditions import IfMatch, etag, expected_version, held_to
from daemon.api.roles import Caller, V1Route
from daemon.service_layer.read_models import job_status
from ledger.display import printable

log = logging.getLogger("sendledger.api")
router = APIRouter(prefix="/v1", route_class=V1Route)


_TEXT = exactly({"type": "string", "pattern": NO_NUL})


@router.get(
    "/review",
    response_model=list[ReviewItem],
    responses=documented(401, 422),
    summary="Jobs in review (as `review list --json`), of a channel or for a reason",
)
def review_list(
    ctx: Ctx,
    who: Caller,
    channel: Annotated[str | None, Query(json_schema_extra=_TEXT)] = None,
    reason: Annotated[
        str | None, Query(json_schema_extra=exactly({"type": "string", "enum": REASONS}))
    ] = None,
) -> list[dict[str, Any]]:
    return ctx.services.review_list(channel=channel, reason=reason)


@router.post(
    "/review/triage",
    response_model=list[TriageItemOut],
    responses=documented(401, 413, 422),
    summary="Search every matching job in review: one copy -> resolved as sent, else left",
)
async def review_triage(
    ctx: Ctx, who: Caller, body: Annotated[TriageIn | None, Body()] = None
) -> list[dict[str, Any]]:
    body = body or TriageIn()
    items = await run_in_threadpool(
        ctx.services.triage,
        by=who,
        channel=body.channel,
        reason=body.reason,
        dry_run=body.dry_run,
    )
    done = sum(1 for item in items if item.action == "resolved-sent")
    log.info("triage by %s: %d jobs searched, %d resolved as sent%s", printable(who),
             len(items), done, " (dry run)" if body.dry_run else "")  # fmt: skip
    return [item.as_dict() for item in items]


@router.post(
    "/review/{key:key}/check",
    response_model=CheckOut,
    responses=documented(401, 404, 503),
    summary="Search the mailbox for the job's Message-ID now; recorded in its history",
)
async def review_check(key: str, ctx: Ctx, who: Caller) -> dict[str, Any]:
    answer = await run_in_threadpool(lambda: ctx.services.check(key, by=who))
    return answer.as_dict()


@router.post(
    "/review/{key:key}/resolve",
    response_model=JobStatus,
    responses=documented(401, 404, 409, 412, 413, 422, 503),
    summary="Record a human's decision on a job in review (a resend is searched first)",
)
async def review_resolve(
    key: str,
    decision: ResolveIn,
    ctx: Ctx,
    who: Caller,
    response: Response,
    if_match: IfMatch = None,
) -> dict[str, Any]:
    expected = expected_version(if_match, decision.expected_version)
    with held_to(if_match):
        job = await run_in_threadpool(
            lambda: ctx.services.resolve(
                key,
                decision.decision,
                note=decision.note,
                by=who,
                expected_version=expected,
            ),
        )
    response.headers["ETag"] = etag(job.version)
    return job_status(job)
