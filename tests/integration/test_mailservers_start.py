"""The real-server pair starts even when a port found free is taken before it binds it
(another process's outgoing connection can get the same port from the kernel): seen in CI
as "dovecot imap did not listen ... Address already in use"."""

from __future__ import annotations

import smtplib
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.integration.mailservers import mail_servers, require_mailservers

import testkit.mailservers as kit


def test_a_port_taken_before_the_servers_bind_it_is_replaced(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    require_mailservers()
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))  # bound, not listening: as an outgoing connection's port
        taken = held.getsockname()[1]
        real = kit.free_port
        ports: Iterator[int] = iter([taken])

        def first_taken() -> int:
            return next(ports, None) or real()

        monkeypatch.setattr(kit, "free_port", first_taken)
        with mail_servers() as servers:
            assert taken not in (servers.smtp_port, servers.imap_port, servers.lmtp_port)
            with smtplib.SMTP("127.0.0.1", servers.smtp_port, timeout=5) as smtp:
                assert smtp.ehlo()[0] == 250


def test_a_server_that_exited_is_not_waited_for(tmp_path: Path) -> None:
    """A server that could not bind its port exits: the start gives up on it at once,
    naming its exit status, instead of waiting out the listen timeout (10 s) before it
    tries new ports. No real server needed: a process that has already exited."""
    ended = subprocess.Popen(["true"])
    ended.wait(timeout=30)
    log = tmp_path / "server.log"
    log.write_text("bind(127.0.0.1): Address already in use\n", encoding="utf-8")
    started = time.monotonic()
    with pytest.raises(RuntimeError, match=r"did not listen on \d+ within 10.0s, exit status 0"):
        kit._wait_listening(kit.free_port(), "a server", log, ended, timeout=10.0)
    assert time.monotonic() - started < 5.0


def test_the_pair_stops_at_once_and_nothing_of_it_still_answers() -> None:
    """Stopped one after the other, the pair took 2.3 s; told together, 1.0 s, each master
    told alone (Postfix's ended through its fatal-error path, which pauses 1 s: its kill of
    a process group it did not lead failed). Each now leads a group of its own, told whole:
    0.01 s, and no child is left holding a port."""
    require_mailservers()
    with mail_servers() as servers:
        with smtplib.SMTP("127.0.0.1", servers.smtp_port, timeout=5) as smtp:
            assert smtp.ehlo()[0] == 250  # an smtpd child is running
        ports = (servers.smtp_port, servers.imap_port, servers.lmtp_port)
        started = time.monotonic()
    took = time.monotonic() - started
    assert took < 0.9, took  # before: 1.0 s at the least, Postfix's pause alone
    for port in ports:
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
