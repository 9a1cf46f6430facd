"""docs/http-api.md against the code it describes, in both directions, so neither can change
alone: the `[api]` keys and their defaults (the settings model), the routes and the statuses
each lists (the OpenAPI document the app serves), the error statuses, the roles (`Role`,
`ROUTE_ROLES`), the metrics (the registry `/metrics` renders), the Python client's calls,
defaults and error classes, and the webhook settings, types and `status --json` fields."""

from __future__ import annotations

import ast
import base64
import inspect
import json
import re
import sys
from collections.abc import Iterator
from contextlib import closing
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client.metrics import MetricWrapperBase
from tests.unit import docs_page
from tests.unit.docs_page import DOCS, table
from tests.unit.engine_rig import EngineRig, policy
from tests.unit.test_api_routes import AUTH, api_context

from daemon import runtime
from daemon.api.app import create_app
from daemon.api.auth import Role
from daemon.api.bodies import decode_body
from daemon.api.metrics import Metrics, Sources, _StoreGauges
from daemon.api.roles import ROUTE_ROLES
from daemon.api.signin_limit import FAILURES, WINDOW
from daemon.cli import api_server, build_parser
from daemon.config.secret_files import warn_exposed_secrets
from daemon.config.settings import ApiSettings, WebhookSettings, settings_from_dict
from daemon.config.sizes import parse_size
from daemon.engine.circuit import OpenCircuit
from daemon.service_layer.intake import MAX_LISTED
from daemon.service_layer.listing import LIMIT_DEFAULT, LIMIT_MAX
from daemon.webhooks.events import (
    REJECTED_CODES,
    WEBHOOK_EVENTS,
    WEBHOOK_TYPES,
    event_id_for,
    payload,
)
from daemon.webhooks.signing import new_secret, parse_secret, signed_headers
from daemon.webhooks.status import COUNT_LIMIT, webhook_status
from daemon.webhooks.worker import Hook
from ledger.stores.positions import LOCK_WAIT_MS
from sendledger import client as client_module
from sendledger.client import ApiError, Client, ClientError, Invalid

PAGE = DOCS / "http-api.md"
STATUS = re.compile(r"(?<![\d.,])([1-5]\d\d)(?!\d|[.,]\d)")
TICKED = re.compile(r"`([^`]+)`")


def section(heading: str) -> str:
    return docs_page.section(PAGE, heading)


@pytest.fixture(scope="module")
def rig() -> Iterator[EngineRig]:
    with closing(EngineRig(policy("legal"))) as rig:
        yield rig


@pytest.fixture(scope="module")
def document(rig: EngineRig) -> dict[str, Any]:
    with TestClient(create_app(api_context(rig))) as client:
        answer = client.get("/v1/openapi.json")
        assert answer.status_code == 200
        doc: dict[str, Any] = answer.json()
        return doc


def operations(document: dict[str, Any]) -> dict[str, set[int]]:
    """`METHOD path` -> the statuses the document lists for it."""
    return {
        f"{method.upper()} {path}": {int(s) for s in op["responses"]}
        for path, item in document["paths"].items()
        for method, op in item.items()
    }


# -- HTTP API ------------------------------------------------------------------------------


def test_the_api_keys_are_the_settings_and_their_defaults() -> None:
    rows = {row[0].strip("`"): row[1] for row in table(section("## HTTP API"), "key")}
    assert set(rows) == {f"api.{name}" for name in ApiSettings.model_fields}
    defaults = ApiSettings()
    assert rows["api.listen"] == "off" and defaults.listen == ""
    assert rows["api.token_file"] == "required with `listen`" and defaults.token_file is None
    assert parse_size(rows["api.max_body"].strip("`")) == defaults.max_body
    assert rows["api.trusted_hosts"].startswith("`[]`") and defaults.trusted_hosts == []
    assert rows["api.public_url"] == "none" and defaults.public_url == ""


def test_a_token_file_others_can_read_is_warned_about(tmp_path: Path) -> None:
    """`run` and `api` call `warn_exposed_secrets` at start-up
    (tests/e2e/test_api_tokens.py runs `api`); the token file is one of the secrets."""
    tokens = tmp_path / "api-tokens"
    tokens.write_text("shop:0123456789abcdef-shop\n", encoding="utf-8")
    config = settings_from_dict(
        {"api": {"listen": "127.0.0.1:8025", "token_file": "api-tokens"}},
        config_path=tmp_path / "c.toml",
    )
    tokens.chmod(0o644)
    assert warn_exposed_secrets(config) == [tokens]
    tokens.chmod(0o600)
    assert warn_exposed_secrets(config) == []
    for door in (runtime, api_server):
        assert "warn_exposed_secrets(" in Path(door.__file__).read_text(encoding="utf-8")


