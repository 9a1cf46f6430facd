"""`security = "none"` to `localhost` (docs/configuration.md "Keys of smtp-imap and graph
providers"): the setting is taken for a loopback host by its name, and the password then
goes in clear text, so the name is connected to on its loopback addresses only, whatever a
resolver answers for it (no `localhost` line in /etc/hosts, a search domain that has one),
as a webhook's `http://localhost` is (tests/integration/test_webhooks_http.py)."""

from __future__ import annotations

import contextlib
import functools
import socket
import ssl
import threading
from collections.abc import Iterator
from io import BufferedReader
from pathlib import Path

import pytest
from tests.integration.listeners import stop_listening
from tests.integration.resolving import outside_address, resolving
from tests.unit.smtp_loopback import converse, message_of_lines, submit_timed

from daemon.config.settings import SmtpImapProviderSettings, settings_from_dict
from daemon.providers.base import ProviderError
from daemon.providers.imap_sessions import ImapSessions
from daemon.providers.kept import MailEndpoint, ReuseLimits
from daemon.providers.outcomes import SendKind
from daemon.providers.smtp_imap import SmtpImapProvider
from daemon.tools.probe import _through_relay


def _take_data(conn: socket.socket, reader: BufferedReader) -> bool:
    conn.sendall(b"354 go on\r\n")
    while reader.readline() not in (b".\r\n", b""):
        pass
    conn.sendall(b"250 2.0.0 queued\r\n")
    return True


def _serve(conn: socket.socket, greeting: bytes, heard: list[bytes]) -> None:
    with conn:
        heard.append(b"connected")
        conn.settimeout(2)
        reader = conn.makefile("rb")
        if greeting.startswith(b"220"):
            converse(conn, reader, functools.partial(_take_data, conn, reader))
        else:
            conn.sendall(greeting)
            heard.append(reader.readline())


@contextlib.contextmanager
def listening(host: str, port: int, greeting: bytes) -> Iterator[tuple[int, list[bytes]]]:
    """A server on `host` that greets and takes a message (SMTP) or one line (IMAP); its
    port and what it heard."""
    listener = socket.create_server((host, port))
    heard: list[bytes] = []

    def loop() -> None:
        with contextlib.suppress(OSError):
            while True:
                _serve(listener.accept()[0], greeting, heard)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1], heard
    finally:
        stop_listening(listener)
        thread.join(5)


@contextlib.contextmanager
def localhost_outside(
    monkeypatch: pytest.MonkeyPatch, greeting: bytes
) -> Iterator[tuple[int, list[bytes]]]:
    """A server on an outside address of this host, which `localhost` resolves to."""
    outside = outside_address()
    with listening(outside, 0, greeting) as (port, heard):
        info = [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (outside, port))]
        resolving(monkeypatch, "localhost", lambda: info)
        yield port, heard


def endpoint(port: int, host: str = "localhost") -> MailEndpoint:
    return MailEndpoint(
        host, port, "none", "user@example.com", "secret", 1.0, ssl.create_default_context()
    )


