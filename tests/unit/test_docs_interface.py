"""cli.md, http-api.md and review.md against the parser, the OpenAPI document, the client, the
metrics registry and the code behind them, both ways (docs/development.md "Writing the docs")."""

from __future__ import annotations

import argparse
import ast
import inspect
import json
import re
from argparse import SUPPRESS
from datetime import UTC, datetime
from itertools import accumulate
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client.metrics import MetricWrapperBase
from tests.unit.docs_code import parsers
from tests.unit.docs_code import rig as rig
from tests.unit.docs_page import CODE, REPO, block, flat, keyed, page, section, table
from tests.unit.engine_rig import EngineRig
from tests.unit.test_api_routes import AUTH, api_context

import daemon.cli
from daemon import exit_codes
from daemon.api.app import create_app
from daemon.api.errors import STATUS
from daemon.api.metrics import Metrics, Sources, _StoreGauges
from daemon.api.recorded_metrics import RecordedByPeople
from daemon.doubles.fake_provider import Scripted
from daemon.engine.circuit import OpenCircuit
from daemon.service_layer.read_models import event_record, job_status, review_rows
from daemon.service_layer.services import CheckAnswer, Copy, TriageItem
from daemon.webhooks.events import WEBHOOK_TYPES
from daemon.webhooks.status import webhook_status
from ledger import attachments, content, extra_headers
from ledger.application import SubmitResult
from ledger.exceptions import Refusal
from sendledger import client as client_module

OPENED = OpenCircuit("fake", datetime(2026, 1, 1, tzinfo=UTC), 3, datetime.now(UTC), False)


def documented() -> dict[tuple[str, ...], list[str]]:
    """Each command path of the list with its entry's lines (a command listed in two forms
    has both); an option its description names is the command's too."""
    entries: dict[tuple[str, ...], list[str]] = {}
    for line in block(section("cli.md", "## Command line", until=6)).splitlines():
        if words := re.match(r"sendledger((?: [a-z][a-z-]*)*)", line):
            current = entries.setdefault(tuple(words[1].split()), [])
        current.append(line)
    return entries


def test_every_command_option_argument_choice_and_exit_code_is_the_parser_s() -> None:
    listed, commands = documented(), parsers()
    assert set(listed) == set(commands)
    hidden = (argparse._HelpAction, argparse._SubParsersAction)  # a suppressed option: the top's
    for path, parser in commands.items():
        actions = [a for a in parser._actions if not isinstance(a, hidden) and a.help != SUPPRESS]
        written = set(re.findall(r"--[a-z][a-z-]*", " ".join(listed[path]))) - {"--help"}
        assert written == {o for a in actions for o in a.option_strings if o[:2] == "--"}, path
        own = [x for x in listed[path] if x.startswith("sendledger") or re.match(r"\s+\[", x)]
        line = " ".join(re.split(r"\s{3,}", x.strip())[0] for x in own)  # without descriptions
        for action in actions:
            if not action.option_strings:  # a positional: in brackets when optional
                name = str(action.metavar or action.dest).upper()
                pattern = rf"\[{name}\b" if action.nargs == "?" else rf"(?<!\[){name}\b"
                assert re.search(pattern, line), (path, name)
            elif action.required:
                assert re.search(rf"(?<!\[){action.option_strings[0]}\b", line), path
        by_option = {o: a for a in actions for o in a.option_strings}
        for option, written in re.findall(r"(--[a-z-]+)[ =]([a-z][\w-]*(?:\|[a-z][\w-]*)+)", line):
            assert set(written.split("|")) == set(by_option[option].choices or ()), option
    rows = keyed(section("cli.md", "### Exit codes"), "Code")
    constants = {v for k, v in vars(exit_codes).items() if k.startswith("EXIT_")} | {130}
    assert set(rows) == {str(code) for code in constants}
    named = {"bad input": Refusal.BAD_INPUT, "unknown job": Refusal.NOT_FOUND}
    named |= {"conflict": Refusal.CONFLICT, "unexpected failure": Refusal.UNAVAILABLE}
    assert set(named.values()) == set(Refusal)  # each refusal on the row that names it
    assert all(rows[str(exit_codes.REFUSAL_CODES[r])][0].startswith(w) for w, r in named.items())
    epilog = daemon.cli.build_parser().epilog or ""
    assert {int(code) for code in re.findall(r"\b(\d+) [a-z]", epilog)} == constants
    # docs/architecture.md "One service layer": each refusal's exit code and HTTP status.
    layer = flat(section("architecture.md", "One service layer"))
    said = {int(c): int(s) for c, s in re.findall(r": (?:exit )?(\d) / (\d{3})\b", layer)}
    assert said == {exit_codes.REFUSAL_CODES[r]: STATUS[r] for r in Refusal}


