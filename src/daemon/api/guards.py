"""What every request passes before a route: the Host check (`[api] trusted_hosts`) and
HEAD answered wherever GET is (README "HTTP API").

Redirects never carry the Host header: the app's own redirects are paths (`/ui/`), and
slash redirects are off (`redirect_slashes=False`), so a forged Host cannot send a
browser elsewhere. `trusted_hosts` refuses a request whose Host is not listed (400).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send


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


async def answer_json(send: Send, status: int, body: dict[str, Any]) -> None:
    payload = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(payload))]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


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
            reason = "a NUL character (%00) is not allowed"
            error = {"index": None, "field": "query", "reason": reason}
            body = {"error": f"query: {reason}", "errors": [error], "count": 1}
            await answer_json(send, 422, body)
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


__all__ = ["HeadAsGet", "NoNulInQuery", "TrustedHosts", "answer_json", "host_allowed", "host_name"]
