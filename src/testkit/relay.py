"""A fault-injecting HTTP relay for crash-boundary tests.

It sits between a client and the Gmail API (the emulator or Google itself, over http or
https) and, per request kind, either passes the exchange through or breaks it at a chosen
point: before the upstream sees the request, or after the upstream has processed it but
before the client hears back; or it forwards it late (`slow`: a provider that answers
slowly but answers, within the client's timeout). The relay forwards each client request
at most once and never re-sends on its own, so the upstream's acceptance log counts
exactly what the client stack sent.

Closing without a response (fail-before-forward, drop-response, and the end of a hang) is a
plain close (FIN) by default, so the client reads end-of-stream: http.client raises
RemoteDisconnected. With `reset=True` the relay sets SO_LINGER 0 and the client gets a
connection reset (ECONNRESET) instead. Both modes look the same from the client whichever
choice is made: the client cannot tell "never forwarded" from "forwarded, reply lost",
which is the ambiguity under test.
"""

from __future__ import annotations

import http.client
import json
import random
import re
import socket
import ssl
import struct
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any, Literal, get_args
from urllib.parse import urlsplit

from testkit._http import (
    HOP_BY_HOP,
    BodyError,
    LoopbackService,
    TlsQuietHandler,
    google_error,
)
from testkit.tls import TlsFiles

Mode = Literal[
    "pass",
    "fail-before-forward",
    "drop-response",
    "hang",
    "hang-before-forward",
    "500-after-forward",
    "503",
    "429",
    "403-rate-limit",
    "slow",
]
MODES: tuple[Mode, ...] = get_args(Mode)
Kind = Literal["send", "search", "token", "history", "other"]
KINDS: tuple[Kind, ...] = get_args(Kind)

_FORWARDING: frozenset[Mode] = frozenset(
    {"pass", "drop-response", "hang", "500-after-forward", "slow"}
)
# Gmail's messages.send and drafts.send; Graph's send of a draft and sendMail.
_SEND = re.compile(r"/users/[^/]+/(?:messages/send|drafts/send|messages/[^/]+/send|sendMail)/?$")
# Gmail's messages.list/get; Graph's message list (in a folder or not) and get.
_SEARCH = re.compile(r"/users/[^/]+/(?:mailFolders/[^/]+/)?messages(?:/[^/]+)?/?$")
# Gmail's users.history.list: the change log read after an unknown outcome.
_HISTORY = re.compile(r"/users/[^/]+/history/?$")
_JSON = "application/json; charset=UTF-8"


def check_mode(value: str) -> Mode:
    if value not in MODES:
        raise ValueError(f"unknown fault mode {value!r} (one of: {', '.join(MODES)})")
    return value


def classify(method: str, target: str) -> Kind:
    path = urlsplit(target).path
    if method == "POST" and path.rstrip("/").endswith("/token"):
        return "token"
    if method == "POST" and _SEND.search(path):
        return "send"
    if method == "GET" and _SEARCH.search(path) and not _SEND.search(path):
        return "search"
    if method == "GET" and _HISTORY.search(path):
        return "history"
    return "other"


class _Chooser:
    def __init__(self, seed: str, weights: Mapping[Mode, float]) -> None:
        modes: list[Mode] = []
        values: list[float] = []
        for mode, weight in weights.items():
            check_mode(mode)
            if weight < 0:
                raise ValueError(f"negative weight for {mode!r}")
            if weight > 0:
                modes.append(mode)
                values.append(float(weight))
        if not modes:
            raise ValueError("weights must give at least one mode a positive weight")
        self._random = random.Random(seed)
        self._modes = modes
        self._weights = values

    def choose(self) -> Mode:
        return self._random.choices(self._modes, self._weights)[0]


