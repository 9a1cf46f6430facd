"""Delivery reports in a Gmail mailbox: GmailProvider.read_reports on the real client stack
against the emulator, which bounces chosen recipients as Gmail would (docs/providers.md
"Bounces"). What is read is counted at the emulator: its quota ledger and the relay's log.
These are emulator results, not a Gmail guarantee."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from tests.integration.bounce_checks import Mailboxes, run_report_before_send_check

from daemon.providers.base import ProviderError, SendKind
from daemon.providers.gmail import GmailProvider
from daemon.providers.quota import GMAIL_SEND_UNITS
from ledger.delivery_reports import MAX_REPORT_BYTES, DeliveryReport, read_report
from policies.model import ChannelPolicy
from testkit.dsn import rfc3464_report
from testkit.gmail_emulator import GmailEmulator
from testkit.relay import FaultPlan, FaultRelay

GmailProviderFactory = Callable[..., GmailProvider]
RawFactory = Callable[..., bytes]

MAILBOX = "support@example.com"
DOMAIN = "mail.example.com"
MID = f"<job-0123456789abcdef0123456789abcdef@{DOMAIN}>"
GONE = "nobody@gone.example"
SINCE = datetime.now(UTC) - timedelta(hours=1)
#: No fault here hangs: a generous timeout only keeps a loaded machine from failing a read.
CALL_TIMEOUT = 10.0


def _read(provider: GmailProvider, known: frozenset[str] = frozenset()) -> list[DeliveryReport]:
    result = provider.read_reports(SINCE, known=known, max_bytes=MAX_REPORT_BYTES, limit=50)
    assert result.complete
    reports = []
    for found in result.found:
        assert found.raw is not None
        parsed = read_report(found.raw, domains=[DOMAIN])
        assert isinstance(parsed, DeliveryReport), parsed
        reports.append(parsed)
    return reports


def _inject_reports(emulator: GmailEmulator, make_raw: RawFactory, count: int) -> None:
    """`count` reports in the mailbox's INBOX, each about another job."""
    for n in range(count):
        emulator.inject(
            rfc3464_report(make_raw(f"<job-{n:032x}@{DOMAIN}>", to=GONE), mailbox=MAILBOX,
                           recipient=GONE),
            labels=("INBOX",),
            user=MAILBOX,
        )  # fmt: skip


def test_both_report_shapes_are_found_read_and_name_the_message(
    gmail_provider: GmailProviderFactory, emulator: GmailEmulator, make_raw: RawFactory
) -> None:
    emulator.bounce = {GONE: "gmail", "@rfc.example": "rfc3464"}
    provider = gmail_provider(timeout=CALL_TIMEOUT)
    outcome = provider.send_raw(make_raw(MID, to=f"{GONE}, someone@rfc.example"))
    assert outcome.kind is SendKind.CONFIRMED
    reports = _read(provider)
    assert sorted(r.recipients[0].address for r in reports) == [GONE, "someone@rfc.example"]
    assert {r.original_message_id for r in reports} == {MID}
    assert all(r.permanent for r in reports)
    # The job's own search still counts one copy: a report is no copy of the message.
    assert len(provider.search(MID).hits) == 1


