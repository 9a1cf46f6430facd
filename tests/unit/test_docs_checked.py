"""Every claim in the docs pages is checkable (docs/development.md "Writing the docs"): each
page ends with a table, "What checks this page", with a row for every section naming the
tests, benchmarks or commands that check what the section says, and each of them exists. So a
reader who doubts a sentence knows what to run, the prose reads as documentation rather than
as a test log, and a test that is renamed or removed takes its claim's evidence with it
visibly.

A section is the text under a `##`, `###` or `####` heading up to the next heading; one that
holds no prose of its own (only sub-sections or a code block) needs no row."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from daemon.cli import COMMANDS

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6}) (.*)")
TABLE_TITLE = "What checks this page"
ROW = re.compile(r"^\| \[(?P<section>.+?)\]\(#[^)]*\) \| (?P<items>.*) \|$")
ITEM = re.compile(r"`([^`]+)`")
MAKE_TARGET = re.compile(r"^([a-z][a-z0-9_-]*):", re.M)


def sections(text: str) -> list[tuple[str, list[str]]]:
    """(heading, prose lines) for every `##`/`###`/`####` section; fenced code is not
    prose."""
    found: list[tuple[str, list[str]]] = []
    current: list[str] | None = None
    fenced = False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        heading = None if fenced else HEADING.match(line)
        if heading:
            current = None
            if len(heading.group(1)) in (2, 3, 4):
                current = []
                found.append((heading.group(2), current))
        elif current is not None and not fenced and line.strip():
            current.append(line)
    return found


def checks_table(text: str) -> dict[str, list[str]]:
    """The page's table: section heading -> what checks it."""
    rows: dict[str, list[str]] = {}
    for heading, prose in sections(text):
        if heading != TABLE_TITLE:
            continue
        for line in prose:
            row = ROW.match(line)
            if row:
                section = row.group("section").replace("\\|", "|")
                rows[section] = ITEM.findall(row.group("items"))
    return rows


def problems_with(item: str, make_targets: set[str]) -> str | None:
    path, _, test_name = item.partition("::")
    if re.match(r"(tests|bench)/", path):
        file = REPO / path
        if not file.is_file():
            return "no such file"
        if test_name and not re.search(
            rf"^\s*(async )?def {re.escape(test_name)}\(|^class {re.escape(test_name)}\b",
            file.read_text(encoding="utf-8"),
            re.M,
        ):
            return f"no test {test_name} in it"
        return None
    words = item.split()
    if words[:1] == ["make"]:
        return None if len(words) > 1 and words[1] in make_targets else "no such make target"
    if words[:1] == ["sendledger"]:
        return None if len(words) > 1 and words[1] in COMMANDS else "no such command"
    return "not a test path, bench script, `make TARGET` or `sendledger COMMAND`"


def unchecked(page: Path, make_targets: set[str]) -> list[str]:
    text = page.read_text(encoding="utf-8")
    table = checks_table(text)
    out = []
    headings = []
    for heading, prose in sections(text):
        if heading == TABLE_TITLE:
            continue
        headings.append(heading)
        if any(line.startswith("Checked by:") for line in prose):
            out.append(f"{page.name} '{heading}': a `Checked by:` line in the prose")
        if not prose:
            continue
        if heading not in table:
            out.append(f"{page.name} '{heading}': no row in '{TABLE_TITLE}'")
            continue
        if not table[heading]:
            out.append(f"{page.name} '{heading}': its row names nothing")
        for item in table[heading]:
            problem = problems_with(item, make_targets)
            if problem:
                out.append(f"{page.name} '{heading}': {item}: {problem}")
    for stale in sorted(set(table) - set(headings)):
        out.append(f"{page.name}: '{TABLE_TITLE}' names a section it does not have: '{stale}'")
    return out


def make_targets() -> set[str]:
    return set(MAKE_TARGET.findall((REPO / "Makefile").read_text(encoding="utf-8")))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_section_names_what_checks_it(page: Path) -> None:
    assert unchecked(page, make_targets()) == []


def test_the_checker_sees_a_section_without_evidence(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n## Told\n\nA claim.\n\n## Untold\n\nA claim.\n\n"
        "## Only code\n\n```\n## not a heading\n```\n\n"
        "## Wrong\n\nA claim.\n\n## Inline\n\nA claim.\n\nChecked by: `make test`\n\n"
        f"## {TABLE_TITLE}\n\n| section | checked by |\n|---|---|\n"
        "| [Told](#told) | `tests/unit/test_docs_checked.py` |\n"
        "| [Wrong](#wrong) | `tests/unit/test_docs_checked.py::nope`, `make nothing`, "
        "`sendledger frobnicate`, `rm -rf /` |\n"
        "| [Inline](#inline) | `make test` |\n"
        "| [Gone](#gone) | `make test` |\n"
    )
    assert unchecked(page, make_targets()) == [
        "page.md 'Untold': no row in 'What checks this page'",
        "page.md 'Wrong': tests/unit/test_docs_checked.py::nope: no test nope in it",
        "page.md 'Wrong': make nothing: no such make target",
        "page.md 'Wrong': sendledger frobnicate: no such command",
        "page.md 'Wrong': rm -rf /: not a test path, bench script, `make TARGET` or "
        "`sendledger COMMAND`",
        "page.md 'Inline': a `Checked by:` line in the prose",
        "page.md: 'What checks this page' names a section it does not have: 'Gone'",
    ]
