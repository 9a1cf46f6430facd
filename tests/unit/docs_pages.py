"""Reading a docs/ page as the docs tests compare it with the code (docs/development.md
"Writing the docs"): a section's text and a table's rows."""

from __future__ import annotations

import re
from pathlib import Path

DOCS = Path(__file__).resolve().parents[2] / "docs"


def section(page: Path, heading: str) -> str:
    """The text under `heading` (a whole `##`/`###` line) up to the next heading of its
    level or above outside fenced code (the code is kept: examples are in it)."""
    lines = page.read_text(encoding="utf-8").splitlines()
    level = len(heading) - len(heading.lstrip("#"))
    start = lines.index(heading) + 1
    fenced = False
    for end in range(start, len(lines)):
        if lines[end].startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(rf"#{{1,{level}}} ", lines[end]):
            return "\n".join(lines[start:end])
    return "\n".join(lines[start:])


def table(text: str, first: str) -> list[list[str]]:
    """The body rows of the table whose header's first cell is `first` (`\\|` is a pipe in
    a cell)."""
    rows: list[list[str]] = []
    inside = False
    for line in text.splitlines():
        if not line.startswith("|"):
            if inside:
                break
            continue
        cells = [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if not inside:
            inside = cells[0] == first
        elif not set(cells[0]) <= {"-"}:
            rows.append(cells)
    assert rows, f"no table headed {first!r}"
    return rows


def flat(text: str) -> str:
    """The text with every run of white space one space (a sentence across lines)."""
    return " ".join(text.split())
