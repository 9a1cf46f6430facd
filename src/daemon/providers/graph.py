"""The Microsoft Graph provider: raw MIME created as a draft, then sent; reconciled by the
draft's immutable id and by `$filter=internetMessageId eq '...'` on Sent Items.

docs/providers.md "Microsoft Graph setup" says what to register; "Outcome classification" in
docs/architecture.md (and `graph_classify.py`) what each answer means. Why two steps and
not `sendMail`: `sendMail` answers 202 with no id at all, so a lost answer leaves only the
search; a draft has an immutable id (`Prefer: IdType="ImmutableId"`) from before anything
is sent, it can be sent at most once, and the id stays the same when Graph files the sent
copy in Sent Items, so the copy can be read back by id, with no search index in between.

Nothing below `send_raw` sends a request twice ("No silent re-send" in
docs/architecture.md): every Graph call goes through `SingleShotHttp`
(`daemon/providers/transport.py`: one attempt, redirects off, "not sent" only from a failed
connect). Tokens come from msal (client credentials), whose requests go through a
`SingleShotHttp` each too (`graph_token_http.py`): none is repeated, and each ends within
`timeout` (a token request could not send mail anyway).
"""

from __future__ import annotations

import base64
import json
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime
from email.parser import BytesHeaderParser
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

from daemon.providers.answers import json_object
from daemon.providers.base import (
    Provider,
    ProviderBase,
    ProviderError,
    ReportRead,
    ScopeLost,
    SearchHit,
    SearchResult,
    SendKind,
    SendOutcome,
    next_call,
    stopped_before_send,
)
from daemon.providers.draft_handle import BeforeDeleting, DraftFirst
from daemon.providers.graph_classify import (
    TokenError,
    after_draft_delete,
    after_draft_sent,
    classify_create_exception,
    classify_create_response,
    classify_send_exception,
    classify_send_response,
    classify_token_failure,
    read_error,
    token_error,
)
from daemon.providers.graph_reports import KeptListings, read_reports_in
from daemon.providers.graph_token_http import TokenHttp
from daemon.providers.mailboxes import IDLE_AFTER, Mailboxes
from daemon.providers.outcomes import DeleteRefused, Fenced, first_copies
from daemon.providers.per_thread import PerThreadHttp
from daemon.providers.timeouts import timed_out
from daemon.providers.transport import (
    DEFAULT_MAX_IDLE,
    NotSentError,
    SingleShotHttp,
    TransportStats,
    describe,
)
from ledger.message_id import same_message_id

GRAPH_API = "https://graph.microsoft.com/v1.0"
AUTHORITY = "https://login.microsoftonline.com"
GRAPH_SCOPE = "https://graph.microsoft.com/.default"
IMMUTABLE_IDS = 'IdType="ImmutableId"'
#: `user = "{from}"`: act as each job's From mailbox (application permissions).
FROM_PLACEHOLDER = "{from}"
SENT_ITEMS = "sentitems"
#: Where a sent copy its sender deleted is: still a copy (`search_in`).
DELETED_ITEMS = "deleteditems"
DRAFTS = "drafts"
#: Where a draft deleted from Deleted Items lies (its well-known name), still read by id.
RECOVERABLE_ITEMS = "recoverableitemsdeletions"
#: A DELETE's 4xx that may be answered otherwise later: the rest are refusals for good.
#: 423: "the resource that is being accessed is locked" (Graph's error table), a lock that
#: ends, not a hold.
_REFUSED_FOR_NOW = frozenset({401, 404, 408, 409, 412, 423, 429})
#: A DELETE's answer (`GraphProvider._delete_once`): status, what Graph said, Retry-After.
_Refusal = tuple[int, str, float | None]
log = logging.getLogger("sendledger.providers.graph")

#: What deleting a draft came to (`GraphProvider._delete`).
DELETED, GONE, SENT = "deleted", "gone", "sent"
PAGE_SIZE = 100
MAX_PAGES = 50
# With what a person checking a copy is shown (docs/review.md "Review").
_SELECT = "id,internetMessageId,isDraft,parentFolderId,subject,toRecipients,sentDateTime"
#: Seconds between reads of a sent draft's id while waiting for its copy.
POLL_INTERVAL = 0.2
#: Message-IDs per mailbox whose unconfirmed drafts this process remembers.
REMEMBERED_DRAFTS = 10_000

Response = tuple[int, dict[str, str], bytes]


def trusted_ca_bundle(environ: Mapping[str, str] = os.environ) -> str | None:
    """The CA bundle the process is told to trust: REQUESTS_CA_BUNDLE, else SSL_CERT_FILE;
    None: the default bundle. Both the Graph calls and msal's requests (through the same
    transport, `graph_token_http.py`) are given it."""
    return environ.get("REQUESTS_CA_BUNDLE") or environ.get("SSL_CERT_FILE") or None


class GraphTokens:
    """Application tokens from msal's ConfidentialClientApplication (client credentials).

    The msal application is made on first use, not at start-up: making it runs msal's
    tenant discovery (an HTTP request), and a daemon must start while the identity
    platform is unreachable. msal caches the token until shortly before it expires."""

    def __init__(
        self,
        *,
        authority: str,
        tenant_id: str,
        client_id: str,
        credential: str | dict[str, str],
        timeout: float,
        ca_bundle: str | None = None,
    ) -> None:
        self.authority_url = f"{authority.rstrip('/')}/{tenant_id}"
        self.client_id = client_id
        self._credential = credential
        self._timeout = timeout
        # None: the bundle the process is told to trust when msal is made, else httplib2's
        # (requests, msal's own client, read the same variables).
        self._ca_bundle = ca_bundle
        self._lock = threading.Lock()
        self._app: Any = None

    def _application(self) -> Any:
        import msal

        with self._lock:
            if self._app is None:
                try:
                    self._app = msal.ConfidentialClientApplication(
                        self.client_id,
                        client_credential=self._credential,
                        authority=self.authority_url,
                        # Graph's own authority is known to msal; any other host (a
                        # national cloud's, the emulator's) would be refused without this.
                        instance_discovery=False,
                        http_client=TokenHttp(
                            timeout=self._timeout,
                            ca_certs=self._ca_bundle or trusted_ca_bundle(),
                        ),
                    )
                except TokenError:
                    raise  # TokenHttp's own: a redirect, named as it is
                except ValueError as exc:
                    # msal's tenant discovery got a 4xx (unknown tenant) or a bad key.
                    raise TokenError(
                        f"authority {self.authority_url}: {exc}", transient=False
                    ) from exc
                except Exception as exc:
                    raise TokenError(
                        f"authority {self.authority_url} unreachable: {describe(exc)}",
                        transient=True,
                    ) from exc
            return self._app

    def token(self) -> str:
        app = self._application()
        try:
            answer = app.acquire_token_for_client(scopes=[GRAPH_SCOPE])
        except TokenError:
            raise
        except Exception as exc:
            raise TokenError(f"token endpoint: {describe(exc)}", transient=True) from exc
        if not isinstance(answer, dict):
            raise TokenError("token endpoint: no answer", transient=True)
        if "access_token" not in answer:
            raise token_error(answer)
        return str(answer["access_token"])

    def invalidate(self) -> None:
        """Forget the cached token (Graph refused it: 401)."""
        with self._lock:
            app = self._app
        if app is not None:
            app.remove_tokens_for_client()

    def close(self) -> None:
        """Close msal's HTTP session: its keep-alive connection to the token endpoint
        stayed open after the provider closed (a reload's old provider kept it until the
        process ended). A later `token()` makes a new application."""
        with self._lock:
            app, self._app = self._app, None
        if app is not None:
            app.http_client.close()