#: Routes outside the document it serves: the document itself.
UNDOCUMENTED = {"GET /v1/openapi.json"}
#: Statuses the page states for every route rather than per route: 400 (api.trusted_hosts),
#: 401 and 403 (every /v1 route), 413 (every body), 422 (a NUL in any query).
EVERY_ROUTE = {400, 401, 403, 413, 422}


def test_the_route_table_is_the_openapi_document(document: dict[str, Any]) -> None:
    rows = {row[0].strip("`"): row[1] for row in table(section("## HTTP API"), "route")}
    documented = operations(document)
    assert set(rows) == set(documented) | UNDOCUMENTED
    for route, answers in rows.items():
        if route in UNDOCUMENTED:
            continue
        said = {int(s) for s in STATUS.findall(answers)}
        assert said <= documented[route], route
        # A status particular to the route (not one of every route's, not a plain 200) is
        # on its row.
        assert documented[route] - EVERY_ROUTE - {200} <= said, route


def names(text: str) -> list[str]:
    return re.findall(r'"(\w+)"', text)


def properties(document: dict[str, Any], schema: str) -> list[str]:
    return list(document["components"]["schemas"][schema]["properties"])


def test_the_bodies_and_answers_the_rows_show_are_the_models(document: dict[str, Any]) -> None:
    rows = {row[0].strip("`"): row[1] for row in table(section("## HTTP API"), "route")}
    listing = rows["GET /v1/jobs"].split("`", 2)[1]
    outer, inner = listing.split("[{", 1)
    assert names(inner.split("}]", 1)[0]) == properties(document, "ListedJob")
    assert names(outer + inner.split("}]", 1)[1]) == properties(document, "JobList")
    check = rows["POST /v1/review/{key}/check"].split("`", 2)[1]
    copies = check.split("[{", 1)[1].split("}]", 1)[0]
    assert names(copies) == properties(document, "CopyOut")
    assert set(names(check)) - set(names(copies)) < set(properties(document, "CheckOut"))
    assert check.endswith(", ...}")  # the rest (message_id, hits) is in the document
    request, answer = re.findall(r"`(\{[^`]+\})`", rows["POST /v1/review/triage"])
    assert names(request) == properties(document, "TriageIn")
    assert names(answer) == properties(document, "TriageItemOut")
    actions = re.findall(r"`([a-z-]+)`", rows["POST /v1/review/triage"].split("`action`", 1)[1])
    assert actions == ["resolved-sent", "would-resolve-sent", "left", "search-failed"]
    assert "resolved-sent, would-resolve-sent (dry run), left or search-failed" in str(
        document["components"]["schemas"]["TriageItemOut"]
    )
    resolve = rows["POST /v1/review/{key}/resolve"].split("`", 2)[1]
    assert names(resolve) == ["as", "sent", "resend", "abandon", "note", "expected_version"]
    assert properties(document, "ResolveIn") == ["as", "note", "expected_version"]
    assert names(rows["POST /v1/jobs/{key}/cancel"]) == properties(document, "CancelIn")


def test_every_v1_route_documents_401_and_403_and_others_need_no_token(
    document: dict[str, Any],
) -> None:
    for route, statuses in operations(document).items():
        if " /v1/" in route:
            assert {401, 403} <= statuses, route
        else:
            assert not {401, 403} & statuses, route


def test_the_error_table_is_every_status_the_document_lists(document: dict[str, Any]) -> None:
    rows = {int(row[0]): row[1] for row in table(section("### Errors and statuses"), "status")}
    errors = {s for statuses in operations(document).values() for s in statuses if s >= 400}
    # The two statuses no route of the document gives: Starlette's 405 (re-worded,
    # tests/unit/test_api_fails_cleanly.py) and the page's sign-in limit.
    assert set(rows) == errors | {405, 429}
    assert f"after {FAILURES} failed attempts" in rows[429]
    assert f"within {WINDOW / 60:g} minutes" in rows[429]
    assert f"at most {MAX_LISTED} errors" in rows[422]
    shape = rows[422].split("`", 2)[1]
    assert names(shape) == ["error", "errors", "index", "field", "reason", "count"]
    assert properties(document, "Invalid") == ["error", "errors", "count"]
    assert properties(document, "FieldError") == ["index", "field", "reason"]
    said = " ".join(section("## HTTP API").split())
    assert (
        'Errors are `{"error": "..."}`; 422 adds `"errors": [{"index", "field", "reason"}]`'
        in (said)
        and 'and `"count"` (how many there were)' in said
    )


