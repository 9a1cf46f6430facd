"""Each section with prose has a "What checks this page" row naming only things that exist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from tests.unit.docs_page import CODE, PAGES, missing_paths, page, prose_lines

from daemon.cli import COMMANDS

TITLE = "What checks this page"
ROW = re.compile(r"^\| \[(?P<section>.+?)\]\(#[^)]*\) \| (?P<items>.*) \|$")
MAKE_TARGETS = set(re.findall(r"^([a-z][a-z0-9_-]*):", page("Makefile"), re.M))


def problem_with(item: str) -> str | None:
    words = item.split()
    if re.match(r"(tests|bench)/\S+\.py", item):
        return "; ".join(missing_paths(item)) or None
    if words[0] in ("make", "sendledger"):
        known, what = (MAKE_TARGETS, "make target") if words[0] == "make" else (COMMANDS, "command")
        return None if words[1:2] and words[1] in known else f"no such {what}"
    return "not a test path, bench script, `make TARGET` or `sendledger COMMAND`"


@pytest.mark.parametrize("path", PAGES, ids=lambda p: p.name)
def test_every_section_names_what_checks_it(path: Path) -> None:
    found: dict[str, list[str]] = {}  # the prose lines of each `##` to `####` section
    prose: list[str] = []
    for line in prose_lines(path.read_text(encoding="utf-8")):
        if heading := re.match(r"(#{1,6}) (.*)", line):
            prose = found.setdefault(heading[2], []) if 2 <= len(heading[1]) <= 4 else []
        elif line.strip():
            prose.append(line)
    rows = [row for line in found.pop(TITLE, []) if (row := ROW.match(line))]
    named = {row["section"].replace("\\|", "|"): CODE.findall(row["items"]) for row in rows}
    out = [f"{path.name}: '{TITLE}' names no section '{s}'" for s in set(named) - set(found)]
    for heading, lines in found.items():
        if any(line.startswith("Checked by:") for line in lines):
            out.append(f"{path.name} '{heading}': a `Checked by:` line in the prose")
        if lines and not named.get(heading):
            out.append(f"{path.name} '{heading}': no row in '{TITLE}', or it names nothing")
        items = named.get(heading, [])
        out += [f"{path.name} '{heading}': {i}: {p}" for i in items if (p := problem_with(i))]
    assert out == []