class _Mailbox:
    """One mailbox the provider acts as: its request limit (Graph allows 4 concurrent
    requests per mailbox and app) and the drafts this process created, by Message-ID.
    With `user = "{from}"` one per From address, made on first use and dropped once idle
    (`daemon/providers/mailboxes.py`)."""

    def __init__(self, user: str, max_concurrent: int) -> None:
        self.user = user
        self.path = "/users/" + quote(user, safe="@")
        self.slots = threading.BoundedSemaphore(max_concurrent)
        self._calls = 0  # requests in flight (holding or waiting for a slot)
        self._lock = threading.Lock()
        # Oldest first; bounded, because forgetting one only loses the fast path (the
        # $filter still finds the copy) while keeping all would grow without end.
        self._drafts: OrderedDict[str, list[str]] = OrderedDict()
        #: The id of its Recoverable Items folder once Graph has answered it.
        self.recoverable: str | None = None

    def remember(self, message_id: str | None, draft_id: str) -> None:
        if message_id is not None:
            with self._lock:
                key = _key(message_id)
                self._drafts.setdefault(key, []).append(draft_id)
                self._drafts.move_to_end(key)
                while len(self._drafts) > REMEMBERED_DRAFTS:
                    self._drafts.popitem(last=False)

    def drafts(self, message_id: str) -> list[str]:
        with self._lock:
            return list(self._drafts.get(_key(message_id), ()))

    @contextmanager
    def slot(self) -> Iterator[None]:
        """One of the mailbox's request slots, for one request (waited for)."""
        with self._lock:
            self._calls += 1
        try:
            with self.slots:
                yield
        finally:
            with self._lock:
                self._calls -= 1

    def idle_at(self, now: float) -> float | None:
        """None when a fresh mailbox would equal this one: no request in flight and no
        draft remembered (a draft of an attempt not yet settled is what its next
        attempt tidies). Otherwise when to look again."""
        with self._lock:
            if self._calls == 0 and not self._drafts:
                return None
            return now + (1.0 if self._calls else IDLE_AFTER)

    def forget(self, message_id: str | None, draft_id: str) -> None:
        if message_id is None:
            return
        with self._lock:
            ids = self._drafts.get(_key(message_id), [])
            if draft_id in ids:
                ids.remove(draft_id)
            if not ids:
                self._drafts.pop(_key(message_id), None)


def _key(message_id: str) -> str:
    return message_id.strip().strip("<>").lower()


def _message_id(raw: bytes) -> str | None:
    found = BytesHeaderParser().parsebytes(raw).get("Message-ID")
    return None if found is None else str(found)


def _made_drafts(mailbox: _Mailbox, message_id: str, recorded: Collection[str]) -> list[str]:
    """The drafts made for `message_id`: this process's, then those recorded."""
    return list(dict.fromkeys([*mailbox.drafts(message_id), *recorded]))


def filter_value(message_id: str) -> str:
    """The internetMessageId Graph stores (angle brackets included) as an OData literal.
    Refuses values that could change the filter's meaning."""
    value = message_id.strip()
    if not (value.startswith("<") and value.endswith(">")):
        value = f"<{value.strip('<>')}>"
    if len(value) < 3 or any(c.isspace() or ord(c) < 32 for c in value):
        raise ProviderError(f"cannot search for Message-ID {message_id!r}")
    return "'" + value.replace("'", "''") + "'"


