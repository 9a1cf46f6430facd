"""One webhook delivery: an HTTP POST with the standard library (docs/http-api.md "Webhooks").

No redirect is followed (a 3xx is a failure: a receiver that moved says so in its
config, and a redirect must not carry a signed payload elsewhere), no proxy from the
environment is used, and the whole attempt (the name's lookup, the connection over each
of its addresses, the request, the answer) ends after `timeout`. Only a 2xx counts as
delivered, decided by the status line (its body is not read).
"""

from __future__ import annotations

import contextlib
import http.client
import ipaddress
import socket
import ssl
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

from ledger.display import printable

#: Bytes of a refusal's body kept for `webhooks status`.
ERROR_BODY = 200
#: The names the settings take for loopback as written (`daemon/config/settings.py:
#: _is_loopback`, `http://` without `allow_http`): reached on a loopback address only.
LOOPBACK_NAMES = ("localhost", "localhost.localdomain")


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
        # each address the whole timeout and the name's lookup none, so a host with
        # several silent addresses, or a resolver that never answers, held the attempt
        # for a multiple of it. Each step gets only the time left.
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


def _left(deadline: float) -> float:
    """Seconds until `deadline`; TimeoutError once it has passed."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError
    return left


def _resolve(host: str, port: int, deadline: float) -> list[Any]:
    """`socket.getaddrinfo`, given up at `deadline`: the lookup cannot be interrupted, so
    it runs in a thread of its own, left to end by itself (the system resolver's own
    timeouts end it) when the attempt has stopped waiting."""
    found: list[Any] = []
    failed: list[Exception] = []
    done = threading.Event()

    def lookup() -> None:
        try:
            found.extend(socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM))
        except Exception as exc:
            failed.append(exc)
        finally:
            done.set()

    threading.Thread(target=lookup, name="webhook-resolve", daemon=True).start()
    if not done.wait(_left(deadline)):
        raise TimeoutError
    if failed:
        raise failed[0]
    if not found:
        raise OSError(f"no address for {host!r}")
    return found


def _loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def _connect(
    host: str, port: int, deadline: float, context: ssl.SSLContext | None
) -> socket.socket:
    """A socket connected to `host` (TLS-wrapped with `context`), every step (the lookup,
    each address in turn, the handshake) within the time left before `deadline`."""
    error: OSError | None = None
    found = _resolve(host, port, deadline)
    if host.lower() in LOOPBACK_NAMES:
        # Allowed plain http as loopback by its name; a resolver may answer another
        # address for it (no `localhost` line in /etc/hosts, a search domain that has
        # one), which would get the payload in clear text.
        found = [info for info in found if _loopback(info[4][0])]
        if not found:
            raise OSError(f"{host!r} resolved to no loopback address")
    for family, kind, proto, _name, address in found:
        left = _left(deadline)
        sock = socket.socket(family, kind, proto)
        try:
            sock.settimeout(left)
            sock.connect(address)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if context is not None:
                sock.settimeout(_left(deadline))
                sock = context.wrap_socket(sock, server_hostname=host)
            sock.settimeout(_left(deadline))
            return sock
        except TimeoutError:
            sock.close()
            raise  # the attempt's time is spent: the next address would have none
        except OSError as exc:
            sock.close()
            if isinstance(exc, ssl.SSLError | ssl.CertificateError):
                raise  # the host answered and refused: another address is the same host
            error = exc
    assert error is not None
    raise error


__all__ = ["Outcome", "Poster", "post"]
