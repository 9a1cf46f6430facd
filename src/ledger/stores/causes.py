"""What a store error wraps: the SQLite and PostgreSQL backends judge a driver error that
eventsourcing re-raised as its own by the errors in its chain (a lock, a serialization
failure, a lock timeout)."""

from __future__ import annotations


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


__all__ = ["exception_chain", "read_only"]
