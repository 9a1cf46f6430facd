"""The import rules of docs/architecture.md ("Layers and what each may import")."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path
from typing import Any

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
IO_MODULES = ("sqlite3", "psycopg", "socket", "http", "urllib", "httplib2", "googleapiclient")
STORAGE = ("eventsourcing.sqlite", "eventsourcing.postgres", "eventsourcing.popo")


@functools.cache
def nodes(path: Path) -> tuple[ast.AST, ...]:
    """Every node of the module's tree, parsed once for all the tests of a run."""
    return tuple(ast.walk(ast.parse(path.read_text(encoding="utf-8"))))


def imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in nodes(path):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def imported(path: Path) -> set[str]:
    """`imports` and, for `from a import b`, `a.b` too: `from daemon import cli` imports
    `daemon.cli` as surely as `import daemon.cli` does."""
    found = imports(path)
    for node in nodes(path):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def under(names: set[str], *prefixes: str) -> list[str]:
    return sorted(n for n in names if any(n == p or n.startswith(p + ".") for p in prefixes))


def modules(package: str) -> list[Path]:
    return sorted((SRC / package).rglob("*.py"))


def domain_modules() -> list[Path]:
    ledger = SRC / "ledger"
    return [
        path
        for path in modules("ledger")
        if path.name != "application.py" and "stores" not in path.relative_to(ledger).parts
    ]


@pytest.mark.parametrize("path", domain_modules(), ids=lambda p: p.name)
def test_the_domain_does_no_io_and_imports_no_outer_layer(path: Path) -> None:
    found = imports(path)
    assert not under(found, *IO_MODULES, *STORAGE), path
    assert not under(found, "policies", "daemon", "testkit"), path


@pytest.mark.parametrize("path", modules("ledger"), ids=lambda p: p.name)
def test_the_ledger_imports_neither_policies_nor_daemon(path: Path) -> None:
    assert not under(imports(path), "policies", "daemon", "testkit"), path


@pytest.mark.parametrize("path", modules("policies"), ids=lambda p: p.name)
def test_policies_import_no_runtime(path: Path) -> None:
    found = imports(path)
    assert not under(found, "daemon", "testkit", *IO_MODULES, *STORAGE), path
    assert not under(found, "ledger.application", "ledger.stores"), path


@pytest.mark.parametrize("path", modules("testkit"), ids=lambda p: p.name)
def test_the_testkit_stands_alone(path: Path) -> None:
    assert not under(imports(path), "ledger", "policies", "daemon"), path


def test_only_demo_and_the_testkit_commands_use_the_testkit() -> None:
    # probe.py: its fault relays drop the reply to the one real send it makes; try_it.py:
    # `sendledger try` runs the emulator and a relay for its own daemon.
    users = {p.name for p in modules("daemon") if under(imports(p), "testkit")}
    assert users <= {"demo.py", "probe.py", "try_it.py", "testkit_doubles.py"}, users


def test_providers_never_touch_the_store() -> None:
    for path in sorted((SRC / "daemon" / "providers").glob("*.py")):
        assert not under(imports(path), "ledger.application", "ledger.stores"), path


@pytest.mark.parametrize("path", modules("sendledger"), ids=lambda p: p.name)
def test_the_client_imports_only_the_standard_library(path: Path) -> None:
    # A door from outside the process (docs/http-api.md "Python client"): a user's program imports
    # it without the daemon's packages, so nothing of ours and nothing installed.
    import sys

    outside = {name.split(".")[0] for name in imports(path)} - {"sendledger", "__future__"}
    assert outside <= set(sys.stdlib_module_names), (path, outside - sys.stdlib_module_names)


def test_the_daemon_never_runs_on_a_test_double() -> None:
    # daemon/doubles/ implements the provider port for tests and benches; the bootstrap, the
    # CLI and the API must not be able to reach it, so no setting can select a fake provider.
    users = {
        str(p.relative_to(SRC))
        for p in modules("daemon")
        if "doubles" not in p.parts and under(imports(p), "daemon.doubles")
    }
    assert users == set(), users


def test_the_daemon_package_keeps_only_its_wiring_at_the_top() -> None:
    # Everything else lives in a package named for its role (docs/architecture.md "Layers and
    # what each may import"): a new flat module has to say which room it belongs in.
    top = {p.name for p in (SRC / "daemon").glob("*.py")}
    assert top == {
        "__init__.py",
        "__main__.py",
        "bootstrap.py",
        "console.py",
        "crashpoints.py",
        "exit_codes.py",
        "from_settings.py",
        "logs.py",
        "runtime.py",
        "secret_reads.py",
        "systemd.py",
        "wakeup.py",
    }, top


