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


__all__ = ["exception_chain"]
