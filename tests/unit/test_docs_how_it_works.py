"""docs/how-it-works.md against the code it describes (docs/development.md "Writing the
docs"): the event table against the SendJob aggregate's events, the states, escalation
reasons, resolutions and confirmation routes named on the page against the vocabulary, the
tick's steps against the engine, the Gmail outcome table against the classification
functions (each row fed real inputs), the guarantee table's columns against the policy
model, and the crash matrix the page describes against the e2e test that runs it. Each
comparison goes both ways, so neither the page nor the code can change alone."""

from __future__ import annotations

import ast
import hashlib
import http.client
import json
import logging
import re
import socket
import ssl
from pathlib import Path
from types import SimpleNamespace
from typing import Any, get_args

import pytest
from eventsourcing.domain import Aggregate
from tests.unit.docs_page import CODE, DocsPage, flat, table
from tests.unit.engine_rig import EngineRig, policy

from daemon.cli.audit import EVENT_TYPES
from daemon.doubles.fake_provider import Scripted
from daemon.engine.recover import Recover
from daemon.engine.search import Sweep, Verify
from daemon.providers.base import SendKind, SendOutcome
from daemon.providers.classify import classify_send_exception, classify_send_response
from daemon.providers.transport import NotSentError, ResponseLostError
from daemon.runtime import Daemon
from ledger.job import SendJob
from ledger.message_id import message_id_for
from ledger.vocabulary import FINAL_STATES, ConfirmedVia, EscalationReason, JobState, Resolution
from policies.model import OnUnknown

REPO = Path(__file__).resolve().parents[2]
PAGE = DocsPage("how-it-works.md")
section = PAGE.section


def event_rows() -> dict[str, str]:
    return {CODE.findall(name)[0]: text for name, text in table(section("The job's events"))}


def event_classes() -> dict[str, type[Any]]:
    """The events a job's history can hold (not the library's bases nor SendJob.Created,
    which only satisfies eventsourcing: a job is created by Requested)."""
    return {
        name: value
        for name, value in vars(SendJob).items()
        if isinstance(value, type)
        and issubclass(value, Aggregate.Event)
        and name not in ("Event", "Created")
    }


def test_the_event_table_names_every_event_and_its_topic() -> None:
    assert set(event_rows()) == set(event_classes())
    for name, cls in event_classes().items():
        assert f"sendledger:SendJob.{name}" == cls.TOPIC
    assert "`sendledger:SendJob.<Event>`" in section("How it works")
    # The event log's reader offers the same names (`sendledger audit --event`).
    assert set(EVENT_TYPES) == set(event_rows())


def test_the_message_id_example_is_the_recipe() -> None:
    text = flat(section("The Message-ID"))
    example = re.search(r"Key `([^`]+)` on `([^`]+)` is always `([^`]+)`", text)
    assert example
    key, domain, shown = example.groups()
    assert message_id_for(key, domain) == shown
    digest = hashlib.sha256(key.encode("utf-8")).hexdigest()[:32]
    assert shown == f"<job-{digest}@{domain}>"
    assert "the first 32 hex digits of the SHA-256 of the key (UTF-8)" in text


def fields_of(cls: type[Any]) -> set[str]:
    return {name for klass in cls.__mro__ for name in getattr(klass, "__annotations__", {})}


@pytest.mark.parametrize("event", ["Requested", "Attempted", "DraftCreated", "SearchedMiss"])
def test_the_fields_the_table_names_are_the_events_fields(event: str) -> None:
    # Plain lower-case names in the row are its fields; `timeout` is the provider setting
    # the deadline is made of, `rfc822msgid:` a query's prefix.
    named = {w for w in CODE.findall(event_rows()[event]) if re.fullmatch(r"[a-z_]+", w)}
    assert named, event
    assert named - fields_of(getattr(SendJob, event)) - {"timeout"} == set()


def test_the_reasons_resolutions_and_routes_are_the_vocabulary() -> None:
    rows = event_rows()
    assert set(CODE.findall(rows["Escalated"])) == {r.value for r in EscalationReason}
    assert set(CODE.findall(rows["Resolved"])) == {r.value for r in Resolution}
    routes = set(CODE.findall(rows["Confirmed"])) - {"verify_at"}
    assert routes == {v.value for v in ConfirmedVia}


