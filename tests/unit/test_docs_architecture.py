"""docs/architecture.md says where the code is and what it does; these tests hold the page to
the code (docs/development.md "Writing the docs"): every module, function, class and method
the page names exists where it says, the life of one job names calls that really happen in
the order it gives, the layer list is the daemon's real packages, the typed-decisions table
is the aggregate's commands and the decision types, and each invariant names its tests."""

from __future__ import annotations

import ast
import re
from datetime import UTC, datetime
from functools import cache
from pathlib import Path

import pytest
from tests.unit import docs_page

from daemon.config.settings import Settings
from ledger import decision_types
from ledger.vocabulary import EscalationReason

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src"
PAGE = REPO / "docs" / "architecture.md"
SPAN = re.compile(r"`([^`\n]+)`")
# Dotted names in the page that are not our code although their first part is the name of
# one of our modules: Gmail API calls and a Gmail scope.
NOT_CODE = {
    "drafts.create",
    "drafts.get",
    "drafts.list",
    "drafts.send",
    "messages.get",
    "messages.send",
    "gmail.compose",
}


def text() -> str:
    return PAGE.read_text(encoding="utf-8")


def section(title: str) -> str:
    """The text under the heading `title`, up to the next heading."""
    return docs_page.section(PAGE, title, until=6)


