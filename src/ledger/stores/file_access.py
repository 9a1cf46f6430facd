"""Why this process may not use a SQLite store's files, in an operator's words: a folder
on the way it may not enter, the file it may not read or write, SQLite's -wal and -shm
files beside it, or the folder they are made in (docs/cli.md "Exit codes").

Asked only once SQLite or the file system refused something (`causes.access_denied`),
with this process's effective user and groups, as the refusal was: a daemon running as a
service user on a store root made is told which file's or folder's mode to fix, not
"attempt to write a readonly database" or "unable to open database file"."""

from __future__ import annotations

import os
import pwd
from pathlib import Path

#: SQLite's files beside a store in WAL mode, made by the first process that opens it.
WAL_FILES = ("-wal", "-shm")


def _may(path: Path, mode: int) -> bool:
    if os.access in os.supports_effective_ids:
        return os.access(path, mode, effective_ids=True)
    return os.access(path, mode)


def _user() -> str:
    uid = os.geteuid()
    try:
        return f"user {pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:  # a uid with no name (a container's)
        return f"uid {uid}"


def access_problem(path: Path) -> str | None:
    """`permission denied: USER may not ...` naming the first file or folder whose mode
    keeps this process from reading and writing the store at `path`; None when none
    does (the refusal had another cause: a file SQLite itself treats as read-only)."""
    denied = f"permission denied: {_user()} may"
    for folder in reversed(path.parents):  # from the root down to the store's folder
        if not os.path.isdir(folder):  # to be made: its parent must take it
            if not _may(folder.parent, os.W_OK | os.X_OK):
                return f"{denied} not create files in {folder.parent}"
            return None
        if not _may(folder, os.X_OK):
            return f"{denied} not enter {folder}"
    folder = path.parent
    if not os.path.exists(path):
        if not _may(folder, os.W_OK | os.X_OK):
            return f"{denied} not create files in {folder}"
        return None
    if not _may(path, os.R_OK):
        return f"{denied} not read {path}"
    if not _may(path, os.W_OK):
        return f"{denied} read but not write {path}"
    for suffix in WAL_FILES:
        beside = Path(f"{path}{suffix}")
        if os.path.exists(beside) and not _may(beside, os.R_OK | os.W_OK):
            return f"{denied} not write {beside}, SQLite's {suffix[1:]} file beside the store"
    if not _may(folder, os.W_OK | os.X_OK):
        return f"{denied} not create files in {folder}, where SQLite makes the -wal and -shm"
    return None


__all__ = ["WAL_FILES", "access_problem"]
