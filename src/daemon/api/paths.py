"""Every job key is addressable in a path (docs/http-api.md "HTTP API", "Keys in paths").

The rule: a key is one path segment, percent-encoded (`quote(key, safe="")`: `/` as
`%2F`, `%` as `%25`). The routes that act on a key end in a literal action segment
(`/events`, `/cancel`, `/check`, `/resolve`), told apart from a key by the *raw* path, not
the decoded one: `/v1/jobs/solo%2Fevents` is job `solo/events`, `/v1/jobs/amb/events` the
events of job `amb`. A key with a literal `/` still works where it cannot be read as an
action (`/v1/jobs/a/b` is job `a/b`), as before this rule.

Starlette routes on the decoded path, where `%2F` is already `/`. :class:`KeyPaths`
rewrites the path of every keyed route to a canonical form (the key re-encoded as one
segment) from the raw path, and the `key` convertor decodes that segment for the route.
"""

from __future__ import annotations

from urllib.parse import quote, unquote, unquote_to_bytes

from starlette.convertors import Convertor, register_url_convertor
from starlette.types import ASGIApp, Receive, Scope, Send

#: Path prefix -> method -> the action segments a keyed route of that prefix ends in.
FAMILIES: dict[bytes, dict[str, tuple[bytes, ...]]] = {
    b"/v1/jobs/": {"GET": (b"/events",), "POST": (b"/cancel",)},
    b"/v1/review/": {"POST": (b"/check", b"/resolve")},
    b"/ui/jobs/": {"POST": (b"/check", b"/resolve", b"/cancel")},
}


def key_segment(key: str) -> str:
    """A key as one path segment (the form every link and client should use). A key `.`
    or `..` has its dots encoded too: clients remove such segments (RFC 3986 5.2.4)."""
    segment = quote(key, safe="")
    return segment.replace(".", "%2E") if segment in (".", "..") else segment


def request_path(scope: Scope) -> bytes:
    """The request's path as it came, percent escapes and all, without its query."""
    raw: bytes = scope.get("raw_path") or quote(scope["path"], safe="/").encode()
    return raw.partition(b"?")[0]


def canonical_path(raw: bytes, method: str) -> str | None:
    """The path to route for a raw request path under a keyed prefix, else None.
    UnicodeDecodeError when the key's bytes are not UTF-8 text."""
    for prefix, by_method in FAMILIES.items():
        if not raw.startswith(prefix):
            continue
        rest = raw[len(prefix) :]
        suffix = b""
        for action in by_method.get("GET" if method == "HEAD" else method, ()):
            if rest.endswith(action) and len(rest) > len(action):
                rest, suffix = rest[: -len(action)], action
                break
        if not rest:
            return None
        # Strict: with "replace", `caf%E9`, `caf%FF` and `caf%C3` all named job `caf\ufffd`
        # and a cancel acted on it. daemon/api/guards.py: KeysInUtf8 answers the error.
        key = unquote_to_bytes(rest).decode("utf-8")
        return prefix.decode() + key_segment(key) + suffix.decode()
    return None


class KeyPaths:
    """Pure ASGI middleware: the path of a keyed route, canonical (see module doc)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path = canonical_path(request_path(scope), scope["method"])
            if path is not None:
                scope = {**scope, "path": path}
        await self.app(scope, receive, send)


class KeyConvertor(Convertor[str]):
    """`{key:key}`: one percent-encoded segment of a canonical path, decoded."""

    regex = "[^/]+"

    def convert(self, value: str) -> str:
        return unquote(value)

    def to_string(self, value: str) -> str:
        return key_segment(value)


register_url_convertor("key", KeyConvertor())

__all__ = ["FAMILIES", "KeyPaths", "canonical_path", "key_segment", "request_path"]
