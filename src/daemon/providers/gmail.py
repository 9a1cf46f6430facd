"""The Gmail provider: users.messages.send with raw MIME, search by `rfc822msgid:`.

Built on google-api-python-client and google-auth, with the HTTP stack pinned down so that
nothing below `send_raw` re-sends a request on its own ("No silent re-send" in
docs/architecture.md):

* `execute(num_retries=0)` always - googleapiclient's `_retry_request` then makes one
  attempt and retries neither exceptions nor 5xx/429 answers;
* `SingleShotHttp` (transport.py) replaces httplib2's `_conn_request`, which would repeat a
  request after a dropped response, and turns off redirects and the cache;
* google-auth-httplib2's replay after refreshing a token on 401 stays: a 401 was not
  accepted, so the replay is the first delivery, never a second one;
* no requests/urllib3 session is involved for Gmail calls, so no urllib3 `Retry` adapter;
  google-auth's token endpoint helper may repeat a *token* request on a retryable error,
  which cannot send mail.

The API surface comes from the discovery document bundled with googleapiclient
(static_discovery): building the service never touches the network.
"""

from __future__ import annotations

import base64
import heapq
import json
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from datetime import UTC, datetime
from email.parser import BytesHeaderParser
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import google_auth_httplib2
from google.auth import exceptions as auth_exceptions
from google.auth.credentials import Credentials as AuthCredentials
from google.oauth2 import credentials as user_credentials
from google.oauth2 import service_account
from googleapiclient.discovery import build
from googleapiclient.errors import HttpError

from daemon.config.secret_text import read_secret_text
from daemon.config.settings import clear_text_elsewhere
from daemon.providers.answers import json_object
from daemon.providers.base import (
    DEFAULT_READBACK_FIRST,
    DEFAULT_READBACK_RATE,
    Provider,
    ProviderBase,
    ProviderError,
    ReportRead,
    SearchHit,
    SearchResult,
    SendKind,
    SendOutcome,
    next_call,
)
from daemon.providers.classify import (
    classify_send_exception,
    classify_send_response,
    provider_error_for_exception,
    provider_error_for_response,
)
from daemon.providers.draft_handle import (
    BeforeDeleting,
    Draft,
    DraftCheck,
    DraftRefused,
    DraftsProvider,
)
from daemon.providers.gmail_drafts import COMPOSE_SCOPE, DRAFT_STEP_UNITS, GmailDrafts
from daemon.providers.gmail_history import GmailHistory
from daemon.providers.gmail_mailbox import (
    MAX_PAGES,
    Mailbox,
    Response,
    message_id_header,
    metadata_header,
    search_term,
)
from daemon.providers.gmail_reports import GmailReports
from daemon.providers.history_handle import HistoryProvider
from daemon.providers.mailboxes import Mailboxes
from daemon.providers.outcomes import first_copies
from daemon.providers.per_thread import PerThreadHttp
from daemon.providers.quota import (
    GMAIL_GET_UNITS,
    GMAIL_LIST_UNITS,
    GMAIL_PROFILE_UNITS,
    GMAIL_SEND_UNITS,
    TokenBucket,
)
from daemon.providers.transport import DEFAULT_MAX_IDLE, SingleShotHttp, TransportStats
from ledger.exceptions import Refusal, SendledgerError
from ledger.message_id import same_message_id

# gmail.send for messages.send; gmail.readonly because `q=` is refused under gmail.metadata.
SCOPES = [
    "https://www.googleapis.com/auth/gmail.send",
    "https://www.googleapis.com/auth/gmail.readonly",
]
# send_via = "drafts" also creates, sends and deletes drafts: gmail.compose.
DRAFT_SCOPES = [*SCOPES, COMPOSE_SCOPE]
SEND_VIA = ("messages", "drafts")
SENT_LABEL = "SENT"
MAX_PAGE_SIZE = 500  # Gmail's ceiling for messages.list maxResults

#: `user = "{from}"`: act as each job's From mailbox (domain-wide delegation).
FROM_PLACEHOLDER = "{from}"


# Scopes that include composing drafts (gmail.modify and full access do).
COMPOSE_CAPABLE = frozenset(
    {COMPOSE_SCOPE, "https://www.googleapis.com/auth/gmail.modify", "https://mail.google.com/"}
)


class MissingScope(SendledgerError, ValueError):
    """The credentials are not granted a scope the configured send path needs."""

    kind = Refusal.BAD_INPUT


class DelegationRequired(SendledgerError, ValueError):
    """`user` does not fit the credentials' delegation: `user = "{from}"` with credentials
    that cannot act as other mailboxes, or a service account with a `user` that is no
    mailbox's address. The setting to fix is `user`."""

    kind = Refusal.BAD_INPUT


class CredentialsFileInvalid(SendledgerError, ValueError):
    """The credentials file was read but holds no usable key: not JSON, not an object, a
    type google-auth does not take, or fields it refuses. The setting to fix is
    `credentials_file`."""

    kind = Refusal.BAD_INPUT