def test_the_states_shown_are_the_job_states() -> None:
    text = section("The job's events")
    listed = re.search(r"States shown to users: (.*?)\. ", text, re.S)
    assert listed
    assert CODE.findall(listed.group(1)) == [s.value for s in JobState]


def test_the_events_named_as_policy_decisions_carry_the_policy() -> None:
    text = section("The job's events")
    named = re.search(r"records a policy's decision \((.*?)\)", text, re.S)
    assert named
    carrying = {
        name for name, cls in event_classes().items() if {"policy", "fingerprint"} <= fields_of(cls)
    }
    assert set(CODE.findall(named.group(1))) == carrying


def test_the_tick_has_the_five_steps_in_order() -> None:
    steps = re.findall(r"^\d\. \*\*(\w+)\*\*", section("The tick"), re.M)
    rig = EngineRig(policy("receipts"))
    try:
        # A FirstDue is the steps it hands out as one (verify and the confirmed jobs' tidy).
        flat = [s for step in rig.engine._checks_steps for s in getattr(step, "steps", [step])]
        names = [type(step).__name__.lower() for step in flat]
        states = [step.state.value for step in flat]
    finally:
        rig.close()
    checks = list(dict.fromkeys(names))  # the tidy runs once per final state
    assert steps == ["dispatch", *checks]
    assert states[:3] == [JobState.ATTEMPTED, JobState.UNKNOWN, JobState.CONFIRMED]
    assert (Recover.state, Sweep.state, Verify.state) == tuple(states[:3])
    assert set(states[3:]) == FINAL_STATES


# -- the Gmail outcome table: every row fed what it names --------------------------------


def google_error(status: int, reason: str) -> bytes:
    errors = [{"message": "m", "domain": "usageLimits", "reason": reason}]
    return json.dumps({"error": {"code": status, "message": "m", "errors": errors}}).encode()


def lost(cause: BaseException) -> ResponseLostError:
    return ResponseLostError("request written, then no response", host="h", cause=cause)


#: What each row of the table names, as the classifier is handed it.
ROW_INPUTS: dict[str, list[BaseException | tuple[int, dict[str, str], bytes]]] = {
    "no connection made (refused, DNS failure, connect timeout, TLS handshake failed)": [
        ConnectionRefusedError(),
        socket.gaierror(-2, "Name or service not known"),
        NotSentError("connect timed out", host="h", cause=TimeoutError()),
        NotSentError("TLS handshake failed", host="h", cause=ssl.SSLError()),
        ssl.SSLCertVerificationError("certificate verify failed"),
    ],
    "request sent, then timeout / reset / closed without response": [
        lost(TimeoutError()),
        lost(ConnectionResetError()),
        lost(http.client.RemoteDisconnected()),
        TimeoutError(),
        ConnectionResetError(),
        http.client.RemoteDisconnected(),
    ],
    "2xx with a message id": [(200, {}, b'{"id": "18c0ffee"}'), (202, {}, b'{"id": "x1"}')],
    "2xx without a readable id": [(200, {}, b"{}"), (200, {}, b"not json")],
    "5xx": [(500, {}, b""), (502, {}, b""), (503, {}, b"")],
    "429; 403 rateLimitExceeded / userRateLimitExceeded / dailyLimitExceeded": [
        (429, {"Retry-After": "7"}, b""),
        (403, {}, google_error(403, "rateLimitExceeded")),
        (403, {}, google_error(403, "userRateLimitExceeded")),
        (403, {}, google_error(403, "dailyLimitExceeded")),
    ],
    "400 and other 4xx": [
        (400, {}, google_error(400, "invalidArgument")),
        (403, {}, google_error(403, "forbidden")),
        (404, {}, b""),
    ],
}


def classified(given: BaseException | tuple[int, dict[str, str], bytes]) -> SendOutcome:
    if isinstance(given, BaseException):
        return classify_send_exception(given)
    return classify_send_response(*given)