@cache
def modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module under src/."""
    found = {}
    for path in SRC.rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


@cache
def tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


def members(body: list[ast.stmt]) -> dict[str, ast.AST]:
    """The names a module or class body defines (functions, classes, assignments, imports)."""
    names: dict[str, ast.AST] = {}
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names[node.name] = node
        elif isinstance(node, ast.Assign):
            names.update((t.id, node) for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = node
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update(((a.asname or a.name).split(".")[0], node) for a in node.names)
    return names


def defined(module: str, dotted: str) -> bool:
    """Whether `dotted` (`name` or `Class.member`) is defined in `module`."""
    scope: dict[str, ast.AST] = members(tree(modules()[module]).body)
    for part in dotted.split("."):
        node = scope.get(part)
        if node is None:
            return False
        scope = members(node.body) if isinstance(node, ast.ClassDef) else {}
    return True


@cache
def classes() -> dict[str, list[ast.ClassDef]]:
    """Every class of src/ by name, nested ones (SendJob.Requested) included."""
    found: dict[str, list[ast.ClassDef]] = {}
    for path in modules().values():
        for node in ast.walk(tree(path)):
            if isinstance(node, ast.ClassDef):
                found.setdefault(node.name, []).append(node)
    return found


def module_by_path(path: str) -> list[str]:
    """The modules whose file ends with `path` (`stores/sqlite.py`, `postgres.py`)."""
    return [m for m, p in modules().items() if p.as_posix().endswith("/" + path.lstrip("/"))]


def problem(span: str) -> str | None:
    """What is wrong with one backticked name of the page, or None."""
    span = span.removeprefix("src/").removesuffix("()")
    if located := re.fullmatch(r"([\w/]+\.py): ?([\w.]+)", span):
        found = module_by_path(located.group(1))
        if len(found) != 1:
            return f"{located.group(1)} names {len(found)} modules"
        return None if defined(found[0], located.group(2)) else f"not in {found[0]}"
    if re.fullmatch(r"[\w/]+\.py", span):
        if re.match(r"(tests|bench)/", span):
            return None if (REPO / span).is_file() else "no such file"
        return None if len(module_by_path(span)) == 1 else "names no one module"
    if member := re.fullmatch(r"([A-Z]\w*)\.(\w+)", span):
        cls, name = member.groups()
        if cls not in classes():
            return None if cls in {"Resolution"} else f"no class {cls} in src"
        if cls == "Resolution":
            return None
        bodies = [members(node.body) for node in classes()[cls]]
        return None if any(name in body for body in bodies) else f"{cls} has no {name}"
    if dotted := re.fullmatch(r"([a-z_]+(?:\.[a-z_]+)*)\.(\w+)", span):
        head, name = dotted.groups()
        section_model = Settings.model_fields.get(head.split(".")[0])
        if "." not in head and section_model is not None and head not in {"policies"}:
            fields = getattr(section_model.annotation, "model_fields", {})
            return None if name in fields else f"no setting {span}"
        if span in NOT_CODE:
            return None
        candidates = [m for m in modules() if m == head or m.endswith("." + head)]
        if not candidates:
            return None  # not ours (http.client, os.environ, checks.circuits)
        ok = any(defined(m, name) or f"{m}.{name}" in modules() for m in candidates)
        return None if ok else f"nothing named {name} in {candidates}"
    return None


def test_every_module_and_name_the_page_cites_is_where_it_says() -> None:
    wrong = sorted({f"{s}: {p}" for s in SPAN.findall(text()) if (p := problem(s))})
    assert wrong == []


def test_the_name_checker_sees_stale_names() -> None:
    assert problem("daemon/providers/message.py: render_checked") is None
    assert problem("daemon/engine/dispatch.py: render_wave") == "not in daemon.engine.dispatch"
    assert problem("SendJob.Requested") is None
    assert problem("SendJob.resend_now") == "SendJob has no resend_now"
    assert problem("policies.decisions.before_attempt") is None
    assert problem("policies.decisions.before_any") is not None
    assert problem("daemon.search_concurrency") is None
    assert problem("daemon.send_concurrency") == "no setting daemon.send_concurrency"
    assert problem("engine/wave.py") == "names no one module"


def calls_in(module: str, qualname: str) -> list[str]:
    """The names a function calls, in source order (`x.y(...)` gives `y`)."""
    node: ast.AST = tree(modules()[module])
    for part in qualname.split("."):
        node = members(node.body)[part]  # type: ignore[attr-defined]
    found = []
    for call in ast.walk(node):
        if isinstance(call, ast.Call):
            func = call.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            found.append((call.lineno, call.col_offset, name))
    return [name for *_, name in sorted(found)]


# The life of one job as calls: (module, caller, callee), each a call the caller's body makes
# and the page's walk names ("The life of one job, file by file" names the callee, and the
# caller unless it is a private helper).
WALK = [
    ("daemon.cli.job_commands", "cmd_submit", "validate"),
    ("daemon.cli.job_commands", "cmd_submit", "record"),
    ("daemon.service_layer.services", "Intake.validate", "parse_jobs"),
    ("daemon.service_layer.services", "Intake.validate", "senders_for"),
    ("daemon.service_layer.services", "Intake.validate", "check_messages"),
    ("daemon.service_layer.intake", "parse_jobs", "parse_job"),
    ("daemon.service_layer.intake", "senders_for", "sender_for"),
    ("daemon.service_layer.services", "Services.record", "submit_jobs"),
    ("daemon.service_layer.intake", "submit_jobs", "submit"),
    ("ledger.application", "Ledger._request", "request"),
    ("ledger.application", "Ledger._request", "message_id_for"),
    ("daemon.runtime", "Daemon.tick", "hand_out"),
    ("daemon.engine.tick", "Engine._offer_sends", "due"),
    ("daemon.engine.tick", "Engine._load_due", "get_jobs"),
    ("daemon.engine.tick", "Engine._load_due", "load"),
    ("daemon.engine.dispatch", "Dispatch.claim", "before_attempt"),
    ("daemon.engine.dispatch", "Dispatch.claim", "render_checked"),
    ("daemon.engine.dispatch", "Dispatch.claim", "claim"),
    ("daemon.engine.dispatch", "Dispatch.send", "send_raw"),
    ("daemon.engine.dispatch", "Dispatch._read_back_sample", "read_back"),
    ("daemon.engine.dispatch", "Dispatch.outcome_to_events", "record_response"),
    ("daemon.engine.dispatch", "Dispatch.outcome_to_events", "after_response"),
    ("daemon.engine.dispatch", "Dispatch.outcome_to_events", "record_rejection"),
    ("daemon.engine.dispatch", "unknown_to_events", "record_unknown"),
    ("daemon.engine.commit", "GroupCommit._commit", "save_jobs"),
]


@pytest.mark.parametrize(("module", "caller", "callee"), WALK, ids=lambda v: str(v))
def test_the_walk_names_calls_that_happen(module: str, caller: str, callee: str) -> None:
    assert callee in calls_in(module, caller)
    walk = section("The life of one job, file by file")
    for name in (caller.split(".")[-1], callee):
        if name.startswith("_"):
            continue
        assert re.search(rf"\b{re.escape(name)}\b", walk), name


def test_dispatch_runs_its_steps_in_the_order_the_walk_gives() -> None:
    # Invariant 1 read top to bottom: the page's step 4 names Dispatch.dispatch's own calls
    # (on the dispatch or the job's work) in the order the code makes them.
    made = [
        name
        for name in calls_in("daemon.engine.dispatch", "Dispatch.dispatch")
        if not name.startswith("_") and name != "probe_returned"
    ]
    assert made == [
        "claim",
        "save_claim",
        "holding",
        "send",
        "stop_renewing",
        "outcome_to_events",
        "save_soon",
        "count_outcome",
        "release",
    ]
    step = section("The life of one job, file by file").split("4. **Dispatch**", 1)[1]
    step = step.split("\n5. ", 1)[0]
    named = [s for s in SPAN.findall(step) if s in set(made)]
    assert named == made


def listed(block: str, package: str) -> set[str]:
    """The module names the layer block lists for `daemon/<package>/`."""
    match = re.search(rf"daemon/{package}/: [^(]*\(([^)]*)\)", block, re.S)
    assert match, package
    return {word for word in re.findall(r"[a-z_]+", match.group(1))}


def test_the_layer_list_is_the_daemons_real_packages_and_modules() -> None:
    block = section("Layers and what each may import").split("```")[1]
    daemon = SRC / "daemon"
    packages = {p.name for p in daemon.iterdir() if (p / "__init__.py").is_file()}
    assert set(re.findall(r"daemon/(\w+)/", block)) == packages
    top = {p.name for p in daemon.glob("*.py")} - {"__init__.py", "__main__.py"}
    wiring = block.split("At its top level only the wiring:", 1)[1].split("Then one package", 1)[0]
    assert set(re.findall(r"\w+\.py", wiring)) == top
    service_layer = {p.stem for p in (daemon / "service_layer").glob("*.py")} - {"__init__"}
    assert listed(block, "service_layer") == service_layer
    cli = {p.stem for p in (daemon / "cli").glob("*.py")} - {"__init__"}
    groups, helpers = block.split("daemon/cli/:", 1)[1].split("(", 1)[1].split(";", 1)
    assert set(re.findall(r"\w+", groups)) | {"output", "parsers"} == cli
    assert re.match(r"\s*output\.py and parsers\.py ", helpers)


def imported_by(package: str) -> dict[str, set[str]]:
    """Top-level names each module under src/<package> imports."""
    found = {}
    for path in sorted((SRC / package).rglob("*.py")):
        names = set()
        for node in ast.walk(tree(path)):
            if isinstance(node, ast.Import):
                names.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module.split(".")[0])
        found[path.relative_to(SRC).as_posix()] = names
    return found


def test_only_the_api_imports_the_web_stack_and_only_runtime_apscheduler() -> None:
    # "daemon/api/: ... the only place FastAPI, uvicorn, prometheus_client and Jinja2 are
    # imported"; "runtime.py (the APScheduler service)".
    web = {"fastapi", "starlette", "uvicorn", "prometheus_client", "jinja2"}
    every = {**imported_by("daemon"), **imported_by("ledger"), **imported_by("policies")}
    assert [m for m, names in every.items() if names & web and "/api/" not in m] == []
    assert [m for m, names in every.items() if "apscheduler" in names] == ["daemon/runtime.py"]


def table_rows(title: str) -> list[list[str]]:
    rows = [
        [cell.strip() for cell in line.strip("|").split("|")]
        for line in section(title).splitlines()
        if line.startswith("|") and not line.startswith("|---")
    ]
    return rows[1:]


def commands() -> set[str]:
    """SendJob's commands: its public methods that are not properties."""
    [job] = [c for c in classes()["SendJob"] if c.name == "SendJob"]
    return {
        node.name
        for node in job.body
        if isinstance(node, ast.FunctionDef)
        and not node.name.startswith("_")
        and not any(ast.unparse(d) == "property" for d in node.decorator_list)
    }