class CredentialsFileUnreadable(SendledgerError, ValueError):
    """The credentials file is not a readable regular file (docs/configuration.md "Bounds, URLs,
    addresses and files")."""

    kind = Refusal.BAD_INPUT


def load_credentials(
    credentials_file: Path,
    *,
    user: str,
    token_uri: str = "",
    scopes: list[str] | None = None,
    allow_http: bool = False,
) -> AuthCredentials:
    """google-auth credentials from a service-account (domain-wide delegation, acting as
    `user`) or authorized-user JSON file. `token_uri`, when set, replaces the file's; an
    authorized-user file's own token_uri is ignored by google-auth (always Google's).
    A service-account file's own `http://` token_uri to a host that is not a loopback
    address is refused unless `allow_http`, as the `token_uri` setting is.

    Raises ValueError naming the file when it cannot be read or is of an unknown type.
    """
    scopes = SCOPES if scopes is None else scopes
    path = Path(credentials_file)
    try:
        text = read_secret_text(path)  # a regular file: a FIFO must not hang the daemon
    except ValueError as exc:
        raise CredentialsFileUnreadable(str(exc)) from None
    try:
        info: Any = json.loads(text)
    except ValueError as exc:
        raise CredentialsFileInvalid(f"{path}: credentials file is not valid JSON: {exc}") from exc
    if not isinstance(info, dict):
        raise CredentialsFileInvalid(f"{path}: credentials file is not a JSON object")
    if token_uri:
        info["token_uri"] = token_uri
    kind = info.get("type")
    if kind == "service_account" and not token_uri and not allow_http:
        _refuse_clear_text_token_uri(path, info.get("token_uri"))
    if user == FROM_PLACEHOLDER and kind != "service_account":
        raise DelegationRequired(
            f'"{FROM_PLACEHOLDER}" acts as each job\'s From mailbox through domain-wide'
            f" delegation: {path} must hold service_account credentials, not {kind!r}"
        )
    acts_for_one = user != FROM_PLACEHOLDER
    if kind == "service_account" and acts_for_one and (not user or user == "me" or "@" not in user):
        # Outside the file's catch below: the fix is `user`, not the key file.
        raise DelegationRequired(
            "a service account acts for a mailbox through domain-wide delegation:"
            f" user must be that mailbox's address, not {user!r}"
        )
    try:
        if kind == "service_account" and user == FROM_PLACEHOLDER:
            # No subject yet: each mailbox gets its own copy (`with_subject`).
            base = service_account.Credentials
            delegating: AuthCredentials = base.from_service_account_info(  # type: ignore[no-untyped-call]
                info, scopes=scopes
            )
            return delegating
        if kind == "service_account":
            sa = service_account.Credentials
            creds: AuthCredentials = sa.from_service_account_info(  # type: ignore[no-untyped-call]
                info, scopes=scopes, subject=user
            )
            return creds
        if kind == "authorized_user":
            au = user_credentials.Credentials
            info_fn = au.from_authorized_user_info
            user_creds: user_credentials.Credentials = info_fn(info, scopes=scopes)  # type: ignore[no-untyped-call]
            if token_uri:
                # google-auth ignores an authorized-user file's token_uri on purpose (a
                # file must not be able to send a refresh token elsewhere); only the
                # configured override may.
                user_creds = user_creds.with_token_uri(token_uri)
            return user_creds
    except ValueError as exc:
        raise CredentialsFileInvalid(f"{path}: {exc}") from exc
    raise CredentialsFileInvalid(
        f"{path}: unsupported credentials type {kind!r}"
        " (expected 'service_account' or 'authorized_user')"
    )


def _refuse_clear_text_token_uri(path: Path, file_token_uri: object) -> None:
    # The signed assertion goes to the file's token_uri when the setting is empty: the
    # settings' check never saw that URL, so it is made here, by the same rule.
    if isinstance(file_token_uri, str) and clear_text_elsewhere(file_token_uri):
        host = urlsplit(file_token_uri).hostname or ""
        raise CredentialsFileInvalid(
            f"{path}: its token_uri is http:// to {host}, which sends the signed assertion"
            " in clear text: use https://, set the provider's token_uri, or set"
            " allow_http = true (loopback: write 127.0.0.1 or [::1])"
        )


def build_gmail_service(http: Any, *, api_endpoint: str = "") -> Any:
    """The gmail v1 Resource, from the bundled discovery document (no network).

    The document's rootUrl is "https://gmail.googleapis.com/" with an empty servicePath and
    method paths such as "gmail/v1/users/{userId}/messages/send"; an `api_endpoint`
    replaces rootUrl + servicePath, so "http://127.0.0.1:PORT" gives
    "http://127.0.0.1:PORT/gmail/v1/users/...", the emulator's layout.
    """
    client_options = {"api_endpoint": api_endpoint.rstrip("/") + "/"} if api_endpoint else None
    return build(
        "gmail",
        "v1",
        http=http,
        static_discovery=True,
        cache_discovery=False,
        client_options=client_options,
    )


