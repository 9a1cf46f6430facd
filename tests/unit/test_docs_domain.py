"""What the docs say sendledger does (events, outcomes, tick, layers, make, bench), vs the code."""

from __future__ import annotations

import contextlib
import http.client
import json
import re
import socket
import ssl
from datetime import UTC, datetime
from typing import Any

from tests.unit.docs_code import EVENTS, FIELDS, MAKE_TARGETS, bench, parsers
from tests.unit.docs_page import CODE, SRC, block, flat, keyed, page, section, table
from tests.unit.engine_rig import EngineRig, policy

from daemon.cli import COMMANDS
from daemon.cli.audit import EVENT_TYPES
from daemon.engine import recover, search
from daemon.providers import gmail, graph, smtp_imap
from daemon.providers.base import Provider, ProviderBase, SendKind
from daemon.providers.classify import classify_send_exception, classify_send_response
from daemon.providers.smtp_classify import Stage
from daemon.providers.transport import NotSentError, ResponseLostError
from ledger import decision_types
from ledger.job import SendJob
from ledger.vocabulary import FINAL_STATES, ConfirmedVia, EscalationReason, Resolution


def gerr(status: int, reason: str) -> tuple[int, dict[str, str], bytes]:
    return status, {}, json.dumps({"error": {"errors": [{"reason": reason}]}}).encode()


DAEMON = {p.name for p in (SRC / "daemon").iterdir() if (p / "__init__.py").is_file()}
DROPS = [TimeoutError(), ConnectionResetError(), http.client.RemoteDisconnected("")]
#: What each row of the Gmail outcome table names (by its first words), as the classifier is
#: handed it; the 403 reasons a row names are added from the row.
ROW_INPUTS: dict[str, list[Any]] = {
    "no connection made": [
        *(NotSentError("n", host="h", cause=c) for c in (TimeoutError(), ssl.SSLError())),
        *(ConnectionRefusedError(), socket.gaierror(-2, "x"), ssl.SSLCertVerificationError()),
    ],
    "request sent": [*(ResponseLostError("l", host="h", cause=c) for c in DROPS), *DROPS],
    "2xx with a message id": [(200, {}, b'{"id": "18c0ffee"}'), (202, {}, b'{"id": "x1"}')],
    "2xx without a readable id": [(200, {}, b"{}"), (200, {}, b"not json")],
    "5xx": [(500, {}, b""), (502, {}, b""), (503, {}, b"")],
    "429": [(429, {"Retry-After": "7"}, b"")],
    "400 and other 4xx": [gerr(400, "invalidArgument"), gerr(403, "forbidden"), (404, {}, b"")],
}


def test_the_event_table_and_versions_are_the_job_s_events_topics_fields_and_words() -> None:
    rows = {n: c[0] for n, c in keyed(section("how-it-works.md", "The job's events")).items()}
    assert set(rows) == set(EVENTS) == set(EVENT_TYPES)
    assert all(f"sendledger:SendJob.{name}" == cls.TOPIC for name, cls in EVENTS.items())
    for name in ("Requested", "Attempted", "DraftCreated", "SearchedMiss"):  # rows of fields
        named = {w for w in CODE.findall(rows[name]) if re.fullmatch(r"[a-z_]+", w)}
        assert named and named - FIELDS[name] <= {"timeout"}, name
    words = {"Escalated": EscalationReason, "Resolved": Resolution, "Confirmed": ConfirmedVia}
    for name, kind in words.items():
        assert set(CODE.findall(rows[name])) - {"verify_at"} == {k.value for k in kind}, name
    text = flat(section("architecture.md", "Stored events keep loading"))
    written = {name: int(n) for name, n in re.findall(r"`(\w+)` (?:is )?at version (\d+)", text)}
    versions = {name: getattr(event, "class_version", 1) for name, event in EVENTS.items()}
    assert written == {name: v for name, v in versions.items() if v > 1}
    steps = [(n, f"upcast_v{s}_v{s + 1}") for n, v in versions.items() for s in range(1, v)]
    assert [step for step in steps if not hasattr(EVENTS[step[0]], step[1])] == []


def test_the_tick_s_steps_are_the_engine_s_in_order() -> None:
    steps = re.findall(r"^\d\. \*\*(\w+)\*\*", section("how-it-works.md", "The tick"), re.M)
    with contextlib.closing(EngineRig(policy("receipts"))) as rig:  # a FirstDue is several
        done = [s for step in rig.engine._checks_steps for s in getattr(step, "steps", [step])]
    assert steps == ["dispatch", *dict.fromkeys(type(s).__name__.lower() for s in done)]
    states = [step.state for step in done]
    assert states[:3] == [recover.Recover.state, search.Sweep.state, search.Verify.state]
    assert set(states[3:]) == FINAL_STATES


