"""The send-outcome table (DESIGN.md), row by row, without a network."""

from __future__ import annotations

import http.client
import json
import socket
import ssl
from datetime import UTC, datetime

import httplib2
import pytest
from google.auth import exceptions as auth_exceptions

from daemon.providers.base import ProviderError, SendKind
from daemon.providers.classify import (
    classify_send_exception,
    classify_send_response,
    error_reasons,
    is_rate_limited,
    message_id_from_body,
    parse_retry_after,
    provider_error_for_exception,
    provider_error_for_response,
)
from daemon.providers.timeouts import closed_unanswered
from daemon.providers.transport import NotSentError, ResponseLostError


def google_error(status: int, reason: str, message: str = "msg") -> bytes:
    return json.dumps(
        {
            "error": {
                "code": status,
                "message": message,
                "errors": [{"message": message, "domain": "global", "reason": reason}],
                "status": "X",
            }
        }
    ).encode()


NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC).timestamp()


def fixed_now() -> float:
    return NOW


# -- responses -------------------------------------------------------------------------------


@pytest.mark.parametrize("status", [200, 201, 202])
def test_2xx_with_id_is_confirmed(status: int) -> None:
    out = classify_send_response(status, {}, b'{"id": "18c0ffee", "threadId": "18c0ffee"}')
    assert out.kind is SendKind.CONFIRMED
    assert out.provider_message_id == "18c0ffee"
    assert out.status == status


@pytest.mark.parametrize(
    "body",
    [b"", b"not json", b"{}", b'{"id": ""}', b'{"id": 42}', b"[]", b'{"threadId": "x"}', None],
)
def test_2xx_without_a_readable_id_is_unknown(body: bytes | None) -> None:
    out = classify_send_response(200, {}, body)
    assert out.kind is SendKind.UNKNOWN
    assert out.provider_message_id is None
    assert "without a readable message id" in out.reason


@pytest.mark.parametrize("status", [500, 502, 503, 504, 599])
def test_5xx_is_unknown(status: int) -> None:
    out = classify_send_response(status, {"retry-after": "5"}, google_error(status, "backendError"))
    assert out.kind is SendKind.UNKNOWN
    assert out.status == status
    assert not out.transient


def test_429_is_transient_with_retry_after() -> None:
    out = classify_send_response(429, {"Retry-After": "7"}, b"")
    assert out.kind is SendKind.REJECTED
    assert out.transient
    assert out.retry_after == 7.0


@pytest.mark.parametrize(
    "reason", ["rateLimitExceeded", "userRateLimitExceeded", "dailyLimitExceeded"]
)
def test_403_rate_limits_are_transient(reason: str) -> None:
    out = classify_send_response(403, {"retry-after": "2.5"}, google_error(403, reason))
    assert out.kind is SendKind.REJECTED
    assert out.transient
    assert out.retry_after == 2.5
    assert reason in out.reason


def test_403_rate_limit_in_error_info_details_counts() -> None:
    body = json.dumps(
        {
            "error": {
                "code": 403,
                "message": "Quota exceeded",
                "details": [
                    {
                        "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                        "reason": "RATE_LIMIT_EXCEEDED",
                    }
                ],
            }
        }
    )
    assert classify_send_response(403, {}, body).transient


def test_rate_limit_without_retry_after() -> None:
    out = classify_send_response(429, {}, google_error(429, "rateLimitExceeded"))
    assert out.transient
    assert out.retry_after is None


@pytest.mark.parametrize(
    ("status", "reason"),
    [
        (400, "invalidArgument"),
        (400, "failedPrecondition"),
        (401, "authError"),  # still 401 after google-auth refreshed and replayed
        (403, "insufficientPermissions"),
        (403, "forbidden"),
        (403, "domainPolicy"),
        (404, "notFound"),
        (413, "uploadTooLarge"),
    ],
)
def test_other_4xx_are_permanent(status: int, reason: str) -> None:
    out = classify_send_response(status, {"retry-after": "3"}, google_error(status, reason))
    assert out.kind is SendKind.REJECTED
    assert not out.transient
    assert out.retry_after is None
    assert out.status == status
    assert f"HTTP {status}" in out.reason and reason in out.reason


