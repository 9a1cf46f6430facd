"""An httplib2 transport that makes each request exactly once and says which phase failed.

Why not plain `httplib2.Http`: its `_conn_request` repeats a request by itself

* once more when sending or reading fails on a connection (`RETRIES = 2`), and
* once more "regardless of the number of RETRIES set" when the first read ends in
  `BadStatusLine` - and `http.client.RemoteDisconnected`, what a dropped response looks
  like, is a `BadStatusLine`. Setting `httplib2.RETRIES = 1` does not stop that one.

For `users.messages.send` either repeat is a second email. So `SingleShotHttp` replaces
`_conn_request` with one attempt, and splits it into two phases so the caller can tell
"not sent" from "maybe sent":

1. connect (DNS, TCP, TLS handshake; through a proxy: the tunnel) on a FRESH connection.
   No byte of the request has left yet, so a failure here proves nothing was sent:
   `NotSentError`.
2. write the request and read the whole response. From the first byte written on, a
   failure (timeout, reset, closed without a response, unreadable body) leaves the
   outcome unknown: `ResponseLostError`.

A fresh connection per request is what makes phase 1 a proof: on a reused keep-alive
connection a stale socket would only show up while writing, in phase 2, where it cannot
be told apart from a server that took the request and died. The price is one handshake
per call, small next to Gmail's quota (a send costs 100 of a user's 250 units/s).

Also switched off: redirects (httplib2 re-POSTs on 308; Gmail does not redirect API calls,
so a 3xx is surfaced as a response and classified as unknown), the cache and httplib2's
own credential challenges (`add_credentials` is never called). The one replay left below
us is google-auth-httplib2's retry after refreshing a token on 401: a 401 means the
request was not accepted, so that replay cannot make a second copy.

Both errors derive from `httplib2.HttpLib2Error` so google-auth's httplib2 adapter wraps
them in `google.auth.exceptions.TransportError` during a token refresh, as it does for
httplib2's own errors; the original stays reachable through `__cause__`/`args`.
"""

from __future__ import annotations

import http.client
import socket
from typing import Any

import httplib2


class TransportFailure(httplib2.HttpLib2Error):  # type: ignore[misc]
    """Base for the two phases. `cause` is the exception from the socket or http.client."""

    def __init__(self, message: str, *, host: str, cause: BaseException) -> None:
        super().__init__(message)
        self.message = message
        self.host = host
        self.cause = cause


class NotSentError(TransportFailure):
    """No connection was made: the request never left this process."""


class ResponseLostError(TransportFailure):
    """The request was (or may have been) written, and no complete response came back."""


def describe(exc: BaseException) -> str:
    """A short, stable label for a low-level failure, for reasons and logs."""
    if isinstance(exc, socket.gaierror):
        return f"DNS lookup failed ({exc})"
    if isinstance(exc, TimeoutError | socket.timeout):
        return "timed out"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, http.client.RemoteDisconnected):
        return "connection closed without a response"
    if isinstance(exc, ConnectionResetError):
        return "connection reset"
    if isinstance(exc, http.client.IncompleteRead):
        return "response cut off"
    if isinstance(exc, http.client.BadStatusLine):
        return "bad status line"
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class SingleShotHttp(httplib2.Http):  # type: ignore[misc]
    """`httplib2.Http` that never repeats a request and never reuses a connection."""

    def __init__(self, *, timeout: float, **kwargs: Any) -> None:
        if timeout is None or timeout <= 0:
            # httplib2 treats None as "no timeout": a hung server would hang us forever.
            raise ValueError(f"a positive timeout is required, got {timeout!r}")
        super().__init__(timeout=timeout, **kwargs)
        self.follow_redirects = False
        self.follow_all_redirects = False
        self.redirect_codes: frozenset[int] = frozenset()
        self.cache = None

    def _conn_request(
        self,
        conn: http.client.HTTPConnection,
        request_uri: str,
        method: str,
        body: Any,
        headers: dict[str, str],
    ) -> tuple[httplib2.Response, bytes]:
        host = f"{conn.host}:{conn.port}"
        # Phase 1: connect, always afresh (see the module docstring).
        if conn.sock is not None:
            conn.close()
        try:
            conn.connect()
        except Exception as exc:
            conn.close()
            raise NotSentError(
                f"no connection to {host}: {describe(exc)}", host=host, cause=exc
            ) from exc
        # Phase 2: from here on the server may have the request.
        try:
            conn.request(method, request_uri, body, headers)
            raw = conn.getresponse()
            content: bytes = b"" if method == "HEAD" else raw.read()
            response = httplib2.Response(raw)
            if method != "HEAD":
                content = httplib2._decompressContent(response, content, self.limit_kwargs)
        except Exception as exc:
            raise ResponseLostError(
                f"{method} sent to {host}, then {describe(exc)}", host=host, cause=exc
            ) from exc
        finally:
            # One request per connection: nothing is left for a later call to trip on.
            conn.close()
        return response, content
