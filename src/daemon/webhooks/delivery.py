"""One webhook delivery: an HTTP POST with the standard library (docs/http-api.md "Webhooks").

No redirect is followed (a 3xx is a failure: a receiver that moved says so in its
config, and a redirect must not carry a signed payload elsewhere), no proxy from the
environment is used, and the whole attempt (the name's lookup, the connection, the
request, the answer) ends after `timeout`. A host's addresses are raced as happy eyeballs
do (`sendledger.connecting`): a silent first address (a dead IPv6 route) holds the
attempt a quarter of a second, not its whole timeout. Only a 2xx counts as
delivered, decided by the status line (its body is not read).
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import ssl
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlsplit

from ledger.display import printable
from sendledger.connecting import loopback_only, race, resolve
from sendledger.final_answers import FinalAnswer

#: Bytes of a refusal's body kept for `webhooks status`.
ERROR_BODY = 200


@dataclass(frozen=True)
class Outcome:
    ok: bool
    status: int | None = None  # the HTTP status, None when no response came
    error: str = ""  # why it failed, one printable line


class Poster(Protocol):
    def __call__(
        self, url: str, body: bytes, headers: Mapping[str, str], timeout: float
    ) -> Outcome: ...


def post(url: str, body: bytes, headers: Mapping[str, str], timeout: float) -> Outcome:
    """POST `body`; the whole attempt ends within about `timeout`, however slowly the
    receiver drips its answer (a timer shuts the socket down at the deadline)."""
    deadline = time.monotonic() + timeout
    parts = urlsplit(url)
    host = parts.hostname or ""
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    connection: http.client.HTTPConnection
    context: ssl.SSLContext | None = None
    if parts.scheme == "https":
        context = ssl.create_default_context()
        connection = http.client.HTTPSConnection(host, parts.port, timeout=timeout, context=context)
    else:
        connection = http.client.HTTPConnection(host, parts.port, timeout=timeout)
    # A 103 before the receiver's 200 is not its answer (sendledger/final_answers.py).
    connection.response_class = FinalAnswer
    sent = {
        "Content-Type": "application/json",
        "User-Agent": "sendledger-webhooks",
        **headers,
    }
    expired = threading.Event()

    def cut() -> None:
        expired.set()
        sock = connection.sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    timer = threading.Timer(timeout, cut)
    timer.daemon = True
    timer.start()
    try:
        # Connected here, not by `http.client` (`socket.create_connection`): that gives
        # each address the whole timeout, one after the other, and the name's lookup
        # none, so a host with a silent first address was never reached on its second,
        # and a resolver that never answers held the attempt for ever. Each step gets
        # only the time left.
        connection.sock = _connect(host, parts.port or connection.default_port, deadline, context)
        if expired.is_set():
            # The deadline passed while connecting, when there was no socket to cut: the
            # time is spent, and a request sent now could be taken with its answer called
            # a failure.
            raise TimeoutError
        connection.request("POST", path, body=body, headers=sent)
        response = connection.getresponse()
        if expired.is_set():
            raise TimeoutError  # the head was cut short: what was parsed is not an answer
        status = response.status
        if 200 <= status < 300:
            # The status decides: the receiver has the event. Its body is not waited
            # for (one without a length that never ends would turn this into a
            # failure, and the event would go out again on every retry).
            return Outcome(True, status)
        detail = b""
        with contextlib.suppress(OSError, http.client.HTTPException):
            detail = response.read(ERROR_BODY)  # what it says, if it says it in time
    except (OSError, http.client.HTTPException) as exc:
        if expired.is_set() or isinstance(exc, TimeoutError):
            return Outcome(False, None, f"no answer within {timeout:g}s")
        return Outcome(False, None, printable(f"{type(exc).__name__}: {exc}")[:300])
    finally:
        timer.cancel()
        connection.close()
    text = printable(detail.decode("utf-8", "replace")).strip()
    return Outcome(False, status, f"HTTP {status}" + (f": {text}" if text else ""))


def _connect(
    host: str, port: int, deadline: float, context: ssl.SSLContext | None
) -> socket.socket:
    """A socket connected to `host` (TLS-wrapped with `context`), every step (the lookup,
    the addresses raced as happy eyeballs do, `sendledger.connecting.race`, the
    handshake) within the time left before `deadline`."""
    # Allowed plain http as loopback by its name: on its loopback addresses only.
    found = loopback_only(host, resolve(host, port, deadline))
    # With TLS the handshake is part of the race: an address that connects and then
    # fails it (a middlebox that hangs up, a certificate that does not verify) is that
    # address failing, and the next one is tried within the deadline.
    return race(found, deadline, tls=context, server_hostname=host)


__all__ = ["Outcome", "Poster", "post"]