def test_the_outcome_tables_are_the_classification_and_the_providers() -> None:
    table = keyed(section("how-it-works.md", "Outcome classification of a Gmail send"))
    rows = {re.split(r" \(|[;,]", what)[0]: (what, cells[0]) for what, cells in table.items()}
    assert set(rows) == set(ROW_INPUTS)
    for first, (what, cell) in rows.items():
        kind = CODE.findall(cell)[0]
        said: dict[str, object] = {"kind": SendKind(kind.lower())}
        if kind == "Rejected":
            said |= {"transient": "transient" in cell, "unavailable": "unavailable" in cell}
            assert said["transient"] != ("permanent" in cell), cell
        quota = [gerr(403, reason) for reason in re.findall(r"\w+Exceeded", what)]
        for given in [*ROW_INPUTS[first], *quota]:
            error = isinstance(given, BaseException)
            outcome = classify_send_exception(given) if error else classify_send_response(*given)
            assert {name: getattr(outcome, name) for name in said} == said, (what, given)
    # providers.md's outcomes are the classifiers' (test_smtp_classify.py): its stages, read-back
    kinds = keyed(section("providers.md", "What each kind does"))
    readable = (gmail.GmailProvider, smtp_imap.SmtpImapProvider, graph.GraphProvider)
    read_back = [not cell.startswith("none:") for cell in kinds["read-back of the Message-ID"]]
    assert read_back == [p.response_ids_readable for p in readable]
    stages = re.search(r"to ((?:[A-Z]+, )*[A-Z]+ or [A-Z]+);", kinds["not sent"][1])
    named = re.split(r", | or ", stages.group(1)) if stages else []
    assert named and all({"EHLO": "HELLO"}.get(n, n) in Stage.__members__ for n in named)


def test_the_layer_list_is_the_daemon_s_packages_and_modules() -> None:
    text = block(section("architecture.md", "Layers and what each may import"))
    assert set(re.findall(r"daemon/(\w+)/", text)) == DAEMON
    wiring = text.split("At its top level only the wiring:", 1)[1].split("Then one package")[0]
    top = {p.name for p in (SRC / "daemon").glob("*.py")} - {"__init__.py", "__main__.py"}
    assert set(re.findall(r"\w+\.py", wiring)) == top
    for package in ("service_layer", "cli"):
        listed = re.search(rf"daemon/{package}/: [^(]*\(([^);]*)", text, re.S)
        named = set(re.findall(r"[a-z_]+", listed.group(1) if listed else ""))
        modules = {p.stem for p in (SRC / "daemon" / package).glob("*.py")} - {"__init__"}
        assert named and modules - {"output", "parsers"} <= named <= modules


def test_the_typed_decisions_table_is_the_job_s_commands_and_the_decision_types() -> None:
    rows = table(section("architecture.md", "Typed decisions"))
    job = {n: v for n, v in vars(SendJob).items() if n[0] > "_"}  # not _private nor TOPIC
    commands = {n for n, v in job.items() if not isinstance(v, type | property)}
    assert {c for row in rows for c in re.findall(r"\(`(\w+)`", row[0])} == commands
    own = {n: v for n, v in vars(decision_types).items() if n[0] != "_" and isinstance(v, type)}
    kinds = {n for n, v in own.items() if v.__module__ == decision_types.__name__}
    assert {w for row in rows for w in re.findall(r"`([A-Z]\w+)", row[1])} - {"Resolution"} == kinds
    given = [r for row in rows for r in re.findall(r"Review\(([^)]*)\)", row[1])]
    reasons = {r.strip() for r in "/".join(given).split("/")}
    reasons |= {r for row in rows for r in re.findall(r"Escalated\(([\w-]+)\)", row[2])}
    assert reasons == {reason.value for reason in EscalationReason}


def test_a_new_provider_s_capabilities_are_the_port_s_with_the_defaults_written() -> None:
    text = flat(section("architecture.md", "Adding a provider"))
    listed = text.split("The capabilities, with their defaults:", 1)[1].split("2. ", 1)[0]
    written = dict(re.findall(r"`(\w+)(?:\([^)]*\))?` \(([^):]*)", listed))
    members = {n for n in dir(Provider) if n[0] != "_"} | set(Provider.__annotations__)
    calls = {"send_raw", "search", "read_message_id", "close", "name"}
    assert set(written) | {"readback_first"} == members - calls  # `a` / `b` (...): one row
    base = type("Plain", (ProviderBase,), {"name": "plain"})()
    meant: dict[str, object] = {"False": False, "None": None, "0.0": 0.0, "30 s": 30.0, "0": 0}
    meant |= {"its name": "plain", "`scope(": "plain", "itself": base, "none deleted": []}
    meant["nothing listed"] = ()
    args = {"for_job": ("a@b.c", None), "delete_drafts": ("<a@b>",), "scope_of": ("a@b.c",)}
    valued = {n: d for n, d in written.items() if d in meant}
    reports = base.read_reports(datetime.now(UTC), known=(), max_bytes=1, limit=1)
    shown: dict[str, Any] = {"read_reports": reports.listed}
    for name in set(valued) - {"read_reports"}:
        value = getattr(base, name)
        shown[name] = value(*args.get(name, ())) if callable(value) else value
    assert shown == {n: meant[d] for n, d in valued.items()}
    assert set(written) - set(valued) == {"readback_rate", "ping"}  # said in words