def test_the_job_fields_and_limits_are_the_intake_s() -> None:
    text = section("cli.md", "### Message fields", until=3)
    optional = re.search(r"Optional: ((?:`\w+`,\s)+)and:", text)
    rows = CODE.findall(optional.group(1)) + list(keyed(text, "Field")) if optional else []
    assert sorted(rows) == sorted(content.OPTIONAL_FIELDS)
    limits = {"subject": [content.MAX_SUBJECT], "extra headers": [content.MAX_EXTRA_HEADERS]}
    limits |= {"one extra header value": [content.MAX_HEADER_VALUE]}
    limits |= {"extra header name": [extra_headers.MAX_HEADER_NAME]}
    limits["an address as typed, display name included"] = [content.MAX_ADDRESS_TEXT]
    limits["references"] = [content.MAX_REFERENCES, extra_headers.MAX_MESSAGE_ID]
    limits["attachment file name"] = [attachments.MAX_FILENAME]
    limits["the whole message"] = [25]  # the gmail default, checked in test_docs_settings
    rows = table(section("cli.md", "#### Limits"), "What")
    numbers = {r[0]: [int(n.replace(",", "")) for n in re.findall(r"\d[\d,]*", r[1])] for r in rows}
    assert numbers == limits


def shown(path: tuple[str, ...], after: str = "sendledger") -> list[str]:
    """The quoted names of the first `{...}` (braces matched) of a command's entry after `after`."""
    text = " ".join(line.strip() for line in documented()[path]).split(after, 1)[-1]
    text = text[text.index("{") :]
    depth = accumulate({"{": 1, "}": -1}.get(c, 0) for c in text)
    return names(text[: next(i for i, d in enumerate(depth) if d == 0) + 1])


def test_each_command_prints_the_fields_the_list_shows(rig: EngineRig) -> None:
    submitted = SubmitResult(key="k", message_id="<m@x>", state="requested", created=True)
    assert shown(("submit",)) == list(submitted.as_dict())
    rig.submit("receipts", "shown")
    rig.provider.script(Scripted.lost_request())
    rig.tick()
    assert [f for f in shown(("status",)) if f != "send_at"] == list(job_status(rig.job("shown")))
    assert shown(("status",), after='"purged":') == ["at", "by"]
    history = list(event_record(rig.ledger.history("shown")[0]))[:3]
    assert history == shown(("history",), after="oldest first:")
    [row] = review_rows(rig.ledger)
    assert list(row) == [f for f in shown(("review", "list")) if f != "send_at"]
    answer = CheckAnswer("k", "review", "<m@x>", "q", [Copy("p", "d", "t", "s")], True).as_dict()
    check = shown(("review", "check"))
    copy = list(answer["copies"][0])
    assert [f for f in check if f not in copy] == list(answer)
    assert check[check.index("copies") + 1 :][: len(copy)] == copy
    item = TriageItem("k", "c", None, 0, [], "left", "none found: left in review")
    assert shown(("review", "triage"), after="--json:") == list(item.as_dict())
    hooks = flat(section("http-api.md", "## Webhooks")).split("`--json` gives, per webhook:")[1]
    [record] = webhook_status(rig.ledger, {"ops": list(WEBHOOK_TYPES)}, now=0.0)
    assert set(CODE.findall(hooks.split("Metrics:")[0])) - {"webhook-id"} == set(record)