def test_403_without_a_body_is_permanent() -> None:
    out = classify_send_response(403, {}, b"<html>Forbidden</html>")
    assert out.kind is SendKind.REJECTED
    assert not out.transient


@pytest.mark.parametrize("status", [100, 204, 301, 302, 307, 308])
def test_odd_statuses_are_unknown_not_rejected(status: int) -> None:
    # 204 has no body, so no id; a redirect is not a refusal we can prove.
    assert classify_send_response(status, {}, b"").kind is SendKind.UNKNOWN


# -- exceptions -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cause",
    [
        ConnectionRefusedError(111, "Connection refused"),
        socket.gaierror(-2, "Name or service not known"),
        TimeoutError("timed out"),  # connect timeout: raised in the connect phase
        ssl.SSLError(1, "[SSL: WRONG_VERSION_NUMBER] wrong version number"),
        OSError(101, "Network is unreachable"),
    ],
)
def test_connect_phase_failures_are_transient_rejections(cause: Exception) -> None:
    exc = NotSentError("no connection to h:1: x", host="h:1", cause=cause)
    out = classify_send_exception(exc)
    assert out.kind is SendKind.REJECTED
    assert out.transient
    assert out.reason.startswith("not sent")


@pytest.mark.parametrize(
    "cause",
    [
        TimeoutError("timed out"),  # read timeout after the request was written
        http.client.RemoteDisconnected("Remote end closed connection without response"),
        ConnectionResetError(104, "Connection reset by peer"),
        http.client.BadStatusLine("garbage"),
        http.client.IncompleteRead(b"{", 10),
        BrokenPipeError(32, "Broken pipe"),
    ],
)
def test_failures_after_sending_are_unknown(cause: Exception) -> None:
    exc = ResponseLostError("POST sent to h:1, then x", host="h:1", cause=cause)
    out = classify_send_exception(exc)
    assert out.kind is SendKind.UNKNOWN
    assert out.reason == "POST sent to h:1, then x"


@pytest.mark.parametrize(
    "exc",
    [
        ConnectionRefusedError(111, "Connection refused"),
        socket.gaierror(-2, "Name or service not known"),
        httplib2.ServerNotFoundError("Unable to find the server at x"),
        ssl.SSLCertVerificationError(1, "certificate verify failed"),
    ],
)
def test_raw_errors_that_only_happen_before_sending_are_rejections(exc: Exception) -> None:
    out = classify_send_exception(exc)
    assert out.kind is SendKind.REJECTED
    assert out.transient


@pytest.mark.parametrize(
    "exc",
    [
        TimeoutError("timed out"),  # could be connect or read: no proof, so unknown
        ConnectionResetError(104, "reset"),
        http.client.RemoteDisconnected("closed"),
        ssl.SSLError(1, "decryption failed"),
        OSError("something"),
        RuntimeError("a bug somewhere"),
    ],
)
def test_raw_ambiguous_errors_are_unknown(exc: Exception) -> None:
    assert classify_send_exception(exc).kind is SendKind.UNKNOWN


def test_token_transport_failure_is_a_transient_rejection() -> None:
    inner = NotSentError("no connection to t:1: connection refused", host="t:1", cause=OSError())
    # google-auth's exception classes are unannotated (no-untyped-call, here and below).
    wrapped = auth_exceptions.TransportError(inner)  # type: ignore[no-untyped-call]
    wrapped.__cause__ = inner
    out = classify_send_exception(wrapped)
    assert out.kind is SendKind.REJECTED
    assert out.transient
    assert "token endpoint" in out.reason and "connection refused" in out.reason


def test_token_response_lost_is_still_a_rejection() -> None:
    # The token POST may have reached the token endpoint; the send never started.
    inner = ResponseLostError("POST sent to t:1, then timed out", host="t:1", cause=OSError())
    out = classify_send_exception(auth_exceptions.TransportError(inner))  # type: ignore[no-untyped-call]
    assert out.kind is SendKind.REJECTED
    assert out.transient