def test_the_decoder_s_limits_are_the_page_s() -> None:
    """A body nests about 1,000 levels at most and holds integers of up to 4,300 digits."""
    row = " ".join(section("### Errors and statuses").split())
    assert "(about 1,000 levels)" in row and "longer than 4,300 digits" in row
    assert sys.get_int_max_str_digits() == 4300
    assert decode_body(b'{"n": ' + b"9" * 4300 + b"}")["n"] > 0
    deep = sys.getrecursionlimit()
    assert 900 <= deep <= 1100
    nested, depth = decode_body(b"[" * 400 + b"]" * 400), 1
    while nested:
        nested, depth = nested[0], depth + 1
    assert depth == 400
    for refused in (b'{"n": ' + b"9" * 4301 + b"}", b"[" * (deep + 1) + b"]" * (deep + 1)):
        with pytest.raises(json.JSONDecodeError):
            decode_body(refused)
    with pytest.raises(json.JSONDecodeError, match="twice"):
        decode_body(b'{"as": "sent", "as": "abandon"}')


def test_a_403_is_the_role_table_s_sentence(rig: EngineRig) -> None:
    with TestClient(create_app(api_context(rig))) as client:
        text = client.get("/v1/openapi.json").text
        assert "the token lacks the role this route needs" in text
    rows = {int(row[0]): row[1] for row in table(section("### Errors and statuses"), "status")}
    assert "[Roles](#roles)" in rows[403]


def test_the_listing_limits(document: dict[str, Any]) -> None:
    text = section("### Listing jobs")
    assert f"`limit` 1 to\n{LIMIT_MAX} (default {LIMIT_DEFAULT})" in text
    names = {p["name"] for p in document["paths"]["/v1/jobs"]["get"]["parameters"]}
    query = re.search(r"`GET /v1/jobs\?([^`]+)`", text)
    assert query is not None
    assert {part.rstrip("=") for part in query.group(1).split("&")} == names


@pytest.mark.parametrize("open_circuits", [0, 1])
def test_healthz_without_a_token_is_the_brief_the_page_shows(
    rig: EngineRig, open_circuits: int
) -> None:
    """The daemon's /healthz (a scheduler and circuits): without a token the four checks
    the page names, whether or not a circuit is open (the answer stays 200); the circuits
    are among the details a token sees."""
    row = {r[0].strip("`"): r[1] for r in table(section("## HTTP API"), "route")}["GET /healthz"]
    brief = re.search(r"Without a token only `(.+?)`;", row)
    assert brief is not None
    shown = brief.group(1).replace('{"ok", ', '{"ok": true, ')
    opened = OpenCircuit("gmail", datetime(2026, 1, 1, tzinfo=UTC), 3, datetime.now(UTC), False)
    ctx = api_context(rig)
    ctx.health.tick_age = lambda: 0.5
    ctx.health.circuits = lambda: [opened] * open_circuits
    with TestClient(create_app(ctx)) as client:
        anonymous = client.get("/healthz")
        detailed = client.get("/healthz", headers=AUTH)
    assert anonymous.status_code == detailed.status_code == 200
    assert anonymous.json() == json.loads(shown)
    assert len(detailed.json()["checks"]["circuits"]) == open_circuits
    assert "in the daemon `checks.circuits`, the open circuits, which never fail it" in row


# -- Roles ---------------------------------------------------------------------------------


def test_the_roles_are_the_role_enum() -> None:
    rows = table(section("### Roles"), "role")
    assert [row[0].strip("`") for row in rows] == [role.value for role in Role]
    routes = {row[0].strip("`") for row in table(section("### Roles"), "route")}
    assert {f"{m} {p}" for m, p in ROUTE_ROLES} == routes - {"/ui/"} - {
        r for r in routes if r.startswith("/ui/")
    }


# -- Python client -------------------------------------------------------------------------


def test_the_client_calls_the_page_names_exist() -> None:
    text = section("## Python client")
    named = set(re.findall(r"client\.(\w+)\(", text))
    named |= {"submit_many", "events", "page", "review"}
    public = {n for n, _ in inspect.getmembers(Client, inspect.isfunction) if n[0] != "_"}
    assert named == public


