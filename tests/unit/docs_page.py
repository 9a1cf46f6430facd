"""Reading the docs the way the docs tests compare them with the code (docs/development.md
"Writing the docs"): a page, a section, a table as rows, a fenced block, code spans, the
lines outside fenced code, and whether a test or bench path a page names is there."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src"
DOCS = REPO / "docs"
PAGES = [REPO / "README.md", *sorted(DOCS.glob("*.md"))]
CODE = re.compile(r"`([^`\n]+)`")
FENCE = re.compile(r"^\s*(```|~~~)")
SOURCE_PATH = re.compile(
    r"(?<![\w/.])(?:src/)?((?:daemon|ledger|policies|testkit|sendledger)/[\w/]+\.py)"
)
REPO_PATH = re.compile(r"(?<![\w/.])((?:tests|bench)/[\w/]+\.py)(?:::(\w+))?")


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks."""
    lines, fenced = [], False
    for line in text.splitlines():
        fenced ^= bool(FENCE.match(line))
        if not fenced and not FENCE.match(line):
            lines.append(line)
    return lines


def page(name: str) -> str:
    """A page by its name (`cli.md`, `README.md`), or any file by its path in the repository."""
    return (DOCS / name if (DOCS / name).is_file() else REPO / name).read_text(encoding="utf-8")


def section(name: str, heading: str, *, until: int | None = None) -> str:
    """The text under `heading` (a whole line, `## Stores`, or a bare title at any level)
    up to the next heading of level `until` or above (by default its own level)."""
    lines = page(name).splitlines()
    title = re.escape(heading) if heading.startswith("#") else rf"#+ {re.escape(heading)}"
    start = next((i for i, line in enumerate(lines) if re.fullmatch(title, line)), None)
    assert start is not None, f"no section {heading!r}"
    level, fenced = until or len(lines[start]) - len(lines[start].lstrip("#")), False
    for end in range(start + 1, len(lines)):
        fenced ^= bool(FENCE.match(lines[end]))
        if not fenced and re.match(rf"#{{1,{level}}} ", lines[end]):
            return "\n".join(lines[start + 1 : end])
    return "\n".join(lines[start + 1 :])


def block(text: str, lang: str = "") -> str:
    """The first fenced block of `lang` in a text."""
    return text.split(f"```{lang}\n", 1)[1].split("```", 1)[0]


def table(text: str, first: str | None = None) -> list[list[str]]:
    """The body rows of the table whose header's first cell is `first`, or whose header
    starts with `first` when it holds ` | ` (the first table when None), as stripped cells
    (`\\|` is a pipe in a cell)."""
    rows: list[list[str]] = []
    inside = False
    for line in [*text.splitlines(), ""]:
        if not line.startswith("|"):
            if inside:
                break
            continue
        cells = [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if not inside:
            inside = first is None or first in (cells[0], " | ".join(cells)[: len(first)])
        elif not set(cells[0]) <= set("-: ") or rows:
            rows.append(cells)
    assert rows, f"no table headed {first!r}"
    return rows


def keyed(text: str, first: str | None = None) -> dict[str, list[str]]:
    """A table's rows by their first cell, its code (`x`) when it is one."""
    return {(CODE.findall(row[0]) or [row[0]])[0]: row[1:] for row in table(text, first)}


def flat(text: str) -> str:
    """Prose with every run of white space one space (a sentence across lines)."""
    return " ".join(text.split())


def missing_paths(text: str) -> list[str]:
    """Named source paths (`src/`-relative), test and bench paths (a test's `::name` too)
    that are not there."""
    gone = [p for p in SOURCE_PATH.findall(text) if not (REPO / "src" / p).exists()]
    for path, name in REPO_PATH.findall(text):
        if not (REPO / path).is_file():
            gone.append(path)
        elif name and not re.search(rf"^\s*(async )?(def|class) {name}\b", page(path), re.M):
            gone.append(f"{path}::{name}")
    return gone
