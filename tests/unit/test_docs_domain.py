"""What the docs say sendledger does, against the code that does it, both ways
(docs/development.md "Writing the docs"): the events, outcome table (each row fed what it
names), tick steps and guarantee columns of docs/how-it-works.md; the layers, typed
decisions, event versions and provider capabilities of docs/architecture.md; the kinds of
docs/providers.md; the make targets and layout of docs/development.md; the bench options
of docs/performance.md. Lists in prose: test_docs_figures.py."""

from __future__ import annotations

import ast
import http.client
import json
import re
import socket
import ssl
from datetime import UTC, datetime
from typing import Any, get_args

from eventsourcing.domain import Aggregate
from tests.unit.docs_page import CODE, REPO, flat, keyed, page, section, table
from tests.unit.engine_rig import EngineRig, policy

from daemon.cli import COMMANDS, build_parser
from daemon.cli.audit import EVENT_TYPES
from daemon.engine.recover import Recover
from daemon.engine.search import Sweep, Verify
from daemon.providers.base import Provider, ProviderBase, SendKind
from daemon.providers.classify import classify_send_exception, classify_send_response
from daemon.providers.gmail import DRAFT_SCOPES, SCOPES, GmailProvider
from daemon.providers.gmail_drafts import COMPOSE_SCOPE
from daemon.providers.graph import GraphProvider
from daemon.providers.smtp_classify import Stage
from daemon.providers.smtp_imap import SmtpImapProvider
from daemon.providers.transport import NotSentError, ResponseLostError
from ledger import decision_types
from ledger.job import SendJob
from ledger.vocabulary import (
    FINAL_STATES,
    ConfirmedVia,
    EscalationReason,
    Resolution,
)
from policies.model import OnUnknown

SRC = REPO / "src"


# -- docs/how-it-works.md ------------------------------------------------------------------


def fields_of(cls: type[Any]) -> set[str]:
    return {name for klass in cls.__mro__ for name in getattr(klass, "__annotations__", {})}


def test_the_event_table_is_the_job_s_events_their_topics_fields_and_words() -> None:
    rows = {
        n: c[0] for n, c in keyed(section("how-it-works.md", "The job's events"), "event").items()
    }
    events = {
        name: cls
        for name, cls in vars(SendJob).items()
        if isinstance(cls, type)
        and issubclass(cls, Aggregate.Event)
        and name not in ("Event", "Created")
    }
    assert set(rows) == set(events) == set(EVENT_TYPES)
    assert all(f"sendledger:SendJob.{name}" == cls.TOPIC for name, cls in events.items())
    for name in ("Requested", "Attempted", "DraftCreated", "SearchedMiss"):  # rows of fields
        named = {w for w in CODE.findall(rows[name]) if re.fullmatch(r"[a-z_]+", w)}
        assert named and named - fields_of(events[name]) <= {"timeout"}, name
    words = {"Escalated": EscalationReason, "Resolved": Resolution, "Confirmed": ConfirmedVia}
    for name, kind in words.items():
        assert set(CODE.findall(rows[name])) - {"verify_at"} == {k.value for k in kind}, name


def test_the_tick_s_steps_are_the_engine_s_in_order() -> None:
    steps = re.findall(r"^\d\. \*\*(\w+)\*\*", section("how-it-works.md", "The tick"), re.M)
    rig = EngineRig(policy("receipts"))
    try:  # a FirstDue hands out its steps as one (verify and the confirmed jobs' tidy)
        flat_steps = [
            s for step in rig.engine._checks_steps for s in getattr(step, "steps", [step])
        ]
    finally:
        rig.close()
    assert steps == ["dispatch", *dict.fromkeys(type(s).__name__.lower() for s in flat_steps)]
    states = [step.state for step in flat_steps]
    assert [Recover.state, Sweep.state, Verify.state] == states[:3]
    assert set(states[3:]) == FINAL_STATES


def google_error(status: int, reason: str) -> bytes:
    errors = [{"message": "m", "domain": "usageLimits", "reason": reason}]
    return json.dumps({"error": {"code": status, "message": "m", "errors": errors}}).encode()


def lost(cause: BaseException) -> ResponseLostError:
    return ResponseLostError("request written, then no response", host="h", cause=cause)


#: What each row of the Gmail outcome table names, as the classifier is handed it.
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
        *((403, {}, google_error(403, r)) for r in ("rateLimitExceeded", "userRateLimitExceeded")),
        (403, {}, google_error(403, "dailyLimitExceeded")),
    ],
    "400 and other 4xx": [
        (400, {}, google_error(400, "invalidArgument")),
        (403, {}, google_error(403, "forbidden")),
        (404, {}, b""),
    ],
}


