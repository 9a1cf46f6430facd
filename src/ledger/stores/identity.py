"""The daemon identity lock: one live daemon per `daemon.name` and store.

A daemon recovers its own earlier claims at start-up without waiting for their deadline
(docs/architecture.md, invariant 6), which is only safe when no other live process
claims under the same name: where the lock can end under a live holder
(`ends_only_with_holder` false: PostgreSQL), only those past their deadline. Each backend
holds a lock that the operating system or the server drops when the holder dies, so a
kill -9 never leaves a name locked:

- SQLite: an exclusive lock on a byte of the store file itself, so that every path to
  the file (a symlink, a hard link) meets it, and `flock`s on files beside it (released
  with the process's open files): `FileIdentityLock`;
- PostgreSQL: a session advisory lock on a connection of its own (released when the
  server sees the connection close; TCP keepalives on both sides notice a vanished
  host). A database restart drops it under a live daemon: `check`, before every tick,
  takes it again, and ends the daemon's own earlier session if the server still keeps
  it (a silent network);
- memory: a set of names in the process.

Whether a name is held is asked without taking it (`file_names_held`,
`memory_names_held`; PostgreSQL's `pg_locks`, `ledger.stores.loaded_policies`): a daemon's
loaded-policy row counts only while its name is held, so one killed -9 stops counting as
soon as its lock is gone, and the question never makes a daemon starting meanwhile exit 3.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import glob
import hashlib
import os
import struct
import sys
import threading
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ledger.exceptions import Refusal, SendledgerError


class IdentityTaken(SendledgerError):
    """Another live daemon (`by`: or another `sendledger api`) holds this name on this
    store."""

    kind = Refusal.CONFLICT

    def __init__(self, name: str, where: str, *, by: str = "daemon") -> None:
        super().__init__(
            f"daemon.name {name!r} is held by another running {by} on {where}: "
            f"stop it, or give this {by} another name"
        )
        self.name = name
        self.where = where


#: What `sendledger api` holds in place of its `daemon.name`: the name behind a tab, which
#: no daemon name holds (it is printable), so that a daemon and an API server of one config
#: run side by side while a second API server of the name is refused (docs/configuration.md
#: "Daemon names").
API_LOCK_PREFIX = "api\t"


def api_lock_name(name: str) -> str:
    return API_LOCK_PREFIX + name


@dataclass(frozen=True)
class NameSession:
    """The database session that holds a name's lock (PostgreSQL): a write conditioned on
    it (`ScopeLeaseStore.renew`'s `held_by`) is made only while that session still holds
    the name, so that a name taken between a check and the write gets nothing written
    under it by the process that lost it."""

    key: int  # `advisory_key`
    pid: int  # the server's process of the session; 0: none holds it for this process
    #: When that session began (`pg_stat_activity.backend_start`): a server restarted in
    #: a fresh container gives its pids out again, in the same order; None: not known.
    started: Any = None


class IdentityLock(Protocol):
    #: True: the lock ends only with its holder (released, or its process gone), so a
    #: claim under the name found by the next holder has no call in flight. False: it can
    #: end under a live holder (a PostgreSQL session a database restart ended), which may
    #: still be finishing a call when another process takes the name.
    ends_only_with_holder: bool

    def check(self) -> None:
        """Raise IdentityTaken when the name is no longer this process's. A lock that
        can be dropped under a live process (a PostgreSQL session that a database restart
        ended) is taken again here."""
        ...

    def session(self) -> NameSession | None:
        """The session holding the name now, for writes that must be made only while it
        does; None where the lock ends only with this process (nothing to condition)."""
        ...

    def release(self) -> None: ...


def name_digest(name: str) -> str:
    """A file-name-safe stand-in for any daemon name."""
    return hashlib.sha256(name.encode("utf-8")).hexdigest()[:24]


class FileIdentityLock:
    """`name` held on a SQLite store, whichever path reaches the file.

    The lock that counts is keyed on the file itself (its device and inode): an open
    file description lock (Linux `F_OFD_SETLK`) on one byte of the store file, far
    beyond any byte SQLite locks, at an offset derived from the name. A symlink or a hard
    link reaches the same inode, so a second daemon of the same name through one is
    refused like one on the same path. Unlike a POSIX record lock it is not dropped when
    SQLite closes another descriptor of the file in this process, and it conflicts
    between descriptors of one process too. Beside it, `flock`s on
    `STORE.daemon-<hash>.lock` next to the configured and the real path: what earlier
    releases lock (a daemon of one meets this one's lock), the holder's pid for an
    operator, and the only lock where OFD locks do not exist."""

    ends_only_with_holder = True

    def __init__(self, store_path: Path, name: str) -> None:
        where = str(store_path)
        self._fds: list[int] = []
        try:
            if _OFD_LOCKS:
                inode_fd = _lock_inode(store_path, name, where)
                if inode_fd is not None:
                    self._fds.append(inode_fd)
            real = Path(os.path.realpath(store_path))
            locked: set[tuple[int, int]] = set()
            for path in dict.fromkeys([store_path, real]):
                fd = _lock_beside(path, name, where, locked)
                if fd is not None:
                    self._fds.append(fd)
        except BaseException:
            self.release()
            raise
        self.path = _lock_file(store_path, name)

    def check(self) -> None:
        """These locks live as long as their open files: nothing can drop them under us."""

    def session(self) -> NameSession | None:
        return None

    def release(self) -> None:
        while self._fds:
            with contextlib.suppress(OSError):
                os.close(self._fds.pop())  # closing drops the lock


_OFD_LOCKS = hasattr(fcntl, "F_OFD_SETLK") and sys.platform == "linux"
#: Where the names' bytes start: far past the largest SQLite file and the bytes SQLite
#: locks (at 1 GiB), inside a signed 64-bit offset.
_NAME_BYTES = 1 << 62


def _lock_file(store_path: Path, name: str) -> Path:
    return store_path.with_name(f"{store_path.name}.daemon-{name_digest(name)}.lock")


def lock_files(store_path: Path) -> list[Path]:
    """The daemon names' lock files beside the SQLite store at `store_path`, whoever made
    them (a daemon run once as another user leaves its own)."""
    return sorted(store_path.parent.glob(f"{glob.escape(store_path.name)}.daemon-*.lock"))


def _lock_beside(
    store_path: Path, name: str, where: str, locked: set[tuple[int, int]]
) -> int | None:
    """The lock file beside `store_path` locked, its descriptor; None when it is one of
    `locked` (its device and inode) already: a store whose folder is reached by a
    symbolic link has one lock file by both paths, and a second `flock` of it from this
    process conflicted with the first, so the name was refused to its only daemon."""
    fd = os.open(_lock_file(store_path, name), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    stat = os.fstat(fd)
    if (stat.st_dev, stat.st_ino) in locked:
        os.close(fd)  # the lock taken by the other path stays: a flock is not a POSIX lock
        return None
    locked.add((stat.st_dev, stat.st_ino))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        # For an operator who wonders who holds it.
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()} {name}\n".encode())
    except BlockingIOError:
        os.close(fd)
        raise IdentityTaken(name, where) from None
    except BaseException:
        os.close(fd)
        raise
    return fd


#: A file system without record locks (some network and FUSE ones): the flocks remain.
_NO_RECORD_LOCKS = frozenset({errno.EINVAL, errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS})


#: struct flock: l_type, l_whence, l_start, l_len, l_pid (0 for OFD locks).
_FLOCK = "@hhqqi"


def _name_byte(name: str) -> bytes:
    """The `struct flock` of an exclusive lock on the store file's byte for `name`,
    padded to the C struct's size."""
    offset = _NAME_BYTES + int(name_digest(name)[:12], 16)
    request = struct.pack(_FLOCK, fcntl.F_WRLCK, os.SEEK_SET, offset, 1, 0)
    return request + bytes(32 - len(request))


def _lock_inode(store_path: Path, name: str, where: str) -> int | None:
    """An exclusive OFD lock on the store file's byte for `name`; its descriptor, or
    None where the file system has no record locks."""
    request = _name_byte(name)
    # Opened for writing, which an exclusive record lock needs; nothing is written.
    fd = os.open(store_path, os.O_RDWR | os.O_CLOEXEC)
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, request)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EAGAIN, errno.EACCES):
            raise IdentityTaken(name, where) from None
        if exc.errno in _NO_RECORD_LOCKS:
            return None
        raise
    return fd