@pytest.mark.parametrize(("retryable", "transient"), [(False, False), (True, True)])
def test_refresh_error_is_a_rejection(retryable: bool, transient: bool) -> None:
    exc = auth_exceptions.RefreshError("invalid_grant: bad", retryable=retryable)  # type: ignore[no-untyped-call]
    out = classify_send_exception(exc)
    assert out.kind is SendKind.REJECTED
    assert out.transient is transient


def test_other_credential_errors_are_permanent() -> None:
    out = classify_send_exception(auth_exceptions.DefaultCredentialsError("no"))  # type: ignore[no-untyped-call]
    assert out.kind is SendKind.REJECTED
    assert not out.transient


# -- Retry-After and error bodies ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("120", 120.0),
        (" 3 ", 3.0),
        ("1.5", 1.5),
        ("0", 0.0),
        ("-4", 0.0),
        ("Thu, 01 Jan 2026 12:00:30 GMT", 30.0),
        ("Thu, 01 Jan 2026 11:00:00 GMT", 0.0),  # in the past
        (None, None),
        ("", None),
        ("soon", None),
        ("nan", None),
        ("inf", None),
    ],
)
def test_parse_retry_after(value: str | None, expected: float | None) -> None:
    result = parse_retry_after(value, now=fixed_now)
    if expected is None:
        assert result is None
    else:
        assert result == pytest.approx(expected)


def test_error_reasons_tolerates_junk() -> None:
    assert error_reasons(None) == ()
    assert error_reasons(b"\xff\xfe") == ()
    assert error_reasons(b'{"error": "invalid_grant"}') == ()
    assert error_reasons(b'[{"error": {"errors": [{"reason": "r"}]}}]') == ("r",)
    assert not is_rate_limited(403, b'{"error": {"errors": [{"reason": 5}]}}')
    assert is_rate_limited(429, None)


def test_message_id_from_body() -> None:
    assert message_id_from_body(b'{"id": "abc"}') == "abc"
    assert message_id_from_body('{"id": "abc"}') == "abc"
    assert message_id_from_body(b'{"id": " "}') is None


# -- search / read errors ---------------------------------------------------------------------


def test_provider_error_for_response_keeps_retry_after() -> None:
    err = provider_error_for_response(
        "search q", 429, {"Retry-After": "9"}, google_error(429, "rateLimitExceeded")
    )
    assert isinstance(err, ProviderError)
    assert err.retry_after == 9.0
    assert "HTTP 429" in err.reason and "search q" in err.reason


def test_provider_error_for_exception() -> None:
    lost = ResponseLostError("GET sent to h:1, then timed out", host="h:1", cause=TimeoutError())
    assert "timed out" in provider_error_for_exception("get x", lost).reason
    assert "timed out" in provider_error_for_exception("get x", TimeoutError()).reason
    same = ProviderError("already", retry_after=2.0)
    assert provider_error_for_exception("get x", same) is same


# -- "unavailable": nothing sent, and the provider cannot take it now ---------------------

_HOST = "gmail.googleapis.com:443"


@pytest.mark.parametrize(
    "exc",
    [
        ConnectionRefusedError(111, "Connection refused"),
        socket.gaierror(-2, "Name or service not known"),
        NotSentError("no connection", host=_HOST, cause=TimeoutError("timed out")),
        NotSentError("no connection", host=_HOST, cause=ssl.SSLError("handshake failure")),
        ssl.SSLCertVerificationError("certificate verify failed"),
    ],
    ids=["refused", "dns", "connect-timeout", "tls-handshake", "tls-certificate"],
)
def test_no_connection_is_unavailable_and_not_counted(exc: BaseException) -> None:
    outcome = classify_send_exception(exc)
    assert outcome.kind is SendKind.REJECTED and outcome.transient and outcome.unavailable


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (429, google_error(429, "rateLimitExceeded")),
        (403, google_error(403, "userRateLimitExceeded")),
        (403, google_error(403, "dailyLimitExceeded")),
    ],
)
def test_quota_answers_are_unavailable(status: int, body: bytes) -> None:
    outcome = classify_send_response(status, {"Retry-After": "7"}, body)
    assert outcome.kind is SendKind.REJECTED and outcome.unavailable
    assert outcome.retry_after == 7.0


