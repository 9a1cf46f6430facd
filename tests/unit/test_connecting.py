"""The order in which `sendledger.connecting.race` tries a host's addresses (RFC 8305
section 4; docs/architecture.md "Webhooks")."""

from __future__ import annotations

import socket
import time

import pytest

from sendledger.connecting import _open_tunnel, interleaved


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
