"""What a send's result means ("Outcome classification" in docs/architecture.md).

Pure functions (no network): the Gmail adapter hands them what it saw - an HTTP status with
headers and body, or the exception that ended the call - and gets a `SendOutcome` or a
`ProviderError` back. The rule everywhere: "not sent" needs proof; when in doubt, UNKNOWN.
"Unavailable" is a transient rejection that also says the provider cannot be reached or
is over its quota: waited out, not counted against `max_attempts` (docs/operations.md, "Outages and
quotas").

| what happened                                                   | outcome               |
|-----------------------------------------------------------------|-----------------------|
| no connection made (refused, DNS, connect timeout, TLS)         | REJECTED, unavailable |
| request sent, then timeout / reset / closed without response    | UNKNOWN               |
| 2xx with a message id                                           | CONFIRMED             |
| 2xx without a readable id                                       | UNKNOWN               |
| 5xx                                                             | UNKNOWN               |
| 429; 403 rateLimitExceeded / userRateLimitExceeded / daily...   | REJECTED, unavailable |
| 400 and other 4xx (also 401 once a token refresh has failed)    | REJECTED, permanent   |

A search or read that fails is a `ProviderError` (no information); it is `unavailable` for
the same exceptions as a send, for quota answers, and for a 503.
"""

from __future__ import annotations

import email.utils
import http.client
import json
import socket
import ssl
import time
from collections.abc import Callable, Mapping
from typing import Any

from google.auth import exceptions as auth_exceptions

from daemon.providers.base import ProviderError, SendKind, SendOutcome
from daemon.providers.timeouts import timed_out
from daemon.providers.transport import (
    NotSentError,
    ResponseLostError,
    TransportFailure,
    describe,
)
from policies.decisions import retry_after_wait

# Gmail's 403 reasons that mean "slow down", not "forbidden". Compared after dropping
# "_" and case, so the newer google.rpc.ErrorInfo spelling (RATE_LIMIT_EXCEEDED) counts too.
RATE_LIMIT_REASONS = frozenset({"ratelimitexceeded", "userratelimitexceeded", "dailylimitexceeded"})


def _norm_reason(reason: str) -> str:
    return reason.replace("_", "").lower()


def parse_retry_after(value: str | None, *, now: Callable[[], float] = time.time) -> float | None:
    """Seconds to wait from a Retry-After header: delta-seconds or an HTTP-date.

    None when absent or unreadable; never negative, never more than
    `decisions.MAX_RETRY_AFTER` (a week: "1e12" or a date in the year 9999 is a server's
    whim, not a wait).
    """
    if value is None:
        return None
    text = value.strip()
    if not text:
        return None
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        # float() accepts "nan"/"inf": those are not a wait.
        if seconds != seconds or seconds in (float("inf"), float("-inf")):
            return None
        return retry_after_wait(seconds)
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None
    return retry_after_wait(when.timestamp() - now())


def error_reasons(body: bytes | str | None) -> tuple[str, ...]:
    """The machine-readable reasons in a Google API error body, in order.

    Reads both the classic `error.errors[].reason` and `error.details[].reason`
    (google.rpc.ErrorInfo). Anything unparsable gives ().
    """
    if body is None:
        return ()
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return ()
    if isinstance(data, list) and data:
        data = data[0]
    if not isinstance(data, dict):
        return ()
    err = data.get("error")
    if not isinstance(err, dict):
        return ()
    reasons: list[str] = []
    for key in ("errors", "details"):
        items = err.get(key)
        if isinstance(items, list):
            for item in items:
                if isinstance(item, dict) and isinstance(item.get("reason"), str):
                    reasons.append(item["reason"])
    return tuple(reasons)


def error_message(body: bytes | str | None) -> str:
    """`error.message` of a Google API error body, or ""."""
    if body is None:
        return ""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return ""
    if isinstance(data, dict) and isinstance(data.get("error"), dict):
        message = data["error"].get("message")
        if isinstance(message, str):
            return message
    return ""


def is_rate_limited(status: int, body: bytes | str | None) -> bool:
    """429, or a 403 whose reason is one of Gmail's quota reasons."""
    if status == 429:
        return True
    if status == 403:
        return any(_norm_reason(r) in RATE_LIMIT_REASONS for r in error_reasons(body))
    return False


def _header(headers: Mapping[str, str], name: str) -> str | None:
    wanted = name.lower()
    for key, value in headers.items():
        if key.lower() == wanted:
            return value
    return None


def _summary(status: int, body: bytes | str | None) -> str:
    reasons = error_reasons(body)
    message = error_message(body)
    parts = [f"HTTP {status}"]
    if reasons:
        parts.append("/".join(reasons))
    if message:
        parts.append(message[:200])
    return ": ".join(parts)


def message_id_from_body(body: bytes | str | None) -> str | None:
    """The `id` of a Gmail Message resource in a response body, or None."""
    if body is None:
        return None
    try:
        data: Any = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    if isinstance(data, dict):
        value = data.get("id")
        if isinstance(value, str) and value.strip():
            return value
    return None