def test_only_the_command_line_imports_the_command_line() -> None:
    # daemon/cli is a door, never a library: what other layers share with it (a moment as
    # written, `ledger.display.iso`; a rendered message) lives where they may import it.
    # Outside it only the entry point (daemon/console.py) and the commands it registers
    # from other packages (`daemon.cli.COMMANDS`: demo, try, probe in daemon/tools/)
    # reach into it.
    from daemon.cli import COMMANDS

    commands = {name for name in COMMANDS.values() if not name.startswith("daemon.cli.")}
    allowed = {"daemon.console", *commands}
    cli = SRC / "daemon" / "cli"
    users = {
        ".".join(p.relative_to(SRC).with_suffix("").parts)
        for p in modules("daemon")
        if cli not in p.parents and under(imported(p), "daemon.cli")
    }
    assert users <= allowed, users - allowed


#: The daemon's inside: what the doors call, never what calls them.
INSIDE = ("service_layer", "engine", "config", "webhooks")


@pytest.mark.parametrize(
    "path",
    [path for room in INSIDE for path in modules(f"daemon/{room}")],
    ids=lambda p: str(p.relative_to(SRC / "daemon")),
)
def test_the_inside_of_the_daemon_imports_no_door(path: Path) -> None:
    # docs/architecture.md "Layers and what each may import": the command line and the HTTP
    # API parse input into the service layer's calls and format its answers; nothing
    # below them reaches back into a door (every import counts, a function's own too).
    assert not under(imported(path), "daemon.cli", "daemon.api"), path


@pytest.mark.parametrize("path", modules("daemon/service_layer"), ids=lambda p: p.name)
def test_the_service_layer_never_imports_the_dispatch(path: Path) -> None:
    # What the intake shares with the dispatch (the rendered message) is the ledger's,
    # `ledger/message.py`.
    assert not under(imported(path), "daemon.engine.dispatch"), path


#: The provider port: what the engine and the service layer may know of a provider.
PROVIDER_PORT = (
    "daemon.providers.base",
    "daemon.providers.outcomes",
    "daemon.providers.draft_handle",
    "daemon.providers.history_handle",
)


@pytest.mark.parametrize(
    "path", modules("daemon/engine") + modules("daemon/service_layer"), ids=lambda p: p.name
)
def test_the_engine_knows_providers_only_by_their_port(path: Path) -> None:
    # No concrete provider (smtp_imap, gmail, graph, ...) nor their helpers: a provider's
    # capabilities are declared in the port, so nothing above it needs to know which it is.
    found = {n for n in imported(path) if n != "daemon.providers"}
    outside = [n for n in under(found, "daemon.providers") if not under({n}, *PROVIDER_PORT)]
    assert outside == [], (path, outside)


def probes(path: Path) -> list[str]:
    """`hasattr(...)` calls, and `getattr(...)` calls on something named as a provider."""
    found = []
    for node in nodes(path):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.args:
            name, target = node.func.id, ast.unparse(node.args[0])
            if name == "hasattr" or (name == "getattr" and "provider" in target.lower()):
                found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    return found


@pytest.mark.parametrize(
    "path", modules("daemon/engine") + modules("daemon/service_layer"), ids=lambda p: p.name
)
def test_nothing_above_the_port_probes_a_provider(path: Path) -> None:
    # docs/architecture.md "Adding a provider": every capability is declared in the port
    # (`drafts()`, `leaves_drafts`, `search`, ...), with its default, so none is probed.
    assert probes(path) == []


# -- libraries and clocks (docs/architecture.md "Layers and what each may import") ---------


def test_only_the_api_imports_the_web_stack_and_only_runtime_apscheduler() -> None:
    # "daemon/api/: ... the only place FastAPI, uvicorn, prometheus_client and Jinja2 are
    # imported"; "runtime.py (the APScheduler service)".
    web = {"fastapi", "starlette", "uvicorn", "prometheus_client", "jinja2"}
    every = [path for package in ("daemon", "ledger", "policies") for path in modules(package)]
    tops = {p.relative_to(SRC).as_posix(): {n.split(".")[0] for n in imports(p)} for p in every}
    assert [m for m, names in tops.items() if names & web and "/api/" not in m] == []
    assert [m for m, names in tops.items() if "apscheduler" in names] == ["daemon/runtime.py"]


def test_the_decision_functions_read_no_clock() -> None:
    # "the decision functions (pure: no I/O, no clock)": every time is a parameter.
    clocks = {"now", "utcnow", "today", "time", "monotonic", "perf_counter"}
    for path in sorted((SRC / "policies").glob("*.py")):
        calls = {
            node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            for node in nodes(path)
            if isinstance(node, ast.Call)
        }
        assert not calls & clocks, (path.name, calls & clocks)


