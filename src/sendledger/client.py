"""A client of sendledger's HTTP API, on the standard library alone (docs/http-api.md "Python
client", docs/architecture.md "Layers and what each may import").

`urllib` rather than httpx: a program that only submits jobs should not need another
package, and the client must import nothing of the daemon (it is a door from outside the
process). Every call retries where a repeat cannot do harm:

- `submit` on any connection error, 5xx or 429: the job key is the idempotency key, so a
  repeat of a job the server already stored answers 200 (`created: false`), never a copy;
- reads (`status`, `events`, `list`, `review`) on the same;
- `cancel` likewise; a repeat refused (409) after a try whose answer was lost returns the
  job's status when its Cancelled event records this call's note (and the version after
  `expected_version`), rather than 409; any other 409 is raised (another person's cancel);
- `check`, `resolve` and `triage` only when the request surely did not reach the server
  (no connection made: refused, a name that does not resolve, a connect or TLS handshake
  that failed or timed out, a certificate not trusted) or the server said it did nothing
  (429, 503): a decision whose answer was lost raises `ConnectionLost`: look at the job
  (`status`) before deciding again. A check or a triage searches (every job in review,
  for triage) and may run past any timeout while healthy: a repeat would be one more
  search beside the first.

Every exception it raises derives from `ClientError`, its own base rather than the
daemon's (`ledger/exceptions.py`), since the client imports nothing of ours:

    ClientError                 may_have_applied: whether the server may have acted
     ├── ConnectionLost         no answer (after the retries the call allows); `sent`
     ├── ApiError               an error status, with the server's `error` sentence
     │    ├── Unauthorized 401, Forbidden 403, NotFound 404, TooLarge 413
     │    ├── Conflict 409      (_RepeatRefused: a 409 to a repeated try)
     │    ├── Invalid 422       with its field list
     │    └── RateLimited 429 and ServerError 5xx, still after the retries
     └── _NotSent, _AnswerLost  what one try met, inside a call only

A refusal is one exception class per status (`Unauthorized` 401, `Forbidden` 403,
`NotFound` 404, `Conflict` 409, `TooLarge` 413, `Invalid` 422 with its field list), each
with the server's `error` sentence. Every error says whether the call's action (a submit,
cancel, check, resolve or live triage; a read applies nothing) may have been applied:
`may_have_applied`, True when any attempt of the call went out without a final answer (a
lost answer, a 5xx other than 503) and False when every attempt was refused before the
server acted (401, 403, 404, 409, 413, 422, 429, 503, or not sent at all), the table of
docs/http-api.md "Python client". When it is True, look at the job before deciding again.
"""

from __future__ import annotations

import http.client
import json
import random
import ssl
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from email.message import Message
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from sendledger.connecting import create_connection, tunnel_connection
from sendledger.final_answers import FinalAnswer

__all__ = [
    "ApiError",
    "Client",
    "ClientError",
    "Conflict",
    "ConnectionLost",
    "FieldError",
    "Forbidden",
    "Invalid",
    "NotFound",
    "RateLimited",
    "ServerError",
    "TooLarge",
    "Unauthorized",
]

USER_AGENT = "sendledger-client/1"
# `Client.list` hides the builtin inside the class: its signatures use these.
Records = list[dict[str, Any]]


class ClientError(Exception):
    """Anything this client raises. `may_have_applied`: whether the server may have done
    what the call asked (see the module's docstring)."""

    may_have_applied = False


class ConnectionLost(ClientError):
    """No answer came back (after the retries this call allows); `sent` says whether the
    request may have reached the server."""

    def __init__(self, message: str, *, sent: bool) -> None:
        super().__init__(message)
        self.sent = sent


class ApiError(ClientError):
    """The server answered with an error status; `error` is its sentence."""

    status = 0

    def __init__(self, status: int, error: str, body: Any = None) -> None:
        super().__init__(f"{status}: {error}")
        self.status = status
        self.error = error
        self.body = body


