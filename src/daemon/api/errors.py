"""The API's error answers: one JSON shape, `{"error": "..."}`, plus per-field errors."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from daemon.api.models import Invalid, Problem
from daemon.services import Refusal, ServiceError
from ledger.content import JobInputError

T = TypeVar("T")


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        headers: dict[str, str] | None = None,
        errors: list[dict[str, Any]] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers
        self.errors = errors


_STATUS = {
    Refusal.BAD_INPUT: 422,
    Refusal.NOT_FOUND: 404,
    Refusal.CONFLICT: 409,
    Refusal.UNAVAILABLE: 503,
}


def api_error(exc: ServiceError) -> ApiError:
    """A service's refusal as the API's status and `{"error": sentence}`."""
    # The fields a refusal names travel with it, as a 422 of intake lists them.
    errors = [
        {"index": p.index, "field": p.field, "reason": p.reason} for p in exc.problems
    ] or None
    return ApiError(_STATUS[exc.kind], exc.message, errors=errors)


def served(call: Callable[[], T]) -> T:
    """`call()`, its refusal raised as the API's error."""
    try:
        return call()
    except ServiceError as exc:
        raise api_error(exc) from None


def unauthorized() -> ApiError:
    return ApiError(401, "a valid API token is required", {"WWW-Authenticate": "Bearer"})


def problem(status: int, about: str) -> dict[int | str, dict[str, Any]]:
    return {status: {"model": Problem, "description": about}}


def documented(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The error answers a route can give, for its OpenAPI `responses`."""
    about = {
        401: "no valid API token",
        404: "no job with that key",
        409: "conflict: the key is known with other content, or the job's state does "
        "not allow it (the message says why)",
        413: "the request body is larger than api.max_body",
        503: "the mailbox could not be searched now (nothing was decided)",
    }
    responses: dict[int | str, dict[str, Any]] = {}
    for status in statuses:
        if status == 422:
            responses[422] = {"model": Invalid, "description": "invalid input, per field"}
        else:
            responses.update(problem(status, about[status]))
    return responses


def install(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        body: dict[str, Any] = {"error": exc.message}
        if exc.errors:
            body["errors"] = exc.errors
        return JSONResponse(body, exc.status, headers=exc.headers)

    @app.exception_handler(JobInputError)
    async def _refused_field(request: Request, exc: JobInputError) -> JSONResponse:
        # The domain's refusal of one field, wherever a route passes it on (a resolve's
        # note or `by`: README "Keys"): 422 naming it, never a 500.
        errors = [{"index": None, "field": exc.field, "reason": exc.reason}]
        return JSONResponse({"error": str(exc), "errors": errors}, 422)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [
            {
                "index": None,
                "field": ".".join(str(part) for part in error["loc"][1:]) or "body",
                "reason": error["msg"],
            }
            for error in exc.errors()
        ]
        return JSONResponse({"error": "invalid request", "errors": errors}, 422)
