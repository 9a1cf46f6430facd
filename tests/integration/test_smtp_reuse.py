"""Kept SMTP connections and IMAP sessions (docs/providers.md "Connections kept between
sends") against real Postfix and Dovecot, through the SMTP fault relay.

Connections and logins are counted where they happen (the relay's client connections and
the commands it saw, Dovecot's login log lines), copies in the real mailbox's Maildir files:
never in the provider's own records.
"""

from __future__ import annotations

import itertools
import subprocess
import time
from pathlib import Path

import pytest
from tests.integration import test_smtp_imap_provider as provider_tests
from tests.integration.mailservers import (
    DEFER_RECIPIENT,
    PASSWORD,
    RECIPIENT,
    REJECT_RECIPIENT,
    SENDER,
    MailServers,
)
from tests.integration.test_smtp_imap_provider import message, provider_for

from daemon.bootstrap import build_provider
from daemon.config.settings import settings_from_dict
from daemon.providers.base import SendKind, SendOutcome
from daemon.providers.kept import ReuseLimits
from daemon.providers.smtp_imap import SmtpImapProvider
from daemon.providers.smtp_submit import PIPELINE_GROUP
from testkit.smtp_relay import SmtpFaultRelay, SmtpMode

pytestmark = pytest.mark.xdist_group("mailservers")

_ids = itertools.count()
# The provider tests' fixtures: one Postfix + Dovecot pair for the module, a relay per test.
servers = provider_tests.servers
relay = provider_tests.relay


def kept_provider(servers: MailServers, relay: SmtpFaultRelay, **limits: float) -> SmtpImapProvider:
    return provider_for(servers, relay.port, reuse=ReuseLimits(**limits))  # type: ignore[arg-type]


def send(provider: SmtpImapProvider, to: str | None = None) -> tuple[str, SendOutcome]:
    mid = f"<reuse-{next(_ids)}-{time.monotonic_ns()}@sendledger.test>"
    raw = message(mid) if to is None else message(mid, to=to)
    return mid, provider.send_raw(raw)


def confirmed(provider: SmtpImapProvider, count: int) -> list[str]:
    sent = [send(provider) for _ in range(count)]
    assert [o.kind for _, o in sent] == [SendKind.CONFIRMED] * count, sent
    return [mid for mid, _ in sent]


def test_one_connection_and_one_login_serve_many_sends(
    servers: MailServers, relay: SmtpFaultRelay
) -> None:
    provider = kept_provider(servers, relay)
    mids = confirmed(provider, 5)
    assert (relay.sessions, relay.verbs["AUTH"], relay.verbs["MAIL"]) == (1, 1, 5)
    assert relay.verbs["RSET"] == relay.verbs["NOOP"] == 0  # none needed between sends
    # Postfix offers PIPELINING: MAIL, RCPT and DATA in one write; the content only after
    # DATA's 354.
    assert relay.written_ahead == {"MAIL": 5, "RCPT": 5}
    provider.close()
    assert relay.verbs["QUIT"] == 1
    for mid in mids:
        assert servers.wait_copies(mid, 1) == 1
        assert servers.wait_copies(mid, 1, user="rcpt", folder="INBOX") == 1


def test_a_connection_sends_at_most_max_messages_and_lives_at_most_max_age(
    servers: MailServers, relay: SmtpFaultRelay
) -> None:
    provider = kept_provider(servers, relay, max_uses=2)
    confirmed(provider, 5)
    assert (relay.sessions, relay.verbs["AUTH"]) == (3, 3)  # 2 + 2 + 1
    aged = kept_provider(servers, relay, max_age=0.2)
    confirmed(aged, 1)
    time.sleep(0.3)
    confirmed(aged, 2)
    assert relay.sessions == 5  # the aged-out one was closed, its successor reused
    once = kept_provider(servers, relay, max_uses=1)
    confirmed(once, 2)
    assert relay.sessions == 7  # a connection per send, as without reuse


def test_an_idle_connection_is_checked_with_noop_before_it_is_reused(
    servers: MailServers, relay: SmtpFaultRelay
) -> None:
    provider = kept_provider(servers, relay, idle_check_after=0.1)
    confirmed(provider, 2)  # back to back: no check
    assert relay.verbs["NOOP"] == 0
    time.sleep(0.2)
    confirmed(provider, 1)
    assert (relay.verbs["NOOP"], relay.sessions) == (1, 1)


