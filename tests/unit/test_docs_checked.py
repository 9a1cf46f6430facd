"""Every claim in the docs is checkable (docs/development.md "Writing the docs"): each page
ends with a table, "What checks this page", with a row for every section naming the tests,
benchmarks or commands that check what it says, each of which exists. A reader who doubts
a sentence knows what to run, and a test renamed or removed takes its claim's evidence
with it visibly. A section is the text under a `##`, `###` or `####` heading up to the next
heading; one with no prose of its own (only sub-sections or code) needs no row."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from tests.unit.docs_page import CODE, FENCE, PAGES, REPO

from daemon.cli import COMMANDS

TITLE = "What checks this page"
ROW = re.compile(r"^\| \[(?P<section>.+?)\]\(#[^)]*\) \| (?P<items>.*) \|$")
MAKE_TARGETS = set(re.findall(r"^([a-z][a-z0-9_-]*):", (REPO / "Makefile").read_text(), re.M))


def sections(text: str) -> list[tuple[str, list[str]]]:
    """(heading, prose lines) of every `##`/`###`/`####` section."""
    found: list[tuple[str, list[str]]] = []
    current: list[str] | None = None
    fenced = False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced and (heading := re.match(r"^(#{1,6}) (.*)", line)):
            current = [] if len(heading.group(1)) in (2, 3, 4) else None
            if current is not None:
                found.append((heading.group(2), current))
        elif current is not None and not fenced and line.strip():
            current.append(line)
    return found


def problem_with(item: str) -> str | None:
    path, _, name = item.partition("::")
    if re.match(r"(tests|bench)/", path):
        if not (REPO / path).is_file():
            return "no such file"
        code = (REPO / path).read_text(encoding="utf-8")
        found = re.search(
            rf"^\s*(async )?def {re.escape(name)}\(|^class {re.escape(name)}\b", code, re.M
        )
        return None if not name or found else f"no test {name} in it"
    words = item.split()
    if words[:1] == ["make"]:
        return None if words[1:2] and words[1] in MAKE_TARGETS else "no such make target"
    if words[:1] == ["sendledger"]:
        return None if words[1:2] and words[1] in COMMANDS else "no such command"
    return "not a test path, bench script, `make TARGET` or `sendledger COMMAND`"


def unchecked(page: Path) -> list[str]:
    found = sections(page.read_text(encoding="utf-8"))
    table = {
        row.group("section").replace("\\|", "|"): CODE.findall(row.group("items"))
        for heading, prose in found
        if heading == TITLE
        for line in prose
        if (row := ROW.match(line))
    }
    out = []
    for heading, prose in found:
        if heading == TITLE:
            continue
        if any(line.startswith("Checked by:") for line in prose):
            out.append(f"{page.name} '{heading}': a `Checked by:` line in the prose")
        if prose and heading not in table:
            out.append(f"{page.name} '{heading}': no row in '{TITLE}'")
        elif prose and not table[heading]:
            out.append(f"{page.name} '{heading}': its row names nothing")
        out += [
            f"{page.name} '{heading}': {i}: {p}"
            for i in table.get(heading, [])
            if (p := problem_with(i))
        ]
    headings = {heading for heading, _ in found}
    out += [
        f"{page.name}: '{TITLE}' names a section it does not have: '{s}'"
        for s in sorted(set(table) - headings)
    ]
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_section_names_what_checks_it(page: Path) -> None:
    assert unchecked(page) == []


def test_the_checker_sees_a_section_without_evidence(tmp_path: Path) -> None:
    this = "tests/unit/test_docs_checked.py"
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n## Told\n\nA claim.\n\n## Untold\n\nA claim.\n\n"
        "## Only code\n\n```\n## not a heading\n```\n\n"
        "## Wrong\n\nA claim.\n\n## Inline\n\nA claim.\n\nChecked by: `make test`\n\n"
        f"## {TITLE}\n\n| section | checked by |\n|---|---|\n| [Told](#told) | `{this}` |\n"
        f"| [Wrong](#wrong) | `{this}::{'nope'}`, `make nothing`, `sendledger frobnicate`, "
        "`rm -rf /` |\n"
        "| [Inline](#inline) | `make test` |\n| [Gone](#gone) | `make test` |\n"
    )
    assert unchecked(page) == [
        "page.md 'Untold': no row in 'What checks this page'",
        f"page.md 'Wrong': {this}::nope: no test nope in it",
        "page.md 'Wrong': make nothing: no such make target",
        "page.md 'Wrong': sendledger frobnicate: no such command",
        "page.md 'Wrong': rm -rf /: not a test path, bench script, `make TARGET` or "
        "`sendledger COMMAND`",
        "page.md 'Inline': a `Checked by:` line in the prose",
        "page.md: 'What checks this page' names a section it does not have: 'Gone'",
    ]