class Unauthorized(ApiError):
    """401: no valid token."""


class Forbidden(ApiError):
    """403: the token lacks the role this needs (docs/http-api.md "Roles")."""


class NotFound(ApiError):
    """404: no job with that key."""


class Conflict(ApiError):
    """409: the key is known with other content, or the job's state does not allow it."""


class TooLarge(ApiError):
    """413: the request body is larger than the server's api.max_body."""


@dataclass(frozen=True)
class FieldError:
    index: int | None  # the job's place in a list; None for one job or a parameter
    field: str
    reason: str


class Invalid(ApiError):
    """422: invalid input; `errors` names each field (`total`: how many there were, when
    the server listed only the first ones)."""

    def __init__(self, status: int, error: str, body: Any = None) -> None:
        super().__init__(status, error, body)
        items = body.get("errors", []) if isinstance(body, dict) else []
        self.errors = [
            FieldError(item.get("index"), str(item.get("field", "")), str(item.get("reason", "")))
            for item in items
            if isinstance(item, dict)
        ]
        # The server lists at most 100 errors; its `count` is how many there were.
        total = body.get("count") if isinstance(body, dict) else None
        self.total = total if isinstance(total, int) else len(self.errors)


class RateLimited(ApiError):
    """429, still after the retries."""


class ServerError(ApiError):
    """5xx, still after the retries (or at once, for a call that may not repeat). A 503
    says nothing was done; after any other 5xx the server may have acted first."""


_CLASSES: dict[int, type[ApiError]] = {
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    413: TooLarge,
    422: Invalid,
    429: RateLimited,
}


@dataclass(frozen=True)
class _Retry:
    """When a call may be sent again."""

    on_lost_answer: bool  # the request went out, no answer came back
    statuses: frozenset[int]  # answers that mean "try again"


_ANY_FAILURE = _Retry(True, frozenset({429, 500, 502, 503, 504}))
_NOTHING_DONE = _Retry(False, frozenset({429, 503}))
#: Answers that say the server did nothing: refused before it acted, or (503) unable to.
_NOT_APPLIED = frozenset({400, 401, 403, 404, 405, 409, 413, 422, 429, 503})


def _applied(error: ClientError, acts: bool, reached: bool) -> ClientError:
    """`error`, saying whether the call's action may have been applied: `reached` is True
    when an earlier attempt went out and got no final answer."""
    this = isinstance(error, ConnectionLost) and error.sent
    if isinstance(error, ApiError):
        this = error.status not in _NOT_APPLIED
    error.may_have_applied = acts and (reached or this)
    return error