def test_the_typed_decisions_table_is_the_commands_and_the_decision_types() -> None:
    rows = table_rows("Typed decisions")
    named = {cmd for row in rows for cmd in re.findall(r"\(`(\w+)`", row[0])}
    assert named == commands()
    decisions = {word for row in rows for word in re.findall(r"`([A-Z]\w+)", row[1])}
    kinds = {
        name
        for name, value in vars(decision_types).items()
        if isinstance(value, type)
        and not name.startswith("_")
        and value.__module__ == (decision_types.__name__)
    }
    assert decisions - {"Resolution"} == kinds
    reasons = {
        reason.strip()
        for row in rows
        for given in re.findall(r"Review\(([^)]*)\)", row[1])
        for reason in given.split("/")
    }
    reasons |= {r for row in rows for r in re.findall(r"Escalated\(([\w-]+)\)", row[2])}
    assert reasons == {reason.value for reason in EscalationReason}


INVARIANT = re.compile(r"^(\d+)\. \*\*(.*?)(?=^\d+\. |\Z)", re.M | re.S)
TEST_REF = re.compile(r"`(tests/[\w/]+\.py)(?:::(\w+))?`")


def test_every_invariant_names_the_tests_that_check_it() -> None:
    invariants = INVARIANT.findall(section("Invariants"))
    assert [number for number, _ in invariants] == [str(n) for n in range(1, 8)]
    for number, body in invariants:
        refs = TEST_REF.findall(re.sub(r"`tests/(\w+)/\n\s*", r"`tests/\1/", body))
        assert refs, f"invariant {number} names no test"
        for path, name in refs:
            file = REPO / path
            assert file.is_file(), path
            if name:
                assert re.search(rf"^\s*def {name}\(", file.read_text(encoding="utf-8"), re.M)