def test_the_client_example_calls_bind_to_the_client_s_signatures() -> None:
    """Each call of the example (`Client(...)`, `client.X(...)`) fits the signature it
    calls: the names exist and the arguments bind (an instance stands in as `self`)."""
    block = section("## Python client").split("```python\n", 1)[1].split("```", 1)[0]
    bound = []
    for node in ast.walk(ast.parse(block)):
        if not isinstance(node, ast.Call):
            continue
        called = ast.unparse(node.func)
        if called == "Client":
            function = Client.__init__
        elif called.startswith("client."):
            function = getattr(Client, called.removeprefix("client."))
        else:
            continue
        keywords = {k.arg: None for k in node.keywords if k.arg}
        inspect.signature(function).bind(None, *node.args, **keywords)
        bound.append(called)
    assert sorted(bound) == sorted(
        ["Client", *[f"client.{name}" for name in re.findall(r"client\.(\w+)\(", block)]]
    )


def test_the_client_defaults_are_the_page_s() -> None:
    text = " ".join(section("## Python client").split())
    defaults = {
        name: p.default
        for name, p in inspect.signature(Client.__init__).parameters.items()
        if p.default is not inspect.Parameter.empty and name != "sleep"  # a test's clock
    }
    assert defaults == {
        "timeout": 30.0,
        "retries": 4,
        "backoff": 0.5,
        "max_backoff": 30.0,
        "ssl_context": None,
    }
    assert "`ssl_context`" in text
    assert "`retries` more times (default 4)" in text
    assert "`backoff` seconds (default 0.5)" in text
    assert "at most `max_backoff` (30)" in text
    assert "`timeout` (default 30 s)" in text


def test_every_command_the_page_names_parses() -> None:
    commands = re.findall(r"`sendledger ([^`]+)`", PAGE.read_text(encoding="utf-8"))
    assert len(commands) >= 8
    for command in commands:
        for variant in (re.sub(r" ?\[[^\]]*\]", "", command), re.sub(r"[\[\]]", "", command)):
            argv = variant.replace("NAME", "ops").replace("HOST:PORT", "127.0.0.1:8025").split()
            build_parser(argv[0]).parse_args(argv)


def test_the_error_classes_are_the_page_s() -> None:
    text = " ".join(section("## Python client").split())
    classes = {
        name: cls
        for name, cls in vars(client_module).items()
        if isinstance(cls, type) and issubclass(cls, ClientError)
    }
    classes = {name: cls for name, cls in classes.items() if not name.startswith("_")}
    named = {n for n in re.findall(r"`([A-Z]\w+)`", text) if n != "FieldError"}
    assert named == set(classes)
    assert all(issubclass(cls, ClientError) for cls in classes.values())
    assert issubclass(Invalid, ApiError)


def test_the_error_table_says_for_each_error_whether_it_may_have_been_applied() -> None:
    rows = re.findall(r"^\| `(\w+)` \| ([^|]+) \| (yes|no|when `sent` is True)\b", section(
        "## Python client"), re.M)  # fmt: skip
    public = {
        name
        for name, cls in vars(client_module).items()
        if isinstance(cls, type) and issubclass(cls, ClientError) and cls is not ApiError
    } - {"ClientError"}
    public = {name for name in public if not name.startswith("_")}
    assert {name for name, _, _ in rows} == public
    for name, statuses, applied in rows:
        codes = [int(code) for code in re.findall(r"\d{3}", statuses)]
        assert name == "ConnectionLost" or codes, name
        for code in codes:
            kind = client_module._CLASSES.get(code, client_module.ServerError)
            assert kind is getattr(client_module, name), (name, code)
            # "no" is exactly the statuses the client treats as "nothing was done".
            assert (applied == "no") is (code in client_module._NOT_APPLIED), (name, code)


def test_invalid_counts_what_the_server_counted(rig: EngineRig) -> None:
    """A 422 lists at most 100 errors; `Invalid.total` is how many there were (the body's
    `count`: five required fields missing in each of 250 jobs), not how many were listed."""
    with TestClient(create_app(api_context(rig))) as client:
        answer = client.post("/v1/jobs", json=[{}] * 250, headers=AUTH)
    assert answer.status_code == 422
    refused = Invalid(422, answer.json()["error"], answer.json())
    assert len(refused.errors) == MAX_LISTED
    assert refused.total == 250 * 5
    assert refused.errors[0].index == 0 and refused.errors[0].field == "channel"


