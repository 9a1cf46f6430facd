"""Reading the operator's small files (policy files, and the daemon's secret files) without
ever blocking: what is read must be a regular file (docs/configuration.md "Bounds, URLs, addresses
and files").

`open()` on a FIFO waits for a writer that may never come, so a secret file or a policy
replaced by a named pipe once hung the command; a directory, a socket, a device or a
symbolic link to nothing is refused the same way, with a reason that says which it is.
The type is checked before the file is opened (`os.stat` follows symbolic links: a linked
secret, as a container mounts one, is read), the file is opened non-blocking, and the
type is checked again on what was opened, so a swap in between blocks nothing either.
"""

from __future__ import annotations

import os
from pathlib import Path

from ledger.exceptions import Refusal, SendledgerError
from ledger.file_kinds import file_kind

__all__ = [
    "BYTE_ORDER_MARK",
    "FileMissing",
    "FileProblem",
    "read_regular_file",
    "starts_with_a_mark",
]

#: What a file that starts with U+FEFF (a Windows editor's byte order mark) is told: the
#: mark is invisible, and the parser's own words point at line 1, column 1, which looks
#: right.
BYTE_ORDER_MARK = "starts with a byte order mark: save it as UTF-8 without one"


def starts_with_a_mark(text: str) -> bool:
    return text.startswith("\ufeff")


class FileProblem(SendledgerError, ValueError):
    """Why a file cannot be read as a regular file: one line that names it (`reason`
    says why, without the path)."""

    kind = Refusal.BAD_INPUT

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"cannot read {path}: {reason}")
        self.reason = reason


class FileMissing(FileProblem):
    """Nothing is at the path, or a symbolic link there leads to nothing: unlike a file
    of the wrong kind, one that may be put there later (a secret mounted after the
    daemon's start, docs/cli.md "Exit codes")."""


def read_regular_file(path: Path, *, limit: int) -> bytes:
    """The bytes of the regular file at `path` (at most `limit` of them). FileProblem
    for anything else: missing, a dangling symbolic link, a FIFO, a directory, ..."""
    try:
        kind = file_kind(os.stat(path).st_mode)
    except FileNotFoundError:
        if os.path.islink(path):
            raise FileMissing(path, f"a symbolic link to nothing ({os.readlink(path)})") from None
        raise FileMissing(path, "No such file or directory") from None
    except OSError as exc:
        raise FileProblem(path, f"{exc.strerror or exc}") from None
    if kind is not None:
        raise FileProblem(path, f"{kind}, not a regular file")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as exc:
        raise FileProblem(path, f"{exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)
        kind = file_kind(info.st_mode)
        if kind is not None:
            raise FileProblem(path, f"{kind}, not a regular file")
        if info.st_size > limit:
            raise FileProblem(path, f"larger than {limit} bytes")
        chunks: list[bytes] = []
        size = 0
        while size <= limit:
            chunk = os.read(fd, limit + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise FileProblem(path, f"larger than {limit} bytes")
        return b"".join(chunks)
    except OSError as exc:
        raise FileProblem(path, f"{exc.strerror or exc}") from None
    finally:
        os.close(fd)
