"""The files SQLite keeps beside a store file, and whether a path an operator typed names
one of them: never a place for a copy or a backup of the store.

SQLite writes the store's -wal and its -shm (WAL mode) or a -journal (rollback mode) next
to the store's real path. A copy written there is the store's own file to SQLite: the
store's last connection deletes its -wal on close (the copy reported made, then gone), a
daemon starting meanwhile would write its commits into the copy's pages, and a -journal
that is not a journal is replayed or removed by the next open. docs/operations.md
"Backups", "Moving to PostgreSQL".
"""

from __future__ import annotations

import os
from pathlib import Path

from ledger.stores.file_access import WAL_FILES

#: SQLite's files beside a store: WAL mode's log and shared memory, rollback mode's journal.
COMPANION_SUFFIXES = (*WAL_FILES, "-journal")


def companion_of(store: Path, path: Path) -> str | None:
    """The suffix of `store`'s companion file that `path` names, whatever its spelling
    (relative, `..`, a symlinked folder, the store reached through a symlink, its folder
    mounted a second time), or None.

    SQLite names the companions after the store's real path: `path` names one when its
    folder is the store's real folder (the same folder on disk, not only the same path:
    a bind mount has no link to resolve) and its name the store's with the suffix. The
    path need not exist (a backup's file is new)."""
    real_store = os.path.realpath(store)
    folder, name = os.path.split(real_store)
    # The folder resolved with the name kept, and the whole path resolved: a symlink to a
    # companion, dangling too, is one (SQLite would create its target).
    named = {os.path.join(os.path.realpath(path.parent), path.name), os.path.realpath(path)}
    for there, called in (os.path.split(candidate) for candidate in named):
        if not _same_folder(there, folder):
            continue
        for suffix in COMPANION_SUFFIXES:
            if called == f"{name}{suffix}":
                return suffix
    return None


def _same_folder(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:  # one is not there: then only its path can be the other's
        return a == b


__all__ = ["COMPANION_SUFFIXES", "companion_of"]