def test_a_read_downloads_only_reports_and_only_once(
    gmail_provider: GmailProviderFactory,
    emulator: GmailEmulator,
    relay: FaultRelay,
    make_raw: RawFactory,
) -> None:
    emulator.bounce = {GONE: "rfc3464"}
    provider = gmail_provider(timeout=CALL_TIMEOUT)
    provider.send_raw(make_raw(MID, to=GONE))
    # From the mailer daemon, but no report: its metadata says so, its bytes are not read.
    emulator.inject(
        b"From: MAILER-DAEMON@mx.example\r\nSubject: hello\r\nMessage-ID: <x@mx.example>\r\n"
        b"\r\nnot a report\r\n",
        labels=("INBOX",),
        user=MAILBOX,
    )
    # A real report, too large to read.
    big = rfc3464_report(make_raw(MID, to=GONE), mailbox=MAILBOX, recipient=GONE)
    big = big.replace(b"user unknown", b"user unknown" + b" x" * (MAX_REPORT_BYTES // 2))
    emulator.inject(big, labels=("INBOX",), user=MAILBOX)
    # Not from a mailer daemon: never listed.
    emulator.inject(
        rfc3464_report(make_raw(MID, to=GONE), mailbox=MAILBOX, recipient=GONE).replace(
            b"MAILER-DAEMON@mx.example.invalid", b"friend@example.net"
        ),
        labels=("INBOX",),
        user=MAILBOX,
    )
    first = provider.read_reports(SINCE, known=(), max_bytes=MAX_REPORT_BYTES, limit=50)
    assert len(first.listed) == 3
    kinds = sorted((f.content_type, f.raw is not None) for f in first.found)
    assert kinds == [("multipart/report", False), ("multipart/report", True), ("text/plain", False)]
    raw_reads = [e for e in relay.log if "format=raw" in e["path"]]
    assert len(raw_reads) == 1
    again = provider.read_reports(SINCE, known=first.listed, max_bytes=MAX_REPORT_BYTES, limit=50)
    assert again.listed == first.listed and again.found == ()
    assert [e for e in relay.log if "format=raw" in e["path"]] == raw_reads


def test_a_read_leaves_a_sends_worth_of_quota_and_says_it_stopped(
    gmail_provider: GmailProviderFactory, emulator: GmailEmulator, make_raw: RawFactory
) -> None:
    emulator.bounce = {GONE: "rfc3464"}
    # 120 units a second: one send (100) and four reads (5 each) at most.
    provider = gmail_provider(quota_units_per_second=120.0, clock=lambda: 0.0, timeout=CALL_TIMEOUT)
    provider.send_raw(make_raw(MID, to=GONE))  # 100 of the 120: 20 left, less than a send
    stopped = provider.read_reports(SINCE, known=(), max_bytes=MAX_REPORT_BYTES, limit=50)
    assert not stopped.complete and stopped.found == ()
    assert provider.quota_available() == 20.0  # nothing taken: a send's worth is not there
    # 110 units: the list (5) and the report's metadata (5) leave a send's worth; its
    # raw read would not, so it waits for the next read.
    fresh = gmail_provider(quota_units_per_second=110.0, clock=lambda: 0.0, timeout=CALL_TIMEOUT)
    read = fresh.read_reports(SINCE, known=(), max_bytes=MAX_REPORT_BYTES, limit=50)
    assert not read.complete and len(read.listed) == 1 and read.found == ()
    assert fresh.quota_available() == GMAIL_SEND_UNITS


def test_a_read_cut_short_by_429s_goes_on_where_it_stopped_and_finishes(
    gmail_provider: GmailProviderFactory,
    emulator: GmailEmulator,
    relay: FaultRelay,
    make_raw: RawFactory,
) -> None:
    """A mailbox whose reports take more pages than its rate limit lets through in a row:
    every third list or get is refused (429). Each read goes on from the page (and the
    reports) where the last one was refused, instead of listing from page 1 again (which
    never got past page 3): every report is read, each downloaded once."""
    reports = 6
    for n in range(reports):
        mid = f"<job-{n:032x}@{DOMAIN}>"
        emulator.inject(
            rfc3464_report(make_raw(mid, to=GONE), mailbox=MAILBOX, recipient=GONE),
            labels=("INBOX",),
            user=MAILBOX,
        )
    relay.set_plan(FaultPlan(search=["pass", "pass", "429"] * 40))
    provider = gmail_provider(timeout=CALL_TIMEOUT, page_size=1)
    known: set[str] = set()
    failed = 0
    progressed = []
    for _ in range(20):
        try:
            read = provider.read_reports(SINCE, known=known, max_bytes=MAX_REPORT_BYTES, limit=50)
        except ProviderError as exc:
            assert exc.unavailable
            failed += 1
            progressed.append(exc.progressed)
            continue
        known |= {found.provider_id for found in read.found}
        if read.complete:
            break
    else:
        raise AssertionError(f"never complete: {len(known)} of {reports} read")
    assert failed > 0 and len(known) == reports and len(read.listed) == reports
    raw_reads = [e for e in relay.log if "format=raw" in e["path"] and e["mode"] == "pass"]
    assert len(raw_reads) == reports
    # A refused read that listed pages first says so (the engine counts it as progress);
    # one refused at its first call got nowhere.
    assert True in progressed
    relay.set_plan(FaultPlan(search=["429"]))
    with pytest.raises(ProviderError) as refused:
        provider.read_reports(SINCE, known=known, max_bytes=MAX_REPORT_BYTES, limit=50)
    assert refused.value.unavailable and not refused.value.progressed


def test_a_read_whose_scope_moved_makes_no_further_call_and_goes_on_later(
    gmail_provider: GmailProviderFactory,
    emulator: GmailEmulator,
    relay: FaultRelay,
    make_raw: RawFactory,
) -> None:
    """A read of many calls asks before each whether the mailbox's quota scope is still
    the daemon's (`may_go_on`): once it is not, no further call is made (two daemons
    reading one mailbox would spend its quota twice) and the read says it is incomplete;
    a later read goes on from there."""
    reports = 4
    _inject_reports(emulator, make_raw, reports)
    provider = gmail_provider(timeout=CALL_TIMEOUT, page_size=1)
    asked = 0

    def ours_for_three_calls() -> bool:
        nonlocal asked
        asked += 1
        return asked <= 3

    stopped = provider.read_reports(
        SINCE, known=(), max_bytes=MAX_REPORT_BYTES, limit=50, may_go_on=ours_for_three_calls
    )
    calls = [e for e in relay.log if e["kind"] == "search"]
    assert len(calls) == 3 and not stopped.complete and len(stopped.listed) == 3
    rest = provider.read_reports(SINCE, known=(), max_bytes=MAX_REPORT_BYTES, limit=50)
    assert rest.complete and len(rest.listed) == reports and len(rest.found) == reports
    lists = [e for e in relay.log if e["kind"] == "search" and "pageToken" not in e["path"]]
    assert len([e for e in lists if "/messages?" in e["path"]]) == 1  # page 1 listed once


def test_a_stopped_read_forgotten_lists_afresh(
    gmail_provider: GmailProviderFactory,
    emulator: GmailEmulator,
    relay: FaultRelay,
    make_raw: RawFactory,
) -> None:
    """The engine reads the mailbox no more (its channel was removed by a reload): what a
    stopped read kept (its page, its ids) is dropped (`forget_report_reads`), not kept
    for ever, and a read made later lists the mailbox again from page 1."""
    _inject_reports(emulator, make_raw, 2)
    provider = gmail_provider(timeout=CALL_TIMEOUT, page_size=1)
    calls = iter([True])  # page 1, then the scope is another daemon's

    stopped = provider.read_reports(
        SINCE, known=(), max_bytes=MAX_REPORT_BYTES, limit=50,
        may_go_on=lambda: next(calls, False),
    )  # fmt: skip
    assert not stopped.complete and len(stopped.listed) == 1
    assert provider.report_calls.kept() == 1  # it would go on from page 2
    provider.forget_report_reads()
    assert provider.report_calls.kept() == 0
    again = provider.read_reports(SINCE, known=(), max_bytes=MAX_REPORT_BYTES, limit=50)
    assert again.complete and len(again.found) == 2
    lists = [e for e in relay.log if e["kind"] == "search" and "/messages?" in e["path"]]
    assert len([e for e in lists if "pageToken" not in e["path"]]) == 2  # page 1, afresh


def test_a_report_received_before_the_jobs_first_attempt_is_refused(
    gmail_provider: GmailProviderFactory, emulator: GmailEmulator, tmp_path: Path
) -> None:
    """A forger who guessed a job's key mails its report before the job is sent: Gmail's
    internalDate of it is older than the job's first attempt, so the engine refuses it;
    the same report received after the attempt is recorded."""
    policy = ChannelPolicy.model_validate(
        {
            "channel": "mail",
            "provider": "gmail",
            "from": MAILBOX,
            "message_id_domain": DOMAIN,
            "watch_bounces": "1h",
        }
    )

    def deliver_at(raw: bytes, at: float | None = None) -> str:
        return emulator.inject(raw, labels=("INBOX",), user=MAILBOX, received=at)

    run_report_before_send_check(
        tmp_path,
        Mailboxes(
            providers={"gmail": gmail_provider(timeout=CALL_TIMEOUT)},
            policies=[policy],
            mailbox=MAILBOX,
            gone=GONE,
            ok="customer@example.net",
            deliver=deliver_at,
            bounce_arrived=lambda: True,
        ),
        deliver_at,
    )
    # What the engine read it by: the report's internalDate, as the provider says it.
    read = gmail_provider(timeout=CALL_TIMEOUT).read_reports(
        SINCE, known=(), max_bytes=MAX_REPORT_BYTES, limit=50
    )
    received = sorted(f.received_at for f in read.found if f.received_at is not None)
    assert len(received) == len(read.found) == 2
    assert received[1] - received[0] >= timedelta(minutes=10)


def test_a_report_whose_internal_date_is_no_time_is_read_unchecked(
    gmail_provider: GmailProviderFactory, emulator: GmailEmulator, make_raw: RawFactory
) -> None:
    # An internalDate beyond the years a datetime holds failed the whole read (ValueError,
    # no ProviderError): the mailbox's reports were then never read again.
    report = rfc3464_report(make_raw(MID, to=GONE), mailbox=MAILBOX, recipient=GONE)
    emulator.inject(report, labels=("INBOX",), user=MAILBOX, received=999_999_999_999.0)
    read = gmail_provider(timeout=CALL_TIMEOUT).read_reports(
        SINCE, known=(), max_bytes=MAX_REPORT_BYTES, limit=50
    )
    [found] = read.found
    assert found.raw is not None and found.received_at is None
