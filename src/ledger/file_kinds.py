"""What a file that is not a regular one is, in an operator's words: what sendledger reads
(its config, policy and secret files) or keeps its store in must be a regular file, and
`open()` of a named pipe waits for a writer that may never come (docs/configuration.md
"Bounds, URLs, addresses and files")."""

from __future__ import annotations

import stat

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def file_kind(mode: int) -> str | None:
    """What a non-regular file of `mode` (`os.stat`'s) is, or None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    return next((kind for test, kind in _KINDS if test(mode)), "not a regular file")


__all__ = ["file_kind"]