class Client:
    """sendledger's HTTP API at `url` (e.g. "http://127.0.0.1:8025") with one API token.

    `timeout` bounds each attempt's connect (the name's lookup, the server's addresses
    and the TLS handshake together, raced: a silent first address gives way to the next
    after 250 ms, one that fails the handshake at once) and
    each read, in seconds; `retries` is how many more attempts a call may make, waiting
    `backoff` seconds doubled each time (with jitter, at most `max_backoff`; a 429's
    Retry-After is honoured up to it).
    """

    def __init__(
        self,
        url: str,
        token: str,
        *,
        timeout: float = 30.0,
        retries: int = 4,
        backoff: float = 0.5,
        max_backoff: float = 30.0,
        ssl_context: ssl.SSLContext | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"url: http(s)://HOST:PORT expected, got {url!r}")
        # Requested as written: http.client refuses a space, a control character or a
        # non-ASCII character in every attempt (each then read as an answer lost, "sent"),
        # and takes a port past 65535 modulo 65536 (another port).
        for index, char in enumerate(url):
            if char <= " " or char == "\x7f" or not char.isascii():
                raise ValueError(
                    f"url: {char!r} at character {index + 1}: no space, control or "
                    "non-ASCII character (an xn-- host, a percent-encoded path)"
                )
        try:
            port = parts.port
        except ValueError:
            port = 0
        if port == 0:
            raise ValueError(f"url: the port of {url!r} is not a number from 1 to 65535")
        # What a token is on the server (printable ASCII, no spaces): anything else could
        # not be put in the header, and each attempt failing so read as an answer lost.
        if not token or not all("!" <= c <= "~" for c in token):
            raise ValueError("token: an API token of printable ASCII without spaces expected")
        if timeout <= 0 or retries < 0 or backoff < 0 or max_backoff < 0:
            raise ValueError("timeout must be positive; retries and backoffs not negative")
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self._token = token
        self._sleep = sleep
        handlers: list[urllib.request.BaseHandler] = [
            _NoRedirects(),
            _HTTPHandler(),
            _HTTPSHandler(ssl_context),
        ]
        self._opener = urllib.request.build_opener(*handlers)
        self._random = random.Random()

    def __repr__(self) -> str:  # never the token
        return f"Client({self.url!r})"

    # -- jobs -----------------------------------------------------------------------------

    def submit(self, job: Mapping[str, Any]) -> dict[str, Any]:
        """Submit one job (the job JSON of `sendledger submit`): `{"key", "message_id",
        "state", "created"}`; `created` is False when the key was known with the same
        content (nothing written)."""
        answer: dict[str, Any] = self._call("POST", "/v1/jobs", body=dict(job))
        return answer

    def submit_many(self, jobs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Submit a list of jobs, all or nothing: one answer per job, in order."""
        answer: list[dict[str, Any]] = self._call(
            "POST", "/v1/jobs", body=[dict(job) for job in jobs]
        )
        return answer

    def status(self, key: str) -> dict[str, Any]:
        """The job's state (as `sendledger status --json`)."""
        answer: dict[str, Any] = self._call("GET", _job_path(key))
        return answer

    def events(self, key: str) -> list[dict[str, Any]]:
        """The job's events, oldest first (as `sendledger history --json`)."""
        answer: list[dict[str, Any]] = self._call("GET", _job_path(key) + "/events")
        return answer

    def page(
        self,
        *,
        state: str | None = None,
        channel: str | None = None,
        since: str | datetime | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> dict[str, Any]:
        """One page of `GET /v1/jobs`: `{"jobs": [...], "next_cursor"}`. `since` is an
        ISO 8601 time (a naive datetime is taken as UTC) or a duration ago ("24h")."""
        if isinstance(since, datetime):
            since = since.isoformat()
        query = {"state": state, "channel": channel, "since": since, "limit": limit,
                 "cursor": cursor}  # fmt: skip
        answer: dict[str, Any] = self._call("GET", "/v1/jobs", query=query)
        return answer

    def list(
        self,
        *,
        state: str | None = None,
        channel: str | None = None,
        since: str | datetime | None = None,
        page_size: int = 100,
    ) -> Iterator[dict[str, Any]]:
        """Every job matching the filters, least recently changed first, read a page at a
        time (a job that changes meanwhile may show up again later in the walk)."""
        cursor: str | None = None
        while True:
            found = self.page(
                state=state, channel=channel, since=since, limit=page_size, cursor=cursor
            )
            yield from found["jobs"]
            cursor = found.get("next_cursor")
            if not cursor:
                return
            # The cursor is past a row the first page's `since` let in, so every later row
            # is too; sent again, a duration ("24h") would be read anew per page, its bound
            # moving past rows no page had shown yet.
            since = None

    def cancel(
        self, key: str, note: str = "", *, expected_version: int | None = None
    ) -> dict[str, Any]:
        """Withdraw a job not yet attempted: its status (`cancelled`). `expected_version`:
        the job's `version` you decided on; refused (Conflict) if it changed since."""
        body: dict[str, Any] = {"note": note}
        if expected_version is not None:
            body["expected_version"] = expected_version
        try:
            answer: dict[str, Any] = self._call("POST", _job_path(key) + "/cancel", body=body)
        except _RepeatRefused as refused:
            # A try whose answer was lost may have cancelled it, the repeat refused for
            # that; or another person cancelled it meanwhile. Its own only when the job's
            # Cancelled event records what this call sent (the note, and the version after
            # `expected_version`): the server does not say which token a call was.
            try:
                events = self.events(key)
            except ClientError as unseen:
                # The read's error, but the lost try may have cancelled the job.
                unseen.may_have_applied = True
                raise
            cancelled = [e for e in events if e.get("type") == "Cancelled"]
            if not cancelled:
                refused.may_have_applied = False  # never cancelled: the lost try did nothing
                raise
            event = cancelled[-1]
            if event.get("note") != note or (
                expected_version is not None and event.get("version") != expected_version + 1
            ):
                refused.may_have_applied = False  # someone else's cancel, not this call's
                raise
            try:
                return self.status(key)
            except ClientError as unseen:
                unseen.may_have_applied = True  # it did: the event is this call's cancel
                raise
        return answer

    # -- review ---------------------------------------------------------------------------

    def review(self, *, channel: str | None = None, reason: str | None = None) -> Records:
        """The jobs in review (as `sendledger review list --json`)."""
        answer: Records = self._call(
            "GET", "/v1/review", query={"channel": channel, "reason": reason}
        )
        return answer

    def check(self, key: str) -> dict[str, Any]:
        """Search the mailbox for the job's Message-ID now (recorded on the job)."""
        # Not sent again once it went out: a search outlives a timeout while the mailbox is
        # slow but healthy, and a repeat is one more search (quota, a Checked event) beside it.
        answer: dict[str, Any] = self._call(
            "POST", _review_path(key) + "/check", retry=_NOTHING_DONE
        )
        return answer

    def resolve(
        self, key: str, decision: str, note: str = "", *, expected_version: int | None = None
    ) -> dict[str, Any]:
        """A human's decision on a job in review: "sent", "resend" or "abandon".
        `expected_version`: the job's `version` you decided on; refused (Conflict) if it
        changed since (another person's decision, an attempt)."""
        body: dict[str, Any] = {"as": decision, "note": note}
        if expected_version is not None:
            body["expected_version"] = expected_version
        answer: dict[str, Any] = self._call(
            "POST", _review_path(key) + "/resolve", body=body, retry=_NOTHING_DONE
        )
        return answer

    def triage(
        self, *, channel: str | None = None, reason: str | None = None, dry_run: bool = False
    ) -> Records:
        """Search every matching job in review; one copy found -> resolved as sent."""
        body: dict[str, Any] = {"dry_run": dry_run}
        if channel is not None:
            body["channel"] = channel
        if reason is not None:
            body["reason"] = reason
        # Not sent again once it went out: a triage outlives a timeout while healthy (one
        # search per job in review), and a repeat would search every job a second time.
        answer: list[dict[str, Any]] = self._call(
            "POST", "/v1/review/triage", body=body, retry=_NOTHING_DONE, acts=not dry_run
        )
        return answer

    # -- one call -------------------------------------------------------------------------

    def _call(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: Mapping[str, Any] | None = None,
        retry: _Retry = _ANY_FAILURE,
        acts: bool | None = None,
    ) -> Any:
        # A POST asks the server to do something; a GET only reads.
        acts = method != "GET" if acts is None else acts
        reached = False  # an earlier attempt went out and got no final answer
        url = self.url + path
        given = {k: str(v) for k, v in (query or {}).items() if v is not None}
        if given:
            url += "?" + urlencode(given)
        data = None if body is None else json.dumps(body, ensure_ascii=False).encode("utf-8")
        headers = {
            "Authorization": f"Bearer {self._token}",
            "Accept": "application/json",
            "User-Agent": USER_AGENT,
        }
        if data is not None:
            headers["Content-Type"] = "application/json"
        for attempt in range(self.retries + 1):
            last = attempt == self.retries
            try:
                status, text, retry_after = self._exchange(method, url, data, headers)
            except _NotSent as exc:
                if last:
                    lost = ConnectionLost(f"{method} {path}: {exc.reason}", sent=False)
                    raise _applied(lost, acts, reached) from None
                self._wait(attempt, None)
                continue
            except _AnswerLost as exc:
                if last or not retry.on_lost_answer:
                    lost = ConnectionLost(
                        f"{method} {path}: the request was sent but no answer came back "
                        f"({exc.reason})",
                        sent=True,
                    )
                    raise _applied(lost, acts, reached) from None
                reached = True
                self._wait(attempt, None)
                continue
            if status < 400:
                return _json(text)
            if status in retry.statuses and not last:
                reached = reached or status not in _NOT_APPLIED
                self._wait(attempt, retry_after)
                continue
            if status == 409 and reached and retry.on_lost_answer:
                # Only a try that may have applied can be why a repeat is refused: after a
                # 429 or 503 (nothing done) a 409 is the job's state, as on a first try.
                refused = _RepeatRefused(status, _error_text(text), _json_or_none(text))
                raise _applied(refused, acts, reached)
            raise _applied(_error(status, text), acts, reached)
        raise AssertionError("unreachable")

    def _exchange(
        self, method: str, url: str, data: bytes | None, headers: Mapping[str, str]
    ) -> tuple[int, str, float | None]:
        request = urllib.request.Request(url, data=data, headers=dict(headers), method=method)
        try:
            with self._opener.open(request, timeout=self.timeout) as response:
                return response.status, _read(response), None
        except urllib.error.HTTPError as exc:
            with exc:
                try:
                    text = _read(exc)
                except (OSError, ValueError):
                    text = ""
                return exc.code, text, _retry_after(exc.headers)
        except urllib.error.URLError as exc:
            # Raised while connecting or sending. Whatever failed in `connect` (the name's
            # lookup, the TCP handshake, the TLS handshake: refused, timed out, a
            # certificate not trusted) failed before a byte of the request was written;
            # a failure while the request was written may have let some of it out.
            reason = exc.reason
            if isinstance(reason, _ConnectFailed):
                raise _NotSent(str(reason)) from None
            raise _AnswerLost(str(reason)) from None
        except (OSError, ValueError) as exc:
            # Raised while reading the answer (http.client.RemoteDisconnected, a reset, a
            # read timeout, a malformed status line): the request had gone out.
            raise _AnswerLost(f"{type(exc).__name__}: {exc}") from None

    def _wait(self, attempt: int, retry_after: float | None) -> None:
        delay = min(self.max_backoff, self.backoff * 2**attempt) * self._random.uniform(0.5, 1)
        if retry_after is not None:
            delay = max(delay, min(retry_after, self.max_backoff))
        if delay > 0:
            self._sleep(delay)


class _NotSent(ClientError):
    """Inside a call only: the request surely did not reach the server (tried again)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


class _AnswerLost(ClientError):
    """Inside a call only: the request went out and no answer came back."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


class _RepeatRefused(Conflict):
    """A 409 to a repeated try: the lost first try may have done it (`cancel` looks)."""


class _ConnectFailed(ClientError, OSError):
    """Inside a call only: the connection was never made (its cause is `__cause__`), so
    no byte of the request left. An OSError, so that urllib wraps it in a URLError as it
    does the failure it stands for."""


class _HTTPConnection(http.client.HTTPConnection):
    # An interim 1xx (a proxy's 103) is not the API's answer (`final_answers.py`).
    response_class = FinalAnswer

    def connect(self) -> None:
        # `timeout` bounds the name's lookup and the server's addresses together, raced
        # as happy eyeballs do (`sendledger.connecting`): `socket.create_connection` gave
        # each address the whole timeout in turn, so a silent first address (a dead IPv6
        # route) used it up and the next one was never tried.
        self._create_connection = create_connection
        try:
            super().connect()
        except OSError as exc:
            raise _ConnectFailed(str(exc)) from exc


class _HTTPSConnection(http.client.HTTPSConnection):
    response_class = FinalAnswer

    def connect(self) -> None:
        # The TCP connection and the TLS handshake together (`sendledger.connecting`):
        # an address that connects and then fails the handshake (a middlebox that hangs
        # up) gives way to the server's other addresses, and the handshake ends within
        # `timeout` too (connected, it was given the whole of it again). Through a proxy
        # (`https_proxy`) the proxy's addresses, its CONNECT and the handshake share the
        # one timeout likewise (the standard library's way gave the CONNECT and then the
        # handshake each the whole timeout again). The request is written only after.
        try:
            sys.audit("http.client.connect", self, self.host, self.port)
            # Both set by http.client's own __init__ and set_tunnel (not in its stubs).
            context: ssl.SSLContext = self._context  # type: ignore[attr-defined]
            source: tuple[str, int] | None = self.source_address  # type: ignore[attr-defined]
            if self._tunnel_host:  # type: ignore[attr-defined]
                self.sock = tunnel_connection(
                    (self.host, self.port),
                    (self._tunnel_host, self._tunnel_port),  # type: ignore[attr-defined]
                    self._tunnel_headers,  # type: ignore[attr-defined]
                    self.timeout,
                    source,
                    tls=context,
                    server_hostname=self._tunnel_host,  # type: ignore[attr-defined]
                )
                return
            self.sock = create_connection(
                (self.host, self.port),
                self.timeout,
                source,
                tls=context,
                server_hostname=self.host,
            )
        except OSError as exc:
            raise _ConnectFailed(str(exc)) from exc


class _HTTPHandler(urllib.request.HTTPHandler):
    """urllib's handler on a connection that says when it was never made."""

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_HTTPConnection, req)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, context: ssl.SSLContext | None) -> None:
        super().__init__(context=context)
        self._ssl_context = context

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_HTTPSConnection, req, context=self._ssl_context)


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """The API never redirects: an answer that does is shown as it is, and the token is
    never sent to another address."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def _job_path(key: str) -> str:
    return "/v1/jobs/" + _key(key)


def _review_path(key: str) -> str:
    return "/v1/review/" + _key(key)


def _key(key: str) -> str:
    if not key:
        raise ValueError("key: empty")
    # Every character that means something in a path is escaped, `/` included; a key `.`
    # or `..` has its dots encoded too, or a proxy (or urljoin) removes the segment (RFC
    # 3986 5.2.4) and the call reaches another route (the server's `key_segment`, which
    # this standard-library-only client cannot import).
    segment = quote(key, safe="")
    return segment.replace(".", "%2E") if segment in (".", "..") else segment


def _read(response: Any) -> str:
    raw: bytes = response.read()
    return raw.decode("utf-8", "replace")


def _json(text: str) -> Any:
    try:
        return json.loads(text) if text else None
    except ValueError:
        raise ClientError(f"the server's answer is not JSON: {text[:200]!r}") from None


def _json_or_none(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _error_text(text: str) -> str:
    body = _json_or_none(text)
    if isinstance(body, dict) and isinstance(body.get("error"), str):
        return str(body["error"])
    if isinstance(body, dict) and isinstance(body.get("detail"), str):
        return str(body["detail"])
    return text.strip()[:200] or "no error text"


def _error(status: int, text: str) -> ApiError:
    kind = _CLASSES.get(status, ServerError if status >= 500 else ApiError)
    return kind(status, _error_text(text), _json_or_none(text))


def _retry_after(headers: Message | None) -> float | None:
    value = headers.get("Retry-After") if headers is not None else None
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None
