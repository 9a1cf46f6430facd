"""What each step of a Graph send means ("Outcome classification" in docs/architecture.md).

Pure functions (no network). A Graph send is two requests: create the raw MIME as a draft
(`POST /users/{user}/messages`), then send that draft (`POST .../messages/{id}/send`).
Nothing can leave before `send`, so no failure of the token request or of the create step
is ever "maybe sent". The rule everywhere else: "not sent" needs proof; when in doubt,
Unknown.

| step | what happened | outcome |
|---|---|---|
| token | no token (network, 5xx, throttled) | Rejected, transient |
| token | refused (invalid_client, unauthorized_client, invalid_scope...) | Rejected, permanent |
| create | no answer, 5xx, 429/503, 401, a 201 without an id | Rejected, transient |
| create | 400, 403, 404 and other 4xx | Rejected, permanent |
| send | no connection made (refused, DNS, connect timeout, TLS) | Rejected, transient |
| send | request written, then timeout / reset / closed without response | Unknown |
| send | 202 (or another 2xx): accepted, no copy yet | Unknown until the copy is seen |
| send | 202, then the copy read back under the draft's immutable id | Confirmed |
| send | 429; 503 with Retry-After | Rejected, transient, wait Retry-After |
| send | 401 | Rejected, transient (token refused: not accepted) |
| send | other 4xx (400, 403, 404) | Rejected, permanent |
| send | 5xx (503 without Retry-After included) | Unknown |
| send | a rejection whose draft is then gone (404) or no draft any more | Unknown |

After a send-step rejection the provider reads the draft by its immutable id and deletes
it while it is still a draft: a draft that is deleted can never be sent, so the rejection
is then proven; a draft that is already gone (in transit) or is no draft any more (the
sent copy, filed under the same immutable id) may have been sent, so the rejection
becomes Unknown, and the item is not deleted (that would delete the sent copy). A
rejection whose draft could not be read back stays unproven: the next attempt of the same
message reads that draft first and sends nothing when it was sent.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from typing import Any

from daemon.providers.base import ProviderError, SendKind, SendOutcome
from daemon.providers.classify import message_id_from_body, parse_retry_after
from daemon.providers.timeouts import timed_out
from daemon.providers.transport import NotSentError, ResponseLostError, describe
from ledger.exceptions import SendledgerError

# The identity platform's answers that no retry will change.
PERMANENT_TOKEN_ERRORS = frozenset(
    {"invalid_client", "unauthorized_client", "invalid_scope", "invalid_tenant", "invalid_grant"}
)


class TokenError(SendledgerError):
    """No access token: `transient` when asking again later may give one."""

    def __init__(self, reason: str, *, transient: bool) -> None:
        super().__init__(reason)
        self.reason = reason
        self.transient = transient


def token_error(answer: Mapping[str, Any]) -> TokenError:
    """msal's error answer ({"error", "error_description"}) as a TokenError."""
    error = str(answer.get("error", "unknown_error"))
    description = str(answer.get("error_description", "")).split("\n")[0][:200]
    text = f"token refused: {error}" + (f": {description}" if description else "")
    return TokenError(text, transient=error not in PERMANENT_TOKEN_ERRORS)


def graph_error(body: bytes | str | None) -> str:
    """`error.code: error.message` of a Graph error body, or ""."""
    if not body:
        return ""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return ""
    err = data.get("error") if isinstance(data, dict) else None
    if not isinstance(err, dict):
        return ""
    code, message = err.get("code"), err.get("message")
    parts = [str(x) for x in (code, message) if isinstance(x, str) and x]
    return ": ".join(parts)[:240]


def _summary(step: str, status: int, body: bytes | str | None) -> str:
    detail = graph_error(body)
    return f"{step}: HTTP {status}" + (f": {detail}" if detail else "")


def _header(headers: Mapping[str, str], name: str) -> str | None:
    wanted = name.lower()
    return next((v for k, v in headers.items() if k.lower() == wanted), None)


def classify_token_failure(exc: TokenError) -> SendOutcome:
    # A token endpoint that cannot be reached or asks us to wait: unavailable, waited out
    # behind the circuit (docs/operations.md "Outages and quotas"); a refused credential is not.
    return SendOutcome(
        SendKind.REJECTED,
        f"{exc.reason}; not sent",
        transient=exc.transient,
        unavailable=exc.transient,
    )


def classify_create_exception(exc: BaseException) -> SendOutcome:
    """The draft could not be created: whatever happened, nothing was sent (a draft the
    server made anyway is never sent, and a search deletes it)."""
    detail = exc.message if isinstance(exc, NotSentError | ResponseLostError) else describe(exc)
    return SendOutcome(
        SendKind.REJECTED,
        f"create draft failed, not sent: {detail}",
        transient=True,
        # No connection made: the provider is unavailable (docs/operations.md "Outages and quotas").
        unavailable=isinstance(exc, NotSentError),
        timed_out=timed_out(exc),
    )


