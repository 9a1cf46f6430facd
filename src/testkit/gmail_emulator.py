"""A Gmail API emulator: Google's OAuth token endpoint and the Gmail paths sendledger uses.

It serves, on one port, `/token` (as oauth2.googleapis.com does) and the Gmail API under
`/gmail/v1/users/{userId}/...` and `/upload/gmail/v1/...`, so unmodified
google-api-python-client and google-auth code can talk to it. Every accepted message is
written to an acceptance log, which is where tests count effects.

Behaviour kept from Gmail because a client that reconciles by searching for its own
Message-ID (as sendledger's daemon does) depends on it:
- the caller's Message-ID header is kept (unless `rewrite_message_id`, which simulates the
  reported misbehaviour); a message without one gets a Gmail-style one;
- `q=` searches see a message only after the index lag (fixed at acceptance), while
  messages.get and label-only listing see it at once;
- `rfc822msgid:` matches ignoring case, quotes and angle brackets, so a client must
  still compare the header it reads back exactly;
- every Gmail API request (not /token) can be answered `latency` seconds late, to stand in
  for the network and Gmail's own time; with `tls` the emulator serves HTTPS with a
  certificate from a throw-away CA (`testkit.tls`), so clients pay real handshakes;
- SPAM and TRASH are hidden unless `includeSpamTrash` (or in:anywhere / an explicit label);
- the gmail.metadata scope refuses `q` and format=full/raw; a service-account token without
  a subject (no domain-wide delegation) gets "Precondition check failed"; a delegated token
  used for another user's mailbox gets "Delegation denied";
- with `user_quota` (units per second, Gmail's is 250) each mailbox has its own per-user
  quota as a token bucket holding one second's worth (Gmail's "moving average, short
  bursts allowed"): send 100 units, list and get 5; a request over it is answered 429
  userRateLimitExceeded and does nothing. `usage()` says what each mailbox spent.

Drafts (issue 20: a draft id is a key Gmail itself enforces): drafts.create (JSON `raw`
or /upload/, gmail.compose or broader scope) stores a DRAFT-labelled message and logs
nothing; drafts.send turns that same message id into SENT (searchable after the lag from
the send), logs one acceptance and removes the draft, so a second drafts.send, drafts.get
or drafts.delete of the id is 404; drafts.list takes the same `q` terms; a draft without
recipients is refused at send and stays. `rewrite_message_id` replaces the Message-ID on
both paths, at the send (a draft shows the client's until then). A person's Send in the
web client (`send_draft_by_hand`) sends the draft under a new message id.

History (issue 29: Gmail's change log as a second handle, `testkit.history_log`):
`users.history.list` answers each mailbox's records after `startHistoryId` (`messageAdded`
for every message stored, `labelAdded` for a draft that was sent), filtered by `labelId` and
`historyTypes`, in pages, 2 quota units each; a record is listed only `history_lag` seconds
after it was written (0 by default), and the `historyId` an answer or getProfile gives never
passes a record still hidden; `expire_history()` makes every start up to now answer 404.
`rewrite_message_id` applies to it too: the history lists the stored message, whose
Message-ID is the replaced one.

Every Gmail API call is counted by route (`route_counts`), and every `q` a messages.list was
asked is kept (`searches`), so a test can say no search was made.

Bounces (issue 29): a message sent to an address in `bounce` (an address, or "@domain"
for a whole domain) comes back as Gmail's own report would: a delivery status
notification in the sender's INBOX (not in the acceptance log: it was received, not sent),
in Gmail's own shape ("gmail") or the plain RFC 3464 one ("rfc3464"), built by
`testkit.dsn`. As in Gmail, `rfc822msgid:` of the bounced message does not find its report
(the report's own Message-ID is another); `from:` (a substring of the From header, case
blind), `after:` (epoch seconds, or YYYY/MM/DD) and `{a b}` (either term) do.

Terms in `q` other than rfc822msgid:, in:, label:, from: and after: are refused with 400
rather than matched loosely: a test that relies on full-text search should fail loudly
here.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import getaddresses
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import testkit.dsn as dsn
import testkit.mime_reader as mime
from testkit._http import (
    AnsweringHandler,
    LoopbackService,
    Response,
    google_error,
)
from testkit.history_log import (
    HISTORY_TYPES,
    LABEL_ADDED,
    MESSAGE_ADDED,
    HistoryGone,
    HistoryRecord,
    MailboxHistory,
)
from testkit.tls import TlsFiles

JWT_GRANT = "urn:ietf:params:oauth:grant-type:jwt-bearer"
DEFAULT_USER = "me"
TOKEN_LIFETIME = 3600
_SCOPE = "https://www.googleapis.com/auth/"
FULL_SCOPE = "https://mail.google.com/"
SEND_SCOPES = frozenset(
    {FULL_SCOPE, _SCOPE + "gmail.modify", _SCOPE + "gmail.compose", _SCOPE + "gmail.send"}
)
READ_SCOPES = frozenset({FULL_SCOPE, _SCOPE + "gmail.modify", _SCOPE + "gmail.readonly"})
METADATA_SCOPE = _SCOPE + "gmail.metadata"
HIDDEN_LABELS = frozenset({"SPAM", "TRASH"})
MAX_PAGE = 500
DEFAULT_PAGE = 100

_ID = re.compile(r"^[0-9a-f]{1,32}$")
_QUERY_TERM = re.compile(r'(?:[^\s"]+|"[^"]*")+')
_JSON = "application/json; charset=UTF-8"

_ROUTES: list[tuple[str, re.Pattern[str], str]] = [
    ("POST", re.compile(r"^/gmail/v1/users/([^/]+)/messages/send$"), "send"),
    ("POST", re.compile(r"^/upload/gmail/v1/users/([^/]+)/messages/send$"), "upload"),
    ("GET", re.compile(r"^/gmail/v1/users/([^/]+)/messages$"), "list"),
    ("GET", re.compile(r"^/gmail/v1/users/([^/]+)/messages/([^/]+)$"), "get"),
    ("GET", re.compile(r"^/gmail/v1/users/([^/]+)/profile$"), "profile"),
    ("GET", re.compile(r"^/gmail/v1/users/([^/]+)/history$"), "history"),
    ("POST", re.compile(r"^/gmail/v1/users/([^/]+)/drafts/send$"), "drafts.send"),
    ("POST", re.compile(r"^/upload/gmail/v1/users/([^/]+)/drafts/send$"), "drafts.send"),
    ("POST", re.compile(r"^/gmail/v1/users/([^/]+)/drafts$"), "drafts.create"),
    ("POST", re.compile(r"^/upload/gmail/v1/users/([^/]+)/drafts$"), "drafts.upload"),
    ("GET", re.compile(r"^/gmail/v1/users/([^/]+)/drafts$"), "drafts.list"),
    ("GET", re.compile(r"^/gmail/v1/users/([^/]+)/drafts/([^/]+)$"), "drafts.get"),
    ("DELETE", re.compile(r"^/gmail/v1/users/([^/]+)/drafts/([^/]+)$"), "drafts.delete"),
]


# Gmail API quota units per call (developers.google.com/gmail/api/reference/quota).
_ROUTE_UNITS = {
    "send": 100.0,
    "upload": 100.0,
    "list": 5.0,
    "get": 5.0,
    "profile": 1.0,
    "history": 2.0,
    "drafts.create": 10.0,
    "drafts.upload": 10.0,
    "drafts.get": 5.0,
    "drafts.list": 5.0,
    "drafts.delete": 10.0,
    "drafts.send": 100.0,
}
# drafts.* need a scope that may compose: gmail.send alone does not.
COMPOSE_SCOPES = frozenset({FULL_SCOPE, _SCOPE + "gmail.modify", _SCOPE + "gmail.compose"})
DRAFT_LABEL = "DRAFT"
BOUNCE_STYLES = ("gmail", "rfc3464")


@dataclass(frozen=True)
class UserUsage:
    units: float
    max_units_per_second: float  # in any one whole second of the emulator's clock
    max_mean_units_per_second: float  # over any `window` consecutive whole seconds


def _peak_mean(per_second: dict[int, float], window: int) -> float:
    """The highest mean rate over `window` consecutive whole seconds."""
    if not per_second:
        return 0.0
    first, last = min(per_second), max(per_second)
    return max(
        sum(per_second.get(second, 0.0) for second in range(start, start + window)) / window
        for start in range(first, max(first, last - window + 1) + 1)
    )


class ApiError(Exception):
    def __init__(
        self,
        code: int,
        message: str,
        reason: str,
        *,
        domain: str = "global",
        headers: list[tuple[str, str]] | None = None,
        **detail: str,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.headers = headers or []
        self.body = google_error(
            code, message, reason, _STATUS_NAMES.get(code, "UNKNOWN"), domain=domain, **detail
        )


_STATUS_NAMES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    405: "METHOD_NOT_ALLOWED",
    413: "INVALID_ARGUMENT",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
}


@dataclass
class _Token:
    grant: str
    subject: str | None
    scopes: frozenset[str] | None  # None: the grant did not say (refresh without scope)
    expires_at: float


@dataclass
class _Stored:
    seq: int
    id: str
    thread_id: str
    user: str
    labels: list[str]
    raw: bytes
    message_id: str | None
    internal_ms: int
    visible_at: float
    history_id: int
    parsed: Any = field(repr=False, default=None)


@dataclass(frozen=True)
class _Query:
    message_ids: tuple[str, ...]
    labels: tuple[str, ...]
    include_hidden: bool
    after_ms: int | None = None  # after: received later than this
    # from: terms, each group an OR ({a b}); every group must match
    senders: tuple[tuple[str, ...], ...] = ()


def _json_response(
    status: int, body: Any, headers: list[tuple[str, str]] | None = None
) -> Response:
    data = json.dumps(body, indent=2).encode("utf-8")
    return status, [("Content-Type", _JSON), *(headers or [])], data


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class GmailEmulator(LoopbackService):
    _what = "emulator"

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        lag: float = 0.0,
        acceptance_log: Path | None = None,
        require_auth: bool = True,
        rewrite_message_id: bool = False,
        clock: Callable[[], float] = time.time,
        latency: float = 0.0,
        tls: TlsFiles | None = None,
        idle_timeout: float | None = None,
        user_quota: float | None = None,
        grantable_scopes: Sequence[str] | None = None,
        history_lag: float = 0.0,
        bounce: dict[str, str] | None = None,
    ) -> None:
        super().__init__(host, port, tls)
        # Recipient address (or "@domain") -> the report sent back: "gmail" or "rfc3464".
        self.bounce = {k.lower(): v for k, v in (bounce or {}).items()}
        if any(style not in BOUNCE_STYLES for style in self.bounce.values()):
            raise ValueError(f"bounce styles are {', '.join(BOUNCE_STYLES)}")
        # The scopes a token may be granted (domain-wide delegation's list in the admin
        # console; an authorized user's consent); None: whatever is asked for.
        self.grantable_scopes = None if grantable_scopes is None else frozenset(grantable_scopes)
        if user_quota is not None and user_quota <= 0:
            raise ValueError(f"user_quota must be positive, got {user_quota!r}")
        self.user_quota = user_quota
        # Per mailbox: [units left, at time]; and what it spent, per whole second.
        self._quota_left: dict[str, list[float]] = {}
        self._spent: dict[str, dict[int, float]] = {}
        self.quota_refusals = 0
        self._lag = float(lag)
        self._latency = _check_latency(latency)
        # Seconds a keep-alive connection may sit idle before the server closes it
        # (None: QuietHandler's default), to exercise clients that reuse connections.
        self.idle_timeout = idle_timeout
        self._acceptance_log = acceptance_log
        self.require_auth = require_auth
        self.rewrite_message_id = rewrite_message_id
        self._clock = clock
        self._lock = threading.RLock()
        self._tokens: dict[str, _Token] = {}
        self._mailboxes: dict[str, list[_Stored]] = {}
        # Thread ids per mailbox, so accepting a message stays O(1) in a big mailbox.
        self._threads: dict[str, set[str]] = {}
        self._by_id: dict[str, _Stored] = {}
        # Draft id -> its message (labelled DRAFT); drafts.send and drafts.delete remove it.
        self._drafts: dict[str, _Stored] = {}
        self._accepted: list[dict[str, Any]] = []
        self._seq = 0
        self._history = 1000
        self._history_lag = _check_lag(history_lag)
        self._histories: dict[str, MailboxHistory] = {}  # each mailbox's change log
        self.token_requests: list[dict[str, Any]] = []
        #: Gmail API calls answered (or refused) by route name ("send", "list", "history").
        self.route_counts: Counter[str] = Counter()
        #: The `q` of every messages.list that had one, in order.
        self.searches: list[str] = []

    # -- lifecycle ---------------------------------------------------------------------

    @property
    def token_uri(self) -> str:
        return self.url + "/token"

    def _handler(self) -> type[_GmailHandler]:
        class Handler(_GmailHandler):
            pass

        Handler.emulator = self
        if self.idle_timeout is not None:
            Handler.timeout = self.idle_timeout  # type: ignore[assignment]  # int in QuietHandler
        return Handler

    # -- test controls -----------------------------------------------------------------

    def set_lag(self, seconds: float) -> None:
        """Applies to messages accepted from now on; earlier ones keep their index time."""
        with self._lock:
            self._lag = float(seconds)

    def set_history_lag(self, seconds: float) -> None:
        """Applies to history records written from now on; earlier ones keep theirs."""
        value = _check_lag(seconds)
        with self._lock:
            self._history_lag = value

    def expire_history(self, user: str = DEFAULT_USER) -> None:
        """Every startHistoryId `user`'s mailbox has given so far is answered 404 from now
        on, as Gmail does once a start is older than the history it keeps."""
        with self._lock:
            self._history += 1  # a fresh start (getProfile now) is valid again
            self._mailbox_history(user.lower()).expire(self._history)

    def _mailbox_history(self, user: str) -> MailboxHistory:
        # Caller holds the lock.
        return self._histories.setdefault(user, MailboxHistory())

    def _record_change(self, stored: _Stored, kind: str, added: Sequence[str] = ()) -> None:
        """One history record for `stored`, numbered by its history id (lock held)."""
        self._mailbox_history(stored.user).add(
            HistoryRecord(
                id=stored.history_id,
                kind=kind,
                message_id=stored.id,
                thread_id=stored.thread_id,
                labels=tuple(stored.labels),
                added_labels=tuple(added),
                visible_at=self._clock() + self._history_lag,
            )
        )

    def set_latency(self, seconds: float) -> None:
        """Delay before answering each Gmail API request from now on (not /token)."""
        value = _check_latency(seconds)
        with self._lock:
            self._latency = value

    def accepted(self) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(entry) for entry in self._accepted]

    def copies(self, message_id: str) -> int:
        """Accepted copies (inject included) whose stored Message-ID equals message_id."""
        with self._lock:
            return sum(1 for entry in self._accepted if entry["message_id"] == message_id)

    def inject(
        self,
        raw: bytes,
        *,
        labels: Sequence[str] = ("SENT",),
        user: str = "me",
        received: float | None = None,
    ) -> str:
        """Store a message as if it had arrived some other way; rewrite_message_id does not
        apply (tests inject exactly the headers they want to see). `received`: its
        `internalDate` (epoch seconds), when it is not now."""
        stored = self._accept(
            self._mailbox_key(user, None), raw, list(labels), None, via="inject", rewrite=False
        )
        if received is not None:
            with self._lock:
                stored.internal_ms = int(received * 1000)
        return stored.id

    def usage(self, window: int = 5) -> dict[str, UserUsage]:
        """What each mailbox spent of its quota: units accepted, the most in any one
        whole second of the emulator's clock, and the highest mean over `window` seconds
        (Gmail meters a moving average, so one second may hold a burst)."""
        with self._lock:
            return {
                user: UserUsage(
                    units=sum(seconds.values()),
                    max_units_per_second=max(seconds.values(), default=0.0),
                    max_mean_units_per_second=_peak_mean(seconds, window),
                )
                for user, seconds in self._spent.items()
            }

    def _charge(self, user: str, route: str) -> None:
        """Spend `route`'s units of `user`'s quota, or refuse the request (429)."""
        units = _ROUTE_UNITS[route]
        with self._lock:
            now = self._clock()
            if self.user_quota is not None:
                rate = self.user_quota
                left, stamp = self._quota_left.setdefault(user, [rate, now])
                left = min(rate, left + max(0.0, now - stamp) * rate)
                if left + 1e-9 < units:
                    self._quota_left[user] = [left, max(stamp, now)]
                    self.quota_refusals += 1
                    raise ApiError(
                        429,
                        "User-rate limit exceeded. Retry after a second.",
                        "userRateLimitExceeded",
                    )
                self._quota_left[user] = [left - units, max(stamp, now)]
            spent = self._spent.setdefault(user, {})
            spent[int(now)] = spent.get(int(now), 0.0) + units

    def expire_tokens(self) -> None:
        with self._lock:
            for token in self._tokens.values():
                token.expires_at = float("-inf")

    # -- the mailbox -------------------------------------------------------------------

    def _mailbox_key(self, user_id: str, token: _Token | None) -> str:
        if user_id == "me":
            if token is not None and token.subject:
                return token.subject.lower()
            return DEFAULT_USER
        return user_id.lower()

    def _new_id(self) -> str:
        while True:
            candidate = secrets.token_hex(8)
            if candidate not in self._by_id:
                return candidate

    def _accept(
        self,
        user: str,
        raw: bytes,
        labels: list[str],
        thread_id: str | None,
        *,
        via: str,
        rewrite: bool,
        logged: bool = True,
    ) -> _Stored:
        """Store a message; `logged`: it was sent (or injected), so it is in the acceptance
        log too (a draft is stored, not sent)."""
        parsed = mime.parse(raw)
        stored_raw = raw
        if rewrite:
            stored_raw = mime.replace_message_id(raw, _gmail_message_id())
        elif via != "inject" and mime.header(parsed, "Message-ID") is None:
            # Gmail gives every sent message a Message-ID when the client did not.
            stored_raw = mime.replace_message_id(
                raw, f"<CA{secrets.token_urlsafe(24)}@mail.gmail.com>"
            )
        if stored_raw is not raw:
            parsed = mime.parse(stored_raw)
        with self._lock:
            now = self._clock()
            self._seq += 1
            self._history += 1
            message_id_value = self._new_id()
            mailbox = self._mailboxes.setdefault(user, [])
            known_threads = self._threads.setdefault(user, set())
            stored = _Stored(
                seq=self._seq,
                id=message_id_value,
                thread_id=thread_id if thread_id in known_threads else message_id_value,
                user=user,
                labels=list(dict.fromkeys(labels)),
                raw=stored_raw,
                message_id=mime.header(parsed, "Message-ID"),
                internal_ms=int(now * 1000),
                visible_at=now + self._lag,
                history_id=self._history,
                parsed=parsed,
            )
            mailbox.append(stored)
            known_threads.add(stored.thread_id)
            self._by_id[stored.id] = stored
            self._record_change(stored, MESSAGE_ADDED)
        if logged:
            self._log_accepted(stored, raw, via)
        return stored

    def _log_accepted(self, stored: _Stored, raw: bytes, via: str) -> None:
        """One line in the acceptance log: a message actually sent (or injected)."""
        with self._lock:
            entry: dict[str, Any] = {
                "at": _iso(self._clock()),
                "user": stored.user,
                "id": stored.id,
                "threadId": stored.thread_id,
                "message_id": stored.message_id,
                "from": self._joined(stored.parsed, "From"),
                "to": self._joined(stored.parsed, "To"),
                "subject": self._joined(stored.parsed, "Subject"),
                "raw_sha256": hashlib.sha256(raw).hexdigest(),
                "via": via,
            }
            self._accepted.append(entry)
            if self._acceptance_log is not None:
                with self._acceptance_log.open("a", encoding="utf-8") as handle:
                    handle.write(json.dumps(entry, ensure_ascii=False) + "\n")
                    handle.flush()

    @staticmethod
    def _joined(parsed: Any, name: str) -> str | None:
        values = parsed.get_all(name)
        if not values:
            return None
        return ", ".join(mime.decoded(value) for value in values)

    # -- HTTP dispatch -----------------------------------------------------------------

    def handle(self, method: str, target: str, headers: dict[str, str], body: bytes) -> Response:
        """One request in, one response out; `headers` has lower-cased names."""
        split = urlsplit(target)
        path = split.path
        params = parse_qs(split.query, keep_blank_values=True)
        try:
            if path == "/token":
                if method != "POST":
                    raise ApiError(405, "Method Not Allowed", "methodNotAllowed")
                return self._token(headers, body)
            if path.startswith(("/gmail/", "/upload/gmail/")):
                with self._lock:
                    latency = self._latency
                if latency > 0:
                    # Sleeps in this request's own thread: concurrent requests overlap,
                    # as they do against a real server.
                    time.sleep(latency)
                token = self._authenticate(headers)
                matched = [(m, p.match(path), n) for m, p, n in _ROUTES if p.match(path)]
                for route_method, match, name in matched:
                    if method != route_method:
                        continue
                    assert match is not None
                    user = self._authorize_user(unquote(match.group(1)), token)
                    with self._lock:
                        self.route_counts[name] += 1
                    self._charge(user, name)
                    if name.startswith("drafts."):
                        return self._draft_call(name, user, token, match, headers, body, params)
                    if name == "send":
                        return self._send_json(user, token, headers, body)
                    if name == "upload":
                        return self._send_upload(user, token, headers, body, params)
                    if name == "list":
                        return self._list(user, token, params)
                    if name == "get":
                        return self._get(user, token, unquote(match.group(2)), params)
                    if name == "history":
                        return self._history_list(user, token, params)
                    return self._profile(user, token)
                if matched:
                    raise ApiError(405, "Method Not Allowed", "methodNotAllowed")
            raise ApiError(404, f"Not Found: {path}", "notFound")
        except ApiError as exc:
            return _json_response(exc.code, exc.body, exc.headers)

    # -- OAuth -------------------------------------------------------------------------

    def _token(self, headers: dict[str, str], body: bytes) -> Response:
        record: dict[str, Any] = {"at": _iso(self._clock())}
        try:
            form = self._form(headers, body)
            grant = form.get("grant_type", "")
            record["grant_type"] = grant
            if grant == JWT_GRANT:
                claims = _jwt_claims(form.get("assertion", ""))
                for claim in ("iss", "sub", "scope", "aud"):
                    if claim in claims:
                        record[claim] = claims[claim]
                if not isinstance(claims.get("iss"), str) or not claims["iss"]:
                    raise _GrantError("invalid_grant", "assertion has no issuer")
                scope = claims.get("scope")
                if not isinstance(scope, str) or not scope.strip():
                    raise _GrantError(
                        "invalid_scope", "Invalid OAuth scope or ID token audience provided."
                    )
                self._check_grantable(scope, "unauthorized_client")
                subject = claims.get("sub")
                token = _Token(
                    grant="jwt",
                    subject=subject if isinstance(subject, str) and subject else None,
                    scopes=frozenset(scope.split()),
                    expires_at=0.0,
                )
            elif grant == "refresh_token":
                for name in ("client_id", "client_secret", "refresh_token", "scope"):
                    if name in form:
                        record[name] = form[name] if name != "client_secret" else "***"
                if not form.get("refresh_token") or not form.get("client_id"):
                    raise _GrantError("invalid_grant", "refresh_token and client_id required")
                scope_text = form.get("scope", "").strip()
                self._check_grantable(scope_text, "invalid_scope")
                token = _Token(
                    grant="refresh",
                    subject=None,
                    scopes=frozenset(scope_text.split()) if scope_text else None,
                    expires_at=0.0,
                )
            else:
                raise _GrantError("unsupported_grant_type", f"grant_type {grant!r}")
        except _GrantError as exc:
            record["status"] = 400
            record["error"] = exc.error
            with self._lock:
                self.token_requests.append(record)
            return _json_response(400, {"error": exc.error, "error_description": exc.detail})
        access = "ya29.emu-" + secrets.token_urlsafe(32)
        with self._lock:
            token.expires_at = self._clock() + TOKEN_LIFETIME
            self._tokens[access] = token
            record["status"] = 200
            self.token_requests.append(record)
        answer: dict[str, Any] = {
            "access_token": access,
            "expires_in": TOKEN_LIFETIME,
            "token_type": "Bearer",
        }
        if token.scopes is not None:
            answer["scope"] = " ".join(sorted(token.scopes))
        return _json_response(200, answer, [("Cache-Control", "no-store")])

    def _check_grantable(self, scope_text: str, error: str) -> None:
        # Google refuses the whole token when one scope asked for is not granted.
        if self.grantable_scopes is None or set(scope_text.split()) <= self.grantable_scopes:
            return
        raise _GrantError(
            error,
            "Client is unauthorized to retrieve access tokens using this method, or client"
            " not authorized for any of the scopes requested.",
        )

    @staticmethod
    def _form(headers: dict[str, str], body: bytes) -> dict[str, str]:
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _GrantError("invalid_request", "body is not UTF-8") from exc
        if headers.get("content-type", "").startswith("application/json"):
            try:
                data = json.loads(text)
            except ValueError as exc:
                raise _GrantError("invalid_request", "body is not JSON") from exc
            if not isinstance(data, dict):
                raise _GrantError("invalid_request", "body is not a JSON object")
            return {str(k): str(v) for k, v in data.items()}
        return {k: v[-1] for k, v in parse_qs(text, keep_blank_values=True).items()}

    def _authenticate(self, headers: dict[str, str]) -> _Token | None:
        value = headers.get("authorization", "")
        scheme, _, credential = value.partition(" ")
        with self._lock:
            token = self._tokens.get(credential.strip()) if scheme.lower() == "bearer" else None
            valid = token is not None and token.expires_at > self._clock()
        if valid:
            return token
        if not self.require_auth:
            return None
        raise ApiError(
            401,
            "Request had invalid authentication credentials. Expected OAuth 2 access token,"
            " login cookie or other valid authentication credential. See"
            " https://developers.google.com/identity/sign-in/web/devconsole-project.",
            "authError",
            headers=[
                ("WWW-Authenticate", 'Bearer realm="https://accounts.google.com/"'),
            ],
            location="Authorization",
            locationType="header",
        )

    def _authorize_user(self, user_id: str, token: _Token | None) -> str:
        if token is not None and token.grant == "jwt" and token.subject is None:
            raise ApiError(400, "Precondition check failed.", "failedPrecondition")
        if (
            token is not None
            and token.subject is not None
            and user_id != "me"
            and user_id.lower() != token.subject.lower()
        ):
            raise ApiError(403, f"Delegation denied for {token.subject}", "forbidden")
        return self._mailbox_key(user_id, token)

    @staticmethod
    def _require_scope(token: _Token | None, allowed: frozenset[str]) -> None:
        if token is None or token.scopes is None or token.scopes & allowed:
            return
        raise ApiError(
            403,
            "Request had insufficient authentication scopes.",
            "insufficientPermissions",
        )

    # -- messages.send -----------------------------------------------------------------

    def _send_json(
        self, user: str, token: _Token | None, headers: dict[str, str], body: bytes
    ) -> Response:
        self._require_scope(token, SEND_SCOPES)
        metadata = _json_object(body)
        return self._deliver(user, self._raw_of(metadata), metadata, via="send")

    def _send_upload(
        self,
        user: str,
        token: _Token | None,
        headers: dict[str, str],
        body: bytes,
        params: dict[str, list[str]],
    ) -> Response:
        self._require_scope(token, SEND_SCOPES)
        raw, metadata = self._upload(headers, body, params)
        return self._deliver(user, raw, metadata, via="upload")

    @staticmethod
    def _raw_of(message: dict[str, Any]) -> bytes:
        """The MIME bytes of a Message resource's `raw` (messages.send, drafts.create)."""
        raw_text = message.get("raw")
        if not isinstance(raw_text, str) or not raw_text:
            raise ApiError(
                400,
                "'raw' RFC822 payload message string or uploading message via /upload/* URL"
                " required",
                "invalidArgument",
            )
        try:
            return mime.decode_b64url(raw_text)
        except ValueError as exc:
            raise ApiError(400, "Invalid value for ByteString: raw", "invalidArgument") from exc

    @staticmethod
    def _upload(
        headers: dict[str, str], body: bytes, params: dict[str, list[str]]
    ) -> tuple[bytes, dict[str, Any]]:
        """An /upload/ request's message bytes and JSON metadata (uploadType media or
        multipart)."""
        upload_type = (params.get("uploadType") or [""])[-1]
        metadata: dict[str, Any] = {}
        if upload_type == "media":
            return body, metadata
        if upload_type != "multipart":
            raise ApiError(
                400, f"Invalid or unsupported uploadType {upload_type!r}", "invalidArgument"
            )
        try:
            parts = mime.split_related(body, headers.get("content-type", ""))
        except ValueError as exc:
            raise ApiError(400, str(exc), "badContent") from exc
        raw_part: bytes | None = None
        for part_headers, content in parts:
            if part_headers.get("content-type", "").startswith("application/json"):
                metadata = _json_object(content)
            else:
                raw_part = content
        if raw_part is None:
            raise ApiError(400, "Media part missing from multipart upload", "badContent")
        return raw_part, metadata

    def _deliver(self, user: str, raw: bytes, metadata: dict[str, Any], *, via: str) -> Response:
        parsed = mime.parse(raw)
        if not any(parsed.get_all(name) for name in ("To", "Cc", "Bcc")):
            raise ApiError(400, "Recipient address required", "invalidArgument")
        thread_id = metadata.get("threadId")
        stored = self._accept(
            user,
            raw,
            ["SENT"],
            thread_id if isinstance(thread_id, str) else None,
            via=via,
            rewrite=self.rewrite_message_id,
        )
        self._bounce(stored)
        return _json_response(
            200, {"id": stored.id, "threadId": stored.thread_id, "labelIds": stored.labels}
        )

    def _bounce(self, sent: _Stored) -> None:
        """A report in the sender's INBOX for each recipient the emulator bounces."""
        if not self.bounce:
            return
        recipients = [
            address.lower()
            for name in ("To", "Cc", "Bcc")
            for _display, address in getaddresses(sent.parsed.get_all(name) or [])
        ]
        mailbox = sent.user if "@" in sent.user else "me@emulator.invalid"
        for recipient in recipients:
            style = self.bounce.get(recipient) or self.bounce.get(
                "@" + recipient.rpartition("@")[2]
            )
            if style is None:
                continue
            if style == "gmail":
                report = dsn.gmail_report(
                    sent.raw, mailbox=mailbox, recipient=recipient, message_id=sent.message_id or ""
                )
            else:
                report = dsn.rfc3464_report(sent.raw, mailbox=mailbox, recipient=recipient)
            self._accept(
                sent.user, report, ["INBOX", "UNREAD"], None, via="bounce", rewrite=False,
                logged=False,
            )  # fmt: skip

    # -- messages.list / get -------------------------------------------------------------

    def _list(self, user: str, token: _Token | None, params: dict[str, list[str]]) -> Response:
        self._require_scope(token, READ_SCOPES | {METADATA_SCOPE})
        q = (params.get("q") or [""])[-1].strip()
        if q and token is not None and token.scopes is not None and not token.scopes & READ_SCOPES:
            raise ApiError(403, "Metadata scope does not support 'q' parameter", "forbidden")
        query = _parse_query(q, params)
        if q:
            with self._lock:
                self.searches.append(q)
        max_results = _int_param(params, "maxResults", DEFAULT_PAGE)
        if max_results < 1:
            raise ApiError(400, "Invalid maxResults", "invalidArgument")
        max_results = min(max_results, MAX_PAGE)
        page_token = (params.get("pageToken") or [""])[-1]
        before: int | None = None
        if page_token:
            try:
                before = int(page_token)
            except ValueError as exc:
                raise ApiError(400, "Invalid pageToken", "invalidArgument") from exc
        with self._lock:
            now = self._clock()
            matches = [
                stored
                for stored in reversed(self._mailboxes.get(user, []))
                if _matches(stored, query) and (not q or stored.visible_at <= now)
            ]
        total = len(matches)
        if before is not None:
            matches = [stored for stored in matches if stored.seq < before]
        page = matches[:max_results]
        result: dict[str, Any] = {}
        if page:
            result["messages"] = [{"id": m.id, "threadId": m.thread_id} for m in page]
        if len(matches) > max_results:
            result["nextPageToken"] = str(page[-1].seq)
        result["resultSizeEstimate"] = total
        return _json_response(200, result)

    def _get(
        self, user: str, token: _Token | None, message_id: str, params: dict[str, list[str]]
    ) -> Response:
        self._require_scope(token, READ_SCOPES | {METADATA_SCOPE})
        fmt = self._format(token, params)
        if not _ID.match(message_id):
            raise ApiError(400, "Invalid id value", "invalidArgument")
        with self._lock:
            stored = self._by_id.get(message_id)
        if stored is None or stored.user != user:
            raise ApiError(404, "Requested entity was not found.", "notFound")
        return _json_response(200, self._message_resource(stored, fmt, params))

    @staticmethod
    def _format(token: _Token | None, params: dict[str, list[str]]) -> str:
        fmt = (params.get("format") or ["full"])[-1].lower()
        if fmt not in ("minimal", "metadata", "full", "raw"):
            raise ApiError(400, f"Invalid value at 'format' ({fmt})", "invalidArgument")
        metadata_only = (
            token is not None and token.scopes is not None and not token.scopes & READ_SCOPES
        )
        if metadata_only and fmt in ("full", "raw"):
            raise ApiError(403, f"Metadata scope doesn't allow format {fmt.upper()}", "forbidden")
        return fmt

    @staticmethod
    def _message_resource(
        stored: _Stored, fmt: str, params: dict[str, list[str]]
    ) -> dict[str, Any]:
        parsed = stored.parsed
        result: dict[str, Any] = {
            "id": stored.id,
            "threadId": stored.thread_id,
            "labelIds": list(stored.labels),
            "snippet": mime.snippet(parsed),
        }
        if fmt == "metadata":
            wanted = {h.lower() for h in params.get("metadataHeaders", []) if h}
            result["payload"] = {
                "mimeType": parsed.get_content_type(),
                "headers": mime.headers_json(parsed, wanted or None),
            }
        elif fmt == "full":
            result["payload"] = mime.payload_json(parsed)
        result["sizeEstimate"] = len(stored.raw)
        if fmt == "raw":
            result["raw"] = mime.b64url(stored.raw)
        result["historyId"] = str(stored.history_id)
        result["internalDate"] = str(stored.internal_ms)
        return result

    # -- drafts ----------------------------------------------------------------------------

    def drafts(self, user: str = DEFAULT_USER) -> dict[str, str]:
        """Draft id -> its message id, for `user`'s mailbox as it is now."""
        with self._lock:
            return {d: m.id for d, m in self._drafts.items() if m.user == user.lower()}

    def edit_draft(self, draft_id: str, raw: bytes) -> None:
        """A person edits the unsent draft in Gmail's web client: it would send `raw` now
        (its id, its message id and its labels stay)."""
        with self._lock:
            stored = self._drafts[draft_id]
            stored.raw = raw
            stored.parsed = mime.parse(raw)
            stored.message_id = mime.header(stored.parsed, "Message-ID")

    def send_draft_by_hand(self, draft_id: str) -> str:
        """A person presses Send on the unsent draft in Gmail's web client. The client
        saves the draft as it is shown before it sends it, and a saved draft is a new
        message (as a drafts.update makes one): the copy is SENT under a message id of
        its own, with the draft's Message-ID, and the draft's old message id is no more
        (messages.get: 404), as after a deletion. The copy's message id."""
        with self._lock:
            stored = self._drafts.pop(draft_id)
            self._mailboxes[stored.user].remove(stored)
            del self._by_id[stored.id]
        sent = self._accept(
            stored.user,
            stored.raw,
            ["SENT"],
            stored.thread_id,
            via="web client",
            rewrite=self.rewrite_message_id,
        )
        return sent.id

    def drafts_of(self, message_id: str, user: str = DEFAULT_USER) -> int:
        """Unsent drafts in `user`'s mailbox whose Message-ID header is `message_id`."""
        with self._lock:
            return sum(
                1
                for m in self._drafts.values()
                if m.user == user.lower() and m.message_id == message_id
            )

    def _draft_call(
        self,
        name: str,
        user: str,
        token: _Token | None,
        match: re.Match[str],
        headers: dict[str, str],
        body: bytes,
        params: dict[str, list[str]],
    ) -> Response:
        if name in ("drafts.create", "drafts.upload"):
            self._require_scope(token, COMPOSE_SCOPES)
            return self._draft_create(user, name, headers, body, params)
        if name == "drafts.send":
            self._require_scope(token, COMPOSE_SCOPES)
            return self._draft_send(user, body)
        if name == "drafts.delete":
            self._require_scope(token, COMPOSE_SCOPES)
            with self._lock:
                stored = self._own_draft(user, unquote(match.group(2)))
                del self._drafts[unquote(match.group(2))]
                self._mailboxes[user].remove(stored)
                del self._by_id[stored.id]
            return 204, [], b""
        self._require_scope(token, COMPOSE_SCOPES | READ_SCOPES)
        if name == "drafts.get":
            fmt = self._format(token, params)
            draft_id = unquote(match.group(2))
            with self._lock:
                stored = self._own_draft(user, draft_id)
            return _json_response(
                200, {"id": draft_id, "message": self._message_resource(stored, fmt, params)}
            )
        return self._draft_list(user, params)

    def _own_draft(self, user: str, draft_id: str) -> _Stored:
        stored = self._drafts.get(draft_id)
        if stored is None or stored.user != user:
            raise ApiError(404, "Requested entity was not found.", "notFound")
        return stored

    def _draft_create(
        self,
        user: str,
        name: str,
        headers: dict[str, str],
        body: bytes,
        params: dict[str, list[str]],
    ) -> Response:
        if name == "drafts.upload":
            raw, metadata = self._upload(headers, body, params)
            message = metadata.get("message")
        else:
            message = _json_object(body).get("message")
            raw = self._raw_of(message if isinstance(message, dict) else {})
        thread_id = message.get("threadId") if isinstance(message, dict) else None
        stored = self._accept(
            user,
            raw,
            [DRAFT_LABEL],
            thread_id if isinstance(thread_id, str) else None,
            via="drafts.create",
            rewrite=False,  # a draft keeps the client's Message-ID; sending may replace it
            logged=False,
        )
        with self._lock:
            draft_id = self._new_draft_id()
            self._drafts[draft_id] = stored
        return _json_response(
            200,
            {
                "id": draft_id,
                "message": {
                    "id": stored.id,
                    "threadId": stored.thread_id,
                    "labelIds": list(stored.labels),
                },
            },
        )

    def _new_draft_id(self) -> str:
        while True:
            candidate = f"r{secrets.randbelow(10**19):019d}"
            if candidate not in self._drafts:
                return candidate

    def _draft_send(self, user: str, body: bytes) -> Response:
        """Send a draft: its message becomes SENT (same message id) and the draft is gone,
        so a second drafts.send of the same id finds nothing to send (404)."""
        draft_id = _json_object(body).get("id")
        if not isinstance(draft_id, str) or not draft_id:
            raise ApiError(400, "Invalid draft", "invalidArgument")
        with self._lock:
            stored = self._own_draft(user, draft_id)
            if not any(stored.parsed.get_all(n) for n in ("To", "Cc", "Bcc")):
                raise ApiError(400, "Recipient address required", "invalidArgument")
            del self._drafts[draft_id]
            request_raw = stored.raw
            if self.rewrite_message_id:
                stored.raw = mime.replace_message_id(stored.raw, _gmail_message_id())
                stored.parsed = mime.parse(stored.raw)
                stored.message_id = mime.header(stored.parsed, "Message-ID")
            now = self._clock()
            self._history += 1
            stored.labels = ["SENT"]
            stored.visible_at = now + self._lag
            stored.internal_ms = int(now * 1000)
            stored.history_id = self._history
            self._record_change(stored, LABEL_ADDED, ["SENT"])
            self._log_accepted(stored, request_raw, "drafts.send")
        self._bounce(stored)
        return _json_response(
            200, {"id": stored.id, "threadId": stored.thread_id, "labelIds": stored.labels}
        )

    def _draft_list(self, user: str, params: dict[str, list[str]]) -> Response:
        q = (params.get("q") or [""])[-1].strip()
        query = _parse_query(q, {"includeSpamTrash": params.get("includeSpamTrash", [])})
        max_results = min(max(_int_param(params, "maxResults", DEFAULT_PAGE), 1), MAX_PAGE)
        before = _int_param(params, "pageToken", 0) or None
        with self._lock:
            now = self._clock()
            found = sorted(
                (
                    (stored.seq, draft_id, stored)
                    for draft_id, stored in self._drafts.items()
                    if stored.user == user
                    and _matches(stored, query)
                    and (not q or stored.visible_at <= now)
                    and (before is None or stored.seq < before)
                ),
                reverse=True,
            )
        page = found[:max_results]
        result: dict[str, Any] = {"resultSizeEstimate": len(found)}
        if page:
            result["drafts"] = [
                {"id": draft_id, "message": {"id": m.id, "threadId": m.thread_id}}
                for _, draft_id, m in page
            ]
        if len(found) > max_results:
            result["nextPageToken"] = str(page[-1][0])
        return _json_response(200, result)

    def _profile(self, user: str, token: _Token | None) -> Response:
        self._require_scope(token, READ_SCOPES | {METADATA_SCOPE})
        with self._lock:
            mailbox = self._mailboxes.get(user, [])
            body = {
                "emailAddress": user if "@" in user else "me@emulator.invalid",
                "messagesTotal": len(mailbox),
                "threadsTotal": len({m.thread_id for m in mailbox}),
                "historyId": str(self._mailbox_history(user).horizon(self._history, self._clock())),
            }
        return _json_response(200, body)

    # -- users.history.list ----------------------------------------------------------------

    def _history_list(
        self, user: str, token: _Token | None, params: dict[str, list[str]]
    ) -> Response:
        """The mailbox's changes after `startHistoryId` (testkit/history_log.py)."""
        self._require_scope(token, READ_SCOPES | {METADATA_SCOPE})
        start_text = (params.get("startHistoryId") or [""])[-1]
        if not start_text:
            raise ApiError(400, "Missing required field: startHistoryId", "invalidArgument")
        try:
            start = int(start_text)
        except ValueError as exc:
            raise ApiError(400, "Invalid startHistoryId", "invalidArgument") from exc
        kinds = [kind for kind in params.get("historyTypes", []) if kind]
        unknown = [kind for kind in kinds if kind not in HISTORY_TYPES]
        if unknown:
            raise ApiError(
                400, f"Invalid value at 'history_types' ({unknown[0]})", "invalidArgument"
            )
        label = (params.get("labelId") or [""])[-1] or None
        max_results = min(max(_int_param(params, "maxResults", DEFAULT_PAGE), 1), MAX_PAGE)
        page_token = (params.get("pageToken") or [""])[-1]
        try:
            after = int(page_token) if page_token else None
        except ValueError as exc:
            raise ApiError(400, "Invalid pageToken", "invalidArgument") from exc
        with self._lock:
            try:
                answer = self._mailbox_history(user).page(
                    start,
                    current=self._history,
                    now=self._clock(),
                    label=label,
                    kinds=kinds,
                    max_results=max_results,
                    after=after,
                )
            except HistoryGone:
                raise ApiError(404, "Requested entity was not found.", "notFound") from None
        return _json_response(200, answer)