class Delays:
    """How long each `slow` request waits before it is forwarded: `seconds`, plus up to
    `jitter` more, drawn from a generator seeded with `seed` (so a failing run draws the
    same delays again, in the order its requests came)."""

    def __init__(self, seconds: float = 1.0, jitter: float = 0.0, seed: int = 0) -> None:
        if seconds < 0 or jitter < 0:
            raise ValueError(f"delays are 0 or more seconds, got {seconds!r} + {jitter!r}")
        self.seconds = float(seconds)
        self.jitter = float(jitter)
        self._random = random.Random(f"{seed}:slow")
        self._lock = threading.Lock()

    def next(self) -> float:
        if not self.jitter:
            return self.seconds
        with self._lock:
            return self.seconds + self._random.uniform(0.0, self.jitter)


class FaultPlan:
    """Which fault each request gets, by kind.

    A single mode applies to every request of that kind; a sequence is consumed one request
    at a time, after which `default` applies to that kind.
    """

    def __init__(
        self,
        *,
        send: Mode | Sequence[Mode] = "pass",
        search: Mode | Sequence[Mode] = "pass",
        token: Mode | Sequence[Mode] = "pass",
        other: Mode | Sequence[Mode] = "pass",
        default: Mode = "pass",
        history: Mode | Sequence[Mode] = "pass",
    ) -> None:
        self._lock = threading.Lock()
        self.default: Mode = check_mode(default)
        self._fixed: dict[str, Mode] = {}
        self._queues: dict[str, deque[Mode]] = {}
        self._choosers: dict[str, _Chooser] = {}
        kinds = (("send", send), ("search", search), ("token", token), ("history", history),
                 ("other", other))  # fmt: skip
        for kind, spec in kinds:
            if isinstance(spec, str):
                self._fixed[kind] = check_mode(spec)
            else:
                self._queues[kind] = deque(check_mode(mode) for mode in spec)

    @classmethod
    def random(
        cls,
        seed: int,
        send_weights: Mapping[Mode, float],
        search_weights: Mapping[Mode, float] | None = None,
    ) -> FaultPlan:
        """Each request of a kind draws its mode; every kind has its own generator, so the
        send sequence for a seed does not depend on how searches interleave with it."""
        plan = cls()
        plan._choosers["send"] = _Chooser(f"{seed}:send", send_weights)
        if search_weights is not None:
            plan._choosers["search"] = _Chooser(f"{seed}:search", search_weights)
        return plan

    def next_mode(self, kind: str) -> Mode:
        if kind not in KINDS:
            raise ValueError(f"unknown request kind {kind!r}")
        with self._lock:
            chooser = self._choosers.get(kind)
            if chooser is not None:
                return chooser.choose()
            queue = self._queues.get(kind)
            if queue is not None:
                return queue.popleft() if queue else self.default
            return self._fixed.get(kind, self.default)