def names_held(store_path: Path) -> bool:
    """Whether a live process holds a daemon name on the SQLite store at `store_path`,
    whichever name: asked without taking one (`admin copy-store` refuses a store a
    daemon writes to). The names' bytes of the store file are tested for a lock
    (F_OFD_GETLK over all of them), then the `flock`s beside it, each tried shared and
    let go at once. A file system without record locks answers by the flocks alone. The
    store file is asked through the descriptor kept for asking (`_asking`), never one
    opened and closed here: that would drop this process's own SQLite locks on it."""
    fd = _asking_descriptor(store_path) if _OFD_LOCKS else None
    if fd is not None:
        request = struct.pack("@hhqqi", fcntl.F_WRLCK, os.SEEK_SET, _NAME_BYTES, 1 << 48, 0)
        request += bytes(32 - len(request))
        try:
            answer = fcntl.fcntl(fd, fcntl.F_OFD_GETLK, request)
        except OSError as exc:
            if exc.errno not in _NO_RECORD_LOCKS:
                raise
        else:
            if struct.unpack_from("@h", answer)[0] != fcntl.F_UNLCK:
                return True
    for path in lock_files(store_path):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)  # the shared lock, if taken, goes with it
    return False


def file_names_held(store_path: Path, names: Collection[str]) -> set[str] | None:
    """Which of `names` a live process holds on the SQLite store at `store_path`, asked
    with F_OFD_GETLK, which takes no lock. None where it cannot be told: no OFD locks
    here, a file system without record locks (the `flock`s beside the file cannot be
    asked without being taken), a file this process cannot open."""
    if not _OFD_LOCKS:
        return None
    fd = _asking_descriptor(store_path)
    if fd is None:
        return None
    held: set[str] = set()
    try:
        for name in names:
            answer = fcntl.fcntl(fd, fcntl.F_OFD_GETLK, _name_byte(name))
            if struct.unpack_from(_FLOCK, answer)[0] != fcntl.F_UNLCK:
                held.add(name)
    except OSError as exc:
        if exc.errno in _NO_RECORD_LOCKS:
            return None
        raise
    return held


