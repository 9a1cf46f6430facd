"""Reading one docs/ page the way its test compares it with the code (docs/development.md
"Writing the docs"): a section's text by its heading, a Markdown table's rows, prose with
its line breaks folded, and the code spans in a piece of text."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CODE = re.compile(r"`([^`]+)`")


class DocsPage:
    def __init__(self, name: str) -> None:
        self.text = (REPO / "docs" / name).read_text(encoding="utf-8")

    def section(self, title: str) -> str:
        """The text under the `##`/`###` heading `title`, up to the next heading."""
        match = re.search(
            rf"^#{{2,3}} {re.escape(title)}\n(.*?)(?=^#{{1,3}} |\Z)", self.text, re.M | re.S
        )
        assert match, f"no section {title!r} on the page"
        return match.group(1)


def table(text: str) -> list[list[str]]:
    """The body rows of the first Markdown table in `text`, as stripped cells."""
    rows = [line for line in text.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows[2:]]


def flat(text: str) -> str:
    """Prose with its line breaks and runs of spaces folded to one space."""
    return " ".join(text.split())
