"""Why this process may not use a SQLite store's files, in an operator's words: a folder
on the way it may not enter, the file it may not read or write, SQLite's -wal and -shm
files beside it, a daemon name's lock file, or the folder they are made in (docs/cli.md
"Exit codes"); and the one
such cause an open repairs itself, a -wal or -shm of this user's that a read-only open
left without write permission (`repair_wal_modes`, docs/operations.md "Opening the store").

Asked only once SQLite or the file system refused something (`causes.access_denied`),
with this process's effective user and groups, as the refusal was: a daemon running as a
service user on a store root made is told which file's or folder's mode to fix, not
"attempt to write a readonly database" or "unable to open database file"."""

from __future__ import annotations

import os
import pwd
import stat
from pathlib import Path

from ledger.stores.identity import lock_files

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


def wal_files(path: Path) -> list[tuple[str, Path]]:
    """Each of SQLite's files beside the store at `path`, with its suffix: beside the
    file's real path, where SQLite makes them (it resolves symlinks)."""
    real = os.path.realpath(path)
    return [(suffix, Path(f"{real}{suffix}")) for suffix in WAL_FILES]


def repair_wal_modes(path: Path) -> list[tuple[Path, int, int]]:
    """Give the store's -wal and -shm files the store file's mode when this user may write
    the store file but not one of them, and owns it; each file changed, with its mode
    before and after.

    SQLite makes them with the store file's mode: a read while the file was 0400 leaves a
    0400 -shm, which kept every write failing once the file was writable again. A file of
    another user's is left as it is (`access_problem` names it): its mode is its owner's
    to change, root's capabilities notwithstanding."""
    try:
        store_mode = stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        return []  # no store yet, or one this user may not reach: access_problem says
    if not _may(path, os.R_OK | os.W_OK):
        return []
    changed = []
    for _suffix, beside in wal_files(path):
        try:
            found = os.lstat(beside)
        except OSError:
            continue  # none: SQLite makes it with the store file's mode
        mine = found.st_uid == os.geteuid() and stat.S_ISREG(found.st_mode)
        if not mine or _may(beside, os.R_OK | os.W_OK):
            continue
        try:
            os.chmod(beside, store_mode)
        except OSError:
            continue  # a read-only file system, say: access_problem names the file
        changed.append((beside, stat.S_IMODE(found.st_mode), store_mode))
    return changed


def _mounted_read_only(path: Path) -> bool:
    """True when `path` (not made yet: the nearest folder above it) is on a file system
    mounted read-only, where `os.access` refuses writing whatever the modes say."""
    for candidate in (path, *path.parents):
        try:
            return bool(os.statvfs(candidate).f_flag & os.ST_RDONLY)
        except OSError:
            continue
    return False


def _read_only_mount(folder: Path) -> str:
    return (
        f"read-only file system: {folder} is on a file system mounted read-only (a "
        "snapshot, a read-only mount, or a systemd unit's ProtectSystem= without the folder "
        "in ReadWritePaths=): no mode change helps"
    )


def access_problem(path: Path) -> str | None:
    """`permission denied: USER may not ...` naming the first file or folder whose mode
    keeps this process from reading and writing the store at `path`, or `read-only file
    system: ...` where a read-only mount keeps it from writing (its modes are right);
    None when none does (the refusal had another cause: a file SQLite itself treats as
    read-only)."""
    denied = f"permission denied: {_user()} may"
    for folder in reversed(path.parents):  # from the root down to the store's folder
        if not os.path.isdir(folder):  # to be made: its parent must take it
            if not _may(folder.parent, os.W_OK | os.X_OK):
                return f"{denied} not create files in {folder.parent}"
            return None
        if not _may(folder, os.X_OK):
            return f"{denied} not enter {folder}"
    folder = path.parent
    # A store path may be a symlink to another disk: the mount is the target's.
    real = Path(os.path.realpath(path))
    if not os.path.exists(path):
        if _mounted_read_only(real.parent):
            return _read_only_mount(real.parent)
        if not _may(folder, os.W_OK | os.X_OK):
            return f"{denied} not create files in {folder}"
        return None
    if not _may(path, os.R_OK):
        return f"{denied} not read {path}"
    if _mounted_read_only(real):
        return _read_only_mount(real.parent)
    if not _may(path, os.W_OK):
        return f"{denied} read but not write {path}"
    for suffix, beside in wal_files(path):
        if os.path.exists(beside) and not _may(beside, os.R_OK | os.W_OK):
            return f"{denied} not write {beside}, SQLite's {suffix[1:]} file beside the store"
    if not _may(folder, os.W_OK | os.X_OK):
        return f"{denied} not create files in {folder}, where SQLite makes the -wal and -shm"
    # After the folder: every store a daemon ran on keeps the daemon user's lock beside
    # it, which another user's command refused for the folder must not be told to chown.
    for lock in dict.fromkeys([*lock_files(path), *lock_files(real)]):
        if not _may(lock, os.R_OK | os.W_OK):
            # Left by a daemon of that name run as another user (root, once, by hand).
            return (
                f"{denied} not write {lock}, the lock of a daemon.name beside the store "
                "(made by another user: chown it to this one)"
            )
    return None


__all__ = ["WAL_FILES", "access_problem", "repair_wal_modes", "wal_files"]
