"""Which role each route needs: the one table (docs/http-api.md "Roles"), and the route class that
holds every `/v1` route to it.

The check runs before anything of the request is read (its body, its parameters): a
token without the role gets 403 `{"error"}` whatever it sent, so a refusal never tells
whether a job exists or what a valid body looks like. A route missing from the table
needs `admin` (closed, not open); `tests/unit/test_api_roles.py` keeps the table and the
routes equal.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import Depends, Request, Response
from fastapi.routing import APIRoute

from daemon.api.auth import Identity, Role, bearer
from daemon.api.bodies import StrictJsonRoute
from daemon.api.errors import ApiError, unauthorized
from daemon.api.models import Problem
from ledger.display import printable

if TYPE_CHECKING:
    # Its type only: the guard reads the token book the context holds, nothing the
    # context's module needs to build it (the service layer), so it runs without it.
    from daemon.api.context import ApiContext

log = logging.getLogger("sendledger.api")

#: (method, path as the OpenAPI document writes it) -> the role it needs. HEAD is GET's.
ROUTE_ROLES: dict[tuple[str, str], Role] = {
    ("POST", "/v1/jobs"): Role.SUBMIT,
    ("POST", "/v1/jobs/{key}/cancel"): Role.SUBMIT,
    ("GET", "/v1/jobs"): Role.READ,
    ("GET", "/v1/jobs/{key}"): Role.READ,
    ("GET", "/v1/jobs/{key}/events"): Role.READ,
    ("GET", "/v1/review"): Role.REVIEW,
    ("POST", "/v1/review/triage"): Role.REVIEW,
    ("POST", "/v1/review/{key}/check"): Role.REVIEW,
    ("POST", "/v1/review/{key}/resolve"): Role.REVIEW,
}
#: Every page under /ui/ (the queue, a job, its forms, triage, the overview).
PAGE_ROLE = Role.REVIEW


def role_for(method: str, path: str) -> Role:
    method = "GET" if method == "HEAD" else method
    return ROUTE_ROLES.get((method, path), Role.ADMIN)


def forbidden(identity: Identity, role: Role) -> ApiError:
    return ApiError(403, f"the token of {identity.name!r} lacks the {role.value} role this needs")


def authorize(request: Request, path: str) -> Identity:
    """The caller of a `/v1` route, if its token has the role the route needs (401/403)."""
    ctx: ApiContext = request.app.state.ctx  # where `create_app` keeps it (`context_of`)
    identity = ctx.tokens.identity(bearer(request.headers.get("authorization")))
    if identity is None:
        raise unauthorized()
    role = role_for(request.method, path)
    if not identity.may(role):
        # For the operator: which token tried what (never the token).
        log.info("refused %s %s: the token of %s lacks the %s role", request.method, path,
                 printable(identity.name), role.value)  # fmt: skip
        raise forbidden(identity, role)
    return identity


class GuardedRoute(APIRoute):
    """A `/v1` route whose token and role are checked before its body or parameters are
    read; the endpoint's `Caller` dependency reads who it was (`request.state`)."""

    def __init__(self, path: str, endpoint: Callable[..., Any], **kwargs: Any) -> None:
        responses = dict(kwargs.pop("responses", None) or {})
        responses.setdefault(
            403, {"model": Problem, "description": "the token lacks the role this route needs"}
        )
        super().__init__(path, endpoint, responses=responses, **kwargs)

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        path = self.path_format

        async def guarded(request: Request) -> Response:
            request.state.identity = authorize(request, path)
            return await handler(request)

        return guarded


class V1Route(GuardedRoute, StrictJsonRoute):
    """A `/v1` route: token and role checked first, then its JSON body decoded strictly off
    the event loop (`daemon.api.bodies`)."""


def caller_identity(request: Request) -> Identity:
    identity: Identity = request.state.identity
    return identity


def caller(request: Request) -> str:
    """The token's name: its token and role were checked before the route ran (401, 403:
    `authorize`)."""
    return caller_identity(request).name


#: Who called a route, by the name of its token, as a FastAPI dependency (`who: Caller`).
Caller = Annotated[str, Depends(caller)]


__all__ = [
    "PAGE_ROLE",
    "ROUTE_ROLES",
    "Caller",
    "GuardedRoute",
    "V1Route",
    "authorize",
    "caller_identity",
    "forbidden",
    "role_for",
]
