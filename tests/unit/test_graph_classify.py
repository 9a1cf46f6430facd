"""The Graph outcome table (daemon/providers/graph_classify.py; docs/providers.md "Providers",
docs/architecture.md "Outcome classification"), row by row, plus its invariants."""

from __future__ import annotations

import http.client
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from daemon.providers.base import ProviderError, SendKind, SendOutcome
from daemon.providers.graph import filter_value
from daemon.providers.graph_classify import (
    TokenError,
    after_draft_delete,
    classify_create_exception,
    classify_create_response,
    classify_send_exception,
    classify_send_response,
    classify_token_failure,
    graph_error,
    read_error,
    token_error,
)
from daemon.providers.transport import NotSentError, ResponseLostError


def _body(code: str, message: str = "m") -> bytes:
    return json.dumps({"error": {"code": code, "message": message}}).encode()


def _not_sent() -> NotSentError:
    return NotSentError("no connection to h:1: connection refused", host="h:1", cause=OSError())


def _lost() -> ResponseLostError:
    return ResponseLostError(
        "POST sent to h:1, then connection closed without a response",
        host="h:1",
        cause=http.client.RemoteDisconnected(""),
    )


# -- token ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "transient"),
    [
        ("invalid_client", False),
        ("unauthorized_client", False),
        ("invalid_scope", False),
        ("invalid_tenant", False),
        ("temporarily_unavailable", True),
        ("rate_limit_exceeded", True),
    ],
)
def test_token_refusals(error: str, transient: bool) -> None:
    outcome = classify_token_failure(token_error({"error": error, "error_description": "x\ny"}))
    assert outcome.kind is SendKind.REJECTED
    assert outcome.transient is transient
    assert error in outcome.reason and "not sent" in outcome.reason


# -- create: never sent ---------------------------------------------------------------


def test_created_draft_gives_its_id() -> None:
    assert classify_create_response(201, {}, b'{"id": "AAk="}') == "AAk="


@pytest.mark.parametrize(
    ("status", "headers", "body", "transient", "retry_after"),
    [
        (201, {}, b"{}", True, None),  # no readable id
        (201, {}, b"not json", True, None),
        (500, {}, _body("InternalServerError"), True, None),
        (503, {"Retry-After": "7"}, b"", True, 7.0),
        (429, {"retry-after": "2"}, _body("ApplicationThrottled"), True, 2.0),
        (401, {}, _body("InvalidAuthenticationToken"), True, None),
        (400, {}, _body("ErrorMimeContentInvalid"), False, None),
        (403, {}, _body("ErrorAccessDenied"), False, None),
        (404, {}, _body("ErrorInvalidUser"), False, None),
        (413, {}, b"", False, None),
    ],
)
def test_create_failures_are_never_sent(
    status: int,
    headers: dict[str, str],
    body: bytes,
    transient: bool,
    retry_after: float | None,
) -> None:
    outcome = classify_create_response(status, headers, body)
    assert isinstance(outcome, SendOutcome)
    assert outcome.kind is SendKind.REJECTED
    assert outcome.transient is transient
    assert outcome.retry_after == retry_after
    assert "not sent" in outcome.reason


@pytest.mark.parametrize("exc", [_not_sent(), _lost(), TimeoutError(), RuntimeError("bug")])
def test_create_exceptions_are_never_sent(exc: BaseException) -> None:
    outcome = classify_create_exception(exc)
    assert outcome.kind is SendKind.REJECTED and outcome.transient


# -- send -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "headers", "kind", "transient", "retry_after"),
    [
        (202, {}, SendKind.UNKNOWN, False, None),  # accepted; confirmed only once seen
        (200, {}, SendKind.UNKNOWN, False, None),
        (429, {"Retry-After": "3"}, SendKind.REJECTED, True, 3.0),
        (429, {}, SendKind.REJECTED, True, None),
        (503, {"Retry-After": "5"}, SendKind.REJECTED, True, 5.0),
        (503, {}, SendKind.UNKNOWN, False, None),  # a 5xx without a wait: maybe sent
        (500, {"Retry-After": "5"}, SendKind.UNKNOWN, False, None),
        (502, {}, SendKind.UNKNOWN, False, None),
        (504, {}, SendKind.UNKNOWN, False, None),
        (401, {}, SendKind.REJECTED, True, None),
        (400, {}, SendKind.REJECTED, False, None),
        (403, {}, SendKind.REJECTED, False, None),
        (404, {}, SendKind.REJECTED, False, None),
        (302, {}, SendKind.UNKNOWN, False, None),
    ],
)
def test_send_responses(
    status: int,
    headers: dict[str, str],
    kind: SendKind,
    transient: bool,
    retry_after: float | None,
) -> None:
    outcome = classify_send_response(status, headers, _body("X"))
    assert (outcome.kind, outcome.transient, outcome.retry_after) == (kind, transient, retry_after)
    assert outcome.status == status


