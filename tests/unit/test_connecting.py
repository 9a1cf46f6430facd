"""The order in which `sendledger.connecting.race` tries a host's addresses (RFC 8305
section 4; docs/architecture.md "Webhooks")."""

from __future__ import annotations

import socket

from sendledger.connecting import interleaved


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
