"""Every claim in the docs is checkable (docs/development.md "Writing the docs"): each page
ends with "What checks this page", a row for every section with prose of its own naming
the tests, benchmarks, `make` targets or commands that check it, each of which exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from tests.unit.docs_page import CODE, FENCE, PAGES, REPO, missing_paths

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
        fenced ^= bool(FENCE.match(line))
        if not fenced and (heading := re.match(r"^(#{1,6}) (.*)", line)):
            current = [] if len(heading.group(1)) in (2, 3, 4) else None
            if current is not None:
                found.append((heading.group(2), current))
        elif current is not None and not fenced and line.strip() and not FENCE.match(line):
            current.append(line)
    return found


def problem_with(item: str) -> str | None:
    words = item.split()
    if re.match(r"(tests|bench)/\S+\.py", item):
        return "; ".join(missing_paths(item)) or None
    if words[:1] == ["make"]:
        return None if words[1:2] and words[1] in MAKE_TARGETS else "no such make target"
    if words[:1] == ["sendledger"]:
        return None if words[1:2] and words[1] in COMMANDS else "no such command"
    return "not a test path, bench script, `make TARGET` or `sendledger COMMAND`"


def unchecked(page: Path) -> list[str]:
    found = sections(page.read_text(encoding="utf-8"))
    named = {
        row["section"].replace("\\|", "|"): CODE.findall(row["items"])
        for heading, prose in found
        if heading == TITLE
        for line in prose
        if (row := ROW.match(line))
    }
    out = [
        f"{page.name}: '{TITLE}' names no section '{s}'" for s in set(named) - dict(found).keys()
    ]
    for heading, prose in found:
        if heading == TITLE:
            continue
        if any(line.startswith("Checked by:") for line in prose):
            out.append(f"{page.name} '{heading}': a `Checked by:` line in the prose")
        if prose and not named.get(heading):
            out.append(f"{page.name} '{heading}': no row in '{TITLE}', or it names nothing")
        items = named.get(heading, [])
        out += [f"{page.name} '{heading}': {i}: {p}" for i in items if (p := problem_with(i))]
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_section_names_what_checks_it(page: Path) -> None:
    assert unchecked(page) == []


def test_the_checker_sees_a_section_without_evidence(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "# P\n\n## Told\n\nA.\n\n## Untold\n\nA.\n\n## Code\n\n```\n## no\n```\n\n## Wrong\n\nA.\n"
        f"\n## {TITLE}\n\n| section | checked by |\n|---|---|\n| [Told](#told) | `make test` |\n"
        f"| [Wrong](#wrong) | `{Path(__file__).relative_to(REPO)}::{'nope'}`, `make no`, "
        "`sendledger no`, `rm -rf /` |\n"
        "| [Gone](#gone) | `make test` |\n"
    )
    assert [line.split(": ", 1)[-1][:24] for line in unchecked(page)] == [
        "'What checks this page' ",
        "no row in 'What checks t",
        "tests/unit/test_docs_che",
        "make no: no such make ta",
        "sendledger no: no such c",
        "rm -rf /: not a test pat",
    ]
