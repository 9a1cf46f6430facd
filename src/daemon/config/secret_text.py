"""Reading the small text files that hold secrets: a password, API tokens, store keys.

One place decides what "cannot be read" means for all of them, so every such setting
reports a missing, unreadable or non-UTF-8 file the same way; and each must be a regular
file of at most :data:`MAX_SECRET_BYTES` (a FIFO does not hang the command, a directory
or a symbolic link to nothing is named as such: `policies.files`).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from policies.files import read_regular_file

#: Secret files are small (a key, a password, a service-account JSON, a token list).
MAX_SECRET_BYTES = 1024 * 1024


def read_secret_text(path: Path) -> str:
    """The file's text. ValueError with a one-line reason when it cannot be read."""
    data = read_regular_file(path, limit=MAX_SECRET_BYTES)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not UTF-8 text") from None
    if text.startswith("\ufeff"):
        # A Windows editor's mark, read as the first character of the password, token or
        # key: each would then fail where it is used (Azure, the server, a receiver
        # checking a signature) naming no file.
        raise ValueError(f"{path}: starts with a byte order mark: save it as UTF-8 without one")
    return text


def content_lines(text: str) -> Iterator[tuple[int, str]]:
    """(line number, stripped line) of every line that is neither blank nor a # comment."""
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if line and not line.startswith("#"):
            yield number, line