class FaultRelay(LoopbackService):
    def __init__(
        self,
        upstream: str,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        plan: FaultPlan | None = None,
        hang_seconds: float = 30.0,
        slow_seconds: float = 1.0,
        slow_jitter: float = 0.0,
        seed: int = 0,
        retry_after: float | None = 1.0,
        reset: bool = False,
        upstream_timeout: float = 120.0,
        tls: TlsFiles | None = None,
        upstream_ca: str | None = None,
    ) -> None:
        parts = urlsplit(upstream)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"upstream must be an http(s) URL: {upstream!r}")
        self.upstream = upstream
        self._scheme = parts.scheme
        self._upstream_host = parts.hostname
        self._upstream_port = parts.port
        self._host_header = parts.netloc.rsplit("@", 1)[-1]
        self._prefix = parts.path.rstrip("/")
        super().__init__(host, port, tls)
        self._plan = plan or FaultPlan()
        self.hang_seconds = hang_seconds
        self.slow = Delays(slow_seconds, slow_jitter, seed)
        self.retry_after = retry_after
        self.reset = reset
        self.upstream_timeout = upstream_timeout
        # With `tls` the relay itself serves HTTPS (a client that insists on https, such
        # as msal, can be put behind it); `upstream_ca` is the CA file an https upstream
        # is checked against (None: the default trust, which SSL_CERT_FILE changes).
        self._upstream_context = (
            ssl.create_default_context(cafile=upstream_ca) if upstream_ca is not None else None
        )
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self.log: list[dict[str, Any]] = []
        self._refusals_after: dict[str, deque[Mode]] = {}

    def refuse_after_forward(self, kind: Kind, mode: Mode, *, times: int = 1) -> None:
        """The next `times` requests of `kind` that the plan passes are forwarded (the
        upstream acts on them), then answered as `mode` ("503", "429" or "403-rate-limit")
        answers without forwarding: a refusal the upstream never gave, as a gateway in
        front of it may answer. Logged with mode `mode + "-after-forward"`."""
        if mode not in ("503", "429", "403-rate-limit"):
            raise ValueError(f"not a refusal the relay answers: {mode!r}")
        with self._lock:
            self._refusals_after.setdefault(kind, deque()).extend([mode] * times)

    @property
    def plan(self) -> FaultPlan:
        with self._lock:
            return self._plan

    def set_plan(self, plan: FaultPlan) -> None:
        with self._lock:
            self._plan = plan

    _what = "relay"

    def _handler(self) -> type[_RelayHandler]:
        class Handler(_RelayHandler):
            pass

        Handler.relay = self
        return Handler

    def _before_start(self) -> None:
        self._stopping.clear()

    def _before_stop(self) -> None:
        # Release held connections first so their threads do not outlive the relay.
        self._stopping.set()

    def forwarded(self, kind: str | None = None) -> int:
        """How many requests (of a kind) reached the upstream."""
        with self._lock:
            return sum(
                1
                for entry in self.log
                if entry["forwarded"] and (kind is None or entry["kind"] == kind)
            )

    # -- one exchange ------------------------------------------------------------------

    def _exchange(self, handler: _RelayHandler) -> None:
        try:
            body = handler.read_body()
        except BodyError as exc:
            handler.close_connection = True
            error = google_error(400, str(exc), "badRequest", "INVALID_ARGUMENT")
            handler.send_body(400, json.dumps(error).encode(), [("Content-Type", _JSON)])
            return
        kind = classify(handler.command, handler.path)
        mode = self.plan.next_mode(kind)
        refusal: Mode | None = None
        if mode == "pass":
            with self._lock:
                queue = self._refusals_after.get(kind)
                refusal = queue.popleft() if queue else None
        entry: dict[str, Any] = {
            "at": time.time(),
            "kind": kind,
            "mode": mode if refusal is None else f"{refusal}-after-forward",
            "method": handler.command,
            "path": handler.path,
            "forwarded": False,
            "upstream_status": None,
        }
        with self._lock:
            self.log.append(entry)

        if mode == "fail-before-forward":
            self._close(handler)
            return
        if mode == "hang-before-forward":
            self._hold(handler)
            return
        if mode in ("503", "429", "403-rate-limit"):
            self._answer_error(handler, kind, mode)
            return

        assert mode in _FORWARDING
        if mode == "slow":
            entry["delay"] = delay = self.slow.next()
            if self._stopping.wait(delay):
                self._close(handler)  # stopped meanwhile: never forwarded
                return
        try:
            status, reason, headers, data = self._forward(handler, body, entry)
        except (OSError, http.client.HTTPException) as exc:
            entry["error"] = f"{type(exc).__name__}: {exc}"
            if entry["forwarded"]:
                # The upstream may have acted; we have no answer to pass on, so the client
                # gets what the upstream gave us: nothing.
                self._close(handler)
            else:
                handler.close_connection = True
                error = google_error(
                    502, "relay: upstream unreachable", "backendError", "UNAVAILABLE"
                )
                handler.send_body(502, json.dumps(error).encode(), [("Content-Type", _JSON)])
            return
        entry["upstream_status"] = status

        if refusal is not None:
            self._answer_error(handler, kind, refusal)
        elif mode in ("pass", "slow"):
            handler.send_body(status, data, headers, reason=reason)
        elif mode == "drop-response":
            self._close(handler)
        elif mode == "hang":
            self._hold(handler)
        else:
            self._answer_error(handler, kind, "500")

    def _forward(
        self, handler: _RelayHandler, body: bytes, entry: dict[str, Any]
    ) -> tuple[int, str, list[tuple[str, str]], bytes]:
        connection: http.client.HTTPConnection
        if self._scheme == "https":
            connection = http.client.HTTPSConnection(
                self._upstream_host,
                self._upstream_port,
                timeout=self.upstream_timeout,
                context=self._upstream_context,
            )
        else:
            connection = http.client.HTTPConnection(
                self._upstream_host, self._upstream_port, timeout=self.upstream_timeout
            )
        try:
            # Connect separately so `forwarded` is only true once a request could have left.
            connection.connect()
            entry["forwarded"] = True
            connection.putrequest(
                handler.command,
                self._prefix + handler.path,
                skip_host=True,
                skip_accept_encoding=True,
            )
            connection.putheader("Host", self._host_header)
            for name, value in handler.headers.items():
                # Expect is answered here (the body is already read); Host and length are ours.
                if name.lower() in HOP_BY_HOP or name.lower() in (
                    "host",
                    "content-length",
                    "expect",
                ):
                    continue
                connection.putheader(name, value)
            if body or handler.command in ("POST", "PUT", "PATCH"):
                connection.putheader("Content-Length", str(len(body)))
            connection.putheader("Connection", "close")
            connection.endheaders(body or None)
            response = connection.getresponse()
            data = response.read()
            headers = [
                (name, value)
                for name, value in response.getheaders()
                if name.lower() not in HOP_BY_HOP and name.lower() != "content-length"
            ]
            return response.status, response.reason, headers, data
        finally:
            connection.close()

    def _close(self, handler: _RelayHandler) -> None:
        handler.close_connection = True
        if self.reset:
            try:
                handler.connection.setsockopt(
                    socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                )
                # Close here: the server's own shutdown(SHUT_WR) would send a FIN first.
                handler.connection.close()
            except OSError:
                pass

    def _hold(self, handler: _RelayHandler) -> None:
        self._stopping.wait(self.hang_seconds)
        self._close(handler)

    def _answer_error(self, handler: _RelayHandler, kind: str, mode: str) -> None:
        headers = [("Content-Type", _JSON)]
        if self.retry_after is not None and mode != "500":
            headers.append(("Retry-After", _retry_after_text(self.retry_after)))
        status, body = _fault_body(kind, mode)
        handler.send_body(status, json.dumps(body).encode(), headers)