# -- Metrics -------------------------------------------------------------------------------


def registry_families(metrics: Metrics) -> dict[str, tuple[str, tuple[str, ...]]]:
    """name as exposed (counters with `_total`) -> (kind, label names)."""
    found = {}
    for wrapper in vars(metrics).values():
        if isinstance(wrapper, MetricWrapperBase):
            name = wrapper._name + ("_total" if wrapper._type == "counter" else "")
            found[name] = (wrapper._type, tuple(wrapper._labelnames))
    for family in _StoreGauges(metrics.sources).collect():
        found[family.name] = (family.type, tuple(getattr(family, "_labelnames", ())))
    return found


def test_the_metric_table_is_the_daemon_s_registry(rig: EngineRig) -> None:
    opened = OpenCircuit("fake", datetime(2026, 1, 1, tzinfo=UTC), 3, datetime.now(UTC), False)
    daemon = Metrics(
        Sources(rig.ledger, {"fake": rig.provider}, lambda: [], lambda: 1.0, lambda: [opened])
    )
    found = registry_families(daemon)
    rows = table(section("## Metrics"), "metric")
    page = {}
    for name, kind, labels in rows:
        names = TICKED.findall(labels.split("(")[0])
        page[name.strip("`")] = (kind, tuple(names))
    assert page == found
    # What /metrics renders is that registry.
    text = daemon.render().decode()
    assert {n for n in page if f"# TYPE {n} " in text} == set(page)


def test_sendledger_api_has_no_tick_or_circuit_gauges(rig: EngineRig) -> None:
    """`sendledger api` builds its metrics without the engine's tick age and circuits
    (`daemon/api/build.py`): the rows the page marks "daemon only"."""
    api_only = registry_families(Metrics(Sources(rig.ledger, {"fake": rig.provider})))
    rows = {row[0].strip("`"): row[2] for row in table(section("## Metrics"), "metric")}
    absent = {name for name in rows if name not in api_only}
    assert absent == {
        "sendledger_last_tick_age_seconds",
        "sendledger_circuit_open",
        "sendledger_circuit_open_since_seconds",
        "sendledger_circuit_failures",
    }
    for name in absent:
        assert "daemon only" in rows[name] or name.startswith("sendledger_circuit_"), name


def test_the_example_alerts_use_metrics_of_the_table() -> None:
    alerts = (PAGE.parent / "alerts.yml").read_text(encoding="utf-8")
    named = re.findall(r"^\s+- alert: (\w+)$", alerts, re.M)
    assert named == [
        "SendledgerJobsWaitingInReview",
        "SendledgerHandleUnreliable",
        "SendledgerNoTick",
        "SendledgerDuplicates",
        "SendledgerWebhookFailing",
    ]
    text = " ".join(section("## Metrics").split())
    assert "(jobs waiting in review, an unreliable handle, no tick, a duplicate, a webhook" in text
    exprs = " ".join(re.findall(r"^\s+expr: (.+)$", alerts, re.M))
    used = set(re.findall(r"sendledger_\w+", exprs))
    rows = {row[0].strip("`") for row in table(section("## Metrics"), "metric")}
    assert len(exprs.split("sendledger_")) > len(named) and used <= rows


# -- Webhooks ------------------------------------------------------------------------------


def webhook_example() -> dict[str, str]:
    block = section("## Webhooks").split("```toml\n", 1)[1].split("```", 1)[0]
    keys = {}
    for line in block.splitlines()[1:]:
        key, _, rest = line.lstrip("# ").partition(" = ")
        keys[key] = rest.split("  #")[0].strip()
    return keys


def test_the_webhook_example_names_every_setting_with_its_default() -> None:
    example = webhook_example()
    assert set(example) == set(WebhookSettings.model_fields)
    hook = WebhookSettings(url="https://ops.example.com/h", secret_file=Path("s"))
    assert example["events"] == "[" + ", ".join(f'"{t}"' for t in WEBHOOK_TYPES) + "]"
    assert hook.events == list(WEBHOOK_TYPES)
    assert (example["timeout"], hook.timeout) == ('"10s"', 10.0)
    assert (example["retry_backoff"], hook.retry_backoff) == ('"1s"', 1.0)
    assert (example["retry_backoff_max"], hook.retry_backoff_max) == ('"5m"', 300.0)
    assert (example["allow_http"], hook.allow_http) == ("false", False)