def test_a_new_providers_capabilities_default_as_the_page_says() -> None:
    # "Adding a provider": the capabilities, with their defaults, are ProviderBase's.
    from daemon.providers.base import ProviderBase

    class Plain(ProviderBase):
        name = "plain"

    plain = Plain()
    assert plain.response_ids_readable is False
    assert plain.timeout == 30.0
    assert plain.for_job("a@example.com", None) is plain
    assert plain.scope() == "plain" and plain.scope_of("a@example.com") == "plain"
    assert plain.reserve_send() == 0.0
    assert plain.quota_available() is None
    assert plain.leaves_drafts is False and plain.drafts() is None
    assert plain.delete_drafts("<a@b>") == []
    assert plain.forget_idle() == 0
    assert plain.reads_reports is False
    assert plain.read_reports(datetime.now(UTC), known=(), max_bytes=1, limit=1).listed == ()
    page = section("Adding a provider")
    for said in (
        "`response_ids_readable` (False",
        "`timeout` (30 s)",
        "(itself), `scope()` (its name), `reserve_send()` (0.0",
        "`quota_available()` (None)",
        "`scope_of(mailbox)` (`scope()`",
        "`leaves_drafts` (False",
        "`drafts()` (None",
        "`delete_drafts(message_id)` (none deleted)",
        "`forget_idle()` (0",
        "`reads_reports` (False)",
        "(nothing listed)",
    ):
        assert said in page.replace("\n   ", " "), said


def test_the_service_layer_sentence_names_every_service() -> None:
    text = section("One service layer")
    sentence = text.split("Every door acts through", 1)[1].split(". The CLI", 1)[0]
    named = set(re.findall(r"`(?:Services\.)?([a-z_]+)`", sentence))
    [services] = classes()["Services"]
    public = {
        node.name
        for node in services.body
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("_")
    }
    # `job` (a job or not-found) and `search` (the provider call `check` makes) are what the
    # services use, not what a door asks for; `intake` is the validation it holds.
    assert named == public - {"job", "search", "intake"}


def test_each_refusal_maps_to_the_exit_code_and_status_the_page_gives() -> None:
    from daemon.api.errors import STATUS
    from daemon.exit_codes import REFUSAL_CODES
    from ledger.exceptions import Refusal

    said = {
        "bad input": Refusal.BAD_INPUT,
        "not found": Refusal.NOT_FOUND,
        "conflict": Refusal.CONFLICT,
        "a search that could not be made": Refusal.UNAVAILABLE,
    }
    text = re.sub(r"\s+", " ", section("One service layer"))
    for words, refusal in said.items():
        given = rf"{words}: (exit )?{REFUSAL_CODES[refusal]} / {STATUS[refusal]}\b"
        assert re.search(given, text), words
    assert set(said.values()) == set(Refusal)


