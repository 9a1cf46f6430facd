"""Every claim in the docs pages is checkable (docs/development.md "Writing the docs"): each section
of a page ends with a `Checked by:` line naming the tests, benchmarks or commands that check
what the section says, and each of them exists, so a reader who doubts a sentence knows what to
run, and a test that is renamed or removed takes its claim's evidence with it visibly.

A section is the text under a `##`, `###` or `####` heading up to the next heading; one that
holds no prose of its own (only sub-sections or a code block) needs no line."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from daemon.cli import COMMANDS

REPO = Path(__file__).resolve().parents[2]
PAGES = sorted((REPO / "docs").glob("*.md"))
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6}) (.*)")
CHECKED = re.compile(r"^Checked by: (.+)$")
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
    out = []
    for heading, prose in sections(page.read_text(encoding="utf-8")):
        if not prose:
            continue
        last = CHECKED.match(prose[-1])
        if not last:
            out.append(f"{page.name} '{heading}': no `Checked by:` line at its end")
            continue
        items = ITEM.findall(last.group(1))
        if not items:
            out.append(f"{page.name} '{heading}': `Checked by:` names nothing")
        for item in items:
            problem = problems_with(item, make_targets)
            if problem:
                out.append(f"{page.name} '{heading}': {item}: {problem}")
    return out


def make_targets() -> set[str]:
    return set(MAKE_TARGET.findall((REPO / "Makefile").read_text(encoding="utf-8")))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_section_names_what_checks_it(page: Path) -> None:
    assert unchecked(page, make_targets()) == []


def test_the_checker_sees_a_section_without_evidence(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n## Told\n\nA claim.\n\nChecked by: `tests/unit/test_docs_checked.py`\n\n"
        "## Untold\n\nA claim.\n\n## Only code\n\n```\n## not a heading\n```\n\n"
        "## Wrong\n\nA claim.\n\nChecked by: `tests/unit/test_docs_checked.py::nope`, "
        "`make nothing`, `sendledger frobnicate`, `rm -rf /`\n"
    )
    assert unchecked(page, make_targets()) == [
        "page.md 'Untold': no `Checked by:` line at its end",
        "page.md 'Wrong': tests/unit/test_docs_checked.py::nope: no test nope in it",
        "page.md 'Wrong': make nothing: no such make target",
        "page.md 'Wrong': sendledger frobnicate: no such command",
        "page.md 'Wrong': rm -rf /: not a test path, bench script, `make TARGET` or "
        "`sendledger COMMAND`",
    ]