def said(cell: str) -> dict[str, object]:
    """What an outcome cell says, as SendOutcome fields."""
    kind = CODE.findall(cell)[0]
    fields: dict[str, object] = {"kind": SendKind(kind.lower())}
    if kind == "Rejected":
        fields |= {"transient": "transient" in cell, "unavailable": "unavailable" in cell}
        assert fields["transient"] != ("permanent" in cell), cell
    return fields


def test_the_gmail_outcome_table_is_the_classification() -> None:
    rows = keyed(section("how-it-works.md", "Outcome classification of a Gmail send"))
    assert set(rows) == set(ROW_INPUTS)
    for what, inputs in ROW_INPUTS.items():
        for given in inputs:
            if isinstance(given, BaseException):
                outcome = classify_send_exception(given)
            else:
                outcome = classify_send_response(*given)
            expected = said(rows[what][0])
            assert {name: getattr(outcome, name) for name in expected} == expected, (what, given)
    assert classify_send_response(429, {"Retry-After": "7"}, b"").retry_after == 7.0


def test_the_guarantee_columns_and_the_crash_matrix_are_the_code_s() -> None:
    """The crash matrix's modes: test_docs_figures.py's LISTS."""
    [header] = [row for row in page("how-it-works.md").splitlines() if row.startswith("| promise")]
    assert CODE.findall(header) == list(get_args(OnUnknown))


# -- docs/architecture.md ------------------------------------------------------------------


def test_the_layer_list_is_the_daemon_s_packages_and_modules() -> None:
    block = section("architecture.md", "Layers and what each may import").split("```")[1]
    daemon = SRC / "daemon"
    packages = {p.name for p in daemon.iterdir() if (p / "__init__.py").is_file()}
    assert set(re.findall(r"daemon/(\w+)/", block)) == packages
    wiring = block.split("At its top level only the wiring:", 1)[1].split("Then one package")[0]
    top = {p.name for p in daemon.glob("*.py")} - {"__init__.py", "__main__.py"}
    assert set(re.findall(r"\w+\.py", wiring)) == top
    for package in ("service_layer", "cli"):
        listed = re.search(rf"daemon/{package}/: [^(]*\(([^);]*)", block, re.S)
        modules = {p.stem for p in (daemon / package).glob("*.py")} - {"__init__"}
        assert listed and set(re.findall(r"[a-z_]+", listed.group(1))) <= modules
        assert modules - {"output", "parsers"} <= set(re.findall(r"[a-z_]+", listed.group(1)))


def test_the_typed_decisions_table_is_the_job_s_commands_and_the_decision_types() -> None:
    rows = table(section("architecture.md", "Typed decisions"))
    tree = ast.parse((SRC / "ledger" / "job.py").read_text())
    [job] = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "SendJob"]
    methods = [n for n in job.body if isinstance(n, ast.FunctionDef) and n.name[0] != "_"]
    commands = {n.name for n in methods if "property" not in map(ast.unparse, n.decorator_list)}
    assert {c for row in rows for c in re.findall(r"\(`(\w+)`", row[0])} == commands
    own = {n: v for n, v in vars(decision_types).items() if n[0] != "_" and isinstance(v, type)}
    kinds = {n for n, v in own.items() if v.__module__ == decision_types.__name__}
    assert {w for row in rows for w in re.findall(r"`([A-Z]\w+)", row[1])} - {"Resolution"} == kinds
    given = [r for row in rows for r in re.findall(r"Review\(([^)]*)\)", row[1])]
    reasons = {r.strip() for r in "/".join(given).split("/")}
    reasons |= {r for row in rows for r in re.findall(r"Escalated\(([\w-]+)\)", row[2])}
    assert reasons == {reason.value for reason in EscalationReason}


def test_the_event_versions_are_the_classes() -> None:
    text = flat(section("architecture.md", "Stored events keep loading"))
    written = {name: int(n) for name, n in re.findall(r"`(\w+)` (?:is )?at version (\d+)", text)}
    kinds = SendJob.Event | SendJob.Requested
    events = [v for v in vars(SendJob).values() if isinstance(v, type) and issubclass(v, kinds)]
    versioned = {e.__name__: v for e in events if (v := getattr(e, "class_version", 1)) > 1}
    assert written == versioned
    for event in events:
        for step in range(1, getattr(event, "class_version", 1)):
            assert hasattr(event, f"upcast_v{step}_v{step + 1}"), (event, step)