class _GrantError(Exception):
    def __init__(self, error: str, detail: str) -> None:
        super().__init__(detail)
        self.error = error
        self.detail = detail


def _gmail_message_id() -> str:
    """A Message-ID of the shape Gmail gives a message whose own it replaces."""
    return f"<{secrets.token_hex(16)}@mail.gmail.com>"


def _check_lag(seconds: float) -> float:
    value = float(seconds)
    if not 0 <= value <= 86400:
        raise ValueError(f"history lag must be within 0..86400 seconds, got {seconds!r}")
    return value


def _check_latency(seconds: float) -> float:
    value = float(seconds)
    if not 0 <= value < 3600:
        raise ValueError(f"latency must be within 0..3600 seconds, got {seconds!r}")
    return value


def _jwt_claims(assertion: str) -> dict[str, Any]:
    pieces = assertion.split(".")
    if len(pieces) != 3:
        raise _GrantError("invalid_grant", "assertion is not a JWT")
    try:
        claims = json.loads(mime.decode_b64url(pieces[1]))
    except ValueError as exc:
        raise _GrantError("invalid_grant", "assertion payload is not JSON") from exc
    if not isinstance(claims, dict):
        raise _GrantError("invalid_grant", "assertion payload is not an object")
    return claims


def _json_object(body: bytes) -> dict[str, Any]:
    try:
        data = json.loads(body or b"{}")
    except ValueError as exc:
        raise ApiError(400, "Invalid JSON payload received.", "parseError") from exc
    if not isinstance(data, dict):
        raise ApiError(400, "Invalid JSON payload received.", "parseError")
    return data


