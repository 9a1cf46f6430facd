"""The SMTP + IMAP provider against real Postfix and Dovecot, through the SMTP fault relay.

Copies are counted in the Maildir files of the real mailbox, never through the provider.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from email.message import EmailMessage
from pathlib import Path

import pytest
from tests.integration.bounce_checks import Mailboxes, run_bounce_checks
from tests.integration.mailservers import (
    DEFER_RECIPIENT,
    GONE_RECIPIENT,
    PASSWORD,
    RECIPIENT,
    REJECT_RECIPIENT,
    SENDER,
    UNKNOWN_RECIPIENT,
    MailServers,
    free_port,
    mail_servers,
)

from daemon.providers.base import ProviderError, SendKind
from daemon.providers.smtp_imap import SmtpImapProvider
from policies.model import ChannelPolicy
from testkit.smtp_relay import SmtpFaultRelay

pytestmark = pytest.mark.xdist_group("mailservers")


@pytest.fixture(scope="module")
def servers() -> Iterator[MailServers]:
    with mail_servers() as running:
        yield running


@pytest.fixture
def relay(servers: MailServers) -> Iterator[SmtpFaultRelay]:
    with SmtpFaultRelay("127.0.0.1", servers.smtp_port, hang_seconds=1.5) as running:
        yield running


def provider_for(servers: MailServers, smtp_port: int, **overrides: object) -> SmtpImapProvider:
    kwargs: dict[str, object] = {
        "smtp_host": "127.0.0.1",
        "smtp_port": smtp_port,
        "smtp_security": "none",
        "imap_host": "127.0.0.1",
        "imap_port": servers.imap_port,
        "imap_security": "none",
        "username": SENDER,
        "password": PASSWORD,
        "timeout": 0.7,
    }
    kwargs.update(overrides)
    name = str(kwargs.pop("name", "mail"))
    return SmtpImapProvider(name, **kwargs)  # type: ignore[arg-type]


def message(message_id: str, to: str = RECIPIENT, **headers: str) -> bytes:
    msg = EmailMessage()
    msg["From"] = SENDER
    msg["To"] = to
    msg["Subject"] = "sendledger test"
    msg["Message-ID"] = message_id
    for name, value in headers.items():
        msg[name] = value
    msg.set_content("hello\n.leading dot line\n")
    return msg.as_bytes()


def test_pass_is_confirmed_by_the_250_with_the_queue_id(
    servers: MailServers, relay: SmtpFaultRelay
) -> None:
    mid = "<pass-1@sendledger.test>"
    outcome = provider_for(servers, relay.port).send_raw(message(mid))
    assert outcome.kind is SendKind.CONFIRMED, outcome
    assert outcome.provider_message_id and outcome.provider_message_id != mid  # queue id
    assert servers.wait_copies(mid, 1) == 1
    assert servers.wait_copies(mid, 1, user="rcpt", folder="INBOX") == 1


def test_dropped_reply_after_the_final_dot_is_one_copy_unknown_then_found(
    servers: MailServers, relay: SmtpFaultRelay
) -> None:
    """RFC 1047's case: the server queued the message, the client never heard the 250.
    smtplib must not send again; the search finds exactly the one copy."""
    mid = "<drop-1@sendledger.test>"
    provider = provider_for(servers, relay.port)
    relay.set_modes(["drop-response"])
    outcome = provider.send_raw(message(mid))
    assert outcome.kind is SendKind.UNKNOWN, outcome
    assert relay.applied == ["drop-response"]
    assert relay.dropped_replies and relay.dropped_replies[0].startswith("250")
    assert servers.wait_copies(mid, 1) == 1
    servers.settle()
    assert servers.copies(mid) == 1  # one copy, counted in the real mailbox
    result = provider.search(mid)
    assert len(result.copies) == 1
    assert mid in result.query and "UID SEARCH HEADER Message-ID" in result.query
    # What a human checking the copy sees of it (docs/review.md "Review").
    hit = result.hits[0]
    assert (hit.to, hit.subject) == (RECIPIENT, "sendledger test") and hit.date
    assert provider.read_message_id(result.copies[0]) == mid


def test_fail_before_forward_is_unknown_and_nothing_arrives(
    servers: MailServers, relay: SmtpFaultRelay
) -> None:
    mid = "<fbf-1@sendledger.test>"
    provider = provider_for(servers, relay.port)
    relay.set_modes(["fail-before-forward"])
    assert provider.send_raw(message(mid)).kind is SendKind.UNKNOWN
    servers.settle()
    assert servers.copies(mid) == 0
    assert provider.search(mid).copies == []


def test_hang_after_the_final_dot_times_out_as_unknown(
    servers: MailServers, relay: SmtpFaultRelay
) -> None:
    mid = "<hang-1@sendledger.test>"
    relay.set_modes(["hang"])
    outcome = provider_for(servers, relay.port).send_raw(message(mid))
    assert outcome.kind is SendKind.UNKNOWN, outcome
    assert servers.wait_copies(mid, 1) == 1


@pytest.mark.parametrize(
    ("to", "transient", "status"),
    [(DEFER_RECIPIENT, True, 451), (REJECT_RECIPIENT, False, 554), (UNKNOWN_RECIPIENT, False, 550)],
)
def test_refusals_by_reply_code(
    servers: MailServers, to: str, transient: bool, status: int
) -> None:
    mid = f"<refused-{status}@sendledger.test>"
    outcome = provider_for(servers, servers.smtp_port).send_raw(message(mid, to=to))
    assert outcome.kind is SendKind.REJECTED, outcome
    assert outcome.transient is transient and outcome.status == status
    servers.settle()
    assert servers.copies(mid) == 0


def test_search_compares_the_header_exactly(servers: MailServers) -> None:
    """Dovecot's HEADER search matches substrings: a longer id containing ours is no hit."""
    provider = provider_for(servers, servers.smtp_port)
    ours, longer = "<exact-1@sendledger.test>", "<exact-1@sendledger.test.other>"
    for mid in (ours, longer):
        assert provider.send_raw(message(mid)).kind is SendKind.CONFIRMED
        assert servers.wait_copies(mid, 1) == 1
    result = provider.search(ours)
    assert len(result.copies) == 1
    assert result.hits[0].message_id_header == ours
    assert provider.search("<exact-1@sendledger.test.other>").hits[0].message_id_header == longer


