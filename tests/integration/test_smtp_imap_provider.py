"""The SMTP + IMAP provider against real Postfix and Dovecot, through the SMTP fault relay.

Copies are counted in the Maildir files of the real mailbox, never through the provider.
What every provider must do is the provider contract (tests/provider_contract.py), which
`TestSmtpImapContract` runs here; the rest of this file is what is SMTP's own.
"""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from email.message import EmailMessage
from pathlib import Path
from typing import Any, cast

import pytest
from tests.integration.bounce_checks import (
    Mailboxes,
    Outcomes,
    bounces,
    run_bounce_checks,
    run_report_before_send_check,
)
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
from tests.provider_contract import SendContract, Subject

from daemon.engine import Engine, PolicyHolder
from daemon.providers.base import Provider, ProviderError, SendKind, SendOutcome
from daemon.providers.outcomes import SEARCH_STOPS_AT
from daemon.providers.smtp_imap import SmtpImapProvider
from ledger.application import Ledger
from ledger.content import parse_job
from ledger.copies import COPIES_KEPT
from policies.loader import PolicySet
from policies.model import ChannelPolicy
from testkit.smtp_relay import SmtpFaultRelay

pytestmark = pytest.mark.xdist_group("mailservers")


@pytest.fixture(scope="module")
def servers() -> Iterator[MailServers]:
    with mail_servers() as running:
        yield running


# The provider's timeout: what a hang costs each test that meets one, and what every
# healthy call must fit in. 0.7 s was outlived by a connect through the relay to Postfix
# on a machine at load 6 (test_smtp_reuse failed on a send with no fault in it).
TIMEOUT = 2.0
# The relay's hold of a hung reply: far past the timeout, so only the client's timeout
# ends a hang (the relay's close ends the hold at teardown).
HANG_SECONDS = 30.0


@pytest.fixture
def relay(servers: MailServers) -> Iterator[SmtpFaultRelay]:
    with SmtpFaultRelay("127.0.0.1", servers.smtp_port, hang_seconds=HANG_SECONDS) as running:
        yield running


def provider_for(
    servers: MailServers,
    smtp_port: int,
    kind: type[SmtpImapProvider] = SmtpImapProvider,
    **overrides: object,
) -> SmtpImapProvider:
    kwargs: dict[str, object] = {
        "smtp_host": "127.0.0.1",
        "smtp_port": smtp_port,
        "smtp_security": "none",
        "imap_host": "127.0.0.1",
        "imap_port": servers.imap_port,
        "imap_security": "none",
        "username": SENDER,
        "password": PASSWORD,
        "timeout": TIMEOUT,
    }
    kwargs.update(overrides)
    name = str(kwargs.pop("name", "mail"))
    return kind(name, **kwargs)  # type: ignore[arg-type]


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


class SmtpImapSubject(Subject):
    """The provider through the SMTP fault relay to the real Postfix, searching the real
    Dovecot (its IMAP has no fault point); copies counted in the sender's Sent Maildir."""

    sender = SENDER
    recipient = RECIPIENT
    hang_seconds = HANG_SECONDS
    missing_id = "1:999999"

    def __init__(self, servers: MailServers, relay: SmtpFaultRelay) -> None:
        self.servers, self.relay = servers, relay
        self.made: list[SmtpImapProvider] = []
        # Ports bound, never listening, until teardown: a port let go at once could be
        # taken by another test's server (pytest -n 2) and answer.
        self.dead: list[socket.socket] = []
        super().__init__(self.restarted())

    def _made(self, provider: SmtpImapProvider) -> SmtpImapProvider:
        self.made.append(provider)  # closed at teardown: a kept connection holds the relay
        return provider

    def restarted(self) -> Provider:
        return self._made(provider_for(self.servers, self.relay.port))

    def unreachable(self) -> Provider:
        return self._made(provider_for(self.servers, self._dead(), imap_port=self._dead()))

    def _dead(self) -> int:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))  # no SO_REUSEADDR: no other socket may bind it
        self.dead.append(sock)
        return int(sock.getsockname()[1])

    def fault(self, mode: str) -> None:
        self.relay.set_modes([mode])  # type: ignore[list-item]

    def sends_seen(self) -> int:
        return len(self.relay.applied)

    def copies(self, message_id: str, expected: int) -> int:
        if expected:
            self.servers.wait_copies(message_id, expected)
        self.servers.settle()  # delivery is asynchronous: let a late copy arrive
        return self.servers.copies(message_id)

    def refused_for_good(self, message_id: str) -> bytes:
        return self.raw(message_id, to=REJECT_RECIPIENT)  # 554 after the final dot


