"""`sendledger admin backup FILE`: a consistent copy of a SQLite store taken while the
daemon runs, by SQLite's online backup API (docs/operations.md "Backups").

The copy is made in one step, inside one read transaction of the store: in WAL mode a
reader never blocks the daemon's writes, and the file holds the store as it was at one
commit, never half of a transaction (a `cp` of the file and its -wal while a daemon
writes can be either). The file is created private (0600), in a folder that exists, never
over an existing one nor as one of the store's own files beside it (its -wal, -shm or
-journal: `sqlite_companions.py`); a copy that fails or is interrupted is removed, and a
file that cannot be made or written is one line naming it, not a traceback. It is the
store's bytes: an encrypted store's backup is encrypted with the same key, and holds the
same addresses and bodies.

A PostgreSQL store has its server's own tools for this (`pg_dump`).
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ledger.exceptions import Refusal, SendledgerError
from ledger.stores.causes import store_problem
from ledger.stores.index import INDEX_TABLE
from ledger.stores.sqlite import BUSY_TIMEOUT, create_private
from ledger.stores.sqlite_companions import COMPANION_SUFFIXES, companion_of
from ledger.stores.url import SqliteStore, StoreUrlError


class BackupFailed(SendledgerError):
    """The backup could not be made (a full disk, a file size limit, an I/O error): one
    line naming the store, the file and why, exit 1; the partial file was removed."""

    kind = Refusal.UNAVAILABLE


@dataclass(frozen=True)
class BackupResult:
    store: str
    file: str
    bytes: int
    seconds: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def backup(store: SqliteStore, target: Path) -> BackupResult:
    """Copy `store` into the new file `target`; StoreUrlError (bad input) when `target`
    exists, is one of the store's files, is in no folder, or cannot be created there;
    BackupFailed when the copy cannot be written. The copy is checked (`PRAGMA
    quick_check`, the job index's table present) before it is reported."""
    started = time.monotonic()
    _create(store, target)
    try:
        with (
            contextlib.closing(sqlite3.connect(store.path, timeout=BUSY_TIMEOUT)) as source,
            contextlib.closing(sqlite3.connect(target)) as copy,
        ):
            # pages=-1: every page in one step, so one read transaction: a writer
            # committing meanwhile is not in the copy, rather than starting it over.
            source.backup(copy, pages=-1)
            # One file on its own: no -wal beside it to carry along.
            copy.execute("PRAGMA journal_mode = DELETE")
        with contextlib.closing(sqlite3.connect(target)) as copy:
            (verdict,) = copy.execute("PRAGMA quick_check").fetchone()
            found = copy.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (INDEX_TABLE,)
            ).fetchone()
        if verdict != "ok" or found is None:
            raise StoreUrlError(f"{store.describe()}: its copy is not a sound store ({verdict})")
    except BaseException as exc:
        for leftover in (target, *(Path(f"{target}{end}") for end in COMPANION_SUFFIXES)):
            with contextlib.suppress(FileNotFoundError):
                leftover.unlink()
        if isinstance(exc, (sqlite3.Error, OSError)):
            reason = store_problem(exc) or str(exc).strip().splitlines()[0]
            raise BackupFailed(
                f"backup of {store.describe()} into {target} failed ({reason}); "
                f"{target} was removed"
            ) from exc
        raise
    return BackupResult(
        store.describe(), str(target), target.stat().st_size, time.monotonic() - started
    )


def _create(store: SqliteStore, target: Path) -> None:
    """`target` made empty and private, or StoreUrlError naming it."""
    suffix = companion_of(store.path, target)
    if suffix is not None:
        raise StoreUrlError(
            f"{target} is the store's own {suffix} file, which SQLite writes and removes: "
            "a backup goes elsewhere"
        )
    # Not made here: a mistyped folder would be created, and left by a copy that failed.
    if not target.parent.is_dir():
        missing = "is not a folder" if target.parent.exists() else "does not exist"
        raise StoreUrlError(f"{target}: {target.parent} {missing}")
    # Created with O_EXCL, not looked for first: a file another process makes between a
    # look and the creation would be written over, and removed if the copy then failed.
    try:
        create_private(target, new=True)
    except FileExistsError:
        raise StoreUrlError(f"{target} exists: a backup never overwrites a file") from None
    except OSError as exc:
        raise StoreUrlError(f"{target}: cannot be created ({exc.strerror})") from None


__all__ = ["BackupFailed", "BackupResult", "backup"]