@pytest.mark.parametrize("nth", [1, 2, 5])
@pytest.mark.parametrize(
    ("mode", "copies"), [("drop-response", 1), ("fail-before-forward", 0), ("hang", 1)]
)
def test_a_fault_after_the_final_dot_on_the_nth_message_is_unknown_and_never_resent(
    servers: MailServers, relay: SmtpFaultRelay, nth: int, mode: SmtpMode, copies: int
) -> None:
    """RFC 1047's case on a kept connection: Unknown whatever the connection's age, the
    connection is not reused, and the next send goes on a fresh one."""
    provider = kept_provider(servers, relay)
    before_the_fault: list[SmtpMode] = ["pass"] * (nth - 1)
    relay.set_modes([*before_the_fault, mode])
    before = confirmed(provider, nth - 1)
    mid, outcome = send(provider)
    assert outcome.kind is SendKind.UNKNOWN, outcome
    assert relay.applied == ["pass"] * (nth - 1) + [mode]
    after = confirmed(provider, 2)
    assert relay.sessions == 2  # the faulted connection was dropped, one fresh after it
    assert relay.verbs["MAIL"] == nth + 2  # the unknown one was written once
    servers.settle()
    assert servers.copies(mid) == copies
    for other in before + after:
        assert servers.copies(other) == 1


def test_a_connection_the_server_closed_is_replaced_before_mail_from(
    servers: MailServers, relay: SmtpFaultRelay
) -> None:
    provider = kept_provider(servers, relay)
    confirmed(provider, 1)
    assert relay.hang_up() == 1
    time.sleep(0.1)  # the close reaches the kept socket
    (mid,) = confirmed(provider, 1)
    assert (relay.sessions, relay.verbs["MAIL"]) == (2, 2)  # no MAIL on the dead one
    assert provider.connection_stats()["smtp"]["dropped"] == 1
    assert servers.wait_copies(mid, 1) == 1


def test_421_before_mail_from_on_a_kept_connection_is_tried_at_once_on_a_fresh_one(
    servers: MailServers, relay: SmtpFaultRelay
) -> None:
    """Nothing of the message was accepted: the send is not "unavailable" while a fresh
    connection takes it."""
    provider = kept_provider(servers, relay)
    confirmed(provider, 1)
    relay.answer("MAIL", "421 4.3.2 Service shutting down")
    (mid,) = confirmed(provider, 1)
    assert relay.sessions == 2
    assert provider.connection_stats()["smtp"]["retried-fresh"] == 1
    assert servers.wait_copies(mid, 1) == 1
    # The same on a kept connection's NOOP after idling.
    idle = kept_provider(servers, relay, idle_check_after=0.05)
    confirmed(idle, 1)
    time.sleep(0.1)
    relay.answer("NOOP", "421 4.4.2 Timeout exceeded")
    confirmed(idle, 1)
    assert idle.connection_stats()["smtp"]["retried-fresh"] == 1


def test_421_on_the_fresh_connection_too_is_unavailable(
    servers: MailServers, relay: SmtpFaultRelay
) -> None:
    provider = kept_provider(servers, relay)
    confirmed(provider, 1)
    relay.answer("MAIL", "421 4.3.2 Service shutting down", times=2)
    mid, outcome = send(provider)
    assert outcome.kind is SendKind.REJECTED, outcome
    assert outcome.transient and outcome.unavailable and outcome.status == 421
    assert relay.sessions == 2 and relay.verbs["MAIL"] == 3
    servers.settle()
    assert servers.copies(mid) == 0