def expected(outcome: str) -> dict[str, object]:
    """What an outcome cell says, as SendOutcome fields."""
    kind = CODE.findall(outcome)[0]
    said: dict[str, object] = {"kind": SendKind(kind.lower())}
    if kind == "Rejected":
        said["transient"] = "transient" in outcome
        assert said["transient"] != ("permanent" in outcome), outcome
        said["unavailable"] = "unavailable" in outcome
    return said


def test_the_outcome_table_is_the_classification() -> None:
    rows = dict(table(section("Outcome classification of a Gmail send")))
    assert set(rows) == set(ROW_INPUTS)
    for what, inputs in ROW_INPUTS.items():
        said = expected(rows[what])
        for given in inputs:
            outcome = classified(given)
            got = {name: getattr(outcome, name) for name in said}
            assert got == said, (what, given, outcome)
    retried = classified(
        ROW_INPUTS["429; 403 rateLimitExceeded / userRateLimitExceeded / dailyLimitExceeded"][0]
    )
    assert "Retry-After when given" in rows[next(r for r in rows if r.startswith("429"))]
    assert retried.retry_after == 7.0


def test_the_read_back_names_the_unreliable_handle_in_the_log_and_status(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rig = EngineRig(policy("receipts"))
    try:
        rig.provider.replaces_message_id = True
        rig.submit("receipts", "k1")
        with caplog.at_level(logging.CRITICAL, logger="sendledger.engine"):
            rig.tick()
        assert "PROVIDER fake REPLACED OUR MESSAGE-ID" in caplog.text
        line = Daemon.status_line(SimpleNamespace(engine=rig.engine))  # type: ignore[arg-type]
        assert line.endswith("; HANDLE UNRELIABLE: fake")
    finally:
        rig.close()
    assert "the daemon's log and systemd status say so" in flat(
        section("The read-back of the Message-ID")
    )


# -- the guarantees ------------------------------------------------------------------------


def test_the_guarantee_columns_are_the_on_unknown_modes() -> None:
    header = next(line for line in section("Guarantees").splitlines() if line.startswith("|"))
    columns = CODE.findall(header)
    assert columns == list(get_args(OnUnknown))


@pytest.mark.parametrize("misses", [2, 3])
@pytest.mark.parametrize("late", [False, True])
def test_the_last_search_is_at_the_end_of_the_windows(misses: int, late: bool) -> None:
    """A copy indexed within search_after + (confirm_misses - 1) x search_interval is found;
    one indexed later is believed missing and a `retry` channel sends again."""
    assert "(`search_after` + (`confirm_misses` - 1) x `search_interval`)" in section("Guarantees")
    search_after, interval = 60, 30
    window = search_after + (misses - 1) * interval
    rig = EngineRig(
        policy("receipts", on_unknown="retry", confirm_misses=misses),
        index_lag=window + 1 if late else window - 1,
    )
    try:
        rig.submit("receipts", "k1")
        rig.provider.script(Scripted.dropped_response())
        rig.tick()
        rig.advance_and_tick(search_after)
        for _ in range(misses - 1):
            rig.advance_and_tick(interval)
        rig.tick()
        assert rig.provider.sends == (2 if late else 1)
        assert rig.job("k1").state is JobState.CONFIRMED
    finally:
        rig.close()


def test_the_crash_matrix_is_the_one_described() -> None:
    """The points and relay modes the page lists are the ones the e2e matrix runs."""
    tree = ast.parse((REPO / "tests" / "e2e" / "test_crash_matrix.py").read_text("utf-8"))
    found: dict[str, list[str]] = {}
    for node in tree.body:
        target = getattr(node, "target", None) or (getattr(node, "targets", None) or [None])[0]
        if isinstance(target, ast.Name) and target.id in ("POINTS", "MODES"):
            value = node.value  # type: ignore[attr-defined]
            found[target.id] = [ast.literal_eval(elt) for elt in value.elts]
    text = flat(section("How each is tested"))
    modes = re.search(r"for each of (.*?); each ends", text)
    assert modes
    listed = re.split(r", | and ", modes.group(1))
    assert listed == found["MODES"]
    assert found["POINTS"] == ["after-claim", "after-send", "after-search"]
    assert "after the claim, after the send, after the search" in text
