"""Whether a call outlived its timeout: the one test every provider's classifier uses to
tell a hang (a circuit's business, docs/operations.md "Outages and quotas") from a refusal.
Apart from the HTTP transport so the SMTP and IMAP paths need no httplib2."""

from __future__ import annotations

import http.client
import socket
from collections.abc import Iterator


def timed_out(exc: BaseException) -> bool:
    """Whether a call ended because it outlived its timeout (the socket's, anywhere in the
    exception's causes): for the circuit, a hang (docs/operations.md "Outages and quotas")."""
    return any(isinstance(e, TimeoutError | socket.timeout) for e in _causes(exc))


def closed_unanswered(exc: BaseException) -> bool:
    """Whether an HTTP request's connection, raising `exc` before any of the response was
    read (the caller's to know: `transport.py`), was ended by the other side, not timed
    out: closed (the status line read as the connection's end,
    `http.client.RemoteDisconnected`) or reset (a proxy's SO_LINGER 0, as SMTP's reset
    counts): the provider never answered (`SendOutcome.unanswered`)."""
    return not timed_out(exc) and any(
        isinstance(e, http.client.RemoteDisconnected | ConnectionResetError | BrokenPipeError)
        for e in _causes(exc)
    )


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """`exc`, then its causes and contexts, each once."""
    seen: list[BaseException] = []
    todo: list[BaseException] = [exc]
    while todo:
        current = todo.pop()
        if any(current is s for s in seen):
            continue
        seen.append(current)
        yield current
        todo.extend(
            e for e in (current.__cause__, current.__context__) if isinstance(e, BaseException)
        )
