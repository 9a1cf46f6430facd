"""Reading the small text files that hold secrets: a password, API tokens, store keys.

One place decides what "cannot be read" means for all of them, so every such setting
reports a missing, unreadable or non-UTF-8 file the same way.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path


def read_secret_text(path: Path) -> str:
    """The file's text. ValueError with a one-line reason when it cannot be read."""
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not UTF-8 text") from None


def content_lines(text: str) -> Iterator[tuple[int, str]]:
    """(line number, stripped line) of every line that is neither blank nor a # comment."""
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if line and not line.startswith("#"):
            yield number, line
