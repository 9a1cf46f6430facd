"""Request bodies are decoded off the event loop by the strict decoder of job JSON
(`daemon.service_layer.job_json`: a name given twice refused, nesting and integer size bounded), for
every route, so no body can block `/healthz` or answer 500 (docs/http-api.md "HTTP API").

FastAPI decodes a route's JSON body with `Request.json()`: :class:`StrictJsonRoute` hands
its routes a request whose `json()` is :func:`decode_body` in a worker thread. A body the
decoder refuses raises `json.JSONDecodeError`, which FastAPI turns into the 422 of an
invalid body (`daemon.api.errors`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.routing import APIRoute

from daemon.service_layer.job_json import DUPLICATE_REASON, duplicate_field, loads


def decode_jobs(raw: bytes) -> Any:
    """The job JSON of `POST /v1/jobs`; JSONDecodeError for what is not a JSON document
    (not UTF-8, nested too deeply, an integer too long). A name given twice is left
    marked for intake, which names it per job (`job[1].to`)."""
    try:
        return loads(raw)
    except UnicodeDecodeError:
        raise json.JSONDecodeError("not UTF-8", "", 0) from None


def decode_body(raw: bytes) -> Any:
    """The JSON document of any other request body; as :func:`decode_jobs`, and a name
    given twice in one object is refused here."""
    value = decode_jobs(raw)
    duplicate = duplicate_field(value)
    if duplicate is not None:
        raise json.JSONDecodeError(f"{duplicate}: {DUPLICATE_REASON}", "", 0)
    return value


async def decode_off_loop(raw: bytes) -> Any:
    return await run_in_threadpool(decode_body, raw)


async def decode_jobs_off_loop(raw: bytes) -> Any:
    return await run_in_threadpool(decode_jobs, raw)


class StrictJsonRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = await decode_off_loop(await self.body())
        return self._json


class StrictJsonRoute(APIRoute):
    """A route whose JSON body is decoded by :func:`decode_body`, off the event loop."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def strict(request: Request) -> Response:
            return await handler(StrictJsonRequest(request.scope, request.receive))

        return strict
