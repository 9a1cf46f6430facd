"""The order in which `sendledger.connecting.race` tries a host's addresses (RFC 8305
section 4; docs/architecture.md "Webhooks")."""

from __future__ import annotations

import gc
import os
import socket
import ssl
import struct
import threading
import time
import warnings
from typing import Any

import pytest

from sendledger.connecting import _open_tunnel, interleaved, tunnel_connection


def _info(address: str) -> tuple[object, ...]:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    return (family, socket.SOCK_STREAM, 6, "", (address, 443))


def test_the_families_take_turns_from_the_first_ones() -> None:
    # A host with three IPv6 addresses on a dead route and one live IPv4: the IPv4 one is
    # tried second, after one delay, not fourth after three.
    found = [_info(a) for a in ("2001:db8::1", "2001:db8::2", "2001:db8::3", "192.0.2.1")]
    order = [info[4][0] for info in interleaved(found)]
    assert order == ["2001:db8::1", "192.0.2.1", "2001:db8::2", "2001:db8::3"]


def test_one_family_keeps_the_resolvers_order() -> None:
    found = [_info(a) for a in ("192.0.2.3", "192.0.2.1", "192.0.2.2")]
    assert interleaved(found) == found
    assert interleaved([]) == []


def test_an_ipv4_first_answer_starts_with_ipv4() -> None:
    found = [_info(a) for a in ("192.0.2.1", "192.0.2.2", "2001:db8::1")]
    order = [info[4][0] for info in interleaved(found)]
    assert order == ["192.0.2.1", "2001:db8::1", "192.0.2.2"]


@pytest.mark.parametrize(
    ("target", "headers"),
    [
        (("example.com\r\nX-Injected: 1", 443), {}),
        (("example.com", 443), {"Proxy-Authorization": "Basic a\r\nX-Injected: 1"}),
        (("example.com", 443), {"Proxy-Authorization\n": "Basic a"}),
    ],
)
def test_a_tunnel_request_with_a_control_character_is_refused_before_a_byte_leaves(
    target: tuple[str, int], headers: dict[str, str]
) -> None:
    ours, proxy = socket.socketpair()
    with ours, proxy:
        with pytest.raises(ValueError, match="control character"):
            _open_tunnel(ours, target, headers, time.monotonic() + 1)
        proxy.setblocking(False)
        with pytest.raises(BlockingIOError):
            proxy.recv(1)  # nothing was sent


class _WrapsAfterTheReset(ssl.SSLContext):
    """A client context whose wrap waits until the proxy has reset the tunnel: the reset
    that arrives between the CONNECT's answer and the TLS wrap, made certain."""

    reset = threading.Event()

    def wrap_socket(self, *args: Any, **kwargs: Any) -> Any:
        assert self.reset.wait(5)
        time.sleep(0.05)  # the reset has crossed loopback
        return super().wrap_socket(*args, **kwargs)


def _resetting_proxy(reset: threading.Event) -> tuple[socket.socket, int]:
    """A loopback proxy that reads one CONNECT, answers 200 and resets the connection."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.settimeout(5)
            conn.recv(65536)
            conn.sendall(b"HTTP/1.0 200 Connection established\r\n\r\n")
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        reset.set()

    threading.Thread(target=serve, daemon=True).start()
    return listener, listener.getsockname()[1]


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_tunnel_reset_before_the_tls_wrap_closes_its_socket() -> None:
    """The proxy answers the CONNECT and resets the connection before the TLS wrap: the
    call fails and its socket is closed as it raises. The standard library's wrap of a
    socket reset under it (Python before 3.11.9 and 3.12.2) raised with the socket it had
    made still open, left to the collector: one fd more while the error was held, then
    a ResourceWarning."""
    context = _WrapsAfterTheReset(ssl.PROTOCOL_TLS_CLIENT)
    context.reset = threading.Event()
    listener, port = _resetting_proxy(context.reset)
    with listener, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        before = _open_fds()
        with pytest.raises(OSError) as failed:
            tunnel_connection(("127.0.0.1", port), ("localhost", 443), {}, 5, tls=context,
                              server_hostname="localhost")  # fmt: skip
        assert _open_fds() == before, failed.value
        del failed
        gc.collect()
    assert not [w for w in caught if issubclass(w.category, ResourceWarning)]
