"""Connecting to a host within one deadline, its addresses raced as happy eyeballs do
(RFC 8305): the next address is tried a short delay after the previous one started while
that one is still connecting, the first to connect is used and the others are closed.

A host whose first address is silent (a dead IPv6 route, a firewall that drops) is then
reached on the next one after the delay, not after the whole timeout; every attempt, the
name's lookup included, ends at the one deadline (docs/http-api.md "Webhooks", and the
Python client's `timeout`, docs/http-api.md "Python client").

Over https the TLS handshake is part of the race (`race`'s `tls`): an address that takes
the connection and then fails the handshake (a middlebox that hangs up or resets, a
certificate that does not verify) is that address failing, and the others are still
tried within the deadline; a deadline reached mid-handshake is a TimeoutError.

Through an HTTP proxy (`tunnel_connection`, the Python client's `https_proxy`) the one
deadline covers the proxy's addresses, raced as above, its CONNECT exchange and the TLS
handshake with the server behind it.

A daemon's provider call made under a claim passes the claim's lease too (`lease`: the
seconds left of it, asked again whenever a wait reaches its end, as a renewal may have
moved it on; docs/architecture.md "Leases"): every wait ends at the earlier of the two,
and the connection fails "timed out: its claim's lease ends" only once the lease as asked
then has passed.

The standard library only: the Python client (`sendledger.client`) and the daemon's
webhook delivery (`daemon/webhooks/delivery.py`) share it, and the daemon's SMTP and IMAP
connections take a loopback name's addresses from it (`daemon/providers/kept.py`).
"""

from __future__ import annotations

import errno
import ipaddress
import os
import selectors
import socket
import ssl
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

#: How long an address is given alone before the next one starts (RFC 8305's
#: "Connection Attempt Delay", 250 ms recommended).
ATTEMPT_DELAY = 0.25
#: The least delay, however short the timeout shared among many addresses (RFC 8305: 10 ms).
MIN_ATTEMPT_DELAY = 0.01

#: One answer of `socket.getaddrinfo`: family, type, protocol, canonical name, address.
AddressInfo = tuple[Any, ...]

_Socket = TypeVar("_Socket", bound=socket.socket)

_IN_PROGRESS = frozenset({errno.EINPROGRESS, errno.EWOULDBLOCK, errno.EAGAIN})

#: What a wait that reached the end of its call's claim's lease raises (`within`), the
#: words an Unknown's or a refusal's reason keeps on every provider.
LEASE_ENDS = "timed out: its claim's lease ends"

#: The seconds left of a claim's lease under a call, asked again at each wait; None when
#: the call has none (`lease`, above; the daemon's `providers.base.call_time_left`).
LeaseLeft = Callable[[], float | None]