class TestSmtpImapContract(SendContract):
    QUERY = 'UID SEARCH HEADER Message-ID "{id}"'
    subject: SmtpImapSubject

    @pytest.fixture(name="subject")
    def smtp_subject(
        self, servers: MailServers, relay: SmtpFaultRelay
    ) -> Iterator[SmtpImapSubject]:
        subject = SmtpImapSubject(servers, relay)
        yield subject
        for provider in subject.made:
            provider.close()
        for sock in subject.dead:
            sock.close()


@pytest.mark.parametrize(
    ("to", "transient", "status"),
    [(DEFER_RECIPIENT, True, 451), (UNKNOWN_RECIPIENT, False, 550)],
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


def test_no_listener_on_the_relay_upstream_closes_the_client(servers: MailServers) -> None:
    with (
        SmtpFaultRelay("127.0.0.1", free_port()) as relay,
        socket.create_connection(("127.0.0.1", relay.port), timeout=2) as sock,
    ):
        assert sock.recv(100) == b""


def test_a_wrong_password_is_not_sent(servers: MailServers) -> None:
    wrong = provider_for(servers, servers.smtp_port, password="wrong", timeout=10.0)
    outcome = wrong.send_raw(message("<auth-1@sendledger.test>"))
    assert outcome.kind is SendKind.REJECTED and not outcome.transient and outcome.status == 535


def test_a_refused_login_leaves_no_penalty_to_slow_the_next(servers: MailServers) -> None:
    """The private Dovecot keeps no authentication penalty (anvil's, per IP): with one,
    each refused login from 127.0.0.1 made the next ones wait 2 s, then 4 s (the
    wrong-password test took 5 s and had to come last in its module)."""
    wrong = provider_for(servers, servers.smtp_port, password="wrong", timeout=10.0)
    assert wrong.send_raw(message("<auth-2@sendledger.test>")).status == 535
    listed = subprocess.run(
        ["doveadm", "-c", str(servers.root / "dovecot.conf"), "penalty"],
        check=True,
        capture_output=True,
        text=True,
        timeout=10,
    )
    assert listed.stdout.splitlines()[1:] == [], listed.stdout  # the header line only


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


def test_a_report_received_before_the_jobs_first_attempt_is_refused(
    servers: MailServers, tmp_path: Path
) -> None:
    """A forger who guessed a job's key mails its report before the job is sent: the
    INTERNALDATE Dovecot gave it (here set by APPEND) is older than the job's first
    attempt, so it is refused; the same report received after the attempt is recorded."""
    from datetime import UTC, datetime

    mail = provider_for(servers, servers.smtp_port, timeout=5.0)

    def deliver_at(raw: bytes, at: float | None = None) -> None:
        when = None if at is None else datetime.fromtimestamp(at, UTC)
        mail.imap.run(lambda client: client.append("INBOX", raw, msg_time=when), repeatable=False)

    try:
        run_report_before_send_check(
            tmp_path,
            Mailboxes(
                providers={"mail": mail},
                policies=[watching_policy("mail", SENDER)],
                mailbox=SENDER,
                gone=GONE_RECIPIENT,
                ok=RECIPIENT,
                deliver=deliver_at,
                bounce_arrived=lambda: True,
            ),
            deliver_at,
        )
    finally:
        mail.close()


def test_reports_whose_sizes_add_up_past_an_answer_s_bound_are_all_read(
    servers: MailServers,
) -> None:
    """Each within a report read's bound (`MAX_REPORT_BYTES`), together past the bound of
    one IMAP answer (`early_answers.ANSWER_BOUND`). Before: one FETCH of all their bodies,
    cut at that bound, and the read failed (no information) every time until they aged
    out of the look-back: no report of the mailbox was recorded meanwhile."""
    from datetime import UTC, datetime, timedelta

    from daemon.providers.early_answers import ANSWER_BOUND
    from ledger.delivery_reports import MAX_REPORT_BYTES

    mail = provider_for(servers, servers.smtp_port, timeout=10.0, username=RECIPIENT)
    filler = (b"x" * 76 + b"\r\n") * ((MAX_REPORT_BYTES - 4096) // 78)
    raws = [
        b"From: MAILER-DAEMON@example.test\r\nMessage-ID: <big-report-%d@example.test>\r\n"
        b'Content-Type: multipart/report; report-type=delivery-status; boundary="b"\r\n'
        b"\r\n--b\r\nContent-Type: text/plain\r\n\r\n%s\r\n--b--\r\n" % (n, filler)
        for n in range(ANSWER_BOUND // len(filler) + 1)
    ]
    assert all(len(raw) <= MAX_REPORT_BYTES for raw in raws)

    def append(client: Any) -> None:
        for raw in raws:
            client.append("INBOX", raw)

    def remove(client: Any) -> None:
        client.select_folder("INBOX")
        uids = client.search(["HEADER", "Message-ID", "big-report-"])
        client.delete_messages(uids)
        client.expunge()

    mail.imap.run(append, repeatable=False)
    try:
        read = mail.read_reports(
            datetime.now(UTC) - timedelta(days=1),
            known=(),
            max_bytes=MAX_REPORT_BYTES,
            limit=len(raws) + 10,
        )
        got = sorted(r.raw for r in read.found if r.raw and b"<big-report-" in r.raw)
        assert got == sorted(raws)
    finally:
        mail.imap.run(remove, repeatable=False)
        mail.close()


def test_an_unreadable_reply_after_the_final_dot_is_unknown(
    servers: MailServers, relay: SmtpFaultRelay
) -> None:
    """Postfix queues the message and answers 250; what reaches the client is one line
    longer than smtplib reads (8192 bytes), for which smtplib raises its own
    `SMTPResponseException(500, "Line too long.")`. That 500 is smtplib's, not the
    server's: the message may have been (here: was) accepted, so the outcome is Unknown,
    never a refusal."""
    mid = "<garbled-after-dot@sendledger.test>"
    relay.replace_reply(b"250 " + b"x" * 9000 + b"\r\n")
    # Not the module's TIMEOUT (made for the hangs): under a loaded CI run AUTH took longer,
    # the session ended before its end of data, and the test tested nothing.
    provider = provider_for(servers, relay.port, timeout=5.0)
    try:
        outcome = provider.send_raw(message(mid))
    finally:
        provider.close()
    seen = (outcome, relay.applied, relay.dropped_replies)
    assert relay.replaced_replies and relay.replaced_replies[0].startswith("250"), seen
    servers.wait_copies(mid, 1)
    assert outcome.kind is SendKind.UNKNOWN, outcome


def test_a_sent_copy_moved_to_the_trash_is_still_a_copy(servers: MailServers) -> None:
    """The sender moves the sent copy to the folder flagged \\Trash before the search (an
    IMAP client's delete). The message was sent: a miss would have the job resent (or a
    human's resend allowed) and the customer mailed twice. Gmail's search counts trashed
    copies too. A copy in the trash has no read-back id, and is marked as found there
    (alone, it sends an unknown outcome to review: it may have been received)."""
    mid = "<trashed-copy@sendledger.test>"
    provider = provider_for(servers, servers.smtp_port, timeout=5.0)  # not the hangs' TIMEOUT
    try:
        assert provider.send_raw(message(mid)).kind is SendKind.CONFIRMED
        servers.wait_copies(mid, 1)
        _to_the_trash(servers, "Sent", mid)
        assert servers.copies(mid, folder="Trash") == 1
        found = provider.search(mid)
        assert len(found.copies) == 1 and "Trash" in found.query
        assert found.hits[0].labels == ("Trash",) and found.only_in_trash
        with pytest.raises(ProviderError, match="trash"):
            provider.read_message_id(found.hits[0].provider_message_id)
    finally:
        provider.close()


def test_a_search_of_a_sent_folder_holding_many_copies_stops_reading_once_it_has_decided(
    servers: MailServers,
) -> None:
    """60 messages with the Message-ID in the sent folder, and one whose Message-ID only
    contains it (Dovecot matches substrings): the search fetches headers
    SEARCH_STOPS_AT at a time and stops once it has that many copies (before: every
    match's headers fetched, 60 copies kept)."""
    mid = "<many@sendledger.test>"
    provider = provider_for(servers, servers.smtp_port, timeout=5.0)
    try:
        sent = provider.imap.run(provider._sent_folder)
        near = message(f"<x{mid}>")  # a substring's match first: read, no copy
        provider.imap.run(lambda client: client.append(sent, near), repeatable=False)
        raw = message(mid)

        def append_copies(client: Any) -> None:
            for _ in range(60):
                client.append(sent, raw)

        provider.imap.run(append_copies, repeatable=False)
        found = provider.search(mid)
        assert found.count == SEARCH_STOPS_AT and not found.complete
        assert len(found.copies) == COPIES_KEPT
    finally:
        provider.close()


def test_a_message_to_its_own_sender_whose_received_copy_was_deleted_is_one_copy(
    servers: MailServers,
) -> None:
    """A job addressed to its own mailbox (an archive Bcc, a note to self): Postfix
    delivers a copy to the sender's INBOX beside the sent copy, and the person deletes
    the received one. In the trash beside a sent copy, it is no second send: counted, it
    made a false duplicate for review."""
    from imapclient import IMAPClient  # type: ignore[import-untyped]

    mid = "<to-self@sendledger.test>"
    provider = provider_for(servers, servers.smtp_port, timeout=5.0)
    try:
        assert provider.send_raw(message(mid, to=SENDER)).kind is SendKind.CONFIRMED
        servers.wait_copies(mid, 1)
        with IMAPClient("127.0.0.1", port=servers.imap_port, ssl=False) as client:
            client.login(SENDER, PASSWORD)
            deadline = time.monotonic() + 10
            while True:  # delivery through Postfix and LMTP takes a moment
                client.select_folder("INBOX")
                uids = client.search(["HEADER", "Message-ID", mid])
                if uids or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            assert len(uids) == 1
            client.copy(uids, "Trash")
            client.delete_messages(uids)
            client.expunge()
        assert servers.copies(mid, folder="Trash") == servers.copies(mid) == 1
        found = provider.search(mid)
        assert len(found.copies) == 1 and "Trash" not in found.query, found
        assert found.hits[0].labels == ()
    finally:
        provider.close()


def test_real_dovecot_finds_exactly_a_jobs_copy_among_the_ids_its_search_also_matches(
    servers: MailServers,
) -> None:
    """docs/providers.md "The Message-ID in each query", against the real receiver: for
    any key, the Message-ID the recipe makes is sent as `UID SEARCH HEADER Message-ID`,
    and Dovecot's answer, compared exactly, counts the job's one copy and none of its
    neighbours in the sent folder: the same id in upper case (another local part), one
    that contains it, one that extends its domain, and another key's. A neighbour
    counted would be a false duplicate; the copy missed, a resend."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from ledger.message_id import message_id_for

    provider = provider_for(servers, servers.smtp_port, timeout=5.0)
    examples = iter(range(1_000_000))

    @settings(max_examples=15)
    @given(st.text(min_size=1, max_size=40))
    def search_finds_one(key: str) -> None:
        # A domain of each example's own: an example drawn twice starts afresh.
        mid = message_id_for(key, f"n{next(examples)}.sendledger.test")
        neighbours = [
            mid.upper(),
            f"<x{mid}>",
            mid.replace(".test>", ".test.example>"),
            message_id_for(key + "x", "n.sendledger.test"),
        ]
        sent = provider.imap.run(provider._sent_folder)

        def append(client: Any) -> None:
            for each in [*neighbours, mid]:
                client.append(sent, message(each))

        provider.imap.run(append, repeatable=False)
        found = provider.search(mid)
        assert found.count == 1 and found.complete, (mid, found)
        assert found.hits[0].message_id_header == mid

    try:
        search_finds_one()
    finally:
        provider.close()


class _LostRequests(SmtpImapProvider):
    """Searches the real Dovecot; every send is a request that never reached Postfix (a
    timeout before the connection was made), Unknown to the daemon and sent to nobody."""

    def send_raw(self, raw: bytes) -> SendOutcome:
        return SendOutcome(SendKind.UNKNOWN, "timed out before the server answered")


def _to_the_trash(
    servers: MailServers, folder: str, message_id: str, *, arriving: bytes | None = None
) -> None:
    """The one message of the sender's `folder` with `message_id` (`arriving` put there
    first) deleted by an IMAP client: moved to the folder flagged \\Trash."""
    from imapclient import IMAPClient

    with IMAPClient("127.0.0.1", port=servers.imap_port, ssl=False) as client:
        client.login(SENDER, PASSWORD)
        if arriving is not None:
            client.append(folder, arriving)
        client.select_folder(folder)
        uids = client.search(["HEADER", "Message-ID", message_id])
        assert len(uids) == 1
        client.copy(uids, "Trash")
        client.delete_messages(uids)
        client.expunge()


def _received_and_deleted(servers: MailServers, message_id: str) -> None:
    """A message from someone else carrying `message_id` (anyone who knows a job's key
    can compute its Message-ID) lands in the sender's INBOX, and its user deletes it: it
    moves to the folder flagged \\Trash."""
    forged = message(message_id, to=SENDER)
    forged = forged.replace(f"From: {SENDER}".encode(), b"From: mallory@evil.example", 1)
    _to_the_trash(servers, "INBOX", message_id, arriving=forged)
    assert servers.copies(message_id, folder="Trash") == 1
    assert servers.copies(message_id) == 0  # never sent


def test_a_received_message_deleted_to_the_trash_sends_an_unknown_job_to_review(
    servers: MailServers,
) -> None:
    """The job's send never reached the server (Unknown); a message received with its
    Message-ID was deleted to the trash. Before, the search counted it as the job's copy
    and the job was Confirmed, never sent. Now the copy only in the trash goes to review
    (`only-in-trash`), neither Confirmed nor a miss, and nothing is sent."""
    from tests.unit.engine_rig import EngineRig, policy

    from daemon.doubles.fake_provider import FakeProvider
    from ledger.vocabulary import EscalationReason, JobState

    # Its SMTP port has no listener: nothing can be sent, whatever the test does.
    searched = provider_for(servers, free_port(), _LostRequests, name="fake", timeout=5.0)
    # The rig takes a FakeProvider's maker; this test uses only the port's calls.
    with EngineRig(
        policy("receipts", on_unknown="retry"),
        provider=lambda clock: cast(FakeProvider, searched),
    ) as rig:
        try:
            message_id = rig.submit("receipts", "k1")
            assert rig.tick().unknown == 1
            _received_and_deleted(servers, message_id)
            report = rig.advance_and_tick(60)  # search_after
            job = rig.job("k1")
            assert (report.searched, report.confirmed) == (1, 0)
            assert (job.state, job.reason) == (JobState.REVIEW, EscalationReason.ONLY_IN_TRASH)
            assert rig.events("k1")[-2:] == ["Unknown", "Escalated"]
            assert "only in the trash" in rig.ledger.history("k1")[-1].detail
        finally:
            searched.close()
    assert servers.copies(message_id) == 0


def test_copies_in_the_trash_are_marked_and_a_sent_copy_is_not(servers: MailServers) -> None:
    """The search marks each copy with where it was found: the sent folder's not in the
    trash, the trash's (searched only when the sent folder has none) in it."""
    mid = "<marked@sendledger.test>"
    provider = provider_for(servers, servers.smtp_port, timeout=5.0)
    try:
        _received_and_deleted(servers, mid)
        found = provider.search(mid)
        assert found.only_in_trash and [hit.in_trash for hit in found.hits] == [True]
        assert provider.send_raw(message(mid)).kind is SendKind.CONFIRMED
        servers.wait_copies(mid, 1)
        found = provider.search(mid)
        assert not found.only_in_trash and [hit.in_trash for hit in found.hits] == [False]
    finally:
        provider.close()


def test_postfixs_genuine_reports_pass_the_date_check(
    servers: MailServers, relay: SmtpFaultRelay, tmp_path: Path
) -> None:
    """The reports an outsider cannot write are still recorded where the original must
    quote the job's Date (`Provider.keeps_date`): Postfix's own, of a job whose first send
    ended Unknown (its reply after the final dot garbled; the search found the copy), and
    of a job to two recipients whose 60 kB message Postfix quotes by its headers alone
    (`text/rfc822-headers`, past its `bounce_size_limit`), the one gone recipient named."""
    mail = provider_for(servers, relay.port, timeout=5.0)
    policy = watching_policy("mail", SENDER)
    policies = PolicySet({"mail": policy})
    offset = timedelta(0)
    outcomes = Outcomes()
    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.sqlite'}")
    engine = Engine(
        ledger,
        PolicyHolder(lambda: policies, policies),
        {"mail": mail},
        provider_timeouts={"mail": 5.0},
        bounce_interval=0.05,
        daemon_name="it",
        observer=outcomes,
        clock=lambda: datetime.now(UTC) + offset,
    )
    deadline = time.monotonic() + 30.0
    try:
        body = ("x" * 70 + "\n") * 900  # 63 kB: past Postfix's bounce_size_limit (50 kB)
        fields = {"channel": "mail", "key": "several", "to": [RECIPIENT, GONE_RECIPIENT]}
        ledger.submit(parse_job({**fields, "subject": "s", "body": body}), policy.sender)
        while (row := ledger.row("several")).state != "confirmed":  # type: ignore[union-attr]
            assert time.monotonic() < deadline, row
            engine.tick()
        relay.replace_reply(b"250 " + b"x" * 9000 + b"\r\n")
        fields = {"channel": "mail", "key": "unknown-first", "to": GONE_RECIPIENT}
        ledger.submit(parse_job({**fields, "subject": "s", "body": "."}), policy.sender)
        while (row := ledger.row("unknown-first")).state != "confirmed":  # type: ignore[union-attr]
            assert time.monotonic() < deadline, row
            job = ledger.get_job("unknown-first")
            if row.state == "unknown" and job.due_at is not None:  # type: ignore[union-attr]
                # Its search is due when the index has caught up: the engine's clock
                # moves there (after both claims: a report's INTERNALDATE is real time),
                # once Postfix has delivered the copy it searches for (real time too: a
                # loaded machine's delivery can outlast the tick that searches).
                servers.wait_copies(job.message_id, 1)
                offset = max(offset, job.due_at - datetime.now(UTC) + timedelta(seconds=1))
            engine.tick()
        assert any(type(e).__name__ == "Unknown" for e in ledger.history("unknown-first"))

        def report_of(key: str) -> bytes | None:
            # Postfix's own, of this job (earlier tests left reports in the same INBOX).
            named = ledger.get_job(key).message_id.encode()
            found = [p.read_bytes() for p in servers.folder_files("sender", "INBOX")]
            mine = [r for r in found if b"MAILER-DAEMON" in r and named in r]
            return mine[0] if mine else None

        while (several := report_of("several")) is None or report_of("unknown-first") is None:
            assert time.monotonic() < deadline, "Postfix's reports never arrived"
            time.sleep(0.05)
        assert b"text/rfc822-headers" in several and b"x" * 70 not in several
        while not (bounces(ledger, "unknown-first") and bounces(ledger, "several")):
            assert time.monotonic() < deadline, outcomes.seen
            time.sleep(0.05)
            engine.tick()
        for key in ("unknown-first", "several"):
            [event] = bounces(ledger, key)
            assert [r["address"] for r in event.recipients] == [GONE_RECIPIENT]  # type: ignore[attr-defined]
        assert "other-date" not in outcomes.seen and "before-send" not in outcomes.seen
    finally:
        engine.close()
        ledger.close()
        mail.close()
