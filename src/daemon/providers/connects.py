"""A provider's connections, opened within its `timeout` and the claim's lease under the
call (docs/architecture.md "Leases": "A call of many answers").

A send's waits for its answers end within the claim's lease as last written
(`base.call_time_left`), but a connection's opening waited its `timeout` alone, each
address a whole one: the name's lookup, the TCP connect, the TLS handshake (STARTTLS's
too), for a send's own connection and for the token request before it. A server slow to
accept held the call past its lease once the renewals stopped landing (the store lost),
and another daemon recovered the claim and searched while the call went on. Every
provider's connection opens here (HTTP: `transport.SingleShotHttp`, the token requests of
Gmail and Graph with it; SMTP: `smtp_replies`; IMAP: `imap_replies`): its addresses
raced within the one `timeout` (`sendledger.connecting`), and each wait ending at the
lease's end too, asked again when reached, as a renewal may have moved it on, so a slow
but healthy opening whose renewals land goes on; one whose lease has passed ends
"timed out: its claim's lease ends", the send's words. Outside a claim (a search, a
ping) there is no lease and `timeout` alone bounds it.
"""

from __future__ import annotations

import socket
import ssl
import time
from typing import cast

from daemon.providers.base import call_time_left
from sendledger.connecting import handshake, race, resolve


def connect(
    host: str,
    port: int,
    timeout: float,
    *,
    tls: ssl.SSLContext | None = None,
    server_hostname: str | None = None,
) -> socket.socket:
    """A blocking socket connected to `host`:`port` (with `tls`, its handshake then done
    for `server_hostname`, as the standard library's clients wrap a connected socket),
    its timeout `timeout`; the opening within `timeout` as a whole and within the claim's
    lease under the call. OSError (TimeoutError at an end) when none opens."""
    deadline = time.monotonic() + timeout
    found = resolve(host, port, deadline, lease=call_time_left)
    sock = race(found, deadline, lease=call_time_left)
    if tls is not None:
        try:
            sock = handshake(sock, tls, server_hostname, deadline, lease=call_time_left)
        except BaseException:
            sock.close()  # the raw socket; `handshake` closes the one it wrapped
            raise
    sock.settimeout(timeout)
    return sock


class _StartTls:
    """What STARTTLS wraps the session's socket with (smtplib's and imaplib's
    `context.wrap_socket(sock, server_hostname=...)`, the only use either makes of the
    context): the handshake within `timeout` and the claim's lease."""

    def __init__(self, context: ssl.SSLContext, timeout: float) -> None:
        self._context = context
        self._timeout = timeout

    def wrap_socket(self, sock: socket.socket, server_hostname: str | None = None) -> ssl.SSLSocket:
        deadline = time.monotonic() + self._timeout
        wrapped = handshake(sock, self._context, server_hostname, deadline, lease=call_time_left)
        wrapped.settimeout(self._timeout)
        return wrapped


def start_tls(context: ssl.SSLContext, timeout: float) -> ssl.SSLContext:
    """`context` as a STARTTLS of smtplib or imaplib takes it, its handshake bounded as
    `connect`'s is (typed as the context those libraries ask for: they call only its
    `wrap_socket`)."""
    return cast(ssl.SSLContext, _StartTls(context, timeout))


__all__ = ["connect", "start_tls"]
