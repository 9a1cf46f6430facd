"""`/v1/review`: the jobs waiting for a human, and a human's decision on one."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.concurrency import run_in_threadpool

from daemon.api.errors import ApiError, documented
from daemon.api.jobs import Caller, Ctx
from daemon.api.models import JobStatus, ResolveIn, ReviewItem
from daemon.commands import job_status, review_rows
from ledger.application import ConcurrentUpdate, Ledger, UnknownJob
from ledger.job import SendJob, TransitionError
from ledger.vocabulary import Resolution

router = APIRouter(prefix="/v1")


def resolve(ledger: Ledger, key: str, decision: Resolution, note: str, by: str) -> SendJob:
    """A human's decision, as `review resolve`. ApiError 404 / 409 for what cannot be."""
    try:
        job, _ = ledger.update(
            key, lambda j: j.resolve(decision, note=note, by=by, at=ledger.clock())
        )
    except UnknownJob as exc:
        raise ApiError(404, str(exc)) from None
    except (TransitionError, ConcurrentUpdate) as exc:
        raise ApiError(409, f"job {key!r} cannot be resolved: {exc}") from None
    return job


@router.get(
    "/review",
    response_model=list[ReviewItem],
    responses=documented(401),
    summary="Jobs in review (as `review list --json`)",
)
def review_list(ctx: Ctx, who: Caller) -> list[dict[str, Any]]:
    return review_rows(ctx.ledger)


@router.post(
    "/review/{key:path}/resolve",
    response_model=JobStatus,
    responses=documented(401, 404, 409, 413, 422),
    summary="Record a human's decision on a job in review (409 when it is not in review)",
)
async def review_resolve(key: str, decision: ResolveIn, ctx: Ctx, who: Caller) -> dict[str, Any]:
    job = await run_in_threadpool(resolve, ctx.ledger, key, decision.decision, decision.note, who)
    return job_status(job)
