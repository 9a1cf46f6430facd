"""Reading a docs/ page the way its test compares it with the code (docs/development.md
"Writing the docs"): a section's text by its heading, a Markdown table's rows, prose with
its line breaks folded, and the code spans in a piece of text. Headings inside fenced code
(a shell comment) are code, not headings; the code itself is kept, examples are in it."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
CODE = re.compile(r"`([^`]+)`")


def _under(lines: list[str], start: int, level: int) -> str:
    """The lines from `start` up to the next heading of `level` or above, outside fences."""
    fenced = False
    for end in range(start, len(lines)):
        if lines[end].startswith(("```", "~~~")):
            fenced = not fenced
        elif not fenced and re.match(rf"#{{1,{level}}} ", lines[end]):
            return "\n".join(lines[start:end])
    return "\n".join(lines[start:])


def section(page: Path, heading: str, *, until: int | None = None) -> str:
    """The text under `heading` up to the next heading of level `until` or above (by
    default the heading's own level; 6: the next heading of any level). `heading` is a
    whole heading line (`## Stores`) or a bare title, found at any level."""
    lines = page.read_text(encoding="utf-8").splitlines()
    if heading.startswith("#"):
        start = lines.index(heading)
    else:
        start = next(
            i for i, line in enumerate(lines) if re.fullmatch(rf"#+ {re.escape(heading)}", line)
        )
    level = len(lines[start]) - len(lines[start].lstrip("#"))
    return _under(lines, start + 1, until or level)


class DocsPage:
    def __init__(self, name: str) -> None:
        self.text = (DOCS / name).read_text(encoding="utf-8")

    def section(self, title: str) -> str:
        """The text under the `##`/`###` heading `title`, up to the next heading of level
        three or above (a `####` stays inside)."""
        lines = self.text.splitlines()
        starts = [i for i, line in enumerate(lines) if line in (f"## {title}", f"### {title}")]
        assert starts, f"no section {title!r} on the page"
        return _under(lines, starts[0] + 1, 3)


def table(text: str, first: str | None = None) -> list[list[str]]:
    """The body rows of the table whose header's first cell is `first` (the first table
    when None), as stripped cells (`\\|` is a pipe in a cell)."""
    rows: list[list[str]] = []
    inside = header = False
    for line in text.splitlines():
        if not line.startswith("|"):
            if inside:
                break
            continue
        cells = [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if not inside:
            inside = first is None or cells[0] == first
            if not inside:
                continue
            header = True
        elif header and set(cells[0]) <= set("-: "):
            header = False
        else:
            rows.append(cells)
    assert rows, f"no table headed {first!r}"
    return rows


def flat(text: str) -> str:
    """Prose with every run of white space one space (a sentence across lines)."""
    return " ".join(text.split())