def left(deadline: float) -> float:
    """Seconds until `deadline` (`time.monotonic`); TimeoutError once it has passed."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise TimeoutError("timed out")
    return remaining


def within(deadline: float, lease: LeaseLeft | None = None) -> float:
    """Seconds a wait may take now: until `deadline` (`left`), or the end of the `lease`
    when it comes first; TimeoutError once either has passed (`LEASE_ENDS` for the
    lease). Asked again when the wait ends: a lease renewed meanwhile goes on."""
    wait = left(deadline)
    more = None if lease is None else lease()
    if more is None:
        return wait
    if more <= 0:
        raise TimeoutError(LEASE_ENDS)
    return min(wait, more)


def resolve(
    host: str, port: int, deadline: float, *, lease: LeaseLeft | None = None
) -> list[AddressInfo]:
    """`socket.getaddrinfo` for a stream, given up at `deadline` (or the `lease`'s end:
    `within`): the lookup cannot be interrupted, so it runs in a thread of its own, left
    to end by itself (the system resolver's own timeouts end it) when the caller has
    stopped waiting. A literal address is not looked up: no thread to wait on (about 80 us
    of every connection a provider opens to one)."""
    within(deadline, lease)
    if _address(host) is not None:
        return socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM, 0, socket.AI_NUMERICHOST)
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
    while not done.wait(within(deadline, lease)):
        pass  # `within` raises once an end has passed
    if failed:
        raise failed[0]
    if not found:
        raise OSError(f"no address for {host!r}")
    return found


#: The names a setting takes for loopback as written (`http://localhost` without
#: `allow_http`, an SMTP or IMAP server with `security = "none"`): connected to on a
#: loopback address only.
LOOPBACK_NAMES = ("localhost", "localhost.localdomain")


def loopback_only(host: str, found: Sequence[AddressInfo]) -> list[AddressInfo]:
    """`found` (the addresses of `host`), only its loopback ones when `host` is one of
    :data:`LOOPBACK_NAMES`: a resolver may answer another address for such a name (no
    `localhost` line in /etc/hosts, a search domain that has one), which would then get
    in clear text what was allowed only on loopback. OSError when none is left."""
    if host.lower() not in LOOPBACK_NAMES:
        return list(found)
    kept = [info for info in found if _is_loopback(info[4][0])]
    if not kept:
        # What it resolved to, and the fix: the reader sees a name that "is" loopback.
        answered = ", ".join(dict.fromkeys(str(info[4][0]) for info in found))
        raise OSError(
            f"{host!r} resolved to no loopback address ({answered}): "
            "write 127.0.0.1 or ::1 in its place ([::1] in a URL)"
        )
    return kept


def _address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """`host` as an address when it is one written out, else None (a name)."""
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def _is_loopback(address: str) -> bool:
    found = _address(address)
    return found is not None and found.is_loopback


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
    found: Sequence[AddressInfo],
    deadline: float,
    delay: float = ATTEMPT_DELAY,
    *,
    tls: ssl.SSLContext | None = None,
    server_hostname: str | None = None,
    source_address: tuple[str, int] | None = None,
    lease: LeaseLeft | None = None,
) -> socket.socket:
    """A socket connected to the first of `found` to answer, blocking, its timeout the
    time left before `deadline`. Each address starts `delay` after the one before (less
    when the time left, shared among the addresses, is shorter), or at once when every
    one started has failed; the others are closed. TimeoutError at `deadline`, and with
    `lease` at its end too, asked again when reached (`within`). With
    `source_address`, each attempt is bound to it first (one that cannot be, another
    family's address, is that address failing).

    With `tls`, an address has answered once its TLS handshake (for `server_hostname`)
    is done: one that connects and then fails its handshake (hung up, reset, no TLS
    server, a certificate that does not verify) is that address failing, and the race
    goes on with the others; one whose handshake is still silent gives way to the next
    after a delay, as a silent connect does. Trying another address after a certificate
    refused is safe: each must show one valid for the name. When every address failed,
    the error raised is that of the address that got furthest (a certificate refused,
    then any other handshake failure, then a connect failure), the first of those."""
    order = interleaved(found)
    if not order:
        raise OSError("no address to connect to")
    step = max(MIN_ATTEMPT_DELAY, min(delay, left(deadline) / (len(order) + 1)))
    pending: list[socket.socket] = []
    connecting: set[socket.socket] = set()  # of `pending`, those whose connect is under way
    errors: list[tuple[int, OSError]] = []  # (how far the address got, its error)
    at = 0
    next_start = time.monotonic()
    with selectors.DefaultSelector() as selector:

        def opened(sock: socket.socket) -> socket.socket | None:
            """`sock` connected: itself, handshaken when asked, or None while its
            handshake has yet to end, or when it failed."""
            if tls is None:
                pending.remove(sock)
                return _connected(sock, deadline)
            next_after(step)  # the handshake has its turn, as the connect had
            return shaken(sock)

        def shaken(sock: socket.socket) -> socket.socket | None:
            """`sock` (TLS) once its handshake is done; None until then, or failed."""
            assert isinstance(sock, ssl.SSLSocket)
            try:
                sock.do_handshake()
            except ssl.SSLWantReadError:
                selector.register(sock, selectors.EVENT_READ)
                return None
            except ssl.SSLWantWriteError:
                selector.register(sock, selectors.EVENT_WRITE)
                return None
            except OSError as exc:
                failed(sock, 2 if isinstance(exc, ssl.SSLCertVerificationError) else 1, exc)
                return None
            pending.remove(sock)
            return _connected(sock, deadline)

        def failed(sock: socket.socket, rank: int, error: OSError) -> None:
            """`sock`'s address failed, having got as far as `rank`: its turn is free."""
            pending.remove(sock)
            connecting.discard(sock)
            sock.close()
            errors.append((rank, error))
            next_after(0.0)

        def next_after(seconds: float) -> None:
            nonlocal next_start
            next_start = time.monotonic() + seconds

        try:
            while True:
                now = time.monotonic()
                wait = within(deadline, lease)
                if at < len(order) and (now >= next_start or not pending):
                    family, kind, proto, _name, address = order[at][:5]
                    at += 1
                    try:
                        sock = _unconnected(
                            family, kind, proto, source_address, tls, server_hostname
                        )
                    except OSError as exc:
                        errors.append((0, exc))
                        continue
                    pending.append(sock)
                    try:
                        code = sock.connect_ex(address)
                    except OSError as exc:
                        failed(sock, 0, exc)
                        continue
                    next_start = now + step
                    if code == 0:
                        if (won := opened(sock)) is not None:
                            return won
                        continue
                    if code not in _IN_PROGRESS:
                        failed(sock, 0, OSError(code, os.strerror(code)))
                        continue
                    connecting.add(sock)
                    selector.register(sock, selectors.EVENT_WRITE)
                    continue
                if not pending:
                    raise _furthest(errors)
                until = min(next_start, deadline) if at < len(order) else deadline
                for key, _events in selector.select(max(0.0, min(until - now, wait))):
                    sock = key.fileobj  # type: ignore[assignment]
                    selector.unregister(sock)
                    if sock not in connecting:
                        won = shaken(sock)
                    else:
                        connecting.remove(sock)
                        code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                        if code != 0:
                            failed(sock, 0, OSError(code, os.strerror(code)))
                            continue
                        won = opened(sock)
                    if won is not None:
                        return won
        finally:
            for sock in pending:
                sock.close()
            # Each error's traceback holds this frame, which holds `errors`: a cycle
            # that kept the winner (and its caller's response) for the collector,
            # which then closed the winner's socket as unclosed.
            errors.clear()


def _unconnected(
    family: int,
    kind: int,
    proto: int,
    source_address: tuple[str, int] | None,
    tls: ssl.SSLContext | None,
    server_hostname: str | None,
) -> socket.socket:
    """A non-blocking socket for one attempt, bound to `source_address` if given, and
    with `tls` wrapped before it connects: the standard library's `wrap_socket` of a
    connected socket whose peer has just reset it raises with the socket it made still
    open (left to the collector), where an unconnected one has no peer to lose."""
    sock = socket.socket(family, kind, proto)
    try:
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if source_address is not None:
            sock.bind(source_address)
        if tls is None:
            return sock
        return tls.wrap_socket(sock, server_hostname=server_hostname, do_handshake_on_connect=False)
    except BaseException:
        sock.close()
        raise


def _furthest(errors: Sequence[tuple[int, OSError]]) -> OSError:
    """The error of the address that got furthest, the first of those."""
    assert errors
    best = max(rank for rank, _error in errors)
    return next(error for rank, error in errors if rank == best)


def _connected(sock: _Socket, deadline: float) -> _Socket:
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
    *,
    tls: ssl.SSLContext | None = None,
    server_hostname: str | None = None,
) -> socket.socket:
    """`socket.create_connection` with `timeout` bounding the lookup and the addresses
    together, raced (`race`), rather than each address given the whole of it (a silent
    first address then used it all). Without a timeout, the addresses are still raced.
    With `tls`, the TLS handshake for `server_hostname` is in the race and the timeout
    too (`race`). With `source_address`, each attempt is bound to it (`race`): the
    standard library's signature, which `http.client` calls with it."""
    seconds, deadline = _deadline(timeout)
    host, port = address
    sock = race(
        resolve(host, port, deadline),
        deadline,
        tls=tls,
        server_hostname=server_hostname,
        source_address=source_address,
    )
    sock.settimeout(seconds)
    return sock


def tunnel_connection(
    proxy: tuple[str, int],
    target: tuple[str, int],
    headers: Mapping[str, str],
    timeout: float | None = None,
    source_address: tuple[str, int] | None = None,
    *,
    tls: ssl.SSLContext | None = None,
    server_hostname: str | None = None,
) -> socket.socket:
    """A connection to `target` through the HTTP proxy at `proxy` (its `CONNECT`, with
    `headers`: a `Proxy-Authorization`), TLS-wrapped for `server_hostname` with `tls`,
    every step within the one `timeout`: the proxy's lookup and its addresses raced
    (`race`), the CONNECT exchange, then the handshake with the target through it.
    OSError("Tunnel connection failed: ...") when the proxy refuses, as `http.client`
    says it."""
    seconds, deadline = _deadline(timeout)
    sock = race(resolve(*proxy, deadline), deadline, source_address=source_address)
    try:
        _open_tunnel(sock, target, headers, deadline)
        if tls is not None:
            sock = handshake(sock, tls, server_hostname, deadline)
    except BaseException:
        sock.close()  # the raw socket; `handshake` closes the one it wrapped
        raise
    sock.settimeout(seconds)
    return sock


#: The most bytes of a proxy's answer to CONNECT read before it is refused as too long.
MAX_TUNNEL_HEAD = 65536


def _open_tunnel(
    sock: socket.socket, target: tuple[str, int], headers: Mapping[str, str], deadline: float
) -> None:
    """The CONNECT exchange on `sock`, each read given only the time left, so a proxy
    that drips its answer still ends at `deadline`. Nothing past the answer's head is
    read: what follows is the target's."""
    host, port = target
    authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    # Checked as the proxy reads them: a line break or a control character in the
    # target or a header would end the line there and start another request line.
    for text in (authority, *headers, *headers.values()):
        if any(ord(c) < 0x20 or ord(c) == 0x7F for c in text):
            raise ValueError(f"a control character in the proxy request: {text!r}")
    request = [f"CONNECT {authority} HTTP/1.0\r\n".encode("ascii")]
    request += [f"{name}: {value}\r\n".encode("latin-1") for name, value in headers.items()]
    sock.settimeout(left(deadline))
    sock.sendall(b"".join(request) + b"\r\n")
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        sock.settimeout(left(deadline))
        seen = sock.recv(MAX_TUNNEL_HEAD, socket.MSG_PEEK)
        if not seen:
            raise OSError("Tunnel connection failed: the proxy closed the connection")
        end = (head + seen).find(b"\r\n\r\n")
        head += sock.recv(len(seen) if end < 0 else end + 4 - len(head))
        if len(head) > MAX_TUNNEL_HEAD:
            raise OSError("Tunnel connection failed: the proxy's answer is too long")
    status = head.split(b"\r\n", 1)[0].decode("latin-1").strip()
    version, _, rest = status.partition(" ")
    if not version.startswith("HTTP/") or rest.split(" ", 1)[0] != "200":
        raise OSError(f"Tunnel connection failed: {rest or status}")


def handshake(
    sock: socket.socket,
    tls: ssl.SSLContext,
    server_hostname: str | None,
    deadline: float,
    *,
    lease: LeaseLeft | None = None,
) -> ssl.SSLSocket:
    """`sock` (connected) TLS-wrapped, its handshake done by `deadline` (and within the
    `lease`: `within`), however slowly the other end answers (a blocking handshake gives
    each read the whole timeout). The socket returned is blocking, its timeout the time
    left."""
    sock.setblocking(False)
    try:
        wrapped = tls.wrap_socket(
            sock, server_hostname=server_hostname, do_handshake_on_connect=False
        )
    except BaseException as exc:
        close_unreturned(exc)
        raise
    try:
        with selectors.DefaultSelector() as selector:
            while True:
                try:
                    wrapped.do_handshake()
                    break
                except ssl.SSLWantReadError:
                    selector.register(wrapped, selectors.EVENT_READ)
                except ssl.SSLWantWriteError:
                    selector.register(wrapped, selectors.EVENT_WRITE)
                while not selector.select(within(deadline, lease)):
                    pass  # `within` raises once an end has passed
                selector.unregister(wrapped)
    except BaseException:
        wrapped.close()
        raise
    return _connected(wrapped, deadline)


def close_unreturned(exc: BaseException) -> None:
    """Close the SSLSocket that a failed `wrap_socket` made and did not return, `exc`
    being its error. It takes the connected socket's descriptor first; a peer that reset
    the connection just before (a proxy hanging up after its CONNECT answer, a mail
    server after its STARTTLS answer or its accept) then fails it with the new socket
    open, left to the collector (CPython gh-113280, fixed in 2024: there this finds it
    closed). The traceback is the only way to it; a caller of a library that wraps
    (smtplib, IMAPClient) passes the error it caught."""
    tb = exc.__traceback__
    while tb is not None:
        made = tb.tb_frame.f_locals.get("self")
        if isinstance(made, ssl.SSLSocket):
            made.close()
        tb = tb.tb_next


def _deadline(timeout: float | None) -> tuple[float | None, float]:
    """The socket timeout `timeout` stands for (`http.client` passes a sentinel object
    for the default), and the deadline it sets from now (a year when there is none)."""
    seconds = timeout if isinstance(timeout, int | float) else socket.getdefaulttimeout()
    return seconds, time.monotonic() + (seconds if seconds is not None else 365 * 86400.0)


__all__ = [
    "ATTEMPT_DELAY",
    "LEASE_ENDS",
    "LOOPBACK_NAMES",
    "AddressInfo",
    "LeaseLeft",
    "close_unreturned",
    "create_connection",
    "handshake",
    "interleaved",
    "left",
    "loopback_only",
    "race",
    "resolve",
    "tunnel_connection",
    "within",
]