def test_a_new_provider_s_capabilities_are_the_port_s_with_the_defaults_written() -> None:
    text = flat(section("architecture.md", "Adding a provider"))
    listed = text.split("The capabilities, with their defaults:", 1)[1].split("2. ", 1)[0]
    written = dict(re.findall(r"`(\w+)(?:\([^)]*\))?` \(([^):]*)", listed))
    members = {n for n in dir(Provider) if n[0] != "_"} | set(Provider.__annotations__)
    calls = {"send_raw", "search", "read_message_id", "close", "name"}
    assert set(written) | {"readback_first"} == members - calls  # `a` / `b` (...): one row
    base = type("Plain", (ProviderBase,), {"name": "plain"})()
    shown = {
        name: getattr(base, name)()
        if name in ("drafts", "quota_available", "reserve_send", "scope", "forget_idle", "history")
        else getattr(base, name)
        for name in written
        if name not in ("for_job", "delete_drafts", "ping", "scope_of", "read_reports")
    }
    reports = base.read_reports(datetime.now(UTC), known=(), max_bytes=1, limit=1)
    shown |= {
        "for_job": base.for_job("a@b.c", None) is base,
        "delete_drafts": base.delete_drafts("<a@b>"),
        "scope_of": base.scope_of("a@b.c"),
        "read_reports": reports.listed,
    }
    meant = {"False": False, "None": None, "0.0": 0.0, "30 s": 30.0, "its name": "plain"}
    meant |= {"itself": True, "none deleted": [], "0": 0, "`scope(": "plain"}
    meant |= {"nothing listed": ()}
    valued = {n: d for n, d in written.items() if d in meant}
    assert {n: shown[n] for n in valued} == {n: meant[d] for n, d in valued.items()}
    # The rest are said in words no value stands for.
    assert {n for n, d in written.items() if d not in meant} == {"readback_rate", "ping"}


def test_every_invariant_names_a_test() -> None:
    invariants = re.findall(
        r"^(\d+)\. \*\*(.*?)(?=^\d+\. |\Z)", section("architecture.md", "Invariants"), re.M | re.S
    )
    assert [n for n, _ in invariants] == [str(n) for n in range(1, len(invariants) + 1)]
    assert all(re.search(r"`tests/[\w/]*", body) for _, body in invariants)


# -- docs/providers.md ---------------------------------------------------------------------


def test_the_kinds_and_what_each_does_are_the_providers() -> None:
    """The table's outcomes are the classifiers' (tests/unit/test_smtp_classify.py,
    test_graph_classify.py); here, what it names: stages and read-back."""
    rows = keyed(section("providers.md", "What each kind does"))
    readable = [GmailProvider, SmtpImapProvider, GraphProvider]
    said = [not cell.startswith("none:") for cell in rows["read-back of the Message-ID"]]
    assert said == [p.response_ids_readable for p in readable]
    stages = re.search(r"to ((?:[A-Z]+, )*[A-Z]+ or [A-Z]+);", rows["not sent"][1])
    named = re.split(r", | or ", stages.group(1)) if stages else []
    assert named and all({"EHLO": "HELLO"}.get(n, n) in Stage.__members__ for n in named)
    assert [*SCOPES, COMPOSE_SCOPE] == DRAFT_SCOPES  # the setup's scopes: test_docs_figures


# -- docs/operations.md, docs/development.md, docs/performance.md -------------------------


def made(text: str) -> set[str]:
    """The make targets a text runs: `make a b  # ...` lines and `make a` spans."""
    lines = re.findall(r"^make ([a-z0-9 _-]+?)\s*(?:#|$)", text, re.M)
    return {w for line in lines for w in line.split()} | set(
        re.findall(r"`make ([a-z0-9_-]+)`", text)
    )


