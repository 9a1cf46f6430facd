"""Connecting to a host within one deadline, its addresses raced as happy eyeballs do
(RFC 8305): the next address is tried a short delay after the previous one started while
that one is still connecting, the first to connect is used and the others are closed.

A host whose first address is silent (a dead IPv6 route, a firewall that drops) is then
reached on the next one after the delay, not after the whole timeout; every attempt, the
name's lookup included, ends at the one deadline (docs/http-api.md "Webhooks", and the
Python client's `timeout`, docs/http-api.md "Python client").

The standard library only: the Python client (`sendledger.client`) and the daemon's
webhook delivery (`daemon/webhooks/delivery.py`) share it.
"""

from __future__ import annotations

import errno
import os
import selectors
import socket
import threading
import time
from collections.abc import Sequence
from typing import Any

#: How long an address is given alone before the next one starts (RFC 8305's
#: "Connection Attempt Delay", 250 ms recommended).
ATTEMPT_DELAY = 0.25
#: The least delay, however short the timeout shared among many addresses (RFC 8305: 10 ms).
MIN_ATTEMPT_DELAY = 0.01

#: One answer of `socket.getaddrinfo`: family, type, protocol, canonical name, address.
AddressInfo = tuple[Any, ...]

_IN_PROGRESS = frozenset({errno.EINPROGRESS, errno.EWOULDBLOCK, errno.EAGAIN})


def left(deadline: float) -> float:
    """Seconds until `deadline` (`time.monotonic`); TimeoutError once it has passed."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise TimeoutError("timed out")
    return remaining


def resolve(host: str, port: int, deadline: float) -> list[AddressInfo]:
    """`socket.getaddrinfo` for a stream, given up at `deadline`: the lookup cannot be
    interrupted, so it runs in a thread of its own, left to end by itself (the system
    resolver's own timeouts end it) when the caller has stopped waiting."""
    found: list[AddressInfo] = []
    failed: list[Exception] = []
    done = threading.Event()

    def lookup() -> None:
        try:
            found.extend(socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM))
        except Exception as exc:
            failed.append(exc)
        finally:
            done.set()

    threading.Thread(target=lookup, name="resolve", daemon=True).start()
    if not done.wait(left(deadline)):
        raise TimeoutError("timed out")
    if failed:
        raise failed[0]
    if not found:
        raise OSError(f"no address for {host!r}")
    return found


def interleaved(found: Sequence[AddressInfo]) -> list[AddressInfo]:
    """`found` in the order the race tries them: the resolver's order (RFC 6724), the
    families taking turns from the first one's (RFC 8305 section 4), so that a dead
    family costs one delay, not one per address of it."""
    first = [info for info in found if info[0] == found[0][0]] if found else []
    others = [info for info in found if found and info[0] != found[0][0]]
    order: list[AddressInfo] = []
    for index in range(max(len(first), len(others))):
        order.extend(group[index] for group in (first, others) if index < len(group))
    return order


def race(
    found: Sequence[AddressInfo], deadline: float, delay: float = ATTEMPT_DELAY
) -> socket.socket:
    """A socket connected to the first of `found` to answer, blocking, its timeout the
    time left before `deadline`. Each address starts `delay` after the one before (less
    when the time left, shared among the addresses, is shorter), or at once when every
    one started has failed; the others are closed. TimeoutError at `deadline`; when every
    address failed, the last one's error."""
    order = interleaved(found)
    if not order:
        raise OSError("no address to connect to")
    step = max(MIN_ATTEMPT_DELAY, min(delay, left(deadline) / (len(order) + 1)))
    pending: list[socket.socket] = []
    error: OSError | None = None
    at = 0
    next_start = time.monotonic()
    with selectors.DefaultSelector() as selector:
        try:
            while True:
                now = time.monotonic()
                left(deadline)
                if at < len(order) and (now >= next_start or not pending):
                    family, kind, proto, _name, address = order[at][:5]
                    at += 1
                    try:
                        sock = socket.socket(family, kind, proto)
                    except OSError as exc:
                        error = exc
                        continue
                    sock.setblocking(False)
                    code = sock.connect_ex(address)
                    if code == 0:
                        return _connected(sock, deadline)
                    if code not in _IN_PROGRESS:
                        sock.close()
                        error = OSError(code, os.strerror(code))
                        continue
                    pending.append(sock)
                    selector.register(sock, selectors.EVENT_WRITE)
                    next_start = now + step
                    continue
                if not pending:
                    assert error is not None
                    raise error
                until = min(next_start, deadline) if at < len(order) else deadline
                for key, _events in selector.select(max(0.0, until - now)):
                    sock = key.fileobj  # type: ignore[assignment]
                    selector.unregister(sock)
                    pending.remove(sock)
                    code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                    if code == 0:
                        return _connected(sock, deadline)
                    sock.close()
                    error = OSError(code, os.strerror(code))
                    next_start = now  # a failure frees its turn: the next starts now
        finally:
            for sock in pending:
                sock.close()


def _connected(sock: socket.socket, deadline: float) -> socket.socket:
    try:
        sock.setblocking(True)
        sock.settimeout(left(deadline))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except BaseException:
        sock.close()
        raise
    return sock


def create_connection(
    address: tuple[str, int],
    timeout: float | None = None,
    source_address: tuple[str, int] | None = None,
) -> socket.socket:
    """`socket.create_connection` with `timeout` bounding the lookup and the addresses
    together, raced (`race`), rather than each address given the whole of it (a silent
    first address then used it all). Without a timeout, the addresses are still raced."""
    if source_address is not None:
        # No caller of ours binds; the standard library's own path does it right.
        return socket.create_connection(address, timeout, source_address)
    seconds = timeout if isinstance(timeout, int | float) else socket.getdefaulttimeout()
    deadline = time.monotonic() + (seconds if seconds is not None else 365 * 86400.0)
    host, port = address
    sock = race(resolve(host, port, deadline), deadline)
    sock.settimeout(seconds)
    return sock


__all__ = [
    "ATTEMPT_DELAY",
    "AddressInfo",
    "create_connection",
    "interleaved",
    "left",
    "race",
    "resolve",
]
