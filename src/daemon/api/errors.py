"""The API's error answers: one JSON shape, `{"error": "..."}`, plus per-field errors
(docs/http-api.md "HTTP API", "Errors and statuses").

Whatever a client sends, the answer is one of the documented statuses with that shape:
Starlette's own answers (unknown route 404, 405) are re-worded, a body that is not JSON
or nests too deeply is the 422 of an invalid field, and a 422 lists at most
:data:`MAX_LISTED` errors with their total count, so the answer's size does not grow with
the request's.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from daemon.api.models import Invalid, Problem
from daemon.service_layer.problems import MAX_LISTED, FieldProblem, ServiceError
from ledger.content import JobInputError
from ledger.exceptions import Refusal, SendledgerError
from ledger.stores.causes import StoreUnavailable

log = logging.getLogger("sendledger.api")


class ApiError(SendledgerError):
    def __init__(
        self,
        status: int,
        message: str,
        headers: dict[str, str] | None = None,
        problems: Sequence[FieldProblem] = (),
        total: int | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers
        self.problems = list(problems)  # a 422's refused fields
        self.total = total


#: The status of each kind of refusal (ledger/exceptions.py: the tree and its kinds).
STATUS = {
    Refusal.BAD_INPUT: 422,
    Refusal.NOT_FOUND: 404,
    Refusal.CONFLICT: 409,
    Refusal.UNAVAILABLE: 503,
}


def status_of(exc: SendledgerError) -> int | None:
    """The HTTP status of an error of the tree, for the API and the review page alike;
    None for a failure (a 500, logged)."""
    if isinstance(exc, ApiError):
        return exc.status
    return None if exc.kind is None else STATUS[exc.kind]


def unauthorized() -> ApiError:
    return ApiError(401, "a valid API token is required", {"WWW-Authenticate": "Bearer"})


def problem(status: int, about: str) -> dict[int | str, dict[str, Any]]:
    return {status: {"model": Problem, "description": about}}


def documented(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The error answers a route can give, for its OpenAPI `responses`."""
    about = {
        400: "the Host header is not one of api.trusted_hosts",
        401: "no valid API token",
        404: "no job with that key",
        409: "conflict: the key is known with other content, or the job's state does "
        "not allow it (the message says why)",
        412: "If-Match names a version the job is no longer at (the message says what "
        "changed): nothing was recorded",
        413: "the request body is larger than api.max_body",
        503: "the mailbox could not be searched now (nothing was decided)",
    }
    responses: dict[int | str, dict[str, Any]] = {}
    for status in statuses:
        if status == 422:
            responses[422] = {
                "model": Invalid,
                "description": f"invalid input, per field (at most {MAX_LISTED} listed; "
                "`count` is the total)",
            }
        else:
            responses.update(problem(status, about[status]))
    return responses


def invalid(
    problems: Sequence[FieldProblem], total: int | None = None, sentence: str | None = None
) -> JSONResponse:
    """The 422 of refused fields: the first as the sentence (unless given), at most
    MAX_LISTED listed, `count` the total."""
    listed = list(problems[:MAX_LISTED])
    errors = [{"index": p.index, "field": p.field, "reason": p.reason} for p in listed]
    count = max(total or 0, len(problems))
    error = sentence or str(listed[0])
    return JSONResponse({"error": error, "errors": errors, "count": count}, 422)


def _field(loc: Sequence[object]) -> str:
    # ("body", "note") -> "note"; ("query", "page") -> "page"; ("body", 12) (the place in
    # the document where JSON decoding failed) -> "body".
    names = [str(part) for part in loc[1:] if not isinstance(part, int)]
    return ".".join(names) or "body"


def _reason(error: Mapping[str, Any]) -> str:
    if error.get("type") == "json_invalid":
        return f"not valid JSON: {error.get('ctx', {}).get('error', 'decode error')}"
    return str(error["msg"])


def answer(exc: SendledgerError, status: int) -> JSONResponse:
    """`{"error": sentence}` with `status`; a 422 lists the refused fields: a service's or
    the intake's, or the one field the domain refused (a resolve's note or `by`,
    docs/cli.md "Keys")."""
    if isinstance(exc, JobInputError):
        problems = [FieldProblem(None, exc.field, exc.reason)]
        return invalid(problems, sentence=str(exc))
    if status == 422 and isinstance(exc, (ApiError, ServiceError)) and exc.problems:
        return invalid(exc.problems, exc.total, exc.message)
    headers = exc.headers if isinstance(exc, ApiError) else None
    return JSONResponse({"error": str(exc)}, status, headers=headers)


def install(app: FastAPI) -> None:
    @app.exception_handler(SendledgerError)
    async def _refused(request: Request, exc: SendledgerError) -> JSONResponse:
        # Every error of the tree, mapped once; a failure goes on to the 500 below.
        status = status_of(exc)
        if status is None:
            raise exc
        if isinstance(exc, StoreUnavailable):
            # The store's fault, not the client's: the operator reads it in the log.
            log.error("%s %s: %s", request.method, request.url.path, exc)
        return answer(exc, status)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # Starlette's own answers (no such route, a method the route does not take).
        message = {404: "no such route", 405: "method not allowed"}.get(exc.status_code)
        return JSONResponse(
            {"error": message or str(exc.detail)},
            exc.status_code,
            headers=getattr(exc, "headers", None),
        )

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        found = exc.errors()
        problems = [
            FieldProblem(None, _field(error["loc"]), _reason(error)) for error in found[:MAX_LISTED]
        ]
        first = problems[0] if problems else FieldProblem(None, "body", "invalid")
        return invalid(problems or [first], len(found), f"{first.field}: {first.reason}")

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        # A bug, not an input: logged with its traceback; the client gets the shape.
        log.exception("unexpected error on %s %s", request.method, request.url.path)
        return JSONResponse({"error": "internal error (logged)"}, 500)