def _int_param(params: dict[str, list[str]], name: str, default: int) -> int:
    values = params.get(name)
    if not values:
        return default
    try:
        return int(values[-1])
    except ValueError as exc:
        raise ApiError(400, f"Invalid value for {name}", "invalidArgument") from exc


def _truthy(params: dict[str, list[str]], name: str) -> bool:
    return (params.get(name) or ["false"])[-1].lower() in ("true", "1")


def _parse_query(q: str, params: dict[str, list[str]]) -> _Query:
    message_ids: list[str] = []
    labels = [label for label in params.get("labelIds", []) if label]
    include_hidden = _truthy(params, "includeSpamTrash")
    after_ms: int | None = None
    senders: list[tuple[str, ...]] = []
    group: list[str] | None = None  # the from: terms of an open {...}
    for token in _QUERY_TERM.findall(q):
        term = token
        opens, closes = term.startswith("{"), term.endswith("}")
        term = term.removeprefix("{").removesuffix("}")
        if opens:
            if group is not None:
                raise ApiError(400, "emulator: nested { }", "invalidArgument")
            group = []
        operator, sep, value = term.partition(":")
        operator = operator.lower()
        value = value.strip('"')
        if not sep or not value:
            raise ApiError(400, f"emulator: unsupported search term {token!r}", "invalidArgument")
        if group is not None and operator != "from":
            raise ApiError(
                400, f"emulator: only from: terms in {{ }}: {token!r}", "invalidArgument"
            )
        if operator == "from":
            if group is not None:
                group.append(value.lower())
            else:
                senders.append((value.lower(),))
        elif operator == "after":
            after_ms = _after_ms(value)
        elif operator == "rfc822msgid":
            message_ids.append(mime.normalize_message_id(value))
        elif operator == "in" and value.lower() == "anywhere":
            include_hidden = True
        elif operator in ("in", "label"):
            labels.append(value.upper() if operator == "in" else value)
        else:
            raise ApiError(400, f"emulator: unsupported search term {token!r}", "invalidArgument")
        if closes:
            if group is None:
                raise ApiError(400, "emulator: } without {", "invalidArgument")
            senders.append(tuple(group))
            group = None
    if group is not None:
        raise ApiError(400, "emulator: { without }", "invalidArgument")
    if any(label in HIDDEN_LABELS for label in labels):
        include_hidden = True
    return _Query(tuple(message_ids), tuple(labels), include_hidden, after_ms, tuple(senders))