def test_send_exceptions() -> None:
    assert classify_send_exception(_not_sent()).kind is SendKind.REJECTED
    assert classify_send_exception(_not_sent()).transient
    assert classify_send_exception(_lost()).kind is SendKind.UNKNOWN
    assert classify_send_exception(TimeoutError()).kind is SendKind.UNKNOWN


@given(
    status=st.integers(100, 599),
    retry_after=st.none() | st.sampled_from(["0", "1", "2.5", "soon", ""]),
    body=st.binary(max_size=64),
)
@settings(deadline=None)
def test_send_answers_never_confirm_and_reject_only_with_proof(
    status: int, retry_after: str | None, body: bytes
) -> None:
    headers = {} if retry_after is None else {"Retry-After": retry_after}
    outcome = classify_send_response(status, headers, body)
    assert outcome.kind is not SendKind.CONFIRMED
    if outcome.kind is SendKind.REJECTED:
        assert 400 <= status < 500 or (status == 503 and outcome.retry_after is not None)


@given(status=st.integers(100, 599), body=st.binary(max_size=64))
@settings(deadline=None)
def test_create_answers_are_an_id_or_a_rejection(status: int, body: bytes) -> None:
    outcome = classify_create_response(status, {}, body)
    assert isinstance(outcome, str) or outcome.kind is SendKind.REJECTED


# -- deleting the draft after a rejection -------------------------------------------------


def test_a_deleted_draft_keeps_the_rejection_a_gone_one_undoes_it() -> None:
    rejected = classify_send_response(429, {"Retry-After": "1"}, b"")
    assert after_draft_delete(rejected, 204) is rejected
    assert after_draft_delete(rejected, None) is rejected
    assert after_draft_delete(rejected, 500) is rejected
    gone = after_draft_delete(rejected, 404)
    assert gone.kind is SendKind.UNKNOWN and "may have been sent" in gone.reason
    unknown = classify_send_exception(_lost())
    assert after_draft_delete(unknown, 404) is unknown


# -- the search filter ----------------------------------------------------------------------


def test_filter_literal_has_brackets_and_doubled_quotes() -> None:
    assert filter_value("<a@b>") == "'<a@b>'"
    assert filter_value("a@b") == "'<a@b>'"
    assert filter_value("<o'neil@b>") == "'<o''neil@b>'"


@pytest.mark.parametrize("bad", ["", "<>", "<a b@c>", "<a\r\n@c>", "<a\x00@c>"])
def test_filter_refuses_values_that_change_its_meaning(bad: str) -> None:
    with pytest.raises(ProviderError):
        filter_value(bad)


@given(st.text(min_size=1, max_size=40).filter(lambda t: not any(c.isspace() for c in t)))
@settings(deadline=None)
def test_filter_literal_is_one_odata_string(value: str) -> None:
    try:
        literal = filter_value(value)
    except ProviderError:
        return
    inner = literal[1:-1]
    assert literal[0] == literal[-1] == "'"
    # Every quote inside is doubled: the literal cannot end early.
    assert "'" not in inner.replace("''", "")


def test_graph_error_text() -> None:
    assert graph_error(_body("ErrorItemNotFound", "gone")) == "ErrorItemNotFound: gone"
    assert graph_error(b"<html>") == ""
    assert graph_error(None) == ""
    assert "transient" not in repr(TokenError("x", transient=True).reason)


@pytest.mark.parametrize(
    ("status", "unavailable"), [(429, True), (503, True), (500, False), (404, False)]
)
def test_a_read_throttled_or_503_counts_toward_the_circuit(status: int, unavailable: bool) -> None:
    error = read_error("search", status, {"Retry-After": "3"}, _body("x"))
    assert error.unavailable is unavailable and error.retry_after == 3.0


def test_a_send_closed_with_no_response_is_marked_unanswered() -> None:
    """Unknown and marked `unanswered` (as Gmail's: tests/unit/test_classify.py)."""
    cause = http.client.RemoteDisconnected("Remote end closed connection without response")
    try:
        raise ResponseLostError(
            "POST sent to h:1, then x", host="h:1", cause=cause, unanswered=True
        ) from cause
    except ResponseLostError as exc:
        out = classify_send_exception(exc)
    assert out.kind is SendKind.UNKNOWN and out.unanswered
