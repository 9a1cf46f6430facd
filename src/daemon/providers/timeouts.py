"""Whether a call outlived its timeout: the one test every provider's classifier uses to
tell a hang (a circuit's business, docs/operations.md "Outages and quotas") from a refusal.
Apart from the HTTP transport so the SMTP and IMAP paths need no httplib2."""

from __future__ import annotations

import socket


def timed_out(exc: BaseException) -> bool:
    """Whether a call ended because it outlived its timeout (the socket's, anywhere in the
    exception's causes): for the circuit, a hang (docs/operations.md "Outages and quotas")."""
    seen: list[BaseException] = []
    todo: list[BaseException] = [exc]
    while todo:
        current = todo.pop()
        if any(current is s for s in seen):
            continue
        seen.append(current)
        if isinstance(current, TimeoutError | socket.timeout):
            return True
        todo.extend(
            e for e in (current.__cause__, current.__context__) if isinstance(e, BaseException)
        )
    return False