def classify_send_response(
    status: int,
    headers: Mapping[str, str],
    body: bytes | str | None,
    *,
    now: Callable[[], float] = time.time,
) -> SendOutcome:
    """A send for which an HTTP response arrived in full."""
    if 200 <= status < 300:
        provider_id = message_id_from_body(body)
        if provider_id is None:
            return SendOutcome(
                SendKind.UNKNOWN, f"HTTP {status} without a readable message id", status=status
            )
        return SendOutcome(
            SendKind.CONFIRMED,
            f"HTTP {status}",
            provider_message_id=provider_id,
            status=status,
        )
    if status >= 500:
        # Gmail has been seen to send the mail and then answer 500: not a refusal.
        return SendOutcome(SendKind.UNKNOWN, _summary(status, body), status=status)
    if is_rate_limited(status, body):
        return SendOutcome(
            SendKind.REJECTED,
            _summary(status, body),
            transient=True,
            retry_after=parse_retry_after(_header(headers, "retry-after"), now=now),
            status=status,
            unavailable=True,
        )
    if 400 <= status < 500:
        return SendOutcome(SendKind.REJECTED, _summary(status, body), status=status)
    # 1xx/3xx as a final answer: not in Gmail's contract, so no proof either way.
    return SendOutcome(SendKind.UNKNOWN, f"unexpected HTTP {status}", status=status)


def _chain(exc: BaseException) -> list[BaseException]:
    """exc, then its causes/contexts and exception args, without loops."""
    seen: list[BaseException] = []
    todo: list[BaseException] = [exc]
    while todo:
        cur = todo.pop(0)
        if any(cur is s for s in seen):
            continue
        seen.append(cur)
        for nxt in (cur.__cause__, cur.__context__, *cur.args):
            if isinstance(nxt, BaseException):
                todo.append(nxt)
    return seen


def _unavailable(reason: str) -> SendOutcome:
    """Nothing left this host and the provider could not be reached."""
    return SendOutcome(SendKind.REJECTED, reason, transient=True, unavailable=True)


def classify_send_exception(exc: BaseException) -> SendOutcome:
    """A send that ended in an exception instead of a complete response."""
    # google-auth failed to get a token: before the send (no token yet) or after a 401
    # (the send was refused). Either way Gmail did not accept this request.
    if isinstance(exc, auth_exceptions.RefreshError):
        retryable = bool(getattr(exc, "retryable", False))
        return SendOutcome(
            SendKind.REJECTED,
            f"token refresh failed, not sent: {exc}",
            transient=retryable,
        )
    if isinstance(exc, auth_exceptions.TransportError):
        inner = next((e for e in _chain(exc) if isinstance(e, TransportFailure)), None)
        detail = inner.message if inner is not None else str(exc)
        return SendOutcome(
            SendKind.REJECTED,
            f"token endpoint unreachable, not sent: {detail}",
            transient=True,
            unavailable=True,
        )
    if isinstance(exc, auth_exceptions.GoogleAuthError):
        return SendOutcome(SendKind.REJECTED, f"credentials failed, not sent: {exc}")
    if isinstance(exc, NotSentError):
        return _unavailable(f"not sent: {exc.message}")
    if isinstance(exc, ResponseLostError):
        return SendOutcome(
            SendKind.UNKNOWN,
            exc.message,
            timed_out=timed_out(exc),
            unanswered=exc.unanswered,
        )
    # Below: what a stack without SingleShotHttp would raise. Only errors that can happen
    # solely before a request is written count as "not sent".
    if isinstance(exc, socket.gaierror):
        return _unavailable(f"not sent: {describe(exc)}")
    if isinstance(exc, ConnectionRefusedError):
        # ECONNREFUSED is an answer to the TCP SYN: no connection, no request.
        return _unavailable("not sent: connection refused")
    if isinstance(exc, ssl.SSLCertVerificationError):
        # Certificate checks happen in the handshake, before any application data.
        return _unavailable(f"not sent: {describe(exc)}")
    if type(exc).__name__ == "ServerNotFoundError":  # httplib2's DNS failure
        return _unavailable(f"not sent: {exc}")
    if isinstance(exc, OSError | http.client.HTTPException):
        return SendOutcome(
            SendKind.UNKNOWN, f"transport failed: {describe(exc)}", timed_out=timed_out(exc)
        )
    return SendOutcome(SendKind.UNKNOWN, f"unexpected failure: {describe(exc)}")


def provider_error_for_response(
    what: str,
    status: int,
    headers: Mapping[str, str],
    body: bytes | str | None,
    *,
    now: Callable[[], float] = time.time,
) -> ProviderError:
    """A search/read that got a non-2xx answer: no information, with a wait when known.
    Unavailable (counted toward the circuit) on a quota answer or a 503: a read, unlike a
    send, has nothing to lose by calling a 503 "down"."""
    retry_after = parse_retry_after(_header(headers, "retry-after"), now=now)
    return ProviderError(
        f"{what}: {_summary(status, body)}",
        retry_after=retry_after,
        unavailable=status == 503 or is_rate_limited(status, body),
    )


def provider_error_for_exception(what: str, exc: BaseException) -> ProviderError:
    """A search/read that ended in an exception: no information. Unavailable exactly when
    the same exception would make a send "not sent, unavailable" (no connection made, the
    token endpoint unreachable)."""
    if isinstance(exc, ProviderError):
        return exc
    if isinstance(exc, TransportFailure):
        detail = exc.message
    elif isinstance(exc, auth_exceptions.GoogleAuthError):
        detail = f"credentials: {exc}"
    else:
        detail = describe(exc)
    outcome = classify_send_exception(exc)
    return ProviderError(
        f"{what}: {detail}", unavailable=outcome.unavailable, timed_out=outcome.timed_out
    )