def test_the_decision_functions_read_no_clock() -> None:
    # "the decision functions (pure: no I/O, no clock)": every time is a parameter.
    clocks = {"now", "utcnow", "today", "time", "monotonic", "perf_counter"}
    for path in sorted((SRC / "policies").glob("*.py")):
        calls = {
            node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            for node in ast.walk(tree(path))
            if isinstance(node, ast.Call)
        }
        assert not calls & clocks, (path.name, calls & clocks)


def test_the_event_versions_the_page_gives_are_the_classes() -> None:
    # "Stored events keep loading": each versioned event, at the version it is at, with an
    # upcaster per step; every other event class is at version 1.
    from ledger.job import SendJob

    text = re.sub(r"\s+", " ", section("Stored events keep loading"))
    said = {name: int(n) for name, n in re.findall(r"`(\w+)` (?:is )?at version (\d+)", text)}
    events = {
        name: value
        for name, value in vars(SendJob).items()
        if isinstance(value, type) and issubclass(value, SendJob.Event | SendJob.Requested)
    }
    versioned = {n: v for n, e in events.items() if (v := getattr(e, "class_version", 1)) > 1}
    assert said == versioned
    for name, version in versioned.items():
        for step in range(1, version):
            assert hasattr(events[name], f"upcast_v{step}_v{step + 1}"), (name, step)


CITATION = re.compile(
    r"docs/(architecture|development|performance)\.md`{0,2},? \(?\"([^\"]+)\"", re.M
)


def headings(page: str) -> list[str]:
    text = (REPO / "docs" / f"{page}.md").read_text(encoding="utf-8")
    return re.findall(r"^#{1,6} (.+)$", re.sub(r"```.*?```", "", text, flags=re.S), re.M)


def stale_citations(text: str) -> list[str]:
    """Citations of docs/architecture.md, development.md or performance.md by section that
    name no heading of the page (a heading's first words, up to a word's end, are enough)."""
    found = [  # a citation may wrap onto a comment's next line
        (page, re.sub(r"\s*\n\s*#?\s*|\s+", " ", cited)) for page, cited in CITATION.findall(text)
    ]
    return [
        f'{page}.md "{cited}"'
        for page, cited in found
        if not any(re.match(rf"{re.escape(cited)}\b", h) for h in headings(page))
    ]


def test_every_citation_of_these_pages_names_one_of_their_sections() -> None:
    # Docstrings cite the design by section; a renamed section leaves them pointing nowhere.
    files = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    for top in ("src", "tests", "bench"):
        files += sorted((REPO / top).rglob("*.py"))
    stale = [
        f"{path.relative_to(REPO)}: {citation}"
        for path in files
        if path != Path(__file__).resolve()
        for citation in stale_citations(path.read_text(encoding="utf-8"))
    ]
    assert stale == []


def test_the_citation_checker_sees_a_section_that_is_gone() -> None:
    text = 'see docs/architecture.md "Doors" and docs/architecture.md, "Layers" and\n'
    text += 'docs/performance.md "Performance and scaling", docs/development.md "Dev"'
    assert stale_citations(text) == ['architecture.md "Doors"', 'development.md "Dev"']


def test_the_store_port_sentence_names_ledger_methods() -> None:
    port = section("Stores").split("Store URLs pick a backend", 1)[0]
    named = set(re.findall(r"\(`([a-z_]+)`\)", port))
    assert named == {"jobs", "job_events", "due", "scope_leases"}
    assert all(defined("ledger.application", f"Ledger.{name}") for name in named)
    # The URL forms the page gives, as it writes them, are the ones the parser takes.
    from ledger.stores.url import parse_store_url

    urls = re.findall(r"`((?:sqlite|postgresql|memory):[^`]*)`", section("Stores"))
    assert len(urls) == 5
    for url in urls:
        parse_store_url(url.replace("relative/path", "x.sqlite").replace("/absolute/path", "/x"))