#: A descriptor of each store file asked about, by (device, inode), open until the
#: process ends: closing any descriptor of a file drops every POSIX record lock the
#: process holds on it, SQLite's included. Closed after each question, it dropped the
#: shared lock of the daemon's connections (asked at each `POST /v1/jobs`), and another
#: process's checkpoint then cut the WAL from under them: "disk I/O error".
_asking: dict[tuple[int, int], int] = {}
_asking_lock = threading.Lock()


def _asking_descriptor(store_path: Path) -> int | None:
    try:
        stat = os.stat(store_path)
    except OSError:
        return None
    key = (stat.st_dev, stat.st_ino)
    with _asking_lock:
        fd = _asking.get(key)
        if fd is None:
            try:
                fd = os.open(store_path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                return None
            _asking[key] = fd
        return fd


_memory_names: set[tuple[str, str]] = set()
_memory_lock = threading.Lock()


class MemoryIdentityLock:
    ends_only_with_holder = True

    def __init__(self, store: str, name: str) -> None:
        with _memory_lock:
            if (store, name) in _memory_names:
                raise IdentityTaken(name, store)
            _memory_names.add((store, name))
        self._held: tuple[str, str] | None = (store, name)

    def check(self) -> None:
        """Held until released: nothing else removes a name from the set."""

    def session(self) -> NameSession | None:
        return None

    def release(self) -> None:
        with _memory_lock:
            if self._held is not None:
                _memory_names.discard(self._held)
                self._held = None


def memory_names_held(store: str, names: Collection[str]) -> set[str]:
    """Which of `names` a `MemoryIdentityLock` holds on the memory store `store`."""
    with _memory_lock:
        return {name for name in names if (store, name) in _memory_names}


def advisory_key(schema: str, name: str) -> int:
    """The PostgreSQL advisory lock key of `name` in `schema` (`AdvisoryIdentityLock`;
    `ledger.stores.loaded_policies` computes the same in SQL to find it in `pg_locks`)."""
    digest = hashlib.sha256(f"{ADVISORY_PREFIX}{schema}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


ADVISORY_PREFIX = "sendledger:"


def pg_session_holds(session: NameSession | None) -> tuple[str, list[Any]]:
    """PostgreSQL: the condition (and its parameters) a write asks itself in the server's
    lock table: `session` still holds the name's advisory lock (classid, objid: the key's
    high and low 32 bits), so no other process has taken the name since the caller's
    check; and that session, not a later one given the same pid (a server restarted in a
    fresh container). Nothing when `session` is None."""
    if session is None:
        return "", []
    return (
        " AND EXISTS (SELECT 1 FROM pg_locks l WHERE l.locktype = 'advisory' AND "
        "l.granted AND l.objsubid = 1 AND l.pid = %s AND l.database = (SELECT oid FROM "
        "pg_database WHERE datname = current_database()) AND "
        "((l.classid::int8 << 32) | l.objid::int8) = %s AND EXISTS (SELECT 1 FROM "
        "pg_stat_activity a WHERE a.pid = l.pid AND a.backend_start = %s))",
        [session.pid, session.key, session.started],
    )


__all__ = [
    "ADVISORY_PREFIX",
    "API_LOCK_PREFIX",
    "FileIdentityLock",
    "IdentityLock",
    "IdentityTaken",
    "MemoryIdentityLock",
    "NameSession",
    "advisory_key",
    "api_lock_name",
    "file_names_held",
    "memory_names_held",
    "name_digest",
    "names_held",
    "pg_session_holds",
]