@pytest.mark.parametrize("status", [400, 401, 403, 404])
def test_a_definite_refusal_is_not_unavailable(status: int) -> None:
    outcome = classify_send_response(status, {}, google_error(status, "invalidArgument"))
    assert outcome.kind is SendKind.REJECTED and not outcome.unavailable


def test_an_ambiguous_outcome_is_never_unavailable() -> None:
    lost = ResponseLostError("sent, then reset", host=_HOST, cause=ConnectionResetError())
    for outcome in (
        classify_send_exception(lost),
        classify_send_exception(TimeoutError("timed out")),
        classify_send_response(503, {}, google_error(503, "backendError")),
    ):
        assert outcome.kind is SendKind.UNKNOWN and not outcome.unavailable


def test_a_search_refused_for_quota_or_without_connection_says_unavailable() -> None:
    quota = provider_error_for_response("search", 429, {}, google_error(429, "rateLimitExceeded"))
    down = provider_error_for_exception(
        "search", NotSentError("no connection", host=_HOST, cause=ConnectionRefusedError())
    )
    server = provider_error_for_response("search", 500, {}, b"")
    assert quota.unavailable and down.unavailable and not server.unavailable


@pytest.mark.parametrize(
    "exc",
    [
        NotSentError("no connection", host=_HOST, cause=ConnectionRefusedError()),
        ConnectionRefusedError(111, "Connection refused"),
        socket.gaierror(-2, "Name or service not known"),
        auth_exceptions.TransportError(  # type: ignore[no-untyped-call]
            NotSentError("no connection", host="oauth2:443", cause=ConnectionRefusedError())
        ),
    ],
    ids=["not-sent", "refused", "dns", "token-endpoint"],
)
def test_a_read_fails_unavailable_exactly_where_a_send_would(exc: BaseException) -> None:
    """The circuit hears of an outage from searches as from sends (docs/operations.md)."""
    assert provider_error_for_exception("search", exc).unavailable
    assert classify_send_exception(exc).unavailable


@pytest.mark.parametrize(
    ("status", "unavailable"), [(503, True), (500, False), (502, False), (404, False)]
)
def test_a_read_answered_503_is_unavailable_a_send_answered_503_stays_unknown(
    status: int, unavailable: bool
) -> None:
    body = google_error(status, "backendError")
    assert provider_error_for_response("search", status, {}, body).unavailable is unavailable
    assert not classify_send_response(status, {}, body).unavailable


def test_a_read_whose_answer_was_lost_is_not_unavailable() -> None:
    lost = ResponseLostError("GET sent, then reset", host=_HOST, cause=ConnectionResetError())
    refresh = auth_exceptions.RefreshError("invalid_grant")  # type: ignore[no-untyped-call]
    assert not provider_error_for_exception("search", lost).unavailable
    assert not provider_error_for_exception("search", refresh).unavailable


def _lost_after(cause: Exception) -> ResponseLostError:
    """The transport's error for `cause` raised after the request was written and before
    any of the response was read (`from`), marked as the transport marks it."""
    try:
        raise ResponseLostError(
            "POST sent to h:1, then x",
            host="h:1",
            cause=cause,
            unanswered=closed_unanswered(cause),
        ) from cause
    except ResponseLostError as exc:
        return exc


@pytest.mark.parametrize(
    ("cause", "unanswered"),
    [
        (http.client.RemoteDisconnected("Remote end closed connection without response"), True),
        (ConnectionResetError(104, "Connection reset by peer"), True),  # a proxy's reset
        (http.client.IncompleteRead(b"{", 10), False),  # answered, cut off
        (http.client.BadStatusLine("garbage"), False),
        (TimeoutError("timed out"), False),  # a hang: counted as one
    ],
)
def test_a_send_closed_with_no_response_is_marked_unanswered(
    cause: Exception, unanswered: bool
) -> None:
    """Unknown either way, as before; a close with nothing of a response is marked
    `unanswered`, one more of a run that pauses the scope's sends (`Circuits.sent`):
    before, nothing told it from an answer cut off, so a front end closing every send
    had every due job sent into it."""
    out = classify_send_exception(_lost_after(cause))
    assert out.kind is SendKind.UNKNOWN
    assert out.unanswered is unanswered