def made(text: str) -> set[str]:
    """The make targets a text runs: `make a b  # ...` lines and `make a` spans."""
    lines = re.findall(r"^make ([a-z0-9 _-]+?)\s*(?:#|$)", text, re.M)
    return {w for x in lines for w in x.split()} | set(re.findall(r"`make ([a-z0-9_-]+)`", text))


def test_the_make_targets_bench_scripts_their_options_and_layout_are_the_tree_s() -> None:
    makefile, text = page("Makefile"), page("development.md")
    deps = dict(re.findall(r"^([a-z$(][\w$()-]*):(.*)$", makefile, re.M))
    recipes = dict(re.findall(r"^([a-z$(][\w$()-]*):.*\n((?:\t.*\n?)*)", makefile, re.M))
    assert made(text) == MAKE_TARGETS
    listed = text.split("make bench", 1)[1].split("make test-py313")[0]
    scripts = re.findall(r"bench/\w+\.py", recipes["bench"])
    assert re.findall(r"bench/\w+\.py", listed) == scripts
    installing = {t for t, d in deps.items() if {"$(STAMP)", "$(RUN_STAMP)"} & set(d.split())}
    assert installing - {"$(STAMP)"} == made(block(text, "sh")) - {"clean", "test-py313"}
    assert deps["demo"].split() == deps["try"].split() == ["$(RUN_STAMP)"]  # only what runs
    assert " -e ." in recipes["$(RUN_STAMP)"] and "[test]" not in recipes["$(RUN_STAMP)"]
    assert "$(RUN_STAMP)" in deps["$(STAMP)"]
    # What `make test` runs, .ci/run running it with CI set, the test packages it installs.
    runs = {"test-py313", "lint", "typecheck", "test-eventsourcing", "tests"}
    ci = page(".ci/run")
    assert runs <= set(recipes["test"].split()) and ci.index("CI=") < ci.index("exec make test")
    packages = set(makefile.split("TEST_PACKAGES := ", 1)[1].split("\n\n", 1)[0].split())
    assert {"postgresql-15", "postfix", "dovecot-imapd"} <= set(packages)
    url = re.search(r"`(postgresql://[^`]+)`", section("development.md", "The private PostgreSQL"))
    assert url and url.group(1) in page("tests/conftest.py")
    part = r"`(bench/\w+\.py)`\)?[ ,]*\(?(?:part of|in) `make bench`"
    parts = re.findall(part, page("performance.md"))
    assert parts and set(parts) <= set(scripts)
    layout = section("development.md", "Layout")
    packages = {p.name for p in SRC.iterdir() if (p / "__init__.py").is_file()}
    assert set(re.findall(r"^- `src/([\w/]+)/`", layout, re.M)) == packages | {"ledger/stores"}
    daemon = layout.split("- `src/daemon/`", 1)[1].split("\n- ")[0]
    assert set(re.findall(r"`(\w+)/`", daemon)) == DAEMON
    text, where, known, wrong = flat(page("performance.md")), "", set(), []  # a script's options
    for span in CODE.findall(text):  # or a command's, up to the next span naming another
        first = span.removeprefix('HISTORY_ARGS="').split()[0]
        script = re.match(r"^(?:bench/)?(\w+\.py)\b", first)
        if script or span.startswith('HISTORY_ARGS="'):
            where = script.group(1) if script else "history.py"
            known = set(bench(where))
        elif first in COMMANDS:
            path = tuple(span.split()[:2])  # a command, or a command of a group
            where = " ".join(path if path in parsers() else path[:1])
            known = {o for a in parsers()[tuple(where.split())]._actions for o in a.option_strings}
        for option in set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", span)) - {"--variant"}:
            if option not in known:
                wrong.append(f"`{span}`: {option} of {where or 'nothing'}")
    assert wrong == []
    variants = set(re.findall(r"`--variant ([\w-]+)`", text)) - {"email-package-mime"}  # gone
    offered = re.findall(r'^    "([\w-]+)": Variant\(', page("bench/pipeline.py"), re.M)
    assert variants == set(offered)
