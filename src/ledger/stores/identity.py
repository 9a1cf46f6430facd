"""The daemon identity lock: one live daemon per `daemon.name` and store.

A daemon recovers its own earlier claims at start-up without waiting for their deadline
(docs/architecture.md, invariant 6), which is only safe when no other live process
claims under the same name. Each backend holds a lock that the operating system or the
server drops when the holder dies, so a kill -9 never leaves a name locked:

- SQLite: an exclusive `flock` on a file beside the store (released with the process's
  open files);
- PostgreSQL: a session advisory lock on a connection of its own (released when the
  server sees the connection close; TCP keepalives notice a vanished host). A database
  restart drops it under a live daemon: `check`, before every tick, takes it again;
- memory: a set of names in the process.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import threading
from pathlib import Path
from typing import Protocol


class IdentityTaken(Exception):
    """Another live daemon holds this name on this store."""

    def __init__(self, name: str, where: str) -> None:
        super().__init__(
            f"daemon.name {name!r} is held by another running daemon on {where}: "
            "stop it, or give this daemon another name"
        )
        self.name = name


class IdentityLock(Protocol):
    def check(self) -> None:
        """Raise IdentityTaken when the name is no longer this process's. A lock that
        can be dropped under a live process (a PostgreSQL session that a database restart
        ended) is taken again here."""
        ...

    def release(self) -> None: ...


def name_digest(name: str) -> str:
    """A file-name-safe stand-in for any daemon name."""
    return hashlib.sha256(name.encode("utf-8")).hexdigest()[:24]


class FileIdentityLock:
    def __init__(self, store_path: Path, name: str) -> None:
        self.path = store_path.with_name(f"{store_path.name}.daemon-{name_digest(name)}.lock")
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise IdentityTaken(name, str(store_path)) from None
        # For an operator who wonders who holds it; the lock itself is the flock.
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()} {name}\n".encode())
        self._fd: int | None = fd

    def check(self) -> None:
        """An flock lives as long as the open file: nothing can drop it under us."""

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)  # closing drops the flock
            self._fd = None


_memory_names: set[tuple[str, str]] = set()
_memory_lock = threading.Lock()


class MemoryIdentityLock:
    def __init__(self, store: str, name: str) -> None:
        with _memory_lock:
            if (store, name) in _memory_names:
                raise IdentityTaken(name, store)
            _memory_names.add((store, name))
        self._held: tuple[str, str] | None = (store, name)

    def check(self) -> None:
        """Held until released: nothing else removes a name from the set."""

    def release(self) -> None:
        with _memory_lock:
            if self._held is not None:
                _memory_names.discard(self._held)
                self._held = None


__all__ = [
    "FileIdentityLock",
    "IdentityLock",
    "IdentityTaken",
    "MemoryIdentityLock",
    "name_digest",
]
