"""A Microsoft Graph mail emulator: the Microsoft identity platform's token endpoint and
the Graph paths a sender of raw MIME uses, on one port.

It serves what unmodified `msal` (client credentials) and a Graph client need:

- `GET /{tenant}/v2.0/.well-known/openid-configuration` (msal's tenant discovery) and
  `POST /{tenant}/oauth2/v2.0/token` (grant_type=client_credentials with a client secret or
  a client assertion, scope `https://graph.microsoft.com/.default`);
- under `/v1.0/users/{user}/`: `messages` (POST a base64 MIME body as `text/plain`: a
  draft in Drafts, 201), `messages/{id}/send` (202, empty), `sendMail` (MIME, 202, no
  id), `messages/{id}` (GET, DELETE), `messages` and `mailFolders/{folder}/messages` (GET
  with `$filter=internetMessageId eq '...'`, `$top`, `$skip`).

Behaviour kept from Graph because a client that reconciles by its own Message-ID depends
on it:
- `Prefer: IdType="ImmutableId"` gives ids that stay the same when the draft is sent and
  filed in Sent Items (Graph's "immutable identifiers"); without it an id names the item in
  its folder and changes when it moves;
- a 202 is not a copy yet: the message is in transit (a GET by id answers 404, as Graph's
  does right after a send) until `file_delay` has passed, then it is in Sent Items; a
  `$filter` sees it only `lag` later still (the search index);
- a consumed draft cannot be sent again (404 while in transit, 400 once filed), so one
  draft is at most one message;
- `DELETE messages/{id}` moves the item to Deleted Items (its immutable id stays, a draft
  stays a draft that can still be sent by its id); only an item already there is deleted
  for good (Graph's soft and hard delete); `POST messages/{id}/move` with a `destinationId`
  moves an item (201); `late_send_on_delete` holds ids of drafts whose send, in flight
  from another client, lands just before a DELETE of them (the race a fence loses), and
  `late_send_before_purge` just before a DELETE of them in Deleted Items;
- `recoverable_items`: a DELETE in Deleted Items moves the item to Recoverable Items
  (`recoverableitemsdeletions`, where Exchange Online keeps it for its deleted item
  retention, for good under a hold) instead of removing it: a GET by its immutable id
  still answers it there, a send of it is 404, and a DELETE of it is refused, 403
  `ErrorCannotDeleteObject` (Graph's "you may not be able to delete items in the
  recoverable items deletions folder"); `refuse_delete` maps an immutable id to the
  (status, code) every DELETE of it is answered with, the item left where it is (a hold
  or a retention label on one draft; with `refuse_delete_retry_after`, a Retry-After);
  `GET mailFolders/{name}` answers a well-known folder's id (404 while its name is in
  `folders_unanswered`);
- `rewrite_message_id` replaces the Message-ID of each message sent (both paths), to test
  a client's defence against a provider that does;
- `filter_ignores_case` makes `internetMessageId eq '...'` compare without case, as
  Exchange compares strings in a restriction (Graph does not document it for this
  property): a filter's match is the server's, and a client acts only on the header it
  then reads and compares itself;
- `throttle(n)` answers the next n API requests 429 with Retry-After, doing nothing; so
  does a request over `mailbox_concurrency` (Graph's 4 in flight per app and mailbox),
  each taking `latency` seconds.

Bounces (issue 29): a message sent to an address in `bounce` (an address, or "@domain")
comes back as Exchange's non-delivery report (`testkit.dsn.exchange_report`), an Inbox item
of class `REPORT.IPM.Note.NDR`; `inject` files any message in Inbox. The one other filter
served is the one a reader of reports sends: `receivedDateTime ge <time> and
singleValueExtendedProperties/Any(ep: ep/id eq 'String 0x001A' and ep/value eq '<class>')`,
with `$expand=singleValueExtendedProperties($filter=id eq 'Integer 0x0E08')` for each
item's size; `messages/{id}/$value` answers an item's MIME.

Every message actually sent is written to the acceptance log (JSON lines), which is where
tests count effects. Other filters are refused with 400 rather than matched loosely.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import json
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import getaddresses
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

import testkit.dsn as dsn
import testkit.mime_reader as mime_reader
from testkit._http import AnsweringHandler, LoopbackService, Response
from testkit.tls import TlsFiles

GRAPH_SCOPE = "https://graph.microsoft.com/.default"
CLIENT_CREDENTIALS = "client_credentials"
ASSERTION_TYPE = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"
TOKEN_LIFETIME = 3599
DEFAULT_TENANT = "00000000-0000-0000-0000-00000000beef"
DEFAULT_CLIENT_ID = "11111111-2222-3333-4444-555555555555"
DEFAULT_CLIENT_SECRET = "emulator-secret"
DRAFTS = "drafts"
DELETED_ITEMS = "deleteditems"
SENT_ITEMS = "sentitems"
RECOVERABLE_ITEMS = "recoverableitemsdeletions"
FOLDERS = frozenset({DRAFTS, SENT_ITEMS, "inbox", "deleteditems", RECOVERABLE_ITEMS})
DEFAULT_TOP = 10
MAX_TOP = 1000
IMMUTABLE = re.compile(r'idtype\s*=\s*"?immutableid"?', re.IGNORECASE)
_FILTER = re.compile(r"^\s*internetMessageId\s+eq\s+'((?:[^']|'')*)'\s*$")
_CLASS_FILTER = re.compile(
    r"^\s*receivedDateTime\s+ge\s+(\S+)\s+and\s+singleValueExtendedProperties/Any\(ep:\s*"
    r"ep/id\s+eq\s+'String 0x001A'\s+and\s+ep/value\s+eq\s+'([^']*)'\)\s*$"
)
_SIZE_EXPAND = "singleValueExtendedProperties($filter=id eq 'Integer 0x0E08')"
NDR_CLASS = "REPORT.IPM.Note.NDR"
_JSON = "application/json; charset=utf-8"


class GraphError(Exception):
    """An answer in Graph's error shape: {"error": {"code", "message", "innerError"}}."""

    def __init__(
        self, status: int, code: str, message: str, headers: list[tuple[str, str]] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers or []

    def response(self) -> Response:
        body = {
            "error": {
                "code": self.code,
                "message": self.message,
                "innerError": {"request-id": secrets.token_hex(8), "date": _iso(time.time())},
            }
        }
        return _json(self.status, body, self.headers)


class _OAuthError(Exception):
    def __init__(self, status: int, error: str, description: str) -> None:
        super().__init__(description)
        self.status = status
        self.error = error
        self.description = description


@dataclass
class _Item:
    """One message in a mailbox. `folder` None: in transit (sent, not filed yet)."""

    immutable_id: str
    rest_id: str
    user: str
    raw: bytes
    message_id: str | None
    folder: str | None
    is_draft: bool
    created: float
    filed_at: float | None = None  # when it reaches Sent Items (in transit until then)
    searchable_at: float | None = None  # when $filter sees it in its folder
    parsed: Any = field(repr=False, default=None)
    message_class: str = "IPM.Note"  # PidTagMessageClass: REPORT.IPM.Note.NDR for a report
    received: float | None = None  # receivedDateTime of a message that came in (Inbox)


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _json(status: int, body: Any, headers: list[tuple[str, str]] | None = None) -> Response:
    return status, [("Content-Type", _JSON), *(headers or [])], json.dumps(body).encode()


def odata_literal(value: str) -> str:
    """`value` as an OData string literal (single quotes doubled)."""
    return "'" + value.replace("'", "''") + "'"


class GraphEmulator(LoopbackService):
    _what = "emulator"

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        tls: TlsFiles | None = None,
        tenant_id: str = DEFAULT_TENANT,
        clients: dict[str, str] | None = None,
        lag: float = 0.0,
        file_delay: float = 0.0,
        acceptance_log: Path | None = None,
        rewrite_message_id: bool = False,
        mailboxes: Iterable[str] | None = None,
        mailbox_concurrency: int | None = 4,
        latency: float = 0.0,
        clock: Callable[[], float] = time.time,
        bounce: dict[str, str] | None = None,
    ) -> None:
        super().__init__(host, port, tls)
        self.tenant_id = tenant_id
        # Recipient address (or "@domain") -> "exchange": a non-delivery report comes back.
        self.bounce = {k.lower(): v for k, v in (bounce or {}).items()}
        # client_id -> secret; a client assertion (certificate) is accepted for a known id.
        self.clients = (
            dict(clients) if clients is not None else {DEFAULT_CLIENT_ID: DEFAULT_CLIENT_SECRET}
        )
        self._lag = float(lag)
        self._file_delay = float(file_delay)
        self._acceptance_log = acceptance_log
        self.rewrite_message_id = rewrite_message_id
        # `internetMessageId eq` ignores case (the module docstring).
        self.filter_ignores_case = False
        # Immutable ids of drafts a late send takes just before a DELETE of them arrives.
        self.late_send_on_delete: set[str] = set()
        # The same, for a DELETE of the draft in Deleted Items (the one that is for good).
        self.late_send_before_purge: set[str] = set()
        # A DELETE in Deleted Items moves the item to Recoverable Items (the module docstring).
        self.recoverable_items = False
        # Immutable id -> (status, code) of every DELETE of it: refused, nothing moved.
        self.refuse_delete: dict[str, tuple[int, str]] = {}
        # Seconds of the Retry-After a `refuse_delete` refusal carries (None: none).
        self.refuse_delete_retry_after: float | None = None
        # Well-known folder names a GET mailFolders/{name} answers 404 for now.
        self.folders_unanswered: set[str] = set()
        # An application access policy: None lets the app reach every mailbox.
        self.mailboxes = None if mailboxes is None else {m.lower() for m in mailboxes}
        # Graph allows 4 requests in flight per app and mailbox; more are answered 429.
        self.mailbox_concurrency = mailbox_concurrency
        # Seconds each API request takes (while it counts as in flight).
        self.latency = float(latency)
        self._running: dict[str, int] = {}
        self.peak_in_flight: dict[str, int] = {}
        self.concurrency_refusals = 0
        self._clock = clock
        self._lock = threading.RLock()
        self._tokens: dict[str, float] = {}  # access token -> expiry
        self._items: list[_Item] = []
        self._accepted: list[dict[str, Any]] = []
        self._throttle = 0
        self._throttle_retry_after = 1.0
        self.token_requests: list[dict[str, Any]] = []
        self.requests: list[tuple[str, str]] = []  # (method, path) of every API request

    # -- lifecycle ---------------------------------------------------------------------

    @property
    def authority(self) -> str:
        """What a client configures as `authority` (msal appends the tenant)."""
        return self.url

    @property
    def api_endpoint(self) -> str:
        return self.url + "/v1.0"

    def _handler(self) -> type[_GraphHandler]:
        class Handler(_GraphHandler):
            pass

        Handler.emulator = self
        return Handler

    # -- test controls -----------------------------------------------------------------

    def set_lag(self, seconds: float) -> None:
        """The search lag of messages filed from now on."""
        with self._lock:
            self._lag = float(seconds)

    def set_file_delay(self, seconds: float) -> None:
        """How long a message sent from now on is in transit before Sent Items has it."""
        with self._lock:
            self._file_delay = float(seconds)

    def throttle(self, requests: int, retry_after: float = 1.0) -> None:
        """Answer the next `requests` API calls 429 with Retry-After, doing nothing."""
        with self._lock:
            self._throttle = requests
            self._throttle_retry_after = retry_after

    def expire_tokens(self) -> None:
        with self._lock:
            for token in self._tokens:
                self._tokens[token] = float("-inf")

    def accepted(self) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(entry) for entry in self._accepted]

    def copies(self, message_id: str) -> int:
        """Messages actually sent whose stored Message-ID equals `message_id`."""
        with self._lock:
            return sum(1 for entry in self._accepted if entry["message_id"] == message_id)

    def folder(self, user: str, folder: str) -> list[dict[str, Any]]:
        """What `folder` of `user`'s mailbox holds now (immutable ids), search lag or not."""
        with self._lock:
            self._settle()
            return [
                self._resource(item, immutable=True)
                for item in self._items
                if item.user == user.lower() and item.folder == folder.lower()
            ]

    def move(self, user: str, immutable_id: str, folder: str) -> None:
        """A person's client moves a filed item to `folder` (Deleted Items: a delete): its
        immutable id stays, its REST id changes, as Graph's do."""
        with self._lock:
            self._settle()
            item = next(i for i in self._items
                        if i.user == user.lower() and i.immutable_id == immutable_id)  # fmt: skip
            item.folder = folder.lower()
            item.rest_id = self._new_id()

    def send_draft(self, user: str, immutable_id: str) -> int:
        """Another client's send of a draft by its immutable id (a stalled attempt's call
        landing late): 202, or the status Graph would answer (404: no such item)."""
        with self._lock:
            self._settle()
            try:
                status, _, _ = self._send(user.lower(), immutable_id, True)
            except GraphError as exc:
                return exc.status
            return status

    def inject_draft(self, raw: bytes, *, user: str) -> str:
        """A draft as if a person had saved it; returns its immutable id."""
        return self._store_draft(user.lower(), raw).immutable_id

    def inject(
        self,
        raw: bytes,
        *,
        user: str,
        message_class: str = "IPM.Note",
        received: float | None = None,
    ) -> str:
        """A message received into `user`'s Inbox now, or at `received` (epoch seconds: its
        `receivedDateTime`) (a report: `NDR_CLASS`); its immutable id."""
        item = self._file(user.lower(), raw, "inbox", message_class=message_class)
        if received is not None:
            with self._lock:
                item.received = received
        return item.immutable_id

    # -- the mailbox -------------------------------------------------------------------

    def _new_id(self) -> str:
        return "AAkALgAAAAAAHYQDEapmEc2byACqAC-EWg0A" + secrets.token_urlsafe(24)

    def _settle(self) -> None:
        """File every message whose transit is over (called under the lock)."""
        now = self._clock()
        for item in self._items:
            if item.folder is None and item.filed_at is not None and item.filed_at <= now:
                item.folder = SENT_ITEMS
                item.rest_id = self._new_id()  # a mutable id names the item in its folder
                item.searchable_at = item.filed_at + self._lag

    def _store_draft(self, user: str, raw: bytes) -> _Item:
        parsed = mime_reader.parse(raw)
        if mime_reader.header(parsed, "Message-ID") is None:
            # Exchange gives a new item an internetMessageId when the MIME has none.
            raw = mime_reader.replace_message_id(
                raw, f"<{secrets.token_hex(12)}@emulator.prod.outlook.com>"
            )
            parsed = mime_reader.parse(raw)
        return self._file(user, raw, DRAFTS)

    def _file(
        self, user: str, raw: bytes, folder: str, *, message_class: str = "IPM.Note"
    ) -> _Item:
        """A new item in `folder`: a draft (Drafts), or a message received now (Inbox)."""
        parsed = mime_reader.parse(raw)
        with self._lock:
            now = self._clock()
            item = _Item(
                # Graph's two id kinds differ; only the immutable one survives a move.
                immutable_id=self._new_id(),
                rest_id=self._new_id(),
                user=user,
                raw=raw,
                message_id=mime_reader.header(parsed, "Message-ID"),
                folder=folder,
                is_draft=folder == DRAFTS,
                created=now,
                searchable_at=now + self._lag,
                parsed=parsed,
                message_class=message_class,
                received=None if folder == DRAFTS else now,
            )
            self._items.append(item)
            return item

    def _dispatch(self, item: _Item, via: str, request_raw: bytes) -> None:
        """The message leaves: it is accepted (logged), in transit, then filed."""
        if self.rewrite_message_id:
            item.raw = mime_reader.replace_message_id(
                item.raw, f"<{secrets.token_hex(16)}@emulator.prod.outlook.com>"
            )
            item.parsed = mime_reader.parse(item.raw)
            item.message_id = mime_reader.header(item.parsed, "Message-ID")
        now = self._clock()
        item.folder = None
        item.is_draft = False
        item.filed_at = now + self._file_delay
        item.searchable_at = None
        entry: dict[str, Any] = {
            "at": _iso(now),
            "user": item.user,
            "id": item.immutable_id,
            "message_id": item.message_id,
            "from": _joined(item.parsed, "From"),
            "to": _joined(item.parsed, "To"),
            "subject": _joined(item.parsed, "Subject"),
            "toRecipients": [
                {"emailAddress": {"name": name, "address": address}}
                for name, address in getaddresses([_joined(item.parsed, "To") or ""])
                if address
            ],
            "raw_sha256": hashlib.sha256(request_raw).hexdigest(),
            "via": via,
        }
        self._accepted.append(entry)
        if self._acceptance_log is not None:
            with self._acceptance_log.open("a", encoding="utf-8") as handle:
                handle.write(json.dumps(entry, ensure_ascii=False) + "\n")
        self._settle()
        self._bounce(item)

    def _bounce(self, item: _Item) -> None:
        """Exchange's report in the sender's Inbox for each recipient it bounces."""
        if not self.bounce:
            return
        subject = _joined(item.parsed, "Subject") or ""
        for name in ("To", "Cc", "Bcc"):
            for _display, recipient in getaddresses(item.parsed.get_all(name) or []):
                recipient = recipient.lower()
                domain = "@" + recipient.rpartition("@")[2]
                if recipient in self.bounce or domain in self.bounce:
                    report = dsn.exchange_report(
                        item.raw, mailbox=item.user, recipient=recipient, subject=subject
                    )
                    self.inject(report, user=item.user, message_class=NDR_CLASS)

    def _find(self, user: str, ident: str, immutable: bool) -> _Item | None:
        for item in self._items:
            if item.user != user:
                continue
            if (item.immutable_id if immutable else item.rest_id) == ident:
                return item
        return None

    def _existing(self, user: str, ident: str, immutable: bool) -> _Item:
        """The item in a folder (not in transit), or Graph's 404."""
        item = self._find(user, ident, immutable)
        if item is None or item.folder is None:
            raise GraphError(
                404, "ErrorItemNotFound", "The specified object was not found in the store."
            )
        return item

    def _same_id(self, stored: str | None, wanted: str) -> bool:
        """Whether `$filter=internetMessageId eq 'wanted'` matches an item's Message-ID."""
        if stored is None:
            return False
        if self.filter_ignores_case:
            return stored.lower() == wanted.lower()
        return stored == wanted

    def _resource(self, item: _Item, *, immutable: bool, sizes: bool = False) -> dict[str, Any]:
        extra: dict[str, Any] = {}
        if item.received is not None:
            extra["receivedDateTime"] = _iso(item.received)
        if sizes:
            extra["singleValueExtendedProperties"] = [
                {"id": "Integer 0x0E08", "value": str(len(item.raw))}
            ]
        return extra | {
            "id": item.immutable_id if immutable else item.rest_id,
            "internetMessageId": item.message_id,
            "isDraft": item.is_draft,
            "parentFolderId": item.folder,
            "subject": _joined(item.parsed, "Subject"),
            "toRecipients": [
                {"emailAddress": {"name": name, "address": address}}
                for name, address in getaddresses([_joined(item.parsed, "To") or ""])
                if address
            ],
            "createdDateTime": _iso(item.created),
            "sentDateTime": _iso(item.filed_at) if item.filed_at is not None else None,
        }

    # -- HTTP dispatch -----------------------------------------------------------------

    def handle(self, method: str, target: str, headers: dict[str, str], body: bytes) -> Response:
        """One request in, one response out; `headers` has lower-cased names."""
        split = urlsplit(target)
        path = split.path
        params = parse_qs(split.query, keep_blank_values=True)
        base = self._base(headers)
        tenant_path = f"/{self.tenant_id}"
        try:
            if path == f"{tenant_path}/v2.0/.well-known/openid-configuration":
                return self._openid_configuration(base)
            if path == f"{tenant_path}/oauth2/v2.0/token":
                if method != "POST":
                    raise GraphError(405, "MethodNotAllowed", "POST expected")
                return self._token(body)
            if path.endswith(("/.well-known/openid-configuration", "/oauth2/v2.0/token")):
                return _json(
                    400,
                    {
                        "error": "invalid_tenant",
                        "error_description": f"AADSTS90002: Tenant '{path.split('/')[1]}'"
                        " not found.",
                    },
                )
            if path.startswith("/v1.0/"):
                return self._api(method, path.removeprefix("/v1.0"), params, headers, body)
            raise GraphError(404, "ResourceNotFound", f"Not Found: {path}")
        except GraphError as exc:
            return exc.response()

    def _base(self, headers: dict[str, str]) -> str:
        own = urlsplit(self.url)
        return f"{own.scheme}://{headers.get('host') or own.netloc}"

    # -- identity platform -------------------------------------------------------------

    def _openid_configuration(self, base: str) -> Response:
        root = f"{base}/{self.tenant_id}"
        return _json(
            200,
            {
                "issuer": f"{root}/v2.0",
                "authorization_endpoint": f"{root}/oauth2/v2.0/authorize",
                "token_endpoint": f"{root}/oauth2/v2.0/token",
                "token_endpoint_auth_methods_supported": [
                    "client_secret_post",
                    "private_key_jwt",
                    "client_secret_basic",
                ],
                "response_types_supported": ["code", "id_token", "token"],
                "tenant_region_scope": "EU",
            },
        )

    def _token(self, body: bytes) -> Response:
        record: dict[str, Any] = {"at": _iso(self._clock())}
        try:
            form = {k: v[-1] for k, v in parse_qs(body.decode("utf-8")).items()}
            record.update(
                grant_type=form.get("grant_type"),
                client_id=form.get("client_id"),
                scope=form.get("scope"),
            )
            if form.get("grant_type") != CLIENT_CREDENTIALS:
                raise _OAuthError(
                    400, "unsupported_grant_type", "AADSTS70003: client_credentials only"
                )
            client_id = form.get("client_id", "")
            if client_id not in self.clients:
                raise _OAuthError(
                    400,
                    "unauthorized_client",
                    f"AADSTS700016: Application with identifier '{client_id}' was not found"
                    f" in the directory '{self.tenant_id}'.",
                )
            if "client_assertion" in form:
                self._check_assertion(client_id, form)
                record["credential"] = "assertion"
            elif not secrets.compare_digest(form.get("client_secret", ""), self.clients[client_id]):
                raise _OAuthError(
                    401,
                    "invalid_client",
                    "AADSTS7000215: Invalid client secret provided.",
                )
            else:
                record["credential"] = "secret"
            if form.get("scope", "").split() != [GRAPH_SCOPE]:
                raise _OAuthError(
                    400,
                    "invalid_scope",
                    f"AADSTS1002012: The provided value for scope {form.get('scope')!r} is not"
                    " valid. Client credential flows must have a scope value with /.default.",
                )
        except (UnicodeDecodeError, ValueError):
            record["status"] = 400
            self.token_requests.append(record)
            return _json(400, {"error": "invalid_request", "error_description": "bad form"})
        except _OAuthError as exc:
            record["status"] = exc.status
            record["error"] = exc.error
            with self._lock:
                self.token_requests.append(record)
            return _json(exc.status, {"error": exc.error, "error_description": exc.description})
        access = secrets.token_urlsafe(32)
        with self._lock:
            self._tokens[access] = self._clock() + TOKEN_LIFETIME
            record["status"] = 200
            self.token_requests.append(record)
        answer = {"token_type": "Bearer", "expires_in": TOKEN_LIFETIME, "access_token": access}
        return _json(200, answer, [("Cache-Control", "no-store")])

    @staticmethod
    def _check_assertion(client_id: str, form: dict[str, str]) -> None:
        """A certificate credential: a JWT whose iss and sub are the client. The signature
        is not checked (the emulator holds no registered certificate)."""
        if form.get("client_assertion_type") != ASSERTION_TYPE:
            raise _OAuthError(400, "invalid_request", "AADSTS7000216: client_assertion_type")
        parts = form["client_assertion"].split(".")
        try:
            claims = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
        except (IndexError, ValueError, binascii.Error) as exc:
            raise _OAuthError(400, "invalid_client", "AADSTS50027: invalid JWT") from exc
        if not isinstance(claims, dict) or claims.get("iss") != client_id:
            raise _OAuthError(401, "invalid_client", "AADSTS700021: assertion issuer mismatch")

    # -- Graph API ---------------------------------------------------------------------

    def _authenticate(self, headers: dict[str, str]) -> None:
        scheme, _, credential = headers.get("authorization", "").partition(" ")
        with self._lock:
            expiry = self._tokens.get(credential.strip()) if scheme.lower() == "bearer" else None
            valid = expiry is not None and expiry > self._clock()
        if not valid:
            raise GraphError(
                401,
                "InvalidAuthenticationToken",
                "Access token is empty." if not credential else "Lifetime validation failed.",
                [("WWW-Authenticate", 'Bearer realm="", error="invalid_token"')],
            )

    def _api(
        self,
        method: str,
        path: str,
        params: dict[str, list[str]],
        headers: dict[str, str],
        body: bytes,
    ) -> Response:
        self._authenticate(headers)
        with self._lock:
            self.requests.append((method, path))
            if self._throttle > 0:
                self._throttle -= 1
                retry = self._throttle_retry_after
                raise GraphError(
                    429,
                    "ApplicationThrottled",
                    "Application is over its MailboxConcurrency limit.",
                    [("Retry-After", str(int(retry)) if float(retry).is_integer() else str(retry))],
                )
        parts = [unquote(part) for part in path.strip("/").split("/")]
        if len(parts) < 2 or parts[0] != "users":
            raise GraphError(400, "BadRequest", f"Resource not found for the segment {path!r}.")
        user = parts[1].lower()
        if self.mailboxes is not None and user not in self.mailboxes:
            raise GraphError(403, "ErrorAccessDenied", "Access is denied. Check credentials.")
        with self._in_flight(user):
            return self._mail(method, user, parts[2:], params, headers, body)

    @contextlib.contextmanager
    def _in_flight(self, user: str) -> Iterator[None]:
        """Count the request against its mailbox's concurrency limit for as long as it
        runs (`latency` included); over the limit it is answered 429 and does nothing."""
        with self._lock:
            running = self._running.get(user, 0) + 1
            if self.mailbox_concurrency is not None and running > self.mailbox_concurrency:
                self.concurrency_refusals += 1
                raise GraphError(
                    429,
                    "ApplicationThrottled",
                    "Application is over its MailboxConcurrency limit.",
                    [("Retry-After", "1")],
                )
            self._running[user] = running
            self.peak_in_flight[user] = max(self.peak_in_flight.get(user, 0), running)
            latency = self.latency
        try:
            if latency > 0:
                time.sleep(latency)  # in this request's thread: requests overlap
            yield
        finally:
            with self._lock:
                self._running[user] -= 1

    def _mail(
        self,
        method: str,
        user: str,
        rest: list[str],
        params: dict[str, list[str]],
        headers: dict[str, str],
        body: bytes,
    ) -> Response:
        immutable = bool(IMMUTABLE.search(headers.get("prefer", "")))
        with self._lock:
            self._settle()
            if rest == ["messages"] and method == "POST":
                return self._create(user, headers, body, immutable)
            if rest == ["sendMail"] and method == "POST":
                return self._send_mail(user, headers, body)
            if len(rest) == 3 and rest[0] == "messages" and rest[2] == "send":
                if method != "POST":
                    raise GraphError(405, "MethodNotAllowed", "POST expected")
                return self._send(user, rest[1], immutable)
            if len(rest) == 2 and rest[0] == "messages" and method == "GET":
                return self._get(user, rest[1], immutable)
            if len(rest) == 3 and rest[0] == "messages" and rest[2] == "$value":
                item = self._existing(user, rest[1], immutable)
                return 200, [("Content-Type", "text/plain")], item.raw
            if len(rest) == 2 and rest[0] == "messages" and method == "DELETE":
                return self._delete(user, rest[1], immutable)
            if len(rest) == 3 and rest[0] == "messages" and rest[2] == "move":
                if method != "POST":
                    raise GraphError(405, "MethodNotAllowed", "POST expected")
                return self._move(user, rest[1], body, immutable)
            if rest == ["messages"] and method == "GET":
                return self._list(user, None, params, immutable)
            if len(rest) == 2 and rest[0] == "mailFolders" and method == "GET":
                return self._folder(rest[1].lower())
            if len(rest) == 3 and rest[0] == "mailFolders" and rest[2] == "messages":
                if method != "GET":
                    raise GraphError(405, "MethodNotAllowed", "GET expected")
                return self._list(user, rest[1].lower(), params, immutable)
        raise GraphError(400, "BadRequest", f"Resource not found for the segment {rest!r}.")

    @staticmethod
    def _mime(headers: dict[str, str], body: bytes) -> bytes:
        if not headers.get("content-type", "").lower().startswith("text/plain"):
            raise GraphError(
                415, "UnsupportedMediaType", "this emulator takes MIME content (text/plain) only"
            )
        try:
            raw = base64.b64decode(b"".join(body.split()), validate=True)
        except (binascii.Error, ValueError) as exc:
            raise GraphError(400, "ErrorMimeContentInvalidBase64String", str(exc)) from exc
        if not raw.strip() or b":" not in raw.split(b"\n", 1)[0]:
            raise GraphError(400, "ErrorMimeContentInvalid", "Invalid MIME content.")
        return raw

    def _create(self, user: str, headers: dict[str, str], body: bytes, immutable: bool) -> Response:
        item = self._store_draft(user, self._mime(headers, body))
        return _json(201, self._resource(item, immutable=immutable))

    def _folder(self, name: str) -> Response:
        """A well-known folder: its id is its name here, as its items' `parentFolderId`."""
        if name not in FOLDERS or name in self.folders_unanswered:
            raise GraphError(404, "ErrorInvalidIdMalformed", f"unknown folder {name!r}")
        return _json(200, {"id": name, "displayName": name})

    def _send(self, user: str, ident: str, immutable: bool) -> Response:
        item = self._find(user, ident, immutable)
        if item is None or item.folder in (None, RECOVERABLE_ITEMS):
            raise GraphError(
                404, "ErrorItemNotFound", "The specified object was not found in the store."
            )
        if not item.is_draft:
            raise GraphError(
                400, "ErrorInvalidRequest", "The item is not a draft and cannot be sent."
            )
        self._dispatch(item, "send", item.raw)
        return 202, [], b""

    def _send_mail(self, user: str, headers: dict[str, str], body: bytes) -> Response:
        raw = self._mime(headers, body)
        item = self._store_draft(user, raw)
        self._dispatch(item, "sendMail", raw)
        return 202, [], b""

    def _get(self, user: str, ident: str, immutable: bool) -> Response:
        item = self._find(user, ident, immutable)
        if item is None or item.folder is None:
            raise GraphError(
                404, "ErrorItemNotFound", "The specified object was not found in the store."
            )
        return _json(200, self._resource(item, immutable=immutable))

    def _delete(self, user: str, ident: str, immutable: bool) -> Response:
        item = self._find(user, ident, immutable)
        late = self.late_send_on_delete
        if item is not None and item.folder == DELETED_ITEMS:
            late = self.late_send_before_purge
        if item is not None and item.immutable_id in late and item.folder != RECOVERABLE_ITEMS:
            late.discard(item.immutable_id)
            self._dispatch(item, "send", item.raw)  # another client's send lands first
        if item is None or item.folder is None:
            raise GraphError(
                404, "ErrorItemNotFound", "The specified object was not found in the store."
            )
        refused = self.refuse_delete.get(item.immutable_id)
        if refused is not None:
            wait = self.refuse_delete_retry_after
            raise GraphError(
                refused[0],
                refused[1],
                "Access is denied. Check credentials.",
                [] if wait is None else [("Retry-After", str(int(wait)))],
            )
        if item.folder == RECOVERABLE_ITEMS:
            raise GraphError(403, "ErrorCannotDeleteObject", "Object cannot be deleted.")
        if item.folder == DELETED_ITEMS and self.recoverable_items:
            item.folder = RECOVERABLE_ITEMS  # kept for the retention period, still read by id
            item.rest_id = self._new_id()
        elif item.folder == DELETED_ITEMS:
            self._items.remove(item)  # deleted from Deleted Items: for good
        else:
            item.folder = DELETED_ITEMS  # Graph's DELETE moves it there; a draft stays one
            item.rest_id = self._new_id()
        return 204, [], b""

    def _move(self, user: str, ident: str, body: bytes, immutable: bool) -> Response:
        item = self._existing(user, ident, immutable)
        try:
            destination = str(json.loads(body or b"{}")["destinationId"]).lower()
        except (ValueError, KeyError, TypeError) as exc:
            raise GraphError(400, "ErrorInvalidRequest", "destinationId expected") from exc
        if destination not in FOLDERS:
            raise GraphError(404, "ErrorInvalidIdMalformed", f"unknown folder {destination!r}")
        item.folder = destination
        item.rest_id = self._new_id()
        return _json(201, self._resource(item, immutable=immutable))

    def _list(
        self, user: str, folder: str | None, params: dict[str, list[str]], immutable: bool
    ) -> Response:
        if folder is not None and folder not in FOLDERS:
            raise GraphError(404, "ErrorInvalidIdMalformed", f"unknown folder {folder!r}")
        wanted: str | None = None
        reports: tuple[float, str] | None = None  # (received since, message class)
        if "$filter" in params:
            match = _FILTER.match(params["$filter"][-1])
            by_class = _CLASS_FILTER.match(params["$filter"][-1])
            if by_class is not None:
                since = datetime.fromisoformat(by_class.group(1).replace("Z", "+00:00"))
                reports = (since.timestamp(), by_class.group(2))
            elif match is None:
                raise GraphError(
                    400,
                    "BadRequest",
                    "this emulator filters by internetMessageId eq '...' only",
                )
            else:
                wanted = match.group(1).replace("''", "'")
        expand = params.get("$expand", [""])[-1]
        if expand and expand != _SIZE_EXPAND:
            raise GraphError(400, "BadRequest", f"this emulator expands {_SIZE_EXPAND} only")
        try:
            top = int(params.get("$top", [str(DEFAULT_TOP)])[-1])
            skip = int(params.get("$skip", ["0"])[-1])
        except ValueError as exc:
            raise GraphError(400, "BadRequest", "$top and $skip take integers") from exc
        if not 1 <= top <= MAX_TOP or skip < 0:
            raise GraphError(400, "BadRequest", f"$top must be within 1..{MAX_TOP}")
        now = self._clock()
        found = [
            item
            for item in self._items
            if item.user == user
            and item.folder is not None
            and (folder is None or item.folder == folder)
            and (
                wanted is None
                or (
                    self._same_id(item.message_id, wanted)
                    and item.searchable_at is not None
                    and item.searchable_at <= now
                )
            )
            and (
                reports is None
                or (
                    item.message_class == reports[1]
                    and item.received is not None
                    and item.received >= reports[0]
                    and item.searchable_at is not None
                    and item.searchable_at <= now
                )
            )
        ]
        page = found[skip : skip + top]
        answer: dict[str, Any] = {
            "value": [self._resource(i, immutable=immutable, sizes=bool(expand)) for i in page]
        }
        if skip + top < len(found):
            query = {k: v[-1] for k, v in params.items()}
            query["$skip"] = str(skip + top)
            where = f"mailFolders/{folder}/messages" if folder else "messages"
            link = "&".join(f"{quote(k)}={quote(v, safe='')}" for k, v in query.items())
            answer["@odata.nextLink"] = f"{self.api_endpoint}/users/{quote(user)}/{where}?{link}"
        return _json(200, answer)


def _joined(parsed: Any, name: str) -> str | None:
    values = parsed.get_all(name) if parsed is not None else None
    if not values:
        return None
    return ", ".join(mime_reader.decoded(value) for value in values)


class _GraphHandler(AnsweringHandler):
    emulator: GraphEmulator

    def answer(self, method: str, target: str, headers: dict[str, str], body: bytes) -> Response:
        return self.emulator.handle(method, target, headers, body)

    def failure(self, status: int, message: str) -> Response:
        code = "BadRequest" if status == 400 else "InternalServerError"
        return GraphError(status, code, message).response()
