"""Gmail with `user = "{from}"` (domain-wide delegation) against the emulator, with the
real google-api-python-client and google-auth: each job acts as its own From mailbox,
counted in the emulator's per-user mailboxes (docs/providers.md, "Providers")."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from email.message import EmailMessage
from pathlib import Path

import pytest

from daemon.bootstrap import build_provider
from daemon.config.settings import ConfigError, settings_from_dict
from daemon.doubles.fake_time import FakeTime
from daemon.providers.base import SendKind, for_job
from daemon.providers.gmail import DelegationRequired, GmailProvider
from daemon.providers.mailboxes import IDLE_AFTER
from daemon.tools.probe import run_probe
from testkit.credentials import write_authorized_user, write_service_account
from testkit.gmail_emulator import GmailEmulator
from testkit.relay import FaultPlan, FaultRelay

MAILBOXES = ("alice@example.com", "bob@example.com", "carol@example.com")


def raw_from(sender: str, message_id: str) -> bytes:
    msg = EmailMessage()
    msg["From"] = sender
    msg["To"] = "customer@example.net"
    msg["Subject"] = "Receipt"
    msg["Message-ID"] = message_id
    msg.set_content("Thank you.\n")
    return msg.as_bytes()


def mid(n: int) -> str:
    return f"<job-{n:032x}@mail.example.com>"


def delegating(url: str, credentials: Path, **kwargs: object) -> GmailProvider:
    options = {"timeout": 0.5, "quota_units_per_second": 1e6, **kwargs}
    return GmailProvider(
        "gmail",
        credentials_file=credentials,
        user="{from}",
        api_endpoint=url,
        **options,  # type: ignore[arg-type]
    )


@pytest.fixture
def sa_file(tmp_path: Path, emulator: GmailEmulator) -> Path:
    return write_service_account(tmp_path / "sa.json", token_uri=emulator.token_uri)


def test_each_job_lands_in_its_own_mailbox_once(emulator: GmailEmulator, sa_file: Path) -> None:
    provider = delegating(emulator.url, sa_file)
    try:
        for n, mailbox in enumerate(MAILBOXES):
            view = for_job(provider, f"Shop <{mailbox}>", None)
            outcome = view.send_raw(raw_from(f"Shop <{mailbox}>", mid(n)))
            assert outcome.kind is SendKind.CONFIRMED, outcome
        users = {entry["message_id"]: entry["user"] for entry in emulator.accepted()}
        assert users == {mid(n): mailbox for n, mailbox in enumerate(MAILBOXES)}
        for n, mailbox in enumerate(MAILBOXES):
            own = for_job(provider, mailbox, None).search(mid(n))
            assert len(own.copies) == 1
            other = MAILBOXES[(n + 1) % len(MAILBOXES)]
            assert for_job(provider, other, None).search(mid(n)).copies == []
        # One token per mailbox, each for its own subject.
        subjects = sorted(str(r.get("sub")) for r in emulator.token_requests)
        assert subjects == sorted(MAILBOXES)
    finally:
        provider.close()


def test_a_mailbox_dropped_when_idle_comes_back_with_its_token(
    emulator: GmailEmulator, sa_file: Path
) -> None:
    """docs/performance.md "Many mailboxes, one daemon": an idle mailbox is dropped, and
    when it sends again within the hour it uses the token it had (one token request per
    subject at the emulator); once that token expired, it fetches a new one."""
    time = FakeTime(0.0)
    provider = delegating(emulator.url, sa_file, clock=time, sleep=time.sleep)
    try:
        for n, mailbox in enumerate(MAILBOXES[:2]):
            outcome = for_job(provider, mailbox, None).send_raw(raw_from(mailbox, mid(n)))
            assert outcome.kind is SendKind.CONFIRMED, outcome
        time.now = IDLE_AFTER
        assert provider.forget_idle() == 2 and len(provider.mailboxes) == 0
        outcome = for_job(provider, MAILBOXES[0], None).send_raw(raw_from(MAILBOXES[0], mid(9)))
        assert outcome.kind is SendKind.CONFIRMED, outcome
        subjects = sorted(str(r.get("sub")) for r in emulator.token_requests)
        assert subjects == sorted(MAILBOXES[:2])  # the token came back with its mailbox
        assert provider.kept_tokens() == 1  # bob's
        time.now += 3600.0  # bob's token expired: forgotten; alice's entry dropped
        assert provider.forget_idle() == 1
        assert provider.kept_tokens() == 1  # alice's, which the clock of google-auth holds live
    finally:
        provider.close()


def test_ambiguous_send_is_reconciled_in_the_right_mailbox(
    emulator: GmailEmulator, sa_file: Path
) -> None:
    with FaultRelay(emulator.url, plan=FaultPlan(send="drop-response"), hang_seconds=1.5) as relay:
        provider = delegating(relay.url, sa_file)
        try:
            outcome = for_job(provider, MAILBOXES[1], None).send_raw(raw_from(MAILBOXES[1], mid(7)))
            assert outcome.kind is SendKind.UNKNOWN, outcome
            relay.set_plan(FaultPlan())
            assert len(for_job(provider, MAILBOXES[1], None).search(mid(7)).copies) == 1
            assert for_job(provider, MAILBOXES[0], None).search(mid(7)).copies == []
            assert emulator.copies(mid(7)) == 1
        finally:
            provider.close()


def test_thread_id_reaches_gmail(emulator: GmailEmulator, sa_file: Path) -> None:
    first = emulator.inject(raw_from(MAILBOXES[0], mid(1)), user=MAILBOXES[0])
    thread = next(e["threadId"] for e in emulator.accepted() if e["id"] == first)
    provider = delegating(emulator.url, sa_file)
    try:
        outcome = for_job(provider, MAILBOXES[0], thread).send_raw(raw_from(MAILBOXES[0], mid(2)))
        assert outcome.kind is SendKind.CONFIRMED, outcome
        sent = next(e for e in emulator.accepted() if e["message_id"] == mid(2))
        assert sent["threadId"] == thread
    finally:
        provider.close()


def test_a_mailbox_token_cannot_act_as_another(emulator: GmailEmulator, sa_file: Path) -> None:
    provider = delegating(emulator.url, sa_file)
    try:
        view = for_job(provider, MAILBOXES[0], None)
        # Force the wrong userId with alice's token: the emulator refuses it (403).
        bob = provider.mailbox(MAILBOXES[1])
        alice = provider.mailbox(MAILBOXES[0])
        wrong = type(bob)(bob.user, alice.credentials, bob.bucket, bob.departures)
        outcome = provider.send_as(wrong, raw_from(MAILBOXES[1], mid(3)), None)
        assert outcome.kind is SendKind.REJECTED and outcome.status == 403, outcome
        assert view.send_raw(raw_from(MAILBOXES[0], mid(4))).kind is SendKind.CONFIRMED
        assert emulator.copies(mid(3)) == 0
    finally:
        provider.close()


def test_emulator_enforces_each_mailboxs_quota(tmp_path: Path) -> None:
    with GmailEmulator(user_quota=250.0, clock=lambda: 1000.0) as emu:
        sa = write_service_account(tmp_path / "sa.json", token_uri=emu.token_uri)
        provider = delegating(emu.url, sa)
        try:
            alice = for_job(provider, MAILBOXES[0], None)
            kinds = [alice.send_raw(raw_from(MAILBOXES[0], mid(n))).kind for n in range(3)]
            assert kinds == [SendKind.CONFIRMED, SendKind.CONFIRMED, SendKind.REJECTED]
            bob = for_job(provider, MAILBOXES[1], None)
            assert bob.send_raw(raw_from(MAILBOXES[1], mid(9))).kind is SendKind.CONFIRMED
            usage = emu.usage()
            assert usage[MAILBOXES[0]].max_units_per_second == 200.0
            assert emu.quota_refusals == 1
        finally:
            provider.close()


def test_from_placeholder_needs_a_service_account(tmp_path: Path, emulator: GmailEmulator) -> None:
    user_file = write_authorized_user(tmp_path / "user.json", token_uri=emulator.token_uri)
    with pytest.raises(DelegationRequired, match="service_account"):
        delegating(emulator.url, user_file)


def test_build_provider_names_the_user_field(tmp_path: Path, emulator: GmailEmulator) -> None:
    write_authorized_user(tmp_path / "user.json", token_uri=emulator.token_uri)
    settings = settings_from_dict(
        {
            "store": {"url": f"sqlite:///{tmp_path / 'ledger.sqlite'}"},
            "providers": {
                "many": {"credentials_file": str(tmp_path / "user.json"), "user": "{from}"}
            },
        }
    )
    with pytest.raises(ConfigError, match=r"^providers\.many\.user: .*service_account"):
        build_provider(settings, "many")


def test_probe_acts_as_the_from_mailbox(emulator: GmailEmulator, sa_file: Path) -> None:
    provider = delegating(emulator.url, sa_file)
    try:
        result = run_probe(
            provider, sender=MAILBOXES[2], to="me@example.net", max_wait=5.0, interval=0.01
        )
    finally:
        provider.close()
    assert result["found"] and result["copies"] == 1, result
    assert [e["user"] for e in emulator.accepted()] == [MAILBOXES[2]]


def test_a_bucket_of_one_send_reserves_it_and_each_mailbox_reads_its_own_history(
    emulator: GmailEmulator, sa_file: Path
) -> None:
    """docs/providers.md "What each handle proves": with "{from}" a mailbox's bucket holds
    one send, so a claim's mark is not reserved with it (101 units would never fit) but
    fetched with its own unit; a dropped reply is found in its own mailbox's history."""
    provider = delegating(emulator.url, sa_file, quota_units_per_second=250.0)
    try:
        alice, bob = (for_job(provider, f"Shop <{m}>", None) for m in MAILBOXES[:2])
        assert alice.reserve_send() == 0.0
        history, bob_history = alice.history(), bob.history()
        assert history is not None and bob_history is not None
        mark = history.history_mark()
        assert mark is not None and emulator.route_counts["profile"] == 1
        outcome = alice.send_raw(raw_from(f"Shop <{MAILBOXES[0]}>", mid(1)))
        assert outcome.kind is SendKind.CONFIRMED, outcome
        assert len(history.sent_since(mark, mid(1)).copies) == 1
        assert bob_history.sent_since(mark, mid(1)).copies == []
    finally:
        provider.close()


def test_a_bucket_of_one_send_still_reads_its_mailbox_s_reports(
    emulator: GmailEmulator, sa_file: Path
) -> None:
    """docs/providers.md "Bounces": a read leaves a send's worth of quota where the bucket
    holds more than a send; with "{from}" it holds one send, and the read is paid as it
    comes (it stopped at once, for good, while it waited for a send's worth it never had)."""
    emulator.bounce = {"nobody@gone.example": "rfc3464"}
    provider = delegating(emulator.url, sa_file, quota_units_per_second=250.0)
    try:
        alice = for_job(provider, f"Shop <{MAILBOXES[0]}>", None)
        message = raw_from(f"Shop <{MAILBOXES[0]}>", mid(7)).replace(
            b"customer@example.net", b"nobody@gone.example"
        )
        assert alice.send_raw(message).kind is SendKind.CONFIRMED
        time.sleep(0.5)  # the bucket refills (250 units a second): a send's worth again
        since = datetime.now(UTC) - timedelta(hours=1)
        read = alice.read_reports(since, known=(), max_bytes=1 << 20, limit=10)
        assert read.complete and len(read.found) == 1 and read.found[0].raw is not None
    finally:
        provider.close()