def test_bcc_recipients_get_it_without_the_header(servers: MailServers) -> None:
    mid = "<bcc-1@sendledger.test>"
    raw = message(mid, to=RECIPIENT, Bcc="defer+x@example.test")
    provider = provider_for(servers, servers.smtp_port)
    assert provider.send_raw(raw).kind is SendKind.CONFIRMED
    assert servers.wait_copies(mid, 1, user="defer", folder="INBOX") == 1
    for path in servers.folder_files("rcpt", "INBOX"):
        assert b"defer+x@" not in path.read_bytes()


def test_client_copy_is_appended_to_the_sent_folder(servers: MailServers) -> None:
    """`sent_copy = "client"` for a sender the server files no copy for (rcpt@ has no
    sender_bcc rule): the daemon's APPEND is the one copy."""
    mid = "<client-copy-1@sendledger.test>"
    provider = provider_for(servers, servers.smtp_port, username=RECIPIENT, sent_copy="client")
    assert provider.send_raw(message(mid, to=SENDER)).kind is SendKind.CONFIRMED
    assert servers.copies(mid, user="rcpt", folder="Sent") == 1
    assert len(provider.search(mid).copies) == 1


def test_read_message_id_of_a_reply_id_is_no_information(servers: MailServers) -> None:
    with pytest.raises(ProviderError, match="SMTP reply"):
        provider_for(servers, servers.smtp_port).read_message_id("4XyzQueueId")


def test_no_listener_on_the_relay_upstream_closes_the_client(servers: MailServers) -> None:
    with (
        SmtpFaultRelay("127.0.0.1", free_port()) as relay,
        socket.create_connection(("127.0.0.1", relay.port), timeout=2) as sock,
    ):
        assert sock.recv(100) == b""


def test_wrong_password_and_closed_port_are_not_sent(servers: MailServers) -> None:
    # Last in the module: after a failed AUTH, Dovecot's auth answers Postfix late for a
    # few seconds (measured: 4-5 s), whatever auth_failure_delay says.
    wrong = provider_for(servers, servers.smtp_port, password="wrong", timeout=10.0)
    outcome = wrong.send_raw(message("<auth-1@sendledger.test>"))
    assert outcome.kind is SendKind.REJECTED and not outcome.transient and outcome.status == 535
    closed = provider_for(servers, free_port())
    outcome = closed.send_raw(message("<closed-1@sendledger.test>"))
    assert outcome.kind is SendKind.REJECTED and outcome.transient
    with pytest.raises(ProviderError):
        provider_for(servers, servers.smtp_port, imap_port=free_port()).search("<x@y.test>")


# -- bounces (docs/providers.md "Bounces") ------------------------------------------------


def watching_policy(channel: str, sender: str) -> ChannelPolicy:
    return ChannelPolicy.model_validate(
        {
            "channel": channel,
            "provider": channel,
            "from": sender,
            "message_id_domain": "mail.example.test",
            "watch_bounces": "1h",
        }
    )


def test_postfixs_own_bounce_is_recorded_once_and_forgeries_on_no_job(
    servers: MailServers, tmp_path: Path
) -> None:
    """gone@ is taken at submission; Dovecot refuses its delivery and Postfix's own report
    lands in the sender's INBOX. Forged reports are APPENDed to the same INBOX."""
    mail = provider_for(servers, servers.smtp_port, timeout=5.0)
    other = provider_for(servers, servers.smtp_port, timeout=5.0, name="other", username=RECIPIENT)

    def deliver(raw: bytes) -> None:
        mail.imap.run(lambda client: client.append("INBOX", raw), repeatable=False)

    def bounce_arrived() -> bool:
        heads = [path.read_bytes()[:4096] for path in servers.folder_files("sender", "INBOX")]
        return any(b"multipart/report" in h and b"MAILER-DAEMON" in h for h in heads)

    try:
        run_bounce_checks(
            tmp_path,
            Mailboxes(
                providers={"mail": mail, "other": other},
                policies=[watching_policy("mail", SENDER), watching_policy("other", RECIPIENT)],
                mailbox=SENDER,
                gone=GONE_RECIPIENT,
                ok=RECIPIENT,
                deliver=deliver,
                bounce_arrived=bounce_arrived,
            ),
        )
    finally:
        mail.close()
        other.close()