@pytest.mark.parametrize("pipelining", [True, False], ids=["pipelined", "one-by-one"])
@pytest.mark.parametrize("verb", ["MAIL", "RCPT", "DATA"])
@pytest.mark.parametrize(
    ("reply", "transient"), [("451 4.3.0 busy", True), ("550 5.7.1 no", False)]
)
def test_a_refusal_before_the_data_on_a_kept_connection_resets_it_for_the_next_send(
    servers: MailServers,
    relay: SmtpFaultRelay,
    verb: str,
    reply: str,
    transient: bool,
    pipelining: bool,
) -> None:
    """Pipelined, the commands after the refused one were written too: their replies are
    read (Postfix's 503 or 554), so the connection is still usable after a reset."""
    relay.offer_pipelining = pipelining
    provider = kept_provider(servers, relay)
    confirmed(provider, 1)
    relay.answer(verb, reply)
    mid, outcome = send(provider)
    assert outcome.kind is SendKind.REJECTED, outcome
    assert (outcome.transient, outcome.unavailable, outcome.status) == (
        transient,
        False,
        int(reply[:3]),
    )
    (after,) = confirmed(provider, 1)
    assert (relay.sessions, relay.verbs["RSET"]) == (1, 1)  # reset, then the same connection
    assert bool(relay.written_ahead) is pipelining
    servers.settle()
    assert servers.copies(mid) == 0 and servers.copies(after) == 1


