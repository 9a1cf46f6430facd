"""What every request passes before a route: the Host check (`[api] trusted_hosts`), HEAD
answered wherever GET is, and 405 with the one right `Allow` for a method a path is not
served for (docs/http-api.md "HTTP API").

Redirects never carry the Host header: the app's own redirects are paths (`/ui/`), and
slash redirects are off (`redirect_slashes=False`), so a forged Host cannot send a
browser elsewhere. `trusted_hosts` refuses a request whose Host is not listed (400).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from starlette.routing import BaseRoute, Match, Mount
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from daemon.api.form_text import in_pairs
from daemon.api.paths import canonical_path, request_path


def host_name(header: str) -> str:
    """The name of a Host header value, without port and brackets, lower case."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def host_allowed(name: str, trusted: Sequence[str]) -> bool:
    """`name` is one of `trusted` (`*.example.com` matches its subdomains)."""
    for pattern in trusted:
        pattern = pattern.lower()
        if pattern == "*" or name == pattern:
            return True
        if pattern.startswith("*.") and name.endswith(pattern[1:]):
            return True
    return False


async def answer_json(
    send: Send, status: int, body: dict[str, Any], extra: Sequence[tuple[str, str]] = ()
) -> None:
    payload = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(payload))]
    headers += [(name.encode("latin-1"), value.encode("latin-1")) for name, value in extra]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


async def answer_invalid(send: Send, field: str, reason: str) -> None:
    """The 422 of one refused `field` (docs/http-api.md "Errors and statuses")."""
    error = {"index": None, "field": field, "reason": reason}
    await answer_json(send, 422, {"error": f"{field}: {reason}", "errors": [error], "count": 1})


class TrustedHosts:
    """Pure ASGI middleware: 400 `{"error"}` for a Host not in `trusted` (empty: any)."""

    def __init__(self, app: ASGIApp, trusted: Sequence[str]) -> None:
        self.app = app
        self.trusted = list(trusted)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.trusted:
            header = dict(scope["headers"]).get(b"host", b"").decode("latin-1")
            if not host_allowed(host_name(header), self.trusted):
                await answer_json(send, 400, {"error": "Host not in api.trusted_hosts"})
                return
        await self.app(scope, receive, send)


class NoNulInQuery:
    """Pure ASGI middleware: a query with a NUL character (`%00`) is 422 before any route
    reads it. No stored text holds one, and PostgreSQL refuses it in a query (a filter
    with it would be a 500)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and b"%00" in scope.get("query_string", b"").lower():
            await answer_invalid(send, "query", "a NUL character (%00) is not allowed")
            return
        await self.app(scope, receive, send)


class QueryInUtf8:
    """Pure ASGI middleware: a query parameter whose bytes are not UTF-8 text is 422
    naming it, before any route reads it, on the pages too (`daemon/api/form_text.py`).
    Decoded with U+FFFD in their place, `GET /v1/jobs?channel=caf%E9` listed no job of
    channel `café` and said nothing of why."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            found = in_pairs(scope.get("query_string", b""))
            if found is not None:
                await answer_invalid(send, found.field, found.reason)
                return
        await self.app(scope, receive, send)


class KeysInUtf8:
    """Pure ASGI middleware: a keyed path (`daemon/api/paths.py`) whose key's bytes are not
    UTF-8 text is 422 naming `key` before any route, on the pages too. Decoded with
    U+FFFD in their place, `caf%E9` (a Latin-1 client's `café`), `caf%FF` and `caf%C3`
    each named job `caf\ufffd`, and a cancel or a resolution acted on it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            try:
                canonical_path(request_path(scope), scope["method"])
            except UnicodeDecodeError as exc:
                byte = exc.object[exc.start]
                reason = f"not UTF-8 text (byte 0x{byte:02x}): a key in a path is its UTF-8 bytes"
                await answer_invalid(send, "key", reason + ", percent-encoded")
                return
        await self.app(scope, receive, send)


class HeadAsGet:
    """Pure ASGI middleware: HEAD is answered as GET, headers only (RFC 9110 9.3.2)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return

        async def headers_only(message: Message) -> None:
            if message["type"] == "http.response.body":
                message = {**message, "body": b""}
            await send(message)

        await self.app({**scope, "method": "GET"}, receive, headers_only)


#: The methods a request may name that some route could serve (HEAD is GET's).
METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")


def served(routes: Sequence[BaseRoute], scope: Scope, method: str) -> bool:
    """Whether some route serves `method` for this request's path, as that method routes
    it (a keyed path depends on the method, `daemon/api/paths.py`)."""
    raw = request_path(scope)
    asked = {**scope, "method": method, "path": canonical_path(raw, method) or scope["path"]}
    for route in routes:
        match, _ = route.matches(asked)
        # A mount (the docs page's static files) answers GET and HEAD only.
        if match is Match.FULL and (method == "GET" or not isinstance(route, Mount)):
            return True
    return False


def allowed_methods(routes: Sequence[BaseRoute], scope: Scope) -> set[str]:
    """Every method the app serves for this request's path (HEAD beside GET)."""
    found = {method for method in METHODS if served(routes, scope, method)}
    return found | {"HEAD"} if "GET" in found else found


class MethodsAllowed:
    """Pure ASGI middleware: a method that no route serves for a path that some route
    serves is 405 `{"error"}` with `Allow` naming every method served there. Starlette
    alone names only the first route's methods (`/v1/jobs` said `POST` without `GET`), and
    a keyed path routed as a key for GET (`/v1/review/x/check`) was 404."""

    def __init__(self, app: ASGIApp, routes: Sequence[BaseRoute]) -> None:
        self.app = app
        self.routes = routes  # the app's own list: routes added later are seen too

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            method = "GET" if scope["method"] == "HEAD" else scope["method"]
            # The common case costs one pass over the routes; only a refusal counts them all.
            allowed = (
                set() if served(self.routes, scope, method) else allowed_methods(self.routes, scope)
            )
            if allowed:
                await answer_json(
                    send,
                    405,
                    {"error": "method not allowed"},
                    [("allow", ", ".join(sorted(allowed)))],
                )
                return
        await self.app(scope, receive, send)


__all__ = [
    "METHODS",
    "HeadAsGet",
    "MethodsAllowed",
    "NoNulInQuery",
    "QueryInUtf8",
    "TrustedHosts",
    "allowed_methods",
    "answer_json",
    "host_allowed",
    "host_name",
    "served",
]
