"""IMAP sessions kept between searches and read-backs (docs/providers.md "Connections kept
between sends"): logged in once, reused within `connection_max_age` and
`connection_max_messages` calls, checked with NOOP after `connection_idle_check` of idling
or when the server wrote to the session unasked (a BYE before it closes).

A search or a read changes nothing on the server, so a call that fails on a kept session is
made once more on a fresh one (unless it timed out: a slow server, not a stale session),
and only the fresh session's failure is the call's: `ProviderError`, "no information". An
APPEND is not idempotent (a second one would be a second copy, which a search counts as a
duplicate), so it is never made twice.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, TypeVar

from daemon.providers.base import ProviderError
from daemon.providers.connects import start_tls
from daemon.providers.imap_replies import BoundedIMAPClient
from daemon.providers.kept import Kept, KeptPool, MailEndpoint, ReuseLimits, closed_by_peer
from daemon.providers.timeouts import timed_out
from sendledger.connecting import close_unreturned

R = TypeVar("R")

__all__ = ["ImapSessions"]


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _logout(client: Any) -> None:
    try:
        client.logout()
    except Exception:
        with contextlib.suppress(Exception):
            client.shutdown()


def _shutdown(client: Any) -> None:
    with contextlib.suppress(Exception):
        client.shutdown()


def _written_to_unasked(client: Any) -> bool:
    try:
        return closed_by_peer(client.socket())
    except AttributeError:
        return True


class ImapSessions:
    """Logged-in IMAP sessions to one server as one login. Thread-safe: a session is used
    by one thread at a time (out of the pool while in use)."""

    def __init__(self, endpoint: MailEndpoint, limits: ReuseLimits) -> None:
        self.endpoint = endpoint
        self.limits = limits
        self.pool: KeptPool[Any] = KeptPool(limits, _logout)

    def close(self) -> None:
        self.pool.close()

    def run(self, call: Callable[[Any], R], *, repeatable: bool = True) -> R:
        """`call(client)` on a logged-in session. A kept session that fails the call is
        dropped and, when the call is `repeatable`, it is made once more on a fresh one.
        Raises ProviderError when the answer is not known."""
        kept = self._kept()
        if kept is not None:
            try:
                return self._call(kept, call)
            except ProviderError as exc:
                if not (repeatable and exc.__cause__ is not None and _stale(exc.__cause__)):
                    raise
                self.pool.stats.count("retried-fresh")
        return self._call(self._open(), call)

    def _kept(self) -> Kept[Any] | None:
        """A kept session that answers, or None."""
        while (kept := self.pool.take()) is not None:
            client = kept.conn
            idle = kept.idle(self.pool.clock()) > self.limits.idle_check_after
            if not (idle or _written_to_unasked(client)):
                return kept
            try:
                client.noop()
                return kept
            except Exception:
                self.pool.drop(kept, _shutdown)
        return None

    def _open(self) -> Kept[Any]:
        e = self.endpoint
        try:
            client = e.opened(
                lambda host: BoundedIMAPClient(
                    host,
                    port=e.port,
                    ssl=e.security == "tls",
                    ssl_context=e.ssl_context,
                    timeout=e.timeout,
                )
            )
        except Exception as exc:
            # No connection (refused, DNS, connect timeout, TLS handshake): the server did
            # not answer at all, which the scope's circuit counts (docs/operations.md
            # "Outages and quotas"), as the SMTP side's connect failures are.
            close_unreturned(exc)  # a TLS wrap's socket the client never got (a reset)
            raise ProviderError(
                f"IMAP connect {e.host}:{e.port}: {_describe(exc)}",
                unavailable=True,
                timed_out=timed_out(exc),
            ) from exc
        try:
            if e.security == "starttls":
                client.starttls(start_tls(e.ssl_context, e.timeout))
            client.login(e.username, e.password)
        except Exception as exc:
            close_unreturned(exc)  # STARTTLS's wrap, reset under it
            _logout(client)
            raise ProviderError(
                f"IMAP {e.host}:{e.port}: {_describe(exc)}", timed_out=timed_out(exc)
            ) from exc
        return self.pool.fresh(client)

    def _call(self, kept: Kept[Any], call: Callable[[Any], R]) -> R:
        e = self.endpoint
        try:
            result = call(kept.conn)
        except ProviderError:
            # Our own conclusion from answers the session gave (no \Sent folder, a changed
            # UIDVALIDITY): the session itself is fine.
            self.pool.give_back(kept)
            raise
        except Exception as exc:
            self.pool.drop(kept, _shutdown)
            raise ProviderError(
                f"IMAP {e.host}:{e.port}: {_describe(exc)}", timed_out=timed_out(exc)
            ) from exc
        self.pool.give_back(kept)
        return result


def _stale(exc: BaseException) -> bool:
    """Whether a failure on a kept session may be the session's (closed, reset, aborted)
    rather than the server's answer to a slow call."""
    return not isinstance(exc, TimeoutError)