def test_many_recipients_are_pipelined_in_bounded_groups(
    servers: MailServers, relay: SmtpFaultRelay
) -> None:
    """MAIL, 70 RCPTs and DATA in groups of PIPELINE_GROUP, each group's replies read
    before the next is written: a message to thousands of recipients in one write could
    fill both sides' buffers and hang until the timeout."""
    provider = kept_provider(servers, relay)
    local, domain = RECIPIENT.split("@")
    count = 2 * PIPELINE_GROUP + 6
    mid = f"<reuse-{next(_ids)}-{time.monotonic_ns()}@sendledger.test>"
    to = ", ".join(f"{local}+{n}@{domain}" for n in range(count))
    outcome = provider.send_raw(message(mid, to=to))
    assert outcome.kind is SendKind.CONFIRMED, outcome
    commands = 1 + count + 1
    groups = -(-commands // PIPELINE_GROUP)
    # Each command but a group's last was followed by the next before its reply came.
    assert relay.verbs["RCPT"] == count
    assert sum(relay.written_ahead.values()) == commands - groups
    assert relay.written_ahead["DATA"] == 0
    assert servers.wait_copies(mid, 1) == 1


def test_pipelining_false_in_the_settings_writes_one_command_a_round_trip(
    servers: MailServers, relay: SmtpFaultRelay, tmp_path: Path
) -> None:
    """`[providers.NAME] pipelining = false` (docs/providers.md), built as the daemon builds
    it: Postfix offers PIPELINING, and no command is written before the last one's reply."""
    (tmp_path / "mail-password").write_text(PASSWORD + "\n")
    table = servers.config(Path("mail-password"), smtp_port=relay.port)
    for pipelining in (False, True):
        settings = settings_from_dict(
            {"providers": {"mail": {**table, "pipelining": pipelining}}},
            config_path=tmp_path / "sendledger.toml",
        )
        provider = build_provider(settings, "mail")
        assert isinstance(provider, SmtpImapProvider)
        try:
            confirmed(provider, 2)
        finally:
            provider.close()
        assert bool(relay.written_ahead) is pipelining, relay.written_ahead


def test_a_refused_recipient_then_an_accepted_data_closes_the_connection_without_a_dot(
    servers: MailServers, relay: SmtpFaultRelay
) -> None:
    """Pipelined, DATA was written before the second recipient's refusal was read, and
    Postfix accepts it (354) for the first: the message must not go to one of its two
    recipients. The connection is closed in the data, never ended with a `.` (an empty
    message), so Postfix queues nothing; the next send takes a fresh connection."""
    provider = kept_provider(servers, relay)
    confirmed(provider, 1)
    servers.settle()
    before = sum(servers.message_ids().values())
    relay.answer("RCPT", "550 5.1.1 no such user", skip=1)
    mid = f"<reuse-{next(_ids)}-{time.monotonic_ns()}@sendledger.test>"
    outcome = provider.send_raw(message(mid, to=f"{RECIPIENT}, other-{RECIPIENT}"))
    assert (outcome.kind, outcome.transient, outcome.status) == (SendKind.REJECTED, False, 550)
    assert relay.written_ahead["RCPT"] >= 2 and relay.verbs["DATA"] == 2
    (after,) = confirmed(provider, 1)
    assert relay.sessions == 2
    servers.settle()
    # Counted by file, not by Message-ID: an empty message would carry Postfix's own.
    assert sum(servers.message_ids().values()) == before + 1
    assert servers.copies(after) == 1


def test_refusals_after_the_final_dot_keep_the_connection_after_a_reset(
    servers: MailServers, relay: SmtpFaultRelay
) -> None:
    """Postfix answers 451 (defer@) and 554 (reject@) after the data: the connection is
    reset (Postfix answers a MAIL after its own 451 with 503 otherwise) and takes the next
    message."""
    provider = kept_provider(servers, relay)
    confirmed(provider, 1)
    deferred, outcome = send(provider, DEFER_RECIPIENT)
    assert (outcome.kind, outcome.transient, outcome.status) == (SendKind.REJECTED, True, 451)
    rejected, outcome = send(provider, REJECT_RECIPIENT)
    assert (outcome.kind, outcome.transient, outcome.status) == (SendKind.REJECTED, False, 554)
    (after,) = confirmed(provider, 1)
    assert (relay.sessions, relay.verbs["RSET"]) == (1, 2)
    servers.settle()
    assert servers.copies(deferred) == servers.copies(rejected) == 0
    assert servers.copies(after) == 1


@pytest.mark.parametrize(
    ("verb", "reply", "times", "transient", "unavailable"),
    [
        ("GREETING", "421 4.3.2 Try again later", 1, True, True),
        ("GREETING", "554 5.7.1 No service", 1, False, False),
        ("EHLO", "421 4.3.2 Closing", 1, True, True),
        ("AUTH", "454 4.7.0 Temporary authentication failure", 2, True, False),
        # Not SMTP replies: tried again, never a refusal for a person to review.
        ("GREETING", "HTTP/1.1 400 Bad Request", 1, True, True),
        ("AUTH", "+OK whatever", 2, True, False),
    ],
)
def test_refusals_while_a_fresh_connection_opens(
    servers: MailServers,
    relay: SmtpFaultRelay,
    verb: str,
    reply: str,
    times: int,
    transient: bool,
    unavailable: bool,
) -> None:
    provider = kept_provider(servers, relay)
    # AUTH: smtplib tries PLAIN, then LOGIN
    relay.answer(verb, reply, times=times, garbled=not reply[:3].isdigit())
    mid, outcome = send(provider)
    assert outcome.kind is SendKind.REJECTED, outcome
    assert (outcome.transient, outcome.unavailable) == (transient, unavailable), outcome
    assert relay.verbs["MAIL"] == 0
    confirmed(provider, 1)  # a fresh connection, nothing of the failed one kept
    assert relay.sessions == 2
    servers.settle()
    assert servers.copies(mid) == 0


def _logins(servers: MailServers, at_least: int = 0) -> int:
    """The sender's IMAP logins in Dovecot's log, once there are `at_least` (its log
    process writes a moment after the login) or after 2 s."""
    deadline = time.monotonic() + 2.0
    while True:
        log = (servers.root / "dovecot.log").read_text(errors="replace")
        found = sum(1 for line in log.splitlines() if "Login: user=<sender@" in line)
        if found >= at_least or time.monotonic() > deadline:
            return found
        time.sleep(0.02)


def _kick(servers: MailServers) -> None:
    """Dovecot ends every session of the sender (as at its idle timeout, or a restart)."""
    subprocess.run(
        ["doveadm", "-c", str(servers.root / "dovecot.conf"), "kick", SENDER],
        check=True,
        capture_output=True,
        timeout=10,
    )


def test_searches_share_one_imap_session_and_a_lost_one_is_replaced(
    servers: MailServers, relay: SmtpFaultRelay
) -> None:
    provider = kept_provider(servers, relay)
    (mid,) = confirmed(provider, 1)
    assert servers.wait_copies(mid, 1) == 1
    time.sleep(0.2)  # earlier tests' logins are in the log
    before = _logins(servers)
    for _ in range(3):
        assert len(provider.search(mid).copies) == 1
    hit = provider.search(mid).copies[0]
    assert provider.read_message_id(hit) == mid
    assert _logins(servers, before + 1) - before == 1
    # The server ends the session while it is kept: the next search finds it closed
    # before it writes anything, and logs in again.
    _kick(servers)
    time.sleep(0.1)
    assert len(provider.search(mid).copies) == 1
    assert _logins(servers, before + 2) - before == 2
    assert provider.connection_stats()["imap"]["dropped"] == 1
    assert provider.connection_stats()["imap"]["fresh"] == 2