def _after_ms(value: str) -> int:
    """Gmail's after: in milliseconds: epoch seconds, or a date (YYYY/MM/DD, UTC here)."""
    if value.isdigit():
        return int(value) * 1000
    try:
        day = datetime.strptime(value, "%Y/%m/%d").replace(tzinfo=UTC)
    except ValueError as exc:
        raise ApiError(400, f"emulator: after:{value!r}", "invalidArgument") from exc
    return int(day.timestamp() * 1000)


def _matches(stored: _Stored, query: _Query) -> bool:
    if not query.include_hidden and HIDDEN_LABELS & set(stored.labels):
        return False
    if any(label not in stored.labels for label in query.labels):
        return False
    if query.after_ms is not None and stored.internal_ms <= query.after_ms:
        return False
    if query.senders:
        sender = (mime.header(stored.parsed, "From") or "").lower()
        if not all(any(term in sender for term in group) for group in query.senders):
            return False
    if query.message_ids:
        if stored.message_id is None:
            return False
        own = mime.normalize_message_id(stored.message_id)
        return all(own == wanted for wanted in query.message_ids)
    return True


class _GmailHandler(AnsweringHandler):
    emulator: GmailEmulator

    def answer(self, method: str, target: str, headers: dict[str, str], body: bytes) -> Response:
        return self.emulator.handle(method, target, headers, body)

    def failure(self, status: int, message: str) -> Response:
        if status == 400:
            return _json_response(400, google_error(400, message, "badRequest", "INVALID_ARGUMENT"))
        return _json_response(
            status, google_error(status, "Internal error encountered.", "backendError", "INTERNAL")
        )