@pytest.fixture(scope="module")
def document(rig: EngineRig) -> dict[str, Any]:
    """The OpenAPI document, with `routes` (`METHOD path`: its statuses) and `fields` (a
    schema's properties) added."""
    with TestClient(create_app(api_context(rig))) as client:
        doc: dict[str, Any] = client.get("/v1/openapi.json").json()
    paths, schemas = doc["paths"].items(), doc["components"]["schemas"].items()
    statuses = {(m, p): o["responses"] for p, i in paths for m, o in i.items()}
    doc["routes"] = {f"{m.upper()} {p}": set(map(int, s)) for (m, p), s in statuses.items()}
    doc["fields"] = {n: list(s.get("properties", ())) for n, s in schemas}
    return doc


def names(text: str) -> list[str]:
    return re.findall(r'"(\w+)"', text)


def test_the_route_table_is_the_openapi_document(rig: EngineRig, document: dict[str, Any]) -> None:
    rows = {r: c[0] for r, c in keyed(section("http-api.md", "## HTTP API"), "route").items()}
    served, fields = document["routes"], document["fields"]
    assert set(rows) == set(served) | {"GET /v1/openapi.json"}
    # Statuses stated for every route instead: 400 (trusted hosts), 401, 403, 413, 422.
    for route, statuses in served.items():
        said = {int(s) for s in re.findall(r"(?<![\d.,])([1-5]\d\d)(?!\d|[.,]\d)", rows[route])}
        assert said <= statuses and statuses - {200, 400, 401, 403, 413, 422} <= said, route
    text = rows["GET /v1/jobs"].split("`", 2)[1]
    job = text.split("[{", 1)[1].split("}]", 1)[0]  # a listed job, inside the list's
    assert names(job) == fields["ListedJob"] and names(text.replace(job, "")) == fields["JobList"]
    check = rows["POST /v1/review/{key}/check"].split("`", 2)[1]
    assert names(check.split("[{", 1)[1].split("}]", 1)[0]) == fields["CopyOut"]
    shown = [names(x) for x in re.findall(r"`(\{[^`]+\})`", rows["POST /v1/review/triage"])]
    assert shown == [fields["TriageIn"], fields["TriageItemOut"]]
    resolve = names(rows["POST /v1/review/{key}/resolve"].split("`", 2)[1])
    assert [n for n in resolve if n not in ("sent", "resend", "abandon")] == fields["ResolveIn"]
    assert names(rows["POST /v1/jobs/{key}/cancel"]) == fields["CancelIn"]
    [brief] = re.findall(r"Without a token only `(.+?)`;", rows["GET /healthz"])
    for circuits in ([], [OPENED]):  # /healthz answers the brief shown, a circuit open or not
        ctx = api_context(rig)
        ctx.health.tick_age, ctx.health.circuits = lambda: 0.5, circuits.copy
        with TestClient(create_app(ctx)) as client:
            anonymous, detailed = client.get("/healthz"), client.get("/healthz", headers=AUTH)
        assert anonymous.status_code == detailed.status_code == 200
        assert anonymous.json() == json.loads(brief.replace('{"ok", ', '{"ok": true, '))
        assert len(detailed.json()["checks"]["circuits"]) == len(circuits)
    params = {p["name"] for p in document["paths"]["/v1/jobs"]["get"]["parameters"]}
    query = re.search(r"`GET /v1/jobs\?([^`]+)`", section("http-api.md", "### Listing jobs"))
    assert query and {part.rstrip("=") for part in query.group(1).split("&")} == params
    # The error table: every status a route answers, Starlette's 405 and the sign-in limit's 429.
    errors = keyed(section("http-api.md", "### Errors and statuses"), "status")
    answered = {status for statuses in served.values() for status in statuses if status >= 400}
    assert {int(status) for status in errors} == answered | {405, 429}
    invalid, field = fields["Invalid"], fields["FieldError"]
    assert names(errors["422"][0].split("`", 2)[1]) == [*invalid[:2], *field, *invalid[2:]]


