"""A host name answered as a test says (`resolving`), and an address of this host that is
not loopback (`outside_address`): for what a connection does with the addresses a
resolver gives, a loopback name's outside one included (tests/integration/test_webhooks_http.py,
tests/unit/test_mail_loopback_names.py)."""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

import pytest
from tests.conftest import skip_unless_ci


def resolving(monkeypatch: pytest.MonkeyPatch, name: str, answer: Callable[[], Any]) -> None:
    """`socket.getaddrinfo(name, ...)` is `answer()` for the test; other names resolve."""
    real = socket.getaddrinfo

    def getaddrinfo(host: str, *args: Any, **kwargs: Any) -> Any:
        return answer() if host == name else real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


def outside_address() -> str:
    """An address of this host that is not loopback (the route's source toward a
    documentation network: nothing is sent); skips where there is none, and fails under
    CI, where nothing may skip."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.200", 9))
            address: str = probe.getsockname()[0]
        except OSError:
            address = ""
    if not address or address.startswith("127."):
        skip_unless_ci("no address off loopback" if address else "no route off loopback")
    return address
