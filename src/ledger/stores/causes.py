"""What a store error wraps: the SQLite and PostgreSQL backends judge a driver error that
eventsourcing re-raised as its own by the errors in its chain (a lock, a serialization
failure, a lock timeout), and say what keeps a store from being written in an operator's
words (`StoreUnavailable`)."""

from __future__ import annotations

from eventsourcing.persistence import IntegrityError, PersistenceError

from ledger.exceptions import Refusal, SendledgerError


def exception_chain(exc: BaseException) -> list[BaseException]:
    """`exc` and what it wraps, outermost first, as a traceback walks it: `__cause__`,
    else `__context__` unless suppressed (`raise ... from None`). eventsourcing re-raises
    driver errors as its own, `from` the original."""
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and not any(current is seen for seen in chain):
        chain.append(current)
        if current.__cause__ is not None:
            current = current.__cause__
        elif current.__suppress_context__:
            current = None
        else:
            current = current.__context__
    return chain


#: SQLite's SQLITE_READONLY (a read-only file or folder); PostgreSQL's insufficient
#: privilege and read-only transaction (a role that may only read, a hot standby).
_SQLITE_READONLY = 8
_READ_ONLY_SQLSTATES = frozenset({"42501", "25006"})


def read_only(exc: BaseException) -> bool:
    """True when `exc` (or what it wraps) says the store may be read but not written
    here, not that it is missing, busy or gone."""
    for error in exception_chain(exc):
        code = getattr(error, "sqlite_errorcode", None)
        if isinstance(code, int) and code & 0xFF == _SQLITE_READONLY:
            return True
        if getattr(error, "sqlstate", None) in _READ_ONLY_SQLSTATES:
            return True
    return False


#: SQLite's SQLITE_FULL (the disk, or the file's page limit); PostgreSQL's disk_full.
_SQLITE_FULL = 13
_FULL_SQLSTATES = frozenset({"53100"})
#: SQLite's SQLITE_BUSY and SQLITE_LOCKED; PostgreSQL's lock_not_available (lock_timeout).
_SQLITE_LOCKS = frozenset({5, 6})
_LOCK_SQLSTATES = frozenset({"55P03"})


def _full(exc: BaseException) -> bool:
    for error in exception_chain(exc):
        code = getattr(error, "sqlite_errorcode", None)
        if isinstance(code, int) and code & 0xFF == _SQLITE_FULL:
            return True
        if getattr(error, "sqlstate", None) in _FULL_SQLSTATES:
            return True
    return False


def locked(exc: BaseException) -> bool:
    """True when `exc` (or what it wraps) is a wait for a lock that ran out: SQLite's
    busy or locked, PostgreSQL's lock_timeout."""
    for error in exception_chain(exc):
        code = getattr(error, "sqlite_errorcode", None)
        if isinstance(code, int) and code & 0xFF in _SQLITE_LOCKS:
            return True
        if getattr(error, "sqlstate", None) in _LOCK_SQLSTATES:
            return True
    return False


def _coded(error: BaseException) -> bool:
    """A driver's error: SQLite's result code, or PostgreSQL's SQLSTATE."""
    code = getattr(error, "sqlite_errorcode", None)
    return isinstance(code, int) or isinstance(getattr(error, "sqlstate", None), str)


#: SQLite's SQLITE_PERM and SQLITE_CANTOPEN: a file it may not open as asked.
_SQLITE_NOT_OPENED = frozenset({3, 14})


def access_denied(exc: BaseException) -> bool:
    """True when `exc` (or what it wraps) may come of a file's or folder's mode: a
    PermissionError, or SQLite's read-only or cannot-open (the backend then says which
    file, `StoreBackend.access_problem`)."""
    for error in exception_chain(exc):
        if isinstance(error, PermissionError):
            return True
        code = getattr(error, "sqlite_errorcode", None)
        if isinstance(code, int) and code & 0xFF in _SQLITE_NOT_OPENED:
            return True
    return read_only(exc)


def store_problem(exc: BaseException) -> str | None:
    """What keeps the store from answering, as an operator would say it: read-only, disk
    full or locked; None for anything else (a bug, a conflict, a lost connection)."""
    if read_only(exc):
        return "read-only: it can be read but not written here"
    if _full(exc):
        return "disk full: nothing more can be written"
    if locked(exc):
        return "locked: another process held it for as long as a store call waits"
    return None


class UnsureConflict(SendledgerError, IntegrityError):
    """The store's uniqueness refused a write tried again after a try whose commit is not
    known (its connection lost at COMMIT): the rows it met may be that try's own
    (docs/architecture.md "Ambiguous commits")."""


class StoreUnavailable(SendledgerError, PersistenceError):
    """The store could not be written (or read) for a reason of its own: one line naming
    the store (never its password) and the reason (exit 1, HTTP 503). A PersistenceError
    still, as the library's error it replaces was."""

    kind = Refusal.UNAVAILABLE

    def __init__(self, where: str, problem: str, cause: BaseException, fix: str = "") -> None:
        # The driver's own words (the error with a result code or SQLSTATE, not what was
        # being handled when it came), first line: PostgreSQL adds DETAIL lines.
        chain = exception_chain(cause)
        driver = next((e for e in chain if _coded(e)), chain[0])
        said = str(driver).strip().splitlines()
        detail = f" ({said[0]})" if said else ""
        then = f"; {fix}" if fix else ""
        super().__init__(f"store {where}: {problem}{detail}{then}")


__all__ = [
    "StoreUnavailable",
    "UnsureConflict",
    "access_denied",
    "exception_chain",
    "locked",
    "read_only",
    "store_problem",
]