def _retry_after_text(seconds: float) -> str:
    return str(int(seconds)) if float(seconds).is_integer() else f"{seconds:g}"


def _fault_body(kind: str, mode: str) -> tuple[int, dict[str, Any]]:
    if kind == "token":
        # The OAuth endpoint answers in its own shape, not the Gmail one.
        token_errors = {
            "500": (500, "internal_failure"),
            "503": (503, "temporarily_unavailable"),
            "429": (429, "rate_limit_exceeded"),
            "403-rate-limit": (403, "rate_limit_exceeded"),
        }
        status, error = token_errors[mode]
        return status, {"error": error, "error_description": f"relay fault {mode}"}
    if mode == "500":
        return 500, google_error(500, "Internal error encountered.", "backendError", "INTERNAL")
    if mode == "503":
        return 503, google_error(
            503, "The service is currently unavailable.", "backendError", "UNAVAILABLE"
        )
    if mode == "429":
        return 429, google_error(
            429,
            "Too many concurrent requests for user.",
            "rateLimitExceeded",
            "RESOURCE_EXHAUSTED",
            domain="usageLimits",
        )
    return 403, google_error(
        403,
        "User-rate limit exceeded.  Retry after later.",
        "userRateLimitExceeded",
        "PERMISSION_DENIED",
        domain="usageLimits",
    )


class _RelayHandler(TlsQuietHandler):
    relay: FaultRelay

    def _serve(self) -> None:
        self.relay._exchange(self)

    do_GET = _serve
    do_POST = _serve
    do_PUT = _serve
    do_PATCH = _serve
    do_DELETE = _serve
    do_HEAD = _serve
    do_OPTIONS = _serve