def test_smtp_to_localhost_never_connects_to_an_outside_address_it_resolves_to(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with localhost_outside(monkeypatch, b"220 outside\r\n") as (port, heard):
        outcome, _ = submit_timed(endpoint(port), message_of_lines(1))
    assert heard == []
    assert outcome.kind is SendKind.REJECTED and outcome.transient, outcome
    assert "resolved to no loopback address" in outcome.reason, outcome


def test_imap_to_localhost_never_connects_to_an_outside_address_it_resolves_to(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with localhost_outside(monkeypatch, b"* OK outside IMAP\r\n") as (port, heard):
        sessions = ImapSessions(endpoint(port), ReuseLimits(max_uses=1))
        try:
            with pytest.raises(ProviderError, match="resolved to no loopback address"):
                sessions.run(lambda client: client.noop())
        finally:
            sessions.close()
    assert heard == []


def test_localhost_resolved_off_loopback_is_refused_naming_what_it_resolved_to(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without an outside address of this host too (the tests above skip there): the
    resolver answers documentation addresses nothing listens on. The refusal says what the
    name resolved to and what to write instead, not only that it is refused."""
    info = [
        (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("192.0.2.1", 2525)),
        (socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("2001:db8::1", 2525, 0, 0)),
    ]
    resolving(monkeypatch, "localhost", lambda: info)
    outcome, _ = submit_timed(endpoint(2525), message_of_lines(1))
    assert outcome.kind is SendKind.REJECTED and outcome.transient, outcome
    assert "resolved to no loopback address (192.0.2.1, 2001:db8::1)" in outcome.reason, outcome
    assert "write 127.0.0.1 or ::1" in outcome.reason, outcome


def test_smtp_to_localhost_takes_its_loopback_addresses_only_in_their_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An outside address the resolver gives first is passed over; a loopback address
    that refuses (a server on one family only: ::1 first, the server on 127.0.0.1) gives
    way to the next, as the system's own connect did."""
    outside = outside_address()
    with (
        listening("127.0.0.1", 0, b"220 loopback\r\n") as (port, inside),
        listening(outside, port, b"220 outside\r\n") as (_, heard),
    ):
        info = [
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", (outside, port)),
            # The server listens on 127.0.0.1 alone: 127.0.0.2 refuses at once.
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.2", port)),
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port)),
        ]
        resolving(monkeypatch, "localhost", lambda: info)
        outcome, _ = submit_timed(endpoint(port), message_of_lines(1))
    assert heard == [] and inside == [b"connected"], (heard, inside)
    assert outcome.kind is SendKind.CONFIRMED, outcome


def test_a_loopback_address_written_as_the_host_is_connected_to_as_it_is() -> None:
    with listening("127.0.0.1", 0, b"220 loopback\r\n") as (port, inside):
        outcome, _ = submit_timed(endpoint(port, host="127.0.0.1"), message_of_lines(1))
    assert inside == [b"connected"] and outcome.kind is SendKind.CONFIRMED, outcome


def test_the_probe_s_relay_to_localhost_never_connects_to_an_outside_address(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`sendledger probe` sends through a relay of its own that connects to the configured
    server: with `security = "none"` to `localhost` it took whatever the resolver said,
    and the login went there in clear text through it."""
    (tmp_path / "pw").write_text("secret\n", encoding="utf-8")
    with localhost_outside(monkeypatch, b"220 outside\r\n") as (port, heard):
        table = {
            "kind": "smtp-imap",
            "smtp_host": "localhost",
            "smtp_port": port,
            "smtp_security": "none",
            "imap_host": "127.0.0.1",
            "imap_security": "none",
            "username": "user@example.com",
            "password_file": str(tmp_path / "pw"),
            "timeout": "1s",
        }
        settings = settings_from_dict({"providers": {"m": table}})
        with _through_relay(settings, "m") as provider:
            assert isinstance(provider, SmtpImapProvider)
            try:
                outcome, _ = submit_timed(provider.smtp.endpoint, message_of_lines(1))
            finally:
                provider.close()
    assert heard == [], heard
    assert outcome.kind is not SendKind.CONFIRMED, outcome


def test_an_ipv6_host_in_brackets_is_taken_as_its_address() -> None:
    """`smtp_host = "[::1]"` (as a URL writes it) passed the loopback check, which strips
    the brackets, and was then connected to as written: a name no resolver knows, every
    send not sent (connect), every search unavailable. It is the address now."""
    table = {
        "kind": "smtp-imap",
        "smtp_host": "[::1]",
        "smtp_security": "none",
        "imap_host": "[2001:db8::25]",
        "username": "user@example.com",
        "password_file": "pw",
    }
    config = settings_from_dict({"providers": {"m": table}}).providers["m"]
    assert isinstance(config, SmtpImapProviderSettings)
    assert (config.smtp_host, config.imap_host) == ("::1", "2001:db8::25")
    for host in (config.smtp_host, config.imap_host):
        # As smtplib and imaplib look it up: an address, no resolver asked.
        socket.getaddrinfo(host, 25, type=socket.SOCK_STREAM, flags=socket.AI_NUMERICHOST)
    # A name in brackets is no address: left as written (refused where it is looked up).
    named = settings_from_dict({"providers": {"m": {**table, "imap_host": "[mail.example]"}}})
    assert named.providers["m"].imap_host == "[mail.example]"  # type: ignore[union-attr]


def test_without_a_route_off_loopback_the_outside_tests_fail_under_ci(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The CI machine has an address off loopback (this one, as root: eth0's); one without
    must not pass these tests by skipping them."""

    def unreachable(self: socket.socket, address: object) -> None:
        raise OSError(101, "Network is unreachable")

    monkeypatch.setattr(socket.socket, "connect", unreachable)
    monkeypatch.setattr("tests.conftest.IN_CI", True)
    with pytest.raises(pytest.fail.Exception, match="no route off loopback"):
        outside_address()
    monkeypatch.setattr("tests.conftest.IN_CI", False)
    with pytest.raises(pytest.skip.Exception, match="no route off loopback"):
        outside_address()