def test_the_make_targets_bench_scripts_and_layout_are_the_tree_s() -> None:
    makefile, text = (REPO / "Makefile").read_text(encoding="utf-8"), page("development.md")
    deps = dict(re.findall(r"^([a-z$(][\w$()-]*):(.*)$", makefile, re.M))
    recipes = dict(re.findall(r"^([a-z$(][\w$()-]*):.*\n((?:\t.*\n?)*)", makefile, re.M))
    assert made(text) == set(re.findall(r"^([a-z][a-z0-9_-]*):", makefile, re.M))
    listed = text.split("make bench", 1)[1].split("make test-py313")[0]
    bench = re.findall(r"bench/\w+\.py", recipes["bench"])
    assert re.findall(r"bench/\w+\.py", listed) == bench
    installing = {t for t, d in deps.items() if {"$(STAMP)", "$(RUN_STAMP)"} & set(d.split())}
    block = text.split("```sh", 1)[1].split("```", 1)[0]  # "every target above but ..."
    assert installing - {"$(STAMP)"} == made(block) - {"clean", "test-py313"}
    assert deps["demo"].split() == deps["try"].split() == ["$(RUN_STAMP)"]  # only what runs
    assert " -e ." in recipes["$(RUN_STAMP)"] and "[test]" not in recipes["$(RUN_STAMP)"]
    assert "$(RUN_STAMP)" in deps["$(STAMP)"]
    # "`make test` runs it first, beside lint and mypy"; "runs it too"; "installs ... Postfix
    # and Dovecot"; "`.ci/run` only sets `CI=true` ... and runs `make test`".
    last = [line.split()[-1] for line in recipes["test"].splitlines()]
    assert last == ["typecheck", "test-eventsourcing", "tests"]
    assert recipes["test"].split("\n")[0].split()[-3:] == ["test-py313", "lint", "typecheck"]
    packages = re.search(r"^TEST_PACKAGES := (.*(?:\\\n.*)*)", makefile, re.M)
    assert packages and {"postgresql-15", "postfix", "dovecot-imapd"} <= set(packages[1].split())
    ci = [line for line in (REPO / ".ci" / "run").read_text().splitlines() if line[:1] != "#"]
    assert [line for line in ci if line][-2:] == ['export CI="${CI:-true}"', "exec make test"]
    url = re.search(r"`(postgresql://[^`]+)`", section("development.md", "The private PostgreSQL"))
    assert url and url.group(1) in (REPO / "tests" / "conftest.py").read_text()
    parts = re.findall(
        r"`bench/(\w+\.py)`\)?[ ,]*\(?(?:part of|in) `make bench`", page("performance.md")
    )
    assert parts and all(f"bench/{script}" in bench for script in parts)
    layout = section("development.md", "Layout")
    packages = {p.name for p in SRC.iterdir() if (p / "__init__.py").is_file()}
    assert set(re.findall(r"^- `src/([\w/]+)/`", layout, re.M)) == packages | {"ledger/stores"}
    rooms = {p.name for p in (SRC / "daemon").iterdir() if (p / "__init__.py").is_file()}
    daemon = layout.split("- `src/daemon/`", 1)[1].split("\n- ")[0]
    assert set(re.findall(r"`(\w+)/`", daemon)) == rooms


def options(where: str) -> set[str]:
    """The options of a bench script (`x.py`) or of a command (`sendledger review list`)."""
    if where.endswith(".py"):
        tree = ast.parse((REPO / "bench" / where).read_text(encoding="utf-8"))
        calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
        added = [n for n in calls if getattr(n.func, "attr", "") == "add_argument"]
        return {str(a.value) for n in added for a in n.args[:2] if isinstance(a, ast.Constant)}
    parser = build_parser(where.split()[0])
    for word in where.split():
        sub = next(a for a in parser._actions if isinstance(a.choices, dict))
        parser = sub.choices.get(word, parser)
    return {o for a in parser._actions for o in a.option_strings}


def test_every_bench_option_and_variant_the_performance_page_names_exists() -> None:
    text, where, wrong = flat(page("performance.md")), "", []
    for span in CODE.findall(text):
        first = span.removeprefix('HISTORY_ARGS="').split()[0]
        if script := re.match(r"^(?:bench/)?(\w+\.py)\b", first):
            where = script.group(1)
        elif first in COMMANDS:
            where = " ".join(w for w in span.split()[:2] if not w.startswith("-"))
        elif span.startswith('HISTORY_ARGS="'):
            where = "history.py"
        for option in set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", span)) - {"--variant"}:
            if option not in options(where) if where else True:
                wrong.append(f"`{span}`: {option} of {where or 'nothing'}")
    assert wrong == []
    variants = set(re.findall(r"`--variant ([\w-]+)`", text)) - {"email-package-mime"}  # gone
    tree = ast.parse((REPO / "bench" / "pipeline.py").read_text(encoding="utf-8"))
    offered = [
        n.value for n in tree.body if "VARIANTS" in map(ast.unparse, getattr(n, "targets", []))
    ]
    assert variants == {ast.literal_eval(k) for k in offered[0].keys if k}  # type: ignore[attr-defined]
    # The page's tables each name the script that measured them.
    for lead_in, rows in zip(
        *[iter(re.split(r"\n((?:\|.*\n)+)", page("performance.md")))] * 2, strict=False
    ):
        said = lead_in.rsplit("\n\n", 1)[-1] + rows
        assert re.search(r"`(?:bench/)?\w+\.py", said), f"performance.md: no script for {rows}"
