"""docs/development.md and the README's two commands against what they describe
(docs/development.md "Writing the docs"): the make targets the page names are the
Makefile's, `make bench` runs the scripts the page lists, the layout list is the source tree,
and the private-PostgreSQL paragraph says what the Makefile, `.ci/run` and the test session
do."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from tests.unit import docs_page

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "development.md"
README = REPO / "README.md"
MAKEFILE = (REPO / "Makefile").read_text(encoding="utf-8")
TARGET = re.compile(r"^([a-z][a-z0-9_-]*):(.*)$", re.M)


def page() -> str:
    return PAGE.read_text(encoding="utf-8")


def section(title: str) -> str:
    return docs_page.section(PAGE, title, until=6)


def targets() -> dict[str, str]:
    """Each Makefile target and its prerequisites."""
    return {name: deps for name, deps in TARGET.findall(MAKEFILE)}


def recipe(target: str) -> list[str]:
    match = re.search(rf"^{re.escape(target)}:.*\n((?:\t.*\n?)*)", MAKEFILE, re.M)
    assert match, target
    return [line.strip() for line in match.group(1).splitlines()]


def named_targets(text: str) -> set[str]:
    """`make X Y` at the start of a code line, and `make X` in backticks."""
    found = set()
    for words in re.findall(r"^make ([a-z0-9 _-]+?)\s*(?:#|$)", text, re.M):
        found.update(words.split())
    found.update(re.findall(r"`make ([a-z0-9_-]+)`", text))
    return found


def test_the_page_names_every_make_target_and_only_real_ones() -> None:
    assert named_targets(page()) == set(targets())


def test_every_target_the_page_says_installs_first_does() -> None:
    # "make venv ... (every target above but `test-py313` makes it first)"
    assert "(every target above but `test-py313` makes it first)" in page()
    installing = {
        name for name, deps in targets().items() if {"$(STAMP)", "$(RUN_STAMP)"} & set(deps.split())
    }
    listed = named_targets(page().split("```sh", 1)[1].split("```", 1)[0])
    assert installing == listed - {"clean", "test-py313"}


def test_demo_and_try_install_only_what_runs() -> None:
    """`make demo` and `make try` need the runtime install only; the [test] extra (mypy,
    ruff, playwright, hypothesis: about two minutes on a fresh clone) is for the rest."""
    deps = targets()
    assert deps["demo"].split() == deps["try"].split() == ["$(RUN_STAMP)"]
    runtime = recipe("$(RUN_STAMP)")
    assert any(line.endswith(" -e .") for line in runtime), runtime
    assert not any("[test]" in line for line in runtime)
    stamp = re.search(r"^\$\(STAMP\):(.*)$", MAKEFILE, re.M)
    assert stamp and "$(RUN_STAMP)" in stamp.group(1).split()
    assert any("-e '.[test]'" in line for line in recipe("$(STAMP)"))
    for name in ("test", "unit", "integration", "e2e", "lint", "typecheck", "venv"):
        assert "$(STAMP)" in deps[name].split(), name
    assert "make demo` and `make try` install only what runs" in page()


def test_the_bench_lines_are_what_make_bench_runs_in_order() -> None:
    block = page().split("make bench", 1)[1].split("make test-py313", 1)[0]
    listed = re.findall(r"(bench/\w+\.py)", block)
    steps = recipe("bench")
    # First the bench extra (docs/development.md says so), then the scripts.
    assert steps[0] == "$(BIN)/python -m pip install --quiet -e '.[bench]'"
    assert "the bench extra" in block
    ran = [re.search(r"(bench/\w+\.py)", line).group(1) for line in steps[1:]]  # type: ignore[union-attr]
    assert listed == ran
    assert "$(HISTORY_ARGS)" in steps[1 + ran.index("bench/history.py")]
    assert recipe("soak") == ["$(BIN)/python bench/soak.py $(SOAK_ARGS)"]


def test_make_test_runs_the_313_tests_first_then_everything_then_lint_and_typecheck() -> None:
    steps = recipe("test")
    assert "test-py313" in steps[0]
    assert "test-eventsourcing" in steps[1]  # the store against the newest eventsourcing
    assert steps[2].endswith(" tests") and "pytest" in steps[2]
    assert steps[3].endswith("lint typecheck")
    assert "test-packages" in targets()["test"].split()
    assert recipe("demo") == ["$(BIN)/sendledger demo"]
    assert recipe("try") == ["$(BIN)/sendledger try"]


def test_the_layout_list_is_the_src_packages() -> None:
    layout = section("Layout")
    listed = set(re.findall(r"^- `src/([\w/]+)/`", layout, re.M))
    src = REPO / "src"
    packages = {p.name for p in src.iterdir() if (p / "__init__.py").is_file()}
    assert listed == packages | {"ledger/stores"}
    daemon = src / "daemon"
    rooms = {p.name for p in daemon.iterdir() if (p / "__init__.py").is_file()}
    bullet = layout.split("- `src/daemon/`", 1)[1].split("\n- ", 1)[0]
    assert set(re.findall(r"`(\w+)/`", bullet)) == rooms
    wiring = {p.name for p in daemon.glob("*.py")} - {"__init__.py", "__main__.py"}
    assert {"bootstrap.py", "from_settings.py", "runtime.py"} <= wiring
    stores = {p.stem for p in (src / "ledger" / "stores").glob("*.py")}
    assert {"sqlite", "postgres", "memory"} <= stores
    for tier in ("unit", "integration", "e2e"):
        assert f"`tests/{tier}`" in layout and (REPO / "tests" / tier).is_dir()
    assert (REPO / "tests" / "fixtures" / "store-v1").is_dir()


def test_the_requirements_are_the_packages() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert project["requires-python"] == ">=3.11"
    assert "Requirements: Python >= 3.11 and `make`." in page()
    # README: "([eventsourcing](...) 9.5)"
    assert any(d.startswith("eventsourcing[postgres]>=9.5,<9.6") for d in project["dependencies"])
    assert "eventsourcing.readthedocs.io/) 9.5" in README.read_text(encoding="utf-8")


def test_the_private_postgresql_paragraph_says_what_the_makefile_and_ci_do() -> None:
    text = section("The private PostgreSQL")
    default = "postgresql://sendledger:sendledger@127.0.0.1:5432/sendledger_test"
    assert f"`{default}`" in text.replace("\n", "")
    assert default in (REPO / "tests" / "conftest.py").read_text(encoding="utf-8")
    packages = re.search(r"^TEST_PACKAGES := (.*(?:\\\n.*)*)", MAKEFILE, re.M)
    assert packages and "postgresql-15" in packages.group(1)
    assert {"postfix", "dovecot-imapd"} <= set(packages.group(1).replace("\\", " ").split())
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    commands = [
        line for line in ci.splitlines() if line.strip() and not line.lstrip().startswith("#")
    ]
    assert commands[-2:] == ['export CI="${CI:-true}"', "exec make test"]


def test_the_readme_commands_exist_with_the_options_they_are_given() -> None:
    """Every `sendledger ...` line of the README's quick start, and the providers its next
    sentence names, parse with the real CLI parser (tests/e2e/test_init.py runs them)."""
    import shlex

    from daemon.cli import build_parser

    text = README.read_text(encoding="utf-8")
    quick = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    block = quick.split("```sh\n", 1)[1].split("```", 1)[0]
    lines = [line.split("#")[0].rstrip(" &") for line in block.splitlines()]
    commands = [shlex.split(line)[1:] for line in lines if line.startswith(".venv/bin/sendledger")]
    assert len(commands) == 4
    for provider in re.findall(r"`--provider ([\w-]+)`", quick):
        commands.append(["init", "mail", "--provider", provider])
    assert len(commands) == 6
    for argv in commands:
        command = next(w for w in argv if not w.startswith("-") and not w.endswith(".toml"))
        args = build_parser(command).parse_args(argv)
        assert args.command == command, argv
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert project["scripts"] == {"sendledger": "daemon.cli:main"}  # `pip install .`
    assert "`.venv/bin/sendledger`" in quick and "$(BIN)/sendledger demo" in MAKEFILE


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
        p.relative_to(REPO / "src").as_posix()
        for p in sorted((REPO / "src").rglob("*.py"))
        if re.search(r"^\s*(import|from) psycopg", p.read_text(encoding="utf-8"), re.M)
    ]
    assert importers == ["ledger/stores/postgres.py"]