def test_the_event_table_is_the_one_table() -> None:
    rows = table(section("## Webhooks"), "type")
    assert [row[0].strip("`") for row in rows] == [entry.type for entry in WEBHOOK_EVENTS]


def test_the_status_fields_are_what_status_json_gives(rig: EngineRig) -> None:
    text = " ".join(section("## Webhooks").split("`--json` gives, per webhook:", 1)[1].split())
    text = text.split("Metrics:", 1)[0]
    named = set(TICKED.findall(text)) - {"webhook-id"}  # the header, said of next_event_id
    [record] = webhook_status(rig.ledger, {"ops": list(WEBHOOK_TYPES)}, now=0.0)
    assert named == set(record)
    assert f"counted up to {COUNT_LIMIT:,}" in text


def test_the_webhook_numbers_are_the_code_s() -> None:
    text = " ".join(section("## Webhooks").split())
    assert '"whsec_<base64>" (24-64 bytes)' in text
    for size, ok in ((23, False), (24, True), (64, True), (65, False)):
        secret = "whsec_" + base64.b64encode(b"k" * size).decode()
        if ok:
            assert parse_secret(secret) == secret
        else:
            with pytest.raises(ValueError, match="24 to 64 bytes"):
                parse_secret(secret)
    assert "prints a fresh secret (32 random bytes)" in text
    assert len(base64.b64decode(new_secret().removeprefix("whsec_"))) == 32
    assert "lease in the store (max(60 s, 3 \u00d7 timeout))" in text
    assert Hook("h", "https://a/", new_secret(), frozenset(), timeout=10.0).lease == 60.0
    assert Hook("h", "https://a/", new_secret(), frozenset(), timeout=30.0).lease == 90.0
    assert f"{LOCK_WAIT_MS} ms at the very most" in text


def test_the_rejected_reason_table_is_the_code_s_list() -> None:
    text = section("## Webhooks")
    table = text.split("| `rejected` reason |", 1)[1].split("\n\n", 1)[0]
    codes = re.findall(r"^\| `([a-z]+)` \|", table, re.MULTILINE)
    assert tuple(codes) == REJECTED_CODES
    examples = [json.loads(block.split("```", 1)[0]) for block in text.split("```json\n")[1:]]
    [rejected] = [e for e in examples if e.get("type") == "rejected"]
    assert rejected["reason"] in REJECTED_CODES and rejected["detail"]
    assert list(rejected) == list(examples[0])  # every payload has the same fields


def test_the_payload_example_has_the_payload_s_fields(rig: EngineRig) -> None:
    example = section("## Webhooks").split("```json\n", 1)[1].split("```", 1)[0]
    shown = json.loads(example)
    rig.submit("legal", "order-1042")
    job = rig.ledger.get_job("order-1042")
    [requested] = rig.ledger.history("order-1042")
    sent = payload("confirmed", job, requested, event_id_for(job.id, job.version))
    assert list(sent) == list(shown)
    assert shown["event_id"].startswith("evt_") and sent["event_id"].startswith("evt_")
    assert re.fullmatch(r"evt_[0-9a-f]{32}_\d+", sent["event_id"])
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", sent["at"])
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", shown["at"])


def test_the_reference_library_snippet_takes_a_delivery_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The "Verifying in Python" snippet (`standardwebhooks`), run as printed in a folder
    with `webhook-secret`: a signed delivery is handled (204), a repeat is not handled
    again, a changed body is 401."""
    [snippet] = [
        block
        for block in re.findall(r"```python\n(.*?)```", section("## Webhooks"), re.S)
        if "hook.verify(" in block
    ]
    secret = new_secret()
    (tmp_path / "webhook-secret").write_text(secret + "\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    handled: list[dict[str, Any]] = []
    scope: dict[str, Any] = {
        "already_seen": lambda event_id: event_id in {e["event_id"] for e in handled},
        "handle": handled.append,
    }
    exec(snippet, scope)
    body = json.dumps({"type": "confirmed", "key": "order-1042", "event_id": "evt_1_4"})
    headers = signed_headers(secret, "evt_1_4", datetime.now(UTC), body)
    assert scope["receive"](body.encode(), headers) == 204
    assert scope["receive"](body.encode(), headers) == 204
    assert [e["key"] for e in handled] == ["order-1042"]
    assert scope["receive"](body.replace("1042", "1043").encode(), headers) == 401