def classify_create_response(
    status: int,
    headers: Mapping[str, str],
    body: bytes | str | None,
    *,
    now: Callable[[], float] = time.time,
) -> SendOutcome | str:
    """The draft's immutable id on a 201, else the (never "sent") outcome."""
    if 200 <= status < 300:
        draft_id = message_id_from_body(body)
        if draft_id is not None:
            return draft_id
        return SendOutcome(
            SendKind.REJECTED,
            f"create draft: HTTP {status} without a readable id, not sent",
            transient=True,
            status=status,
        )
    reason = _summary("create draft", status, body) + ", not sent"
    transient = status >= 500 or status in (401, 408, 429) or status < 400
    retry_after = parse_retry_after(_header(headers, "retry-after"), now=now)
    return SendOutcome(
        SendKind.REJECTED,
        reason,
        transient=transient,
        retry_after=retry_after,
        status=status,
        unavailable=status == 429 or (status == 503 and retry_after is not None),
    )


def classify_send_exception(exc: BaseException) -> SendOutcome:
    """The send request ended in an exception instead of a complete response."""
    if isinstance(exc, NotSentError):
        return SendOutcome(
            SendKind.REJECTED, f"send: {exc.message}, not sent", transient=True, unavailable=True
        )
    if isinstance(exc, ResponseLostError):
        return SendOutcome(
            SendKind.UNKNOWN,
            f"send: {exc.message}",
            timed_out=timed_out(exc),
            unanswered=exc.unanswered,
        )
    return SendOutcome(
        SendKind.UNKNOWN, f"send: unexpected failure: {describe(exc)}", timed_out=timed_out(exc)
    )


def classify_send_response(
    status: int,
    headers: Mapping[str, str],
    body: bytes | str | None,
    *,
    now: Callable[[], float] = time.time,
) -> SendOutcome:
    """The send request got a complete answer. A 2xx is Unknown here: the provider reads
    the copy back to confirm it (Graph files the copy in Sent Items after the 202)."""
    if 200 <= status < 300:
        return SendOutcome(
            SendKind.UNKNOWN, f"send: HTTP {status} accepted, sent copy not seen yet", status=status
        )
    retry_after = parse_retry_after(_header(headers, "retry-after"), now=now)
    summary = _summary("send", status, body)
    if status == 429 or (status == 503 and retry_after is not None):
        return SendOutcome(
            SendKind.REJECTED,
            summary + ", not sent",
            transient=True,
            retry_after=retry_after,
            status=status,
            unavailable=True,
        )
    if status >= 500:
        return SendOutcome(SendKind.UNKNOWN, summary, status=status)
    if status == 401:
        return SendOutcome(SendKind.REJECTED, summary + ", not sent", transient=True, status=status)
    if 400 <= status < 500:
        return SendOutcome(SendKind.REJECTED, summary + ", not sent", status=status)
    return SendOutcome(SendKind.UNKNOWN, f"send: unexpected HTTP {status}", status=status)


def after_draft_delete(outcome: SendOutcome, delete_status: int | None) -> SendOutcome:
    """A send-step rejection, given what deleting its draft answered: 2xx proves it (the
    draft can no longer be sent), 404 undoes it (gone: it may have been sent), anything
    else (or no answer) leaves it as Graph's contract says."""
    if outcome.kind is not SendKind.REJECTED or delete_status != 404:
        return outcome
    return SendOutcome(
        SendKind.UNKNOWN,
        f"{outcome.reason}; but the draft is gone, so it may have been sent",
        status=outcome.status,
    )


def after_draft_sent(outcome: SendOutcome) -> SendOutcome:
    """A send-step rejection whose draft, read back by its immutable id, is no draft any
    more: Graph sent it whatever the answer said."""
    if outcome.kind is not SendKind.REJECTED:
        return outcome
    return SendOutcome(
        SendKind.UNKNOWN,
        f"{outcome.reason}; but the draft is no draft any more, so it was sent",
        status=outcome.status,
    )


def read_error(what: str, status: int, headers: Mapping[str, str], body: bytes) -> ProviderError:
    """A search or read that got a non-2xx answer: no information, with a wait if given;
    unavailable (counted toward the circuit) on 429 and 503."""
    retry_after = parse_retry_after(_header(headers, "retry-after"))
    return ProviderError(
        _summary(what, status, body), retry_after=retry_after, unavailable=status in (429, 503)
    )