def test_psycopg_is_imported_only_for_a_postgresql_store(tmp_path: Path) -> None:
    # "`postgres` (psycopg is imported only for it)": a SQLite store never loads the driver.
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from ledger.application import Ledger\n"
        f"with Ledger('sqlite:///{tmp_path}/s.sqlite') as ledger:\n"
        "    ledger.open_counts()\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'psycopg'))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "[]"
    importers = [
        p.relative_to(SRC).as_posix()
        for p in sorted((SRC).rglob("*.py"))
        if re.search(r"^\s*(import|from) psycopg", p.read_text(encoding="utf-8"), re.M)
    ]
    assert importers == ["ledger/stores/pg_refusals.py", "ledger/stores/postgres.py"]


def _house_metrics() -> Any:
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location(
        "house_metrics", SRC.parent / "scripts" / "house_metrics.py"
    )
    assert spec is not None and spec.loader is not None
    metrics = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("house_metrics", metrics)
    spec.loader.exec_module(metrics)
    return metrics


def test_no_modules_import_each_other_in_a_circle() -> None:
    """Every import counted, `TYPE_CHECKING` ones too (docs/architecture.md "Layers and
    what each may import"): two modules that need each other's names share a third, as
    providers/outcomes.py and the provider's `*Calls` protocols do."""
    metrics = _house_metrics()
    assert metrics.cycles(metrics.import_edges(SRC, every=True)) == []


def test_no_import_chain_of_our_modules_is_longer_than_ten() -> None:
    """What loads while a module loads (`TYPE_CHECKING` and function-local imports not
    counted): a newcomer follows at most ten of our modules from a door to a leaf."""
    metrics = _house_metrics()
    chain = metrics.longest_chain(metrics.import_edges(SRC, every=False))
    assert len(chain) <= 10, " -> ".join(chain)


@functools.cache
def _paths() -> dict[str, dict[str, Any]]:
    """The three paths of scripts/house_metrics.py, traced once for the tests below."""
    metrics = _house_metrics()
    paths: dict[str, dict[str, Any]] = metrics.measure_paths(SRC.parent)
    return paths


@pytest.mark.parametrize("path", ["tick", "submit", "search"])
def test_no_file_on_a_path_calls_back_into_its_caller(path: str) -> None:
    """A newcomer follows a job's path one way (docs/architecture.md "The life of one
    job, file by file"): a file that a caller reaches does not call that caller back (a
    function passed in and called counts as a call)."""
    assert _paths()[path]["two_way_pairs"] == []


#: Files a plain send (one job, tick to Confirmed, nothing else due or configured) has
#: no need of: each is skipped when nothing of its own is due (docs/architecture.md
#: "The life of one job, file by file").
NOT_ON_A_PLAIN_SEND = (
    "ledger/stores/purge.py",
    "ledger/stores/causes.py",
    "daemon/engine/search.py",
)


def test_a_plain_send_crosses_no_file_it_does_not_need() -> None:
    assert set(NOT_ON_A_PLAIN_SEND) & set(_paths()["tick"]["file_list"]) == set()


#: ... and the search of an ambiguous send that made no draft.
NOT_ON_A_PLAIN_SEARCH = ("daemon/engine/drafts.py",)


def test_a_plain_search_crosses_no_file_it_does_not_need() -> None:
    assert set(NOT_ON_A_PLAIN_SEARCH) & set(_paths()["search"]["file_list"]) == set()


#: ... and a submission: the loaded-policy rows' store is made once per Ledger.
NOT_ON_A_SUBMISSION = ("ledger/stores/recorder_kind.py",)


def test_a_submission_crosses_no_file_it_does_not_need() -> None:
    assert set(NOT_ON_A_SUBMISSION) & set(_paths()["submit"]["file_list"]) == set()


#: Calls a path has no need of: the loaded-policy judge is handed the time it judges at,
#: it does not read the clock itself; a send tells a reload since its job was loaded
#: from the policies it holds, without the tick looking the channel up again.
NEEDLESS_JUMPS = {
    "submit": ("daemon/service_layer/loaded.py -> daemon/doubles/fake_time.py",),
    "tick": ("daemon/engine/dispatch.py -> daemon/engine/tick.py",),
}


@pytest.mark.parametrize("path", sorted(NEEDLESS_JUMPS))
def test_a_path_makes_no_call_it_does_not_need(path: str) -> None:
    assert set(NEEDLESS_JUMPS[path]) & set(_paths()[path]["jump_list"]) == set()