def _headers(resp: Mapping[str, Any]) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in resp.items()}


def _raw_response(resp: Any, content: Any) -> tuple[Any, Any]:
    # Replaces googleapiclient's JSON postproc: classification wants status and bytes,
    # and a 2xx whose body is not JSON must become "unknown", not an exception.
    return resp, content


class GmailProvider(ProviderBase):
    """The provider port on the Gmail API. Thread-safe: each thread gets its own HTTP
    object (httplib2 is not thread-safe); credentials and the quota buckets are shared.

    With `user = "{from}"` (domain-wide delegation) it acts as each job's From mailbox:
    `for_job` gives the view the engine calls for one job (docs/providers.md, "Providers")."""

    response_ids_readable = True
    reads_reports = True

    def __init__(
        self,
        name: str,
        *,
        credentials_file: Path,
        user: str,
        api_endpoint: str = "",
        token_uri: str = "",
        allow_http: bool = False,
        timeout: float = 30.0,
        quota_units_per_second: float = 250.0,
        page_size: int = 100,
        readback_first: int = DEFAULT_READBACK_FIRST,
        readback_rate: float = DEFAULT_READBACK_RATE,
        reuse_connections: bool = True,
        max_idle: float = DEFAULT_MAX_IDLE,
        ca_certs: str | None = None,
        send_via: str = "messages",
        read_history: bool = True,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if timeout <= 0:
            raise ValueError(f"timeout must be positive, got {timeout!r}")
        if not 1 <= page_size <= MAX_PAGE_SIZE:
            raise ValueError(f"page_size must be within 1..{MAX_PAGE_SIZE}, got {page_size!r}")
        if readback_first < 1:
            raise ValueError(f"readback_first must be at least 1, got {readback_first!r}")
        if not 0.0 <= readback_rate <= 1.0:
            raise ValueError(f"readback_rate must be within 0..1, got {readback_rate!r}")
        if send_via not in SEND_VIA:
            raise ValueError(f"send_via must be one of {', '.join(SEND_VIA)}, got {send_via!r}")
        self.name = name
        self.send_via = send_via
        # The history handle: messages.send only (a sent draft changes labels, adds no
        # message), and only when the configuration does not turn it off.
        self.reads_history = read_history and send_via == "messages"
        # Drafts are made only when sending through them (the port's `leaves_drafts`).
        self.leaves_drafts = send_via == "drafts"
        self.user = user or "me"
        self.per_mailbox = self.user == FROM_PLACEHOLDER
        # Read by the engine's Message-ID read-back sampling (daemon/engine/readback.py).
        self.readback_first = readback_first
        self.readback_rate = float(readback_rate)
        self.reuse_connections = reuse_connections
        self.max_idle = float(max_idle)
        # A CA bundle to trust instead of httplib2's (the emulator's throw-away CA).
        self.ca_certs = ca_certs
        # Shared by every thread's transport: how often a reused connection died.
        self.transport_stats = TransportStats()
        self.api_endpoint = api_endpoint
        self.timeout = float(timeout)
        self.page_size = page_size
        self._quota_rate = float(quota_units_per_second)
        self._clock = clock
        self._sleep = sleep
        self._credentials_file = Path(credentials_file)
        self._token_uri = token_uri
        self._allow_http = allow_http
        self.scopes = DRAFT_SCOPES if send_via == "drafts" else SCOPES
        self._credentials = load_credentials(
            self._credentials_file,
            user=self.user,
            token_uri=token_uri,
            scopes=self.scopes,
            allow_http=allow_http,
        )
        # "{from}": one mailbox per From address, made on first use, dropped once idle.
        self.mailboxes: Mailboxes[Mailbox] = Mailboxes(
            self._delegate, clock=clock, on_drop=self._keep_token
        )
        # The live tokens of dropped mailboxes, by subject: (token, expiry as google-auth
        # writes it, expiry on `clock`), so a mailbox that comes back within the hour
        # does not fetch another; each forgotten when it expires.
        self._tokens: dict[str, tuple[str, datetime, float]] = {}
        self._token_expiries: list[tuple[float, str]] = []
        self._tokens_lock = threading.Lock()
        self._default = (
            None if self.per_mailbox else self._new_mailbox(self.user, self._credentials)
        )
        self._transports = PerThreadHttp(self._new_transport)
        self._closed = False
        self.service = build_gmail_service(self._transport(), api_endpoint=api_endpoint)
        self._messages = self.service.users().messages()
        self.draft_calls = GmailDrafts(self)
        self.history_calls = GmailHistory(self, clock, sleep)
        self.report_calls = GmailReports(self)

    # -- mailboxes ---------------------------------------------------------------------

    def _new_mailbox(self, user: str, credentials: AuthCredentials) -> Mailbox:
        # Capacity at least one send, or a send could never be afforded at low rates. With
        # "{from}" one send (and its draft step) and no more: many mailboxes run at their
        # quota at once, Gmail meters each request when it arrives, and a mailbox changes
        # daemons (docs/performance.md "Several daemons"), so in any second a mailbox
        # spends at most its quota and the one send saved up.
        draft_units = DRAFT_STEP_UNITS if self.send_via == "drafts" else 0.0
        bucket, departures = (
            TokenBucket(self._quota_rate, self._capacity(), clock=self._clock, sleep=self._sleep)
            for _ in range(2)
        )
        return Mailbox(user, credentials, bucket, departures, draft_units)

    def _capacity(self) -> float:
        draft_units = DRAFT_STEP_UNITS if self.send_via == "drafts" else 0.0
        capacity = GMAIL_SEND_UNITS + draft_units if self.per_mailbox else self._quota_rate
        return max(capacity, GMAIL_SEND_UNITS + draft_units)

    def mailbox(self, from_addr: str) -> Mailbox:
        """The mailbox a job from `from_addr` is sent as: the configured user, or with
        "{from}" that address's own (one token, one quota bucket), made on first use."""
        if self._default is not None:
            return self._default
        return self.mailboxes.get(from_addr)

    def _delegate(self, address: str) -> Mailbox:
        """A mailbox acting as `address`, with the token a dropped one left, if live."""
        credentials = self._credentials.with_subject(address)  # type: ignore[attr-defined]
        with self._tokens_lock:
            kept = self._tokens.pop(address.lower(), None)
        if kept is not None:
            credentials.token, credentials.expiry = kept[0], kept[1]
        return self._new_mailbox(address, credentials)

    def _keep_token(self, mailbox: Mailbox) -> None:
        credentials = mailbox.credentials
        expiry = getattr(credentials, "expiry", None)
        if not credentials.valid or not isinstance(expiry, datetime):
            return
        left = (expiry - datetime.now(UTC).replace(tzinfo=None)).total_seconds()
        key, at = mailbox.user.lower(), self._clock() + left
        with self._tokens_lock:
            self._tokens[key] = (str(credentials.token), expiry, at)
            heapq.heappush(self._token_expiries, (at, key))

    def forget_idle(self) -> int:
        """With "{from}": the mailboxes idle long enough that a fresh one would equal
        them dropped, and the kept tokens that expired; each tick, costing what it drops
        (`daemon/providers/mailboxes.py`)."""
        if not self.per_mailbox:
            return 0
        dropped = self.mailboxes.forget_idle()
        now = self._clock()
        with self._tokens_lock:
            while self._token_expiries and self._token_expiries[0][0] <= now:
                _, key = heapq.heappop(self._token_expiries)
                kept = self._tokens.get(key)
                if kept is not None and kept[2] <= now:
                    del self._tokens[key]
        return dropped

    def kept_tokens(self) -> int:
        """Live tokens of dropped mailboxes kept for their return."""
        with self._tokens_lock:
            return len(self._tokens)

    def for_job(self, from_addr: str, thread_id: str | None) -> Provider:
        """The provider as one job sees it: acting as its From mailbox (with "{from}")
        and sending into its Gmail thread. Without either, the provider itself."""
        if self._default is not None and thread_id is None:
            return self
        self.mailbox(from_addr)  # a From it cannot act as fails here, at the job's load
        return GmailMailboxView(self, from_addr, thread_id)

    # -- plumbing ----------------------------------------------------------------------

    def _new_transport(self) -> SingleShotHttp:
        return SingleShotHttp(
            timeout=self.timeout,
            reuse=self.reuse_connections,
            max_idle=self.max_idle,
            stats=self.transport_stats,
            ca_certs=self.ca_certs,
        )

    def _transport(self) -> SingleShotHttp:
        return self._transports.get()

    def _http(self, mailbox: Mailbox) -> google_auth_httplib2.AuthorizedHttp:
        # One connection pool per thread, shared by every mailbox the thread acts as. The
        # wrapper that adds the mailbox's token is made per call: kept per thread and
        # mailbox, 4 workers and 10,000 mailboxes held 40,000 of them.
        return google_auth_httplib2.AuthorizedHttp(mailbox.credentials, http=self._transport())

    def prepare(
        self, request: Any, units: float | None, mailbox: Mailbox, *, draft: bool = False
    ) -> None:
        """Everything that happens before a request may leave: checks and quota pacing
        (`units` None: a send, paid by its reservation when it has one; `draft`: a drafts
        call, paid out of the draft steps' reservations). Failures here are not call
        outcomes, so they raise."""
        if self._closed:
            raise RuntimeError(f"provider {self.name!r} is closed")
        request.postproc = _raw_response
        if units is None:
            mailbox.pay_send()
        elif draft:
            mailbox.pay_draft(units)
        else:
            mailbox.bucket.acquire(units)

    def execute(self, request: Any, mailbox: Mailbox) -> Response:
        """One attempt of one API call: (status, lower-cased headers, body bytes) for any
        complete HTTP answer; exceptions for everything else. num_retries=0: see above."""
        try:
            with mailbox.calling():
                resp, content = request.execute(http=self._http(mailbox), num_retries=0)
        except HttpError as exc:
            return int(exc.resp.status), _headers(exc.resp), bytes(exc.content)
        body = content if isinstance(content, bytes) else str(content).encode("utf-8")
        return int(resp.status), _headers(resp), body

    def answer(
        self, what: str, request: Any, units: float, mailbox: Mailbox, *, draft: bool = False
    ) -> Response:
        """One read or draft call's complete HTTP answer; ProviderError when none came."""
        self.prepare(request, units, mailbox, draft=draft)
        try:
            return self.execute(request, mailbox)
        except Exception as exc:
            raise provider_error_for_exception(what, exc) from exc

    def read_json(
        self, what: str, request: Any, units: float, mailbox: Mailbox, *, draft: bool = False
    ) -> dict[str, Any]:
        status, headers, body = self.answer(what, request, units, mailbox, draft=draft)
        if not 200 <= status < 300:
            raise provider_error_for_response(what, status, headers, body)
        return json_object(what, status, body)

    def pages(
        self,
        what: str,
        method: Callable[..., Any],
        params: dict[str, Any],
        mailbox: Mailbox,
        *,
        draft: bool = False,
    ) -> Iterator[dict[str, Any]]:
        """Every page of a list call, following nextPageToken, at most `MAX_PAGES`. A
        token that repeats would loop forever, and so would new ones without end: an
        answer we cannot finish is no answer (ProviderError). Each page after the first
        asks `next_call` before it is asked for."""
        page_token: str | None = None
        seen_tokens: set[str] = set()
        for _ in range(MAX_PAGES):
            if page_token:
                # One listing is many calls: each further page asks whether the mailbox's
                # quota scope is still the daemon's (`next_call`, as Graph's `each_item`;
                # docs/architecture.md "Scope leases"): gone, it stops there (ScopeLost),
                # no answer, and the scope's owner lists again.
                next_call(what)
            request = method(**params, **({"pageToken": page_token} if page_token else {}))
            page = self.read_json(what, request, GMAIL_LIST_UNITS, mailbox, draft=draft)
            yield page
            next_token = page.get("nextPageToken")
            if not next_token:
                return
            if not isinstance(next_token, str) or next_token in seen_tokens:
                raise ProviderError(f"{what}: paging did not advance")
            seen_tokens.add(next_token)
            page_token = next_token
        raise ProviderError(f"{what}: more than {MAX_PAGES} pages")

    def _unscoped(self) -> Mailbox:
        if self._default is None:
            raise ProviderError(
                f'provider {self.name!r} has user = "{FROM_PLACEHOLDER}": say which mailbox'
            )
        return self._default

    # -- the port ----------------------------------------------------------------------

    def send_raw(self, raw: bytes) -> SendOutcome:
        """One users.messages.send call with the message as `raw` (so Gmail keeps our
        Message-ID). Never raises for the call's outcome; raises (before any network
        activity) only when the provider is closed. With "{from}" it acts as the
        message's From mailbox."""
        if self._default is not None:
            return self.send_as(self._default, raw, None)
        sender = BytesHeaderParser().parsebytes(raw).get("From")
        if sender is None:
            raise ValueError(f'provider {self.name!r}: "{FROM_PLACEHOLDER}" needs a From header')
        return self.send_as(self.mailbox(str(sender)), raw, None)

    def send_as(self, mailbox: Mailbox, raw: bytes, thread_id: str | None) -> SendOutcome:
        if self.send_via == "drafts":
            return self.send_by_draft(mailbox, raw, thread_id)
        encoded = base64.urlsafe_b64encode(raw).decode("ascii")
        body: dict[str, str] = {"raw": encoded}
        if thread_id is not None:
            body["threadId"] = thread_id
        request = self._messages.send(userId=mailbox.user, body=body)
        self.prepare(request, None, mailbox)
        try:
            status, headers, response = self.execute(request, mailbox)
        except Exception as exc:
            return classify_send_exception(exc)
        return classify_send_response(status, headers, response)

    def send_by_draft(self, mailbox: Mailbox, raw: bytes, thread_id: str | None) -> SendOutcome:
        """Create the draft, then send it: one call of the port for an engine that does
        not keep the draft in the job's history. A draft that could not be created sent
        nothing (an orphan a lost answer left is never sent: `find_drafts`)."""
        try:
            draft = self.draft_calls.create(mailbox, raw, thread_id)
        except DraftRefused as exc:
            return SendOutcome(SendKind.REJECTED, f"not sent: {exc.reason}")
        except ProviderError as exc:
            return SendOutcome(
                SendKind.REJECTED,
                f"not sent: {exc.reason}",
                transient=True,
                retry_after=exc.retry_after,
                unavailable=exc.unavailable,
            )
        return self.draft_calls.send(mailbox, draft)

    # -- drafts (send_via = "drafts"; daemon/providers/draft_handle.py) ------------------------

    def create_draft(self, raw: bytes) -> Draft:
        return self.draft_calls.create(self._unscoped(), raw, None)

    def send_draft(self, draft: Draft) -> SendOutcome:
        return self.draft_calls.send(self._unscoped(), draft)

    def check_draft(self, draft: Draft) -> DraftCheck:
        return self.draft_calls.check(self._unscoped(), draft)

    def draft_raw(self, draft: Draft) -> bytes | None:
        return self.draft_calls.raw(self._unscoped(), draft)

    def find_drafts(self, message_id: str) -> list[Draft]:
        return self.draft_calls.find(self._unscoped(), message_id)

    def delete_draft(self, draft_id: str) -> bool:
        return self.draft_calls.delete(self._unscoped(), draft_id)

    def drafts(self) -> DraftsProvider | None:
        return self if self.send_via == "drafts" else None

    # -- the history handle (send_via = "messages"; daemon/providers/history_handle.py) -------

    def history(self) -> HistoryProvider | None:
        return self if self.reads_history else None

    def history_mark(self, before_call: Callable[[], None] | None = None) -> str | None:
        return self.history_calls.mark(self._unscoped(), before_call)

    def sent_since(self, history_id: str, message_id: str) -> SearchResult:
        return self.history_calls.sent_since(self._unscoped(), history_id, message_id)

    def reserve_in(self, mailbox: Mailbox) -> float:
        """One send's quota in `mailbox` (`reserve_send`), with its claim's history mark
        when one is to be fetched (docs/providers.md "What each handle proves")."""
        extra = self.history_calls.mark_units(mailbox) if self.reads_history else 0.0
        if GMAIL_SEND_UNITS + mailbox.draft_units + extra > mailbox.bucket.capacity:
            # A bucket of one send ("{from}"): the mark's fetch pays its own unit.
            extra = 0.0
        wait = mailbox.reserve_send(extra)
        if wait == 0.0 and extra:
            self.history_calls.mark_paid(mailbox)
        return wait

    def delete_drafts(
        self, message_id: str, before_deleting: BeforeDeleting | None = None
    ) -> list[str]:
        return self.delete_drafts_in(self._unscoped(), message_id, before_deleting)

    def delete_drafts_in(
        self, mailbox: Mailbox, message_id: str, before_deleting: BeforeDeleting | None = None
    ) -> list[str]:
        """Every unsent draft with the Message-ID, deleted (drafts.list, then drafts.delete
        of each, once `before_deleting` has taken the list; only in drafts mode, the only
        one that makes drafts)."""
        found = self.draft_calls.find(mailbox, message_id) if self.send_via == "drafts" else []
        if before_deleting is not None:
            before_deleting([draft.draft_id for draft in found])
        deleted = []
        for draft in found:
            # Asked before each call (`next_call`), as the listing did: once the scope
            # moved, the drafts left are its new owner's to delete.
            next_call(f"drafts.delete {draft.draft_id}")
            if self.draft_calls.delete(mailbox, draft.draft_id):
                deleted.append(draft.draft_id)
        return deleted

    def ping(self) -> None:
        self.ping_as(self._unscoped())

    def ping_as(self, mailbox: Mailbox) -> None:
        """users.getProfile: 1 quota unit, sends nothing (a circuit's probe after a hang)."""
        request = self.service.users().getProfile(userId=mailbox.user)
        profile = self.read_json("ping (users.getProfile)", request, GMAIL_PROFILE_UNITS, mailbox)
        self.history_calls.saw(mailbox, profile.get("historyId"), fresh=True)

    def check_access(self) -> None:
        """The start-up check: with send_via = "drafts", that the credentials are granted
        gmail.compose. Raises MissingScope naming it when Google refuses the scope or the
        grant lacks it; any other failure (network, token endpoint down) is left to the
        first real call, which classifies it."""
        if self.send_via != "drafts" or self._default is None:
            return
        granted = self._refresh_scopes(self._default.credentials)
        if granted == "refused":
            # Refused with compose: is compose the one? Ask again without it.
            plain = load_credentials(
                self._credentials_file,
                user=self.user,
                token_uri=self._token_uri,
                scopes=SCOPES,
                allow_http=self._allow_http,
            )
            if not isinstance(self._refresh_scopes(plain), frozenset):
                return  # not about compose (or no answer): the first call will say
            raise MissingScope(
                f'send_via = "drafts" needs the {COMPOSE_SCOPE} scope: the credentials'
                f" are granted {', '.join(SCOPES)} but refused it"
            )
        if isinstance(granted, frozenset) and granted and not granted & COMPOSE_CAPABLE:
            raise MissingScope(
                f'send_via = "drafts" needs the {COMPOSE_SCOPE} scope; the token grants'
                f" {', '.join(sorted(granted))}"
            )

    def _refresh_scopes(self, credentials: AuthCredentials) -> frozenset[str] | str:
        """A fresh token's granted scopes (empty when the answer does not say), "refused"
        when the token endpoint refused the scopes asked for, "failed" otherwise."""
        request = google_auth_httplib2.Request(self._transport())
        try:
            credentials.refresh(request)  # type: ignore[no-untyped-call]
        except auth_exceptions.RefreshError as exc:
            text = str(exc)
            if any(code in text for code in ("unauthorized_client", "invalid_scope")):
                return "refused"
            return "failed"
        except Exception:
            return "failed"
        return frozenset(getattr(credentials, "granted_scopes", None) or ())

    def search(self, message_id: str) -> SearchResult:
        return self.search_in(self._unscoped(), message_id)

    def read_reports(
        self,
        since: datetime,
        *,
        known: Collection[str],
        max_bytes: int,
        limit: int,
        may_go_on: Callable[[], bool] | None = None,
    ) -> ReportRead:
        return self.report_calls.read(
            self._unscoped(), since, known=known, max_bytes=max_bytes, limit=limit,
            may_go_on=may_go_on,
        )  # fmt: skip

    def forget_report_reads(self) -> None:
        self.report_calls.forget(self._unscoped())

    def search_in(self, mailbox: Mailbox, message_id: str) -> SearchResult:
        """Every SENT copy (spam and trash included) whose Message-ID header is ours, up
        to `SEARCH_STOPS_AT` of them (`first_copies`).

        Lists page by page and reads each listed message's header as it comes, because
        Gmail's `rfc822msgid:` match is looser than the exact comparison the ledger
        needs; once enough copies are found no further page is listed nor message read
        (a mailbox holding 10,000 copies costs 21 reads, not 10,000).
        """
        query = f"rfc822msgid:{search_term(message_id)}"
        params: dict[str, Any] = {
            "userId": mailbox.user,
            "q": query,
            "labelIds": [SENT_LABEL],
            "includeSpamTrash": True,
            "maxResults": self.page_size,
        }

        def read() -> Iterator[SearchHit | None]:
            for provider_id in self._listed_ids(query, params, mailbox):
                # Each read is a call after the listing's: asked as each page is.
                next_call(f"search {query}")
                data = self._get_metadata(mailbox, provider_id)
                header = message_id_header(data)
                labels = tuple(str(x) for x in data.get("labelIds") or ())
                if "labelIds" in data and SENT_LABEL not in labels:
                    # The list asked for SENT; a copy relabelled in between is no longer one.
                    yield None
                elif header is not None and same_message_id(header, message_id):
                    yield SearchHit(
                        provider_id,
                        header,
                        labels,
                        date=metadata_header(data, "date") or "",
                        to=metadata_header(data, "to") or "",
                        subject=metadata_header(data, "subject") or "",
                    )
                else:
                    yield None

        hits, complete = first_copies(read(), f"search {query}")
        return SearchResult(query=query, hits=tuple(hits), complete=complete)

    def _listed_ids(self, query: str, params: dict[str, Any], mailbox: Mailbox) -> Iterator[str]:
        """The ids a search lists, page by page, each once, in the order Gmail lists them."""
        seen: set[str] = set()
        for page in self.pages(f"search {query}", self._messages.list, params, mailbox):
            for item in page.get("messages") or []:
                if not isinstance(item, dict) or not isinstance(item.get("id"), str):
                    raise ProviderError(f"search {query}: malformed list entry {item!r}")
                if item["id"] not in seen:
                    seen.add(item["id"])
                    yield item["id"]

    def read_message_id(self, provider_message_id: str) -> str | None:
        return self.read_message_id_in(self._unscoped(), provider_message_id)

    def read_message_id_in(self, mailbox: Mailbox, provider_message_id: str) -> str | None:
        data = self._get_metadata(mailbox, provider_message_id)
        # A copy just sent: where the mailbox's history is now, for the next claims' mark.
        self.history_calls.saw_message(mailbox, data)
        return message_id_header(data)

    def scope(self) -> str:
        return self.name

    def scope_of(self, mailbox: str) -> str:
        return f"{self.name}/{mailbox}" if self.per_mailbox else self.name

    def reserve_send(self) -> float:
        # Unscoped, as send_raw is: with "{from}" the engine reserves through for_job.
        return self.reserve_in(self._default) if self._default is not None else 0.0

    def quota_available(self) -> float:
        """Quota units left now (the metrics gauge reads it): the mailbox's, or with
        "{from}" the lowest of the mailboxes kept (a dropped one's bucket was full)."""
        if self._default is not None:
            return self._default.bucket.available
        buckets = [mailbox.bucket for mailbox in self.mailboxes.entries()]
        return min((bucket.available for bucket in buckets), default=self._capacity())

    def close(self) -> None:
        self._closed = True
        self._transports.close()

    def _get_metadata(self, mailbox: Mailbox, provider_message_id: str) -> dict[str, Any]:
        request = self._messages.get(
            userId=mailbox.user,
            id=provider_message_id,
            format="metadata",
            # Date, To and Subject are what a human checking a copy looks at (docs/review.md
            # "Review"); the same request, so no extra quota.
            metadataHeaders=["Message-ID", "Date", "To", "Subject"],
        )
        return self.read_json(f"get {provider_message_id}", request, GMAIL_GET_UNITS, mailbox)

    def __repr__(self) -> str:
        return f"GmailProvider({self.name!r}, user={self.user!r})"


class GmailMailboxView(ProviderBase):
    """The Gmail provider for one job: its calls act as the job's mailbox, and its send
    goes into the job's thread. Closing it closes nothing (the provider owns the
    connections)."""

    response_ids_readable = True
    reads_reports = True

    def __init__(self, provider: GmailProvider, from_addr: str, thread_id: str | None) -> None:
        self.provider = provider
        self.from_addr = from_addr
        self.thread_id = thread_id
        self.name = provider.name
        self.send_via = provider.send_via
        self.leaves_drafts = provider.leaves_drafts
        self.readback_first = provider.readback_first
        self.readback_rate = provider.readback_rate
        self.timeout = provider.timeout

    @property
    def mailbox(self) -> Mailbox:
        # Asked for at each use, never kept: a view that outlived its mailbox's drop
        # (queued behind an open circuit) spends the same bucket as the newer jobs'.
        return self.provider.mailbox(self.from_addr)

    def scope(self) -> str:
        # One circuit and one queue per mailbox where the quota is per mailbox.
        return self.provider.scope_of(self.mailbox.user.lower())

    def reserve_send(self) -> float:
        return self.provider.reserve_in(self.mailbox)

    def send_raw(self, raw: bytes) -> SendOutcome:
        return self.provider.send_as(self.mailbox, raw, self.thread_id)

    def search(self, message_id: str) -> SearchResult:
        return self.provider.search_in(self.mailbox, message_id)

    def read_reports(
        self,
        since: datetime,
        *,
        known: Collection[str],
        max_bytes: int,
        limit: int,
        may_go_on: Callable[[], bool] | None = None,
    ) -> ReportRead:
        return self.provider.report_calls.read(
            self.mailbox, since, known=known, max_bytes=max_bytes, limit=limit,
            may_go_on=may_go_on,
        )  # fmt: skip

    def forget_report_reads(self) -> None:
        self.provider.report_calls.forget(self.mailbox)

    def create_draft(self, raw: bytes) -> Draft:
        return self.provider.draft_calls.create(self.mailbox, raw, self.thread_id)

    def send_draft(self, draft: Draft) -> SendOutcome:
        return self.provider.draft_calls.send(self.mailbox, draft)

    def check_draft(self, draft: Draft) -> DraftCheck:
        return self.provider.draft_calls.check(self.mailbox, draft)

    def draft_raw(self, draft: Draft) -> bytes | None:
        return self.provider.draft_calls.raw(self.mailbox, draft)

    def find_drafts(self, message_id: str) -> list[Draft]:
        return self.provider.draft_calls.find(self.mailbox, message_id)

    def delete_draft(self, draft_id: str) -> bool:
        return self.provider.draft_calls.delete(self.mailbox, draft_id)

    def drafts(self) -> DraftsProvider | None:
        return self if self.send_via == "drafts" else None

    def history(self) -> HistoryProvider | None:
        return self if self.provider.reads_history else None

    def history_mark(self, before_call: Callable[[], None] | None = None) -> str | None:
        return self.provider.history_calls.mark(self.mailbox, before_call)

    def sent_since(self, history_id: str, message_id: str) -> SearchResult:
        return self.provider.history_calls.sent_since(self.mailbox, history_id, message_id)

    def delete_drafts(
        self, message_id: str, before_deleting: BeforeDeleting | None = None
    ) -> list[str]:
        return self.provider.delete_drafts_in(self.mailbox, message_id, before_deleting)

    def ping(self) -> None:
        self.provider.ping_as(self.mailbox)

    def read_message_id(self, provider_message_id: str) -> str | None:
        return self.provider.read_message_id_in(self.mailbox, provider_message_id)

    def quota_available(self) -> float:
        return self.mailbox.bucket.available

    def close(self) -> None:
        pass

    def __repr__(self) -> str:
        return f"GmailMailboxView({self.name!r}, user={self.mailbox.user!r})"