class GraphProvider(ProviderBase):
    """The provider port on Microsoft Graph. Thread-safe: each thread has its own HTTP
    connection pool (httplib2 is not thread-safe); the token is shared.

    With `user = "{from}"` it acts as each job's From mailbox (application permissions
    reach every mailbox the application access policy allows): `for_job` gives the view
    the engine calls for one job (docs/providers.md "Providers")."""

    response_ids_readable = True
    leaves_drafts = True  # each send creates its draft first
    reads_reports = True

    def __init__(
        self,
        name: str,
        *,
        tokens: GraphTokens,
        user: str,
        api_endpoint: str = GRAPH_API,
        timeout: float = 10.0,
        max_concurrent: int = 4,
        confirm_wait: float = 3.0,
        ca_certs: str | None = None,
        reuse_connections: bool = True,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if timeout <= 0:
            raise ValueError(f"timeout must be positive, got {timeout!r}")
        if max_concurrent < 1:
            raise ValueError(f"max_concurrent must be at least 1, got {max_concurrent!r}")
        if confirm_wait < 0:
            raise ValueError(f"confirm_wait must not be negative, got {confirm_wait!r}")
        if not user:
            raise ValueError('user must be a mailbox address or "{from}"')
        self.name = name
        self.user = user
        self.per_mailbox = user == FROM_PLACEHOLDER
        self.api_endpoint = api_endpoint.rstrip("/")
        self.timeout = float(timeout)
        self.max_concurrent = max_concurrent
        self.confirm_wait = float(confirm_wait)
        self.ca_certs = ca_certs
        self.reuse_connections = reuse_connections
        self.transport_stats = TransportStats()
        self._tokens = tokens
        self._clock = clock
        self._sleep = sleep
        self.mailboxes: Mailboxes[_Mailbox] = Mailboxes(
            lambda address: _Mailbox(address, max_concurrent), clock=clock
        )
        self._default = None if self.per_mailbox else _Mailbox(user, max_concurrent)
        self._transports = PerThreadHttp(self._new_transport)
        self._closed = False
        #: Each mailbox's report listing that stopped before its end (`graph_reports.py`).
        self.report_listings = KeptListings()

    # -- mailboxes ---------------------------------------------------------------------

    def mailbox(self, from_addr: str) -> _Mailbox:
        """The configured mailbox, or with "{from}" the From address's own (made on first
        use)."""
        if self._default is not None:
            return self._default
        return self.mailboxes.get(from_addr)

    def forget_idle(self) -> int:
        """With "{from}": the mailboxes a fresh one would equal, dropped once idle."""
        return self.mailboxes.forget_idle() if self.per_mailbox else 0

    def for_job(self, from_addr: str, thread_id: str | None) -> Provider:
        """The provider as one job sees it: with "{from}", acting as its From mailbox."""
        if self._default is not None:
            return self
        self.mailbox(from_addr)  # a From it cannot act as fails here, at the job's load
        return GraphMailboxView(self, from_addr)

    def scope_of(self, mailbox: str) -> str:
        # Graph limits requests per mailbox: with "{from}" each is a scope of its own.
        return self.name if self._default is not None else f"{self.name}/{mailbox}"

    def _unscoped(self) -> _Mailbox:
        if self._default is None:
            raise ProviderError(
                f'provider {self.name!r} has user = "{FROM_PLACEHOLDER}": say which mailbox'
            )
        return self._default

    # -- plumbing ----------------------------------------------------------------------

    def _new_transport(self) -> SingleShotHttp:
        return SingleShotHttp(
            timeout=self.timeout,
            reuse=self.reuse_connections,
            max_idle=DEFAULT_MAX_IDLE,
            stats=self.transport_stats,
            ca_certs=self.ca_certs,
        )

    def _request(
        self,
        mailbox: _Mailbox,
        method: str,
        path: str,
        *,
        body: bytes | None = None,
        content_type: str | None = None,
        url: str | None = None,
    ) -> Response:
        """One attempt of one Graph call as `mailbox`: (status, lower-cased headers, body).
        Raises TokenError (nothing left), NotSentError or ResponseLostError."""
        if self._closed:
            raise RuntimeError(f"provider {self.name!r} is closed")
        token = self._tokens.token()
        headers = {
            "Authorization": f"Bearer {token}",
            "Prefer": IMMUTABLE_IDS,
            "Accept": "application/json",
        }
        if content_type is not None:
            headers["Content-Type"] = content_type
        target = url or f"{self.api_endpoint}{mailbox.path}{path}"
        with mailbox.slot():
            response, content = self._transports.get().request(
                target, method, body=body if body is not None else "", headers=headers
            )
        status = int(response.status)
        if status == 401:
            self._tokens.invalidate()
        return status, {str(k).lower(): str(v) for k, v in response.items()}, bytes(content)

    def _get_json(
        self, what: str, mailbox: _Mailbox, path: str, *, url: str | None = None
    ) -> dict[str, Any] | None:
        """A GET's JSON object, or None on 404. Raises ProviderError when the answer is not
        known (no answer, another non-2xx, an unreadable body)."""
        answer = self.get_body(what, mailbox, path, url=url)
        return None if answer is None else json_object(what, answer[0], answer[1])

    def get_body(
        self, what: str, mailbox: _Mailbox, path: str, *, url: str | None = None
    ) -> tuple[int, bytes] | None:
        """A GET's (2xx status, body), or None on 404. Raises ProviderError when the
        answer is not known (no answer, another non-2xx)."""
        try:
            status, headers, body = self._request(mailbox, "GET", path, url=url)
        except TokenError as exc:
            # As for a send: a token endpoint to wait for is an unavailable provider.
            raise ProviderError(f"{what}: {exc.reason}", unavailable=exc.transient) from exc
        except Exception as exc:
            detail = getattr(exc, "message", None) or describe(exc)
            # No connection made: unavailable, counted toward the circuit.
            unavailable = isinstance(exc, NotSentError)
            raise ProviderError(
                f"{what}: {detail}", unavailable=unavailable, timed_out=timed_out(exc)
            ) from exc
        if status == 404:
            return None
        if not 200 <= status < 300:
            raise read_error(what, status, headers, body)
        return status, body

    def _message(self, mailbox: _Mailbox, provider_id: str) -> dict[str, Any] | None:
        """The message under an immutable id, or None when Graph answers 404 (deleted, or
        sent and not filed yet)."""
        path = f"/messages/{quote(provider_id, safe='')}?$select={_SELECT}"
        return self._get_json(f"get {provider_id}", mailbox, path)

    def _delete_once(self, mailbox: _Mailbox, draft_id: str) -> _Refusal | None:
        """One DELETE by immutable id: its HTTP status and, refused, what Graph said and its
        Retry-After; None when no answer came."""
        try:
            status, headers, body = self._request(
                mailbox, "DELETE", f"/messages/{quote(draft_id, safe='')}"
            )
        except Exception:
            return None
        if 200 <= status < 300 or status == 404:
            return status, "", None
        error = read_error("DELETE", status, headers, body)
        return status, error.reason, error.retry_after

    def _delete(self, mailbox: _Mailbox, draft_id: str) -> str | _Refusal | None:
        """Delete a draft read as one, for good: `DELETED`; `GONE` (404: gone already, or
        a late send took it and it is in transit); `SENT` (a late send took it before the
        DELETE: under its immutable id the item moved was the sent copy, now put back in
        Sent Items); else the HTTP status that refused it, what Graph said and its
        Retry-After, or None when no answer came.

        Graph's DELETE moves an item to Deleted Items, where a draft is still a draft that
        a send by its immutable id sends (a stalled attempt's call landing late): no fence.
        So what was moved is read back: a draft is deleted again, which from Deleted Items
        is for good (read back once more: a copy a late send filed meanwhile is what that
        DELETE moved); a sent copy goes back to Sent Items, where searches count it."""
        answer = self._delete_once(mailbox, draft_id)
        if answer is None or answer[0] == 404 or not 200 <= answer[0] < 300:
            return GONE if answer is not None and answer[0] == 404 else answer
        try:
            found = self._message(mailbox, draft_id)
            # A draft that was in Deleted Items (a person's delete): that DELETE purged it.
            purged = (
                found is not None
                and found.get("isDraft") is True
                and self._recoverable(mailbox, found)
            )
        except ProviderError:
            return None  # it may still be a draft in Deleted Items: not fenced yet
        if found is None:
            return GONE
        if found.get("isDraft") is not True:
            self._restore(mailbox, draft_id)
            return SENT
        if purged:
            return DELETED
        answer = self._delete_once(mailbox, draft_id)
        if answer is None or answer[0] == 404 or not 200 <= answer[0] < 300:
            return GONE if answer is not None and answer[0] == 404 else answer
        # From Deleted Items that DELETE is for good, unless a late send took the draft
        # since the read and Graph filed the copy: then it moved the copy there.
        try:
            found = self._message(mailbox, draft_id)
        except ProviderError:
            return None  # not known which it deleted: the fence is not proven
        if found is not None and found.get("isDraft") is not True:
            self._restore(mailbox, draft_id)
            return SENT
        return DELETED  # gone, or a draft in Recoverable Items: as deleted as Graph makes it

    def _restore(self, mailbox: _Mailbox, copy_id: str) -> None:
        """Move a sent copy a fence's DELETE moved to Deleted Items back to Sent Items
        (best effort: searches count a copy in Deleted Items when Sent Items has none)."""
        try:
            self._request(
                mailbox,
                "POST",
                f"/messages/{quote(copy_id, safe='')}/move",
                body=json.dumps({"destinationId": SENT_ITEMS}).encode(),
                content_type="application/json",
            )
        except Exception:
            log.warning("sent copy %s left in Deleted Items", copy_id)

    # -- the port ----------------------------------------------------------------------

    def send_raw(self, raw: bytes) -> SendOutcome:
        if self._default is not None:
            return self.send_as(self._default, raw)
        sender = BytesHeaderParser().parsebytes(raw).get("From")
        if sender is None:
            raise ValueError(f'provider {self.name!r}: "{FROM_PLACEHOLDER}" needs a From header')
        return self.send_as(self.mailbox(str(sender)), raw)

    def send_as(self, mailbox: _Mailbox, raw: bytes) -> SendOutcome:
        """Create the draft, send it, and read its copy back (see the module docstring and
        `graph_classify.py` for what each answer means). Never raises for the outcome.
        The engine takes the two steps apart (`make_draft_in`, `send_made_in`), so the
        draft's id is recorded with the claim before it is sent."""
        message_id = _message_id(raw)
        if message_id is not None:
            earlier = self._tidy(mailbox, message_id)
            if earlier is not None:
                return earlier
        created = self._create(mailbox, raw, message_id)
        if isinstance(created, SendOutcome):
            return created
        # No `next_call` between the create and its send: stopped there, the draft just
        # made would stay sendable in Drafts, and deleting it is a fence of several
        # calls, more calls than the one send that makes the attempt whole.
        return self._send_draft(mailbox, message_id, created)

    def make_draft_in(self, mailbox: _Mailbox, raw: bytes) -> str | SendOutcome:
        """The create step alone, before the claim (`DraftFirst.make_draft`)."""
        return self._create(mailbox, raw, _message_id(raw))

    def send_made_in(
        self, mailbox: _Mailbox, raw: bytes, draft_id: str, earlier: Collection[str]
    ) -> SendOutcome:
        """The send step of a draft `make_draft_in` made (`DraftFirst.send_made`), after
        the tidy of the drafts of earlier attempts, this process's and those the job
        recorded (`earlier`), the draft itself left out. Stopped or answered by that
        tidy, the draft is not sent: it is recorded, so the job's next attempt tidies it,
        or, after an Unknown, the sweep's fence deletes it by its id."""
        message_id = _message_id(raw)
        if message_id is not None:
            tidied = self._tidy(mailbox, message_id, earlier, leave=draft_id)
            if tidied is not None:
                return tidied
        return self._send_draft(mailbox, message_id, draft_id)

    def _create(self, mailbox: _Mailbox, raw: bytes, message_id: str | None) -> str | SendOutcome:
        """The create step: the new draft's immutable id (remembered by this process),
        or the create's outcome (a refusal: nothing made that could be sent)."""
        try:
            status, headers, body = self._request(
                mailbox,
                "POST",
                "/messages",
                body=base64.b64encode(raw),
                content_type="text/plain",
            )
        except TokenError as exc:
            return classify_token_failure(exc)
        except Exception as exc:
            return classify_create_exception(exc)
        created = classify_create_response(status, headers, body)
        if isinstance(created, SendOutcome):
            return created
        mailbox.remember(message_id, created)
        return created

    def _send_draft(self, mailbox: _Mailbox, message_id: str | None, draft_id: str) -> SendOutcome:
        """The send step of the draft `draft_id`, its copy read back, a refusal proven."""
        try:
            status, headers, body = self._request(
                mailbox, "POST", f"/messages/{quote(draft_id, safe='')}/send"
            )
        except TokenError as exc:
            outcome = classify_token_failure(exc)
        except Exception as exc:
            outcome = classify_send_exception(exc)
        else:
            outcome = classify_send_response(status, headers, body)
            if 200 <= status < 300:
                outcome = self._await_copy(mailbox, draft_id, outcome)
                if outcome.kind is SendKind.CONFIRMED:
                    mailbox.forget(message_id, draft_id)  # settled: no search will need it
                return outcome
        if outcome.kind is SendKind.REJECTED:
            return self._prove_refusal(mailbox, message_id, draft_id, outcome)
        return outcome

    def _prove_refusal(
        self, mailbox: _Mailbox, message_id: str | None, draft_id: str, refused: SendOutcome
    ) -> SendOutcome:
        """A send-step refusal is proven by deleting the draft while it is still a draft.
        Under its immutable id a draft Graph did send is its sent copy (in transit: 404;
        filed: isDraft false): that is no proof, and deleting it would delete the copy.

        Asked before its read whether the send's quota scope is still this daemon's
        (`next_call`; the send's calls may each have taken the timeout): gone, the proof
        is not made and the outcome is Unknown, not the refusal. The job's next attempt
        is then the scope owner's: Unknown hands the job to that owner's sweep, which
        fences the message's drafts (this one by the id its claim recorded: the owner's
        process does not remember it) and then searches. Once read, the
        draft's fence is not interrupted (stopped between its calls, a draft would be
        left in Deleted Items, still sendable)."""
        try:
            next_call(f"prove the refusal of {draft_id}")
        except ScopeLost as lost:
            return SendOutcome(
                SendKind.UNKNOWN, f"{refused.reason}; not proven: {lost}", status=refused.status
            )
        try:
            found = self._message(mailbox, draft_id)
        except ProviderError:
            return refused  # no answer: the draft stays; the next attempt or search fences it
        if found is None:
            return after_draft_delete(refused, 404)  # remembered: a search reads it by id
        if found.get("isDraft") is not True:
            return after_draft_sent(refused)
        deleted = self._delete(mailbox, draft_id)
        if deleted == SENT:
            return after_draft_sent(refused)
        if deleted == DELETED:
            mailbox.forget(message_id, draft_id)
            return after_draft_delete(refused, 204)
        # Gone (it may be a copy in transit) stays remembered: a search reads it by id.
        return after_draft_delete(refused, 404 if deleted == GONE else None)

    def _tidy(
        self,
        mailbox: _Mailbox,
        message_id: str,
        recorded: Collection[str] = (),
        *,
        leave: str | None = None,
    ) -> SendOutcome | None:
        """Before another attempt of the same message: delete the drafts of earlier ones
        that are still drafts (a rejected send whose draft could not be deleted then, nor
        read to prove the refusal), so none can be sent besides the new one. None: the
        attempt goes ahead. Else what it is instead, with nothing created or sent: a draft
        that is no draft any more was sent (a 429 / 503 a gateway answered after Graph
        sent it), so this attempt would be a second copy: Unknown, and the search finds
        that copy by its immutable id; a draft that cannot be read or deleted now may be
        sent yet: not sent, try again (Rejected, transient).

        Before each draft's read, and before the create that follows a tidy that made
        calls, it asks whether the quota scope is still this daemon's (`next_call`):
        gone, nothing is created or sent (`stopped_before_send`: Rejected, transient,
        not unavailable, so no failure for the circuit, and not an attempt, so not counted
        against `max_attempts`), the drafts left are the next attempt's to tidy or the
        sweep's to fence. Not between a draft's read and its fence, nor inside the fence
        (`delete_drafts_in`). `recorded`: the drafts of the job's earlier attempts its
        claims recorded (another daemon's too); `leave`: the draft about to be sent."""
        tidied = False
        for draft_id in _made_drafts(mailbox, message_id, recorded):
            if draft_id == leave:
                continue
            try:
                next_call(f"tidy the drafts of {message_id}")
                tidied = True
                found = self._message(mailbox, draft_id)
                if found is not None and found.get("isDraft") is True:
                    if self._recoverable(mailbox, found):
                        continue  # fenced before: as deleted as Graph makes it
                    if not self._fence(mailbox, message_id, draft_id):
                        # A late send took it between the read and the DELETE (its copy
                        # moved back to Sent Items, or in transit): another would be a
                        # second copy.
                        return SendOutcome(
                            SendKind.UNKNOWN,
                            f"not sent again: the draft {draft_id} of an earlier attempt"
                            " was sent while it was being deleted",
                        )
                elif found is not None:
                    return SendOutcome(
                        SendKind.UNKNOWN,
                        f"not sent again: the draft {draft_id} of an earlier attempt was sent",
                    )
            except ScopeLost as lost:
                return stopped_before_send(lost)
            except DeleteRefused as exc:
                # Refused for good: sent now, this attempt's copy might be the second one
                # that draft makes; tried again, refused again. A person decides.
                return SendOutcome(SendKind.REJECTED, f"not sent: {exc.reason}")
            except ProviderError as exc:
                return SendOutcome(
                    SendKind.REJECTED,
                    f"the draft {draft_id} of an earlier attempt could not be checked "
                    f"({exc.reason}); not sent",
                    transient=True,
                    retry_after=exc.retry_after,
                    unavailable=exc.unavailable,
                    timed_out=exc.timed_out,
                )
        if tidied:
            try:
                next_call(f"send {message_id}")
            except ScopeLost as lost:
                return stopped_before_send(lost)
        return None

    def _await_copy(self, mailbox: _Mailbox, draft_id: str, accepted: SendOutcome) -> SendOutcome:
        """After a 202: read the draft's immutable id until Graph has filed the sent copy
        (Confirmed with that id) or `confirm_wait` has passed (Unknown: the search will
        settle it). Before each read it asks whether the quota scope is still this
        daemon's (`next_call`): gone, the polling stops there, Unknown, which the search
        of the scope's owner settles (the copy is found by its Message-ID)."""
        end = self._clock() + self.confirm_wait
        while True:
            try:
                next_call(f"read back {draft_id}")
                found = self._message(mailbox, draft_id)
            except ScopeLost as lost:
                return SendOutcome(
                    SendKind.UNKNOWN, f"{accepted.reason}; {lost}", status=accepted.status
                )
            except ProviderError as exc:
                return SendOutcome(
                    SendKind.UNKNOWN, f"{accepted.reason}; read-back failed: {exc.reason}"
                )
            if found is not None and found.get("isDraft") is False:
                return SendOutcome(
                    SendKind.CONFIRMED,
                    f"{accepted.reason.removesuffix(', sent copy not seen yet')}; copy filed",
                    provider_message_id=str(found.get("id") or draft_id),
                    status=accepted.status,
                )
            left = end - self._clock()
            if left <= 0:
                return SendOutcome(
                    SendKind.UNKNOWN,
                    f"{accepted.reason} within {self.confirm_wait:g}s",
                    status=accepted.status,
                )
            self._sleep(min(POLL_INTERVAL, left))

    def search(self, message_id: str) -> SearchResult:
        return self.search_in(self._unscoped(), message_id)

    def search_made(
        self, message_id: str, draft_ids: Collection[str], fenced: Fenced | None = None
    ) -> SearchResult:
        return self.search_in(self._unscoped(), message_id, draft_ids, fenced)

    def search_in(
        self,
        mailbox: _Mailbox,
        message_id: str,
        recorded: Collection[str] = (),
        fenced: Fenced | None = None,
    ) -> SearchResult:
        """Every sent copy whose Message-ID header is `message_id`: Sent Items and Deleted
        Items (its hits `in_trash`, searched only when no other copy was found) searched
        by `$filter=internetMessageId eq '...'` through every page, joined
        with this
        process's drafts of it that are no drafts any more (read by immutable id: a copy
        the filter may not show yet), and with those the job's claims recorded
        (`recorded`, another process's too), read the same way: a person's check in a
        fresh process counts the copy a recorded draft became, as the daemon's sweep
        does, while the index lags. Reads only: a
        human's check may run while the job's send is in flight, and deleting its draft
        then would make that send fail (the engine fences with `delete_drafts` before it
        counts a lapsed claim's copies). `fenced`: as `_drafts_sent`.
        """
        literal = filter_value(message_id)
        hits = self._drafts_sent(mailbox, message_id, recorded, fenced)
        # Deleted Items too, when nothing else was found: a sent copy its sender deleted
        # was sent (Gmail's search counts trashed copies), but a message received with
        # our Message-ID and deleted lies there as well, so its hits are marked
        # `in_trash` and settle nothing alone (`decisions.after_search`: review). Not
        # beside a sent copy: a message addressed to its own mailbox has its received
        # copy there once deleted, which would make a false duplicate. Immutable ids name
        # an item wherever it moves, so a copy moved meanwhile is counted once; a deleted
        # draft is no copy.
        searched = []
        complete = True
        for folder in (SENT_ITEMS, DELETED_ITEMS):
            if folder == DELETED_ITEMS and hits:
                break
            searched.append(folder)
            listed = self._filtered(mailbox, folder, literal)
            read = self._new_hits(hits, listed, message_id, in_trash=folder == DELETED_ITEMS)
            more, complete = first_copies(read, folder)
            hits.update((hit.provider_message_id, hit) for hit in more)
        query = " and ".join(
            f"mailFolders/{folder}/messages?$filter=internetMessageId eq {literal}"
            for folder in searched
        )
        return SearchResult(query=query, hits=tuple(hits.values()), complete=complete)

    def _drafts_sent(
        self,
        mailbox: _Mailbox,
        message_id: str,
        recorded: Collection[str],
        fenced: Fenced | None,
    ) -> dict[str, SearchHit]:
        """The copies this process's drafts of `message_id` and those `recorded` became,
        each read by immutable id, by the copy's id. A draft the fence just before
        (`fenced`) read as no draft, or deleted for good, is taken as that fence read it:
        neither can change since. One it found gone, before or under its deletion, is
        read again: a late send's copy in transit then may be filed now."""
        hits: dict[str, SearchHit] = {}
        known = {} if fenced is None else fenced.read
        for draft_id in _made_drafts(mailbox, message_id, recorded):
            if draft_id in known:
                found = known[draft_id]
            else:
                # Before each call, as before each page (`items`): one search is several
                # calls, and the scope may go to another daemon between two (`next_call`).
                next_call(f"search {filter_value(message_id)}")
                found = self._message(mailbox, draft_id)
            if found is not None and found.get("isDraft") is False:
                hit = self._hit(found, message_id)
                if hit is not None:
                    hits.setdefault(hit.provider_message_id, hit)
        return hits

    def delete_drafts(
        self, message_id: str, before_deleting: BeforeDeleting | None = None
    ) -> list[str]:
        mailbox = self._unscoped()
        return self.delete_drafts_in(mailbox, message_id, before_deleting=before_deleting).deleted

    def draft_first(self) -> DraftFirst:
        return self

    def make_draft(self, raw: bytes) -> str | SendOutcome:
        return self.make_draft_in(self._unscoped(), raw)

    def send_made(self, raw: bytes, draft_id: str, earlier: Collection[str]) -> SendOutcome:
        return self.send_made_in(self._unscoped(), raw, draft_id, earlier)

    def delete_made(
        self,
        message_id: str,
        draft_ids: Collection[str],
        *,
        filtered: bool = True,
        before_deleting: BeforeDeleting | None = None,
    ) -> Fenced:
        return self.delete_drafts_in(
            self._unscoped(),
            message_id,
            draft_ids,
            filtered=filtered,
            before_deleting=before_deleting,
        )

    def delete_drafts_in(
        self,
        mailbox: _Mailbox,
        message_id: str,
        recorded: Collection[str] = (),
        *,
        filtered: bool = True,
        before_deleting: BeforeDeleting | None = None,
    ) -> Fenced:
        """Every draft of `message_id` that is still a draft, deleted, so it can never be
        sent: this process's and those the job's claims recorded (`recorded`, another
        daemon's too), read by immutable id, and (`filtered`) those `$filter` finds in
        Drafts whose header is exactly ours (a lagging index may not list one yet), each
        one deleted only once `before_deleting` has taken the list. The
        ids deleted (one already gone is not counted), and what was read by id that
        the search after the fence need not read again (`Fenced.read`). Not
        `filtered`, only `recorded`: a claim not saved deletes its own draft, not the
        one of the claim that won, whose send may be under way."""
        literal = filter_value(message_id)
        candidates: list[str] = []
        read: dict[str, dict[str, Any] | None] = {}
        mine = mailbox.drafts(message_id)
        ids = _made_drafts(mailbox, message_id, recorded) if filtered else list(recorded)
        for draft_id in ids:
            next_call(f"delete drafts {literal}")  # as in `search_in`
            found = self._message(mailbox, draft_id)
            if found is not None and draft_id not in mine:
                # Another process's (its claim recorded it): remembered as this process's
                # own are, so the search after the fence reads by id the copy a send of
                # it made, which `$filter` may not show for minutes, and `_fence` keeps
                # a late send's copy counted.
                mailbox.remember(message_id, draft_id)
            if found is not None and found.get("isDraft") is True:
                if self._recoverable(mailbox, found):
                    read[draft_id] = None  # fenced before: as deleted as Graph makes it
                else:
                    candidates.append(draft_id)
            elif found is not None:
                read[draft_id] = found  # no draft: a copy stays one, whatever comes after
        # Deleted Items too: a draft deleted there (by a person, or by an earlier
        # release's fence) can still be sent by its id.
        for folder in (DRAFTS, DELETED_ITEMS) if filtered else ():
            for found in self._filtered(mailbox, folder, literal):
                listed, header = found.get("id"), found.get("internetMessageId")
                # The filter's match is Graph's (Exchange compares strings without
                # case): a draft is deleted only when its header is exactly ours, as a
                # search counts a copy (`_hit`).
                if (
                    found.get("isDraft") is True
                    and isinstance(listed, str)
                    and isinstance(header, str)
                    and same_message_id(header, message_id)
                ):
                    candidates.append(listed)
        to_delete = list(dict.fromkeys(candidates))
        if before_deleting is not None:
            before_deleting(to_delete)
        deleted: list[str] = []
        refused: list[str] = []
        for draft_id in to_delete:
            # Not inside one fence (a DELETE, a read, maybe a second DELETE): stopped
            # there, the draft would be left in Deleted Items, still sendable.
            next_call(f"delete drafts {literal}")
            try:
                if self._fence(mailbox, message_id, draft_id):
                    deleted.append(draft_id)
                    read[draft_id] = None  # deleted for good: no late send makes it a copy
            except DeleteRefused as exc:
                refused.append(exc.reason)  # the others deleted all the same
        if refused:
            raise DeleteRefused("; ".join(refused), deleted=deleted)
        return Fenced(deleted, read)

    def ping(self) -> None:
        self.ping_as(self._unscoped())

    def ping_as(self, mailbox: _Mailbox) -> None:
        """One page of one message's id from Sent Items: sends nothing (a circuit's probe
        after a hang)."""
        path = f"/mailFolders/{SENT_ITEMS}/messages?$top=1&$select=id"
        if self._get_json("ping (Sent Items)", mailbox, path) is None:
            raise ProviderError("ping (Sent Items): HTTP 404 (no such mailbox or folder)")

    def _fence(self, mailbox: _Mailbox, message_id: str, draft_id: str) -> bool:
        """Delete one unsent draft for good: True when deleted, False when it was gone or
        a late send took it first (its copy, kept remembered, is what a search counts)."""
        deleted = self._delete(mailbox, draft_id)
        if deleted == DELETED:
            mailbox.forget(message_id, draft_id)
            return True
        if deleted in (GONE, SENT):
            return False
        if deleted is None or isinstance(deleted, str):
            raise ProviderError(f"delete unsent draft {draft_id}: no answer")
        status, said, retry_after = deleted
        if 400 <= status < 500 and status not in _REFUSED_FOR_NOW and retry_after is None:
            # Asked again, Graph answers the same (a hold, a retention label, the app's
            # access): left to be retried, the job's sweep would fail at every return. A
            # refusal that says when to ask again (Retry-After) is not one for good.
            raise DeleteRefused(f"the unsent draft {draft_id} cannot be deleted: {said}")
        raise ProviderError(f"delete unsent draft {draft_id}: {said}", retry_after=retry_after)

    def _recoverable(self, mailbox: _Mailbox, found: Mapping[str, Any]) -> bool:
        """Whether a draft read by id lies in Recoverable Items, where a fence's DELETE
        from Deleted Items put it (`_delete`: as deleted as Graph makes it): no send takes
        it from there, and Graph refuses to delete it again (403, "you may not be able to
        delete items in the recoverable items deletions folder"), so it is fenced. The
        folder's id is asked once per mailbox (by its well-known name), as a part of the
        draft's read: no `next_call` between the read and the fence it decides."""
        folder = found.get("parentFolderId")
        if not isinstance(folder, str) or not folder:
            return False
        if mailbox.recoverable is None:
            what = f"get folder {RECOVERABLE_ITEMS}"
            answer = self._get_json(what, mailbox, f"/mailFolders/{RECOVERABLE_ITEMS}?$select=id")
            known = None if answer is None else answer.get("id")
            if not isinstance(known, str) or not known:
                # Not kept: one 404 kept for the process's life would send every draft
                # fenced there to review, or its next attempt to a refusal for good.
                return False
            mailbox.recoverable = known
        return folder == mailbox.recoverable

    @staticmethod
    def _hit(found: Mapping[str, Any], message_id: str, in_trash: bool = False) -> SearchHit | None:
        """The message as a copy (`in_trash`: listed in Deleted Items); None when its
        Message-ID is not exactly ours."""
        provider_id, header = found.get("id"), found.get("internetMessageId")
        if not isinstance(provider_id, str) or not isinstance(header, str):
            raise ProviderError(f"search: malformed message entry {found!r}")
        if not same_message_id(header, message_id):
            return None
        folder = found.get("parentFolderId")
        return SearchHit(
            provider_id,
            header,
            (str(folder),) if folder else (),
            date=_text(found.get("sentDateTime")),
            to=_recipients(found.get("toRecipients")),
            subject=_text(found.get("subject")),
            in_trash=in_trash,
        )

    def _new_hits(
        self,
        hits: dict[str, SearchHit],
        listed: Iterator[dict[str, Any]],
        message_id: str,
        *,
        in_trash: bool,
    ) -> Iterator[SearchHit | None]:
        """Each listed message as a copy not in `hits` yet, or None (a draft, a copy
        counted already, another Message-ID): what `first_copies` reads."""
        for found in listed:
            draft = found.get("isDraft") is True
            hit = None if draft else self._hit(found, message_id, in_trash)
            yield None if hit is None or hit.provider_message_id in hits else hit

    def _filtered(self, mailbox: _Mailbox, folder: str, literal: str) -> Iterator[dict[str, Any]]:
        """The folder's messages with the Message-ID, page by page as they are pulled (a
        search that stops early, `first_copies`, asks for no further page)."""
        what = f"search {folder} for {literal}"
        path = (
            f"/mailFolders/{folder}/messages?$filter="
            + quote(f"internetMessageId eq {literal}", safe="")
            + f"&$select={_SELECT}&$top={PAGE_SIZE}"
        )
        return self.each_item(what, mailbox, path)

    def items(self, what: str, mailbox: _Mailbox, path: str) -> list[dict[str, Any]]:
        """Every item of a listing, every page (next links on our own endpoint only)."""
        return list(self.each_item(what, mailbox, path))

    def each_item(self, what: str, mailbox: _Mailbox, path: str) -> Iterator[dict[str, Any]]:
        """The items of a listing, each page asked for when the one before is used up."""
        url: str | None = None
        for _ in range(MAX_PAGES):
            next_call(what)
            items, url = self.page(what, mailbox, path, url=url)
            yield from items
            if url is None:
                return
        raise ProviderError(f"{what}: more than {MAX_PAGES} pages")

    def page(
        self, what: str, mailbox: _Mailbox, path: str, *, url: str | None = None
    ) -> tuple[list[dict[str, Any]], str | None]:
        """One page of a listing (`url`: a next link it gave, else its first page): its
        items and the next page's link on our own endpoint (None: the last page)."""
        page = self._get_json(what, mailbox, path, url=url)
        if page is None:
            raise ProviderError(f"{what}: HTTP 404 (no such mailbox or folder)")
        items = page.get("value")
        if not isinstance(items, list):
            raise ProviderError(f"{what}: answer without a value list")
        next_link = page.get("@odata.nextLink")
        found = [item for item in items if isinstance(item, dict)]
        return found, (self._own_link(what, next_link) if next_link else None)

    def _own_link(self, what: str, link: Any) -> str:
        """A next-page link, always on our own api_endpoint: the token goes to no other
        host, and a link that names the upstream of a proxy still works."""
        base = urlsplit(self.api_endpoint)
        parts = urlsplit(link) if isinstance(link, str) else None
        if parts is None or not parts.path.startswith(base.path.rstrip("/") + "/"):
            raise ProviderError(f"{what}: next page link outside {self.api_endpoint}: {link!r}")
        return urlunsplit((base.scheme, base.netloc, parts.path, parts.query, ""))

    def read_message_id(self, provider_message_id: str) -> str | None:
        return self.read_message_id_in(self._unscoped(), provider_message_id)

    def read_reports(
        self,
        since: datetime,
        *,
        known: Collection[str],
        max_bytes: int,
        limit: int,
        may_go_on: Callable[[], bool] | None = None,
    ) -> ReportRead:
        mailbox = self._unscoped()
        return read_reports_in(
            self, mailbox, since, known=known, max_bytes=max_bytes, limit=limit,
            kept=self.report_listings, key=mailbox.user, may_go_on=may_go_on,
        )  # fmt: skip

    def forget_report_reads(self) -> None:
        self.report_listings.take(self._unscoped().user)

    def read_message_id_in(self, mailbox: _Mailbox, provider_message_id: str) -> str | None:
        found = self._message(mailbox, provider_message_id)
        if found is None:
            raise ProviderError(f"get {provider_message_id}: not found")
        value = found.get("internetMessageId")
        return value if isinstance(value, str) else None

    def close(self) -> None:
        self._closed = True
        self._transports.close()
        self._tokens.close()

    def __repr__(self) -> str:
        return f"GraphProvider({self.name!r}, user={self.user!r})"


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _recipients(value: Any) -> str:
    """Graph's `toRecipients` as a To line: `Name <address>`, or the address alone."""
    shown = []
    for recipient in value if isinstance(value, list) else []:
        address = recipient.get("emailAddress") if isinstance(recipient, dict) else None
        if isinstance(address, dict) and (where := _text(address.get("address"))):
            name = _text(address.get("name"))
            shown.append(f"{name} <{where}>" if name and name != where else where)
    return ", ".join(shown)


class GraphMailboxView(ProviderBase):
    """The Graph provider for one job's From mailbox (`user = "{from}"`). Closing it
    closes nothing (the provider owns the connections)."""

    response_ids_readable = True
    leaves_drafts = True
    reads_reports = True

    def __init__(self, provider: GraphProvider, from_addr: str) -> None:
        self.provider = provider
        self.from_addr = from_addr
        self.name = provider.name
        self.timeout = provider.timeout

    @property
    def mailbox(self) -> _Mailbox:
        # Asked for at each use, never kept (`daemon/providers/mailboxes.py`).
        return self.provider.mailbox(self.from_addr)

    def scope(self) -> str:
        # Graph limits requests per mailbox: one circuit and one queue of sends each.
        return self.provider.scope_of(self.mailbox.user.lower())

    def send_raw(self, raw: bytes) -> SendOutcome:
        return self.provider.send_as(self.mailbox, raw)

    def search(self, message_id: str) -> SearchResult:
        return self.provider.search_in(self.mailbox, message_id)

    def search_made(
        self, message_id: str, draft_ids: Collection[str], fenced: Fenced | None = None
    ) -> SearchResult:
        return self.provider.search_in(self.mailbox, message_id, draft_ids, fenced)

    def delete_drafts(
        self, message_id: str, before_deleting: BeforeDeleting | None = None
    ) -> list[str]:
        return self.provider.delete_drafts_in(
            self.mailbox, message_id, before_deleting=before_deleting
        ).deleted

    def draft_first(self) -> DraftFirst:
        return self

    def make_draft(self, raw: bytes) -> str | SendOutcome:
        return self.provider.make_draft_in(self.mailbox, raw)

    def send_made(self, raw: bytes, draft_id: str, earlier: Collection[str]) -> SendOutcome:
        return self.provider.send_made_in(self.mailbox, raw, draft_id, earlier)

    def delete_made(
        self,
        message_id: str,
        draft_ids: Collection[str],
        *,
        filtered: bool = True,
        before_deleting: BeforeDeleting | None = None,
    ) -> Fenced:
        return self.provider.delete_drafts_in(
            self.mailbox, message_id, draft_ids, filtered=filtered, before_deleting=before_deleting
        )

    def ping(self) -> None:
        self.provider.ping_as(self.mailbox)

    def read_message_id(self, provider_message_id: str) -> str | None:
        return self.provider.read_message_id_in(self.mailbox, provider_message_id)

    def read_reports(
        self,
        since: datetime,
        *,
        known: Collection[str],
        max_bytes: int,
        limit: int,
        may_go_on: Callable[[], bool] | None = None,
    ) -> ReportRead:
        mailbox = self.mailbox
        return read_reports_in(
            self.provider, mailbox, since, known=known, max_bytes=max_bytes, limit=limit,
            kept=self.provider.report_listings, key=mailbox.user, may_go_on=may_go_on,
        )  # fmt: skip

    def forget_report_reads(self) -> None:
        self.provider.report_listings.take(self.mailbox.user)

    def close(self) -> None:
        pass

    def __repr__(self) -> str:
        return f"GraphMailboxView({self.name!r}, user={self.mailbox.user!r})"