def test_the_client_s_calls_and_errors_are_the_client_s_and_the_example_binds() -> None:
    text = section("http-api.md", "## Python client")
    client = client_module.Client
    calls = [c for c in ast.walk(ast.parse(block(text, "python"))) if isinstance(c, ast.Call)]
    bound = [c for c in calls if ast.unparse(c.func).startswith(("Client", "client."))]
    for call in bound:  # the example's calls bind to the signatures
        name = ast.unparse(call.func).removeprefix("client.")
        function = client.__init__ if name == "Client" else getattr(client, name)
        keywords = {k.arg: 0 for k in call.keywords if k.arg}
        inspect.signature(function).bind(None, *call.args, **keywords)
    assert len(bound) == 1 + len(re.findall(r"client\.(\w+)\(", block(text, "python")))
    also = CODE.findall(text.split("Also ", 1)[1].split(". Every", 1)[0])
    called = set(re.findall(r"client\.(\w+)\(", text)) | {c for c in also if c.isidentifier()}
    assert called == {n for n, _ in inspect.getmembers(client, inspect.isfunction) if n[0] != "_"}
    found = inspect.getmembers(client_module, inspect.isclass)
    classes = {n for n, c in found if issubclass(c, client_module.ClientError) and n[0] != "_"}
    named = {n for n in re.findall(r"`([A-Z]\w+)`", text) if n not in ("FieldError", "Client")}
    assert named == classes
    rows = keyed(text, "Error")
    assert set(rows) == classes - {"ClientError", "ApiError"}
    for name, (statuses, applied) in rows.items():
        for code in (int(c) for c in re.findall(r"\d{3}", statuses)):
            assert client_module._CLASSES.get(code, client_module.ServerError).__name__ == name
            assert applied.startswith("no") is (code in client_module._NOT_APPLIED), code


def registry(metrics: Metrics) -> dict[str, tuple[str | None, tuple[str, ...]]]:
    """name as exposed (counters with `_total`) -> (kind, label names)."""
    wrappers = [w for w in vars(metrics).values() if isinstance(w, MetricWrapperBase)]
    read_at_scrape = (_StoreGauges(metrics.sources), RecordedByPeople(metrics.sources.ledger))
    families = [family for collector in read_at_scrape for family in collector.collect()]
    made = [(w._name, w._type, w._labelnames) for w in wrappers]
    made += [(f.name, f.type, getattr(f, "_labelnames", ())) for f in families]
    return {n + ("_total" if t == "counter" else ""): (t, tuple(ls)) for n, t, ls in made}


def test_the_metric_table_is_the_registry_and_the_alerts_use_it(rig: EngineRig) -> None:
    sources = Sources(rig.ledger, {"fake": rig.provider}, lambda: [], lambda: 1.0, lambda: [OPENED])
    daemon = Metrics(sources)
    rows = keyed(section("http-api.md", "## Metrics"), "metric")
    written = {n: (kind, tuple(CODE.findall(x.split("(")[0]))) for n, (kind, x) in rows.items()}
    assert written == registry(daemon)
    rendered = daemon.render().decode()
    assert all(f"# TYPE {name} " in rendered for name in written)
    # `sendledger api` has no engine: what it lacks is marked "daemon only" (or a circuit's).
    api = registry(Metrics(Sources(rig.ledger, {"fake": rig.provider})))
    for name in set(written) - set(api):
        assert "daemon only" in rows[name][1] or rows[name][1].startswith("`scope`"), name
    named = re.findall(r"`(sendledger_\w+)`", page("performance.md") + page("operations.md"))
    assert set(named) <= set(written)
    alerts = page("docs/alerts.yml")
    exprs = " ".join(re.findall(r"^\s+expr: (.+)$", alerts, re.M))
    assert re.findall(r"^\s+- alert: (\w+)$", alerts, re.M)
    assert set(re.findall(r"sendledger_\w+", exprs)) <= set(written)


def test_the_review_reasons_and_actions_are_the_code_s(document: dict[str, Any]) -> None:
    actions = table(section("review.md", "## Review: check, resend, triage, cancel"), "Action")
    folder = REPO / "src" / "daemon" / "api" / "templates"
    templates = "".join(p.read_text(encoding="utf-8") for p in folder.glob("*.html"))
    assert [row[0] for row in actions] == ["check", "resolve", "triage", "cancel"]
    for _action, _cli, http, buttons in actions:  # _cli: parsed by test_docs_examples.py
        assert http.strip("`") in document["routes"], http
        for label in re.findall(r'"([^"]+)"', buttons):
            assert f">{label}</button>" in templates, label
