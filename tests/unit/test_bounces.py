"""Bounces on the job (docs/how-it-works.md "Bounces"): the watch a confirmation starts and
its end, one read per mailbox per interval for every watched job, a report recorded once
(read again, after a restart, by a second daemon), attributed only within its own mailbox,
never a change of what was sent, and a channel that sends a permanent bounce to review.
The engine on the memory store and the fake provider's inbox, time injected."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from datetime import datetime, timedelta
from typing import Any

import pytest
from tests.unit.engine_rig import EngineRig, policy, receipt
from tests.unit.meanwhile import Meanwhile

from daemon.doubles.fake_provider import FakeProvider, Scripted
from daemon.engine import Engine, PolicyHolder
from daemon.engine.bounces import SAVE_TRIES
from daemon.providers.outcomes import ReportRead
from daemon.service_layer.read_models import event_record, timeline_details
from daemon.service_layer.services import ChannelPolicies, Services
from daemon.webhooks.events import payload, type_of
from ledger.application import ConcurrentUpdate
from ledger.decision_types import RecordBounce
from ledger.delivery_reports import DeliveryReport, read_report
from ledger.job import BounceRefused, SendJob, TransitionError
from ledger.stores.index import mailbox_digest
from ledger.vocabulary import JobState, Resolution
from policies.loader import PolicySet
from testkit.dsn import rfc3464_report

TO = "customer@example.net"
MAILBOX = "support@example.com"
HOUR = 3600.0
INTERVAL = 60.0  # the default daemon.bounce_interval


def original(message_id: str, to: str = TO) -> bytes:
    return f"From: {MAILBOX}\r\nTo: {to}\r\nMessage-ID: {message_id}\r\n\r\nhi\r\n".encode()


def bounce_of(message_id: str, to: str = TO, **kwargs: str) -> bytes:
    return rfc3464_report(original(message_id, to), mailbox=MAILBOX, recipient=to, **kwargs)


def bounced(rig: EngineRig, key: str) -> list[SendJob.Bounced]:
    return [e for e in rig.ledger.history(key) if isinstance(e, SendJob.Bounced)]


def calls_of(rig: EngineRig, method: str) -> list[str]:
    """The argument of each call of the rig's ledger's `method` from now on."""
    calls: list[str] = []
    original = getattr(rig.ledger, method)

    def counted(argument: str) -> Any:
        calls.append(argument)
        return original(argument)

    setattr(rig.ledger, method, counted)
    return calls


def engine_of(rig: EngineRig, name: str, **options: Any) -> Engine:
    """Another engine on the rig's store, provider and clock, built with `options`; closed
    with the rig."""
    engine = Engine(
        rig.ledger,
        rig.holder,
        {"fake": rig.provider},
        provider_timeouts={"fake": 10.0},
        clock=rig.clock,
        elapsed=rig.clock.elapsed,
        daemon_name=name,
        **options,
    )
    return rig.own(engine)


@pytest.fixture
def rig() -> Iterator[EngineRig]:
    with EngineRig(
        policy("receipts", watch_bounces="1h"),
        policy("legal", watch_bounces="1h", on_bounce="review"),
        policy("plain"),
    ) as rig:
        yield rig


MakeRig = Callable[..., EngineRig]


@pytest.fixture
def make_rig() -> Iterator[MakeRig]:
    """Rigs a test builds on its own policies, each closed after the test."""
    with contextlib.ExitStack() as rigs:
        yield lambda *policies: rigs.enter_context(EngineRig(*policies))


def test_a_report_is_recorded_once_read_after_read_and_after_a_restart(rig: EngineRig) -> None:
    mid = rig.submit("receipts", "r-1")
    rig.tick()
    assert rig.events("r-1")[-2:] == ["Confirmed", "WatchingBounces"]
    rig.provider.deliver(bounce_of(mid))
    report = rig.advance_and_tick(INTERVAL)
    assert report.bounced == 1
    for _ in range(3):
        rig.advance_and_tick(INTERVAL)
    rig.restart()  # what was read is forgotten; the job refuses the report again
    rig.advance_and_tick(INTERVAL)
    [event] = bounced(rig, "r-1")
    assert event.recipients[0]["address"] == TO and event.permanent
    assert event.dsn_id.startswith("<") and event.provider_message_id.startswith("inbox-")
    job = rig.job("r-1")
    assert job.state is JobState.CONFIRMED and job.attempts == 1
    assert rig.provider.reports_fetched == 2  # once per daemon: the second read knew it


def test_one_read_per_mailbox_per_interval_serves_every_watched_job(rig: EngineRig) -> None:
    mids = [rig.submit("receipts", f"r-{n}") for n in range(30)]
    rig.tick()
    reads = rig.provider.report_reads
    assert reads == 1  # thirty watched jobs, one mailbox: one read
    for mid in mids[:5]:
        rig.provider.deliver(bounce_of(mid))
    for _ in range(5):
        rig.advance_and_tick(INTERVAL / 5)  # five ticks inside one interval
    assert rig.provider.report_reads == reads + 1
    assert sum(len(bounced(rig, f"r-{n}")) for n in range(30)) == 5


def test_a_channel_without_a_watch_reads_nothing(rig: EngineRig) -> None:
    mid = rig.submit("plain", "p-1")
    rig.tick()
    rig.provider.deliver(bounce_of(mid))
    rig.advance_and_tick(INTERVAL)
    assert rig.provider.report_reads == 0 and bounced(rig, "p-1") == []
    assert rig.ledger.watched() == []


def test_the_watch_ends_and_the_job_is_purgeable_then(rig: EngineRig) -> None:
    rig.submit("receipts", "r-1")
    rig.tick()
    [watched] = rig.ledger.watched()
    assert (watched.channel, watched.jobs, watched.example_key) == ("receipts", 1, "r-1")
    assert watched.mailbox == mailbox_digest(MAILBOX, "fake") and MAILBOX not in watched.mailbox
    assert not rig.job("r-1").purgeable
    with pytest.raises(TransitionError, match="bounce watch"):
        rig.job("r-1").purge(by="op", rule="test", at=rig.clock())
    rig.advance_and_tick(HOUR + 1)
    # It ends once a read begun after its end (and the clock margin) went through the
    # mailbox: at most two intervals later.
    assert rig.events("r-1")[-1] == "WatchingBounces"
    rig.advance_and_tick(INTERVAL)
    rig.advance_and_tick(INTERVAL)
    assert rig.events("r-1")[-1] == "BounceWatchEnded"
    assert rig.ledger.watched() == [] and rig.job("r-1").purgeable
    row = rig.ledger.row("r-1")
    assert row is not None and row.due_at is None and row.watch_mailbox is None
    rig.advance_and_tick(INTERVAL)
    assert rig.provider.report_reads == 0 or rig.ledger.watched() == []


def test_a_report_before_the_confirmation_waits_for_it(make_rig: MakeRig) -> None:
    """The bounce arrived while the send's outcome was still unknown: it is recorded once
    the search confirms the job."""
    rig = make_rig(policy("receipts", watch_bounces="1h", search_after="5m"))
    rig.provider.script(Scripted.dropped_response())
    mid = rig.submit("receipts", "r-1")
    rig.tick()  # r-1 alone: with two workers, r-2 could take the scripted fate
    assert rig.job("r-1").state is JobState.UNKNOWN
    rig.submit("receipts", "r-2")  # confirmed at once: the mailbox is watched meanwhile
    rig.tick()
    assert rig.job("r-2").state is JobState.CONFIRMED
    rig.provider.deliver(bounce_of(mid))
    rig.advance_and_tick(INTERVAL)
    assert rig.provider.report_reads >= 1 and bounced(rig, "r-1") == []
    rig.advance_and_tick(300)  # search_after: the search confirms r-1; the next read
    assert rig.job("r-1").state is JobState.CONFIRMED
    assert len(bounced(rig, "r-1")) == 1
    assert rig.provider.reports_fetched == 1  # the waiting report was not read again


def test_forgeries_put_nothing_on_any_job(rig: EngineRig) -> None:
    mid = rig.submit("receipts", "r-1")
    plain = rig.submit("plain", "p-1")
    rig.tick()
    for raw in (
        bounce_of(mid.replace("mail.example.com", "evil.example")),  # not ours
        bounce_of(mid, to="someone-else@example.net"),  # not one of its recipients
        bounce_of(plain),  # a job whose bounces are not watched
        bounce_of(mid, status="2.0.0", action="delivered"),  # no failure
        bounce_of(mid) + b"x" * (3 * 1024 * 1024),  # too large
    ):
        rig.provider.deliver(raw)
    rig.advance_and_tick(INTERVAL)
    assert bounced(rig, "r-1") == [] and bounced(rig, "p-1") == []


def test_a_report_in_another_mailbox_is_not_its_jobs(make_rig: MakeRig) -> None:
    """Two providers, two mailboxes: a report in the second naming a job of the first is
    refused, however well formed."""
    rig = make_rig(policy("receipts", watch_bounces="1h"))
    second = FakeProvider("second", clock=rig.clock)
    policies = PolicySet(
        {
            "receipts": policy("receipts", watch_bounces="1h"),
            "other": policy("other", provider="second", watch_bounces="1h"),
        }
    )
    engine = rig.own(
        Engine(
            rig.ledger,
            PolicyHolder(lambda: policies, policies),
            {"fake": rig.provider, "second": second},
            provider_timeouts={"fake": 10.0, "second": 10.0},
            clock=rig.clock,
            elapsed=rig.clock.elapsed,
            daemon_name="two",
        )
    )
    mid = rig.submit("receipts", "r-1")
    rig.ledger.submit(receipt("other", "o-1"), policies["other"].sender)
    engine.tick()
    second.deliver(bounce_of(mid))  # r-1's report, in the other mailbox
    rig.clock.advance(INTERVAL)
    engine.tick()
    assert bounced(rig, "r-1") == [] and second.report_reads >= 1
    rig.provider.deliver(bounce_of(mid))  # in its own mailbox
    rig.clock.advance(INTERVAL)
    engine.tick()
    assert len(bounced(rig, "r-1")) == 1
    engine.close()


def test_a_permanent_bounce_goes_to_review_on_a_review_channel_and_is_never_resent(
    rig: EngineRig,
) -> None:
    mid = rig.submit("legal", "l-1")
    rig.tick()
    rig.provider.deliver(bounce_of(mid, status="4.4.7", action="delayed"))
    rig.advance_and_tick(INTERVAL)
    assert rig.job("l-1").state is JobState.CONFIRMED  # a delay is recorded, no more
    rig.provider.deliver(bounce_of(mid))
    rig.advance_and_tick(INTERVAL)
    job = rig.job("l-1")
    assert [e.permanent for e in bounced(rig, "l-1")] == [False, True]
    assert job.state is JobState.REVIEW and job.reason == "bounced"
    assert job.provider_message_ids and job.attempts == 1
    with pytest.raises(TransitionError, match="resolve as sent or abandon"):
        job.resolve(Resolution.RESEND, note="", by="op", at=rig.clock())
    rig.ledger.update(
        "l-1", lambda j: j.resolve(Resolution.SENT, note="address fixed", by="op", at=rig.clock())
    )
    assert rig.job("l-1").state is JobState.CONFIRMED
    assert rig.provider.sends == 1


def test_the_aggregate_refuses_what_is_not_a_bounce_of_this_watched_job(rig: EngineRig) -> None:
    mid = rig.submit("receipts", "r-1")
    rig.tick()
    job = rig.job("r-1")
    found = read_report(bounce_of(mid), domains=["mail.example.com"])
    assert isinstance(found, DeliveryReport)
    decision = RecordBounce(policy("receipts").ref)
    job.record_bounce(found, provider_message_id="x", decision=decision, at=rig.clock())
    with pytest.raises(BounceRefused, match="recorded already"):
        job.record_bounce(found, provider_message_id="y", decision=decision, at=rig.clock())
    other = read_report(bounce_of(mid, to="nobody@example.org"), domains=["mail.example.com"])
    assert isinstance(other, DeliveryReport)
    with pytest.raises(BounceRefused, match="recipient"):
        job.record_bounce(other, provider_message_id="z", decision=decision, at=rig.clock())
    rig.clock.advance(HOUR + 1)
    job.end_bounce_watch(at=rig.clock())
    fresh = read_report(
        bounce_of(mid).replace(b"reports.example", b"late.example"), domains=["mail.example.com"]
    )
    assert isinstance(fresh, DeliveryReport)
    with pytest.raises(BounceRefused, match="not watched"):
        job.record_bounce(fresh, provider_message_id="w", decision=decision, at=rig.clock())


def test_two_daemons_reading_one_mailbox_record_a_report_once(rig: EngineRig) -> None:
    mids = [rig.submit("receipts", f"r-{n}") for n in range(6)]
    rig.tick()
    other = rig.new_engine("other-daemon")
    for mid in mids:
        rig.provider.deliver(bounce_of(mid))
    rig.clock.advance(INTERVAL)
    first, second = rig.engine.hand_out(), other.hand_out()
    rig.engine.settle()
    other.settle()
    assert all(len(bounced(rig, f"r-{n}")) == 1 for n in range(6))
    other.close()
    assert first.errors == second.errors == 0


def test_a_failed_read_is_waited_out_and_counts_toward_the_circuit(rig: EngineRig) -> None:
    mid = rig.submit("receipts", "r-1")
    rig.tick()
    rig.provider.fail_reads(1)
    rig.provider.deliver(bounce_of(mid))
    rig.clock.advance(INTERVAL)
    assert rig.engine.tick().errors == 1
    assert bounced(rig, "r-1") == []
    rig.advance_and_tick(INTERVAL)
    assert len(bounced(rig, "r-1")) == 1


def test_no_read_while_a_send_of_its_mailbox_waits(rig: EngineRig) -> None:
    rig.submit("receipts", "r-1")
    rig.tick()
    reads = rig.provider.report_reads
    engine = rig.engine
    engine.bounces._sends_waiting = lambda scope: 1  # a send of the mailbox is queued
    rig.clock.advance(INTERVAL)
    engine.tick()
    assert rig.provider.report_reads == reads


def test_the_webhook_says_bounced_with_a_code_and_the_reports_words(rig: EngineRig) -> None:
    mid = rig.submit("receipts", "r-1")
    rig.tick()
    rig.provider.deliver(bounce_of(mid))
    rig.advance_and_tick(INTERVAL)
    [event] = bounced(rig, "r-1")
    assert type_of(event, ["bounced"]) == "bounced" and type_of(event, ["confirmed"]) is None
    body = payload("bounced", rig.job("r-1"), event, "evt_x")
    assert (body["type"], body["reason"], body["state"]) == ("bounced", "permanent", "confirmed")
    assert body["detail"].startswith(f"5.1.1 {TO}: smtp; 550")


def test_a_watch_starts_after_the_confirmation_only() -> None:
    base = policy("receipts", watch_bounces="1h")
    assert base.watch_bounces == HOUR
    with pytest.raises(ValueError, match="needs watch_bounces"):
        policy("receipts", on_bounce="review")
    assert policy("receipts").fingerprint == policy("receipts", on_bounce="record").fingerprint
    assert timedelta(seconds=base.watch_bounces) == timedelta(hours=1)


def test_the_job_page_says_what_the_report_says_and_metrics_count_it(rig: EngineRig) -> None:
    from daemon.api.metrics import Metrics, Sources

    metrics = Metrics(Sources(rig.ledger, {}))
    engine = engine_of(rig, "metrics", observer=metrics)
    mid = rig.submit("receipts", "r-1")
    engine.tick()
    rig.provider.deliver(bounce_of(mid))
    rig.provider.deliver(bounce_of(mid.replace("mail.example.com", "evil.example")))
    rig.clock.advance(INTERVAL)
    engine.tick()
    engine.close()
    [record] = [event_record(e) for e in bounced(rig, "r-1")]
    details = dict(timeline_details(record))
    assert details["recipients"] == f"5.1.1 {TO}: smtp; 550 5.1.1 user unknown"
    assert details["permanent"] == "true" and details["dsn_id"].startswith("<")
    text = metrics.render().decode()
    assert 'sendledger_bounces_total{kind="permanent",verified="false"} 1.0' in text
    assert 'sendledger_bounce_reports_total{outcome="recorded"} 1.0' in text
    assert 'sendledger_bounce_reports_total{outcome="not-ours"} 1.0' in text


def test_a_channel_moved_to_another_provider_reads_each_jobs_bounces_where_it_was_sent() -> None:
    """A tired operator moves a watched channel to another provider (SIGHUP): the jobs
    confirmed on the first have their reports in the first's mailbox, those sent after the
    move in the second's. Each mailbox is read for the jobs sent there, and a report is
    recorded where its job's copy was sent, not dropped as another mailbox's."""
    rig = EngineRig(policy("receipts", watch_bounces="1h"))
    other = rig.add_provider("other")
    try:
        before = rig.submit("receipts", "a-1")
        rig.tick()
        assert rig.job("a-1").last_provider == "fake"
        rig.policies = PolicySet(
            {"receipts": policy("receipts", watch_bounces="1h", provider="other")}
        )
        assert rig.holder.reload()
        after = rig.submit("receipts", "b-1")
        rig.advance_and_tick(1)
        assert rig.job("b-1").last_provider == "other"
        rig.provider.deliver(bounce_of(before))  # where a-1 was sent
        other.deliver(bounce_of(after))  # where b-1 was sent
        rig.advance_and_tick(INTERVAL)
        assert len(bounced(rig, "a-1")) == 1 and len(bounced(rig, "b-1")) == 1
        assert rig.provider.report_reads >= 1 and other.report_reads >= 1
    finally:
        rig.close()


def test_a_report_of_a_job_sent_before_its_channels_domain_changed_is_still_its() -> None:
    """An operator moves a watched channel to another `message_id_domain` (SIGHUP): the
    jobs confirmed before keep their Message-IDs, and a report naming one of them is that
    job's (the index knows the Message-ID), not refused as another domain's."""
    rig = EngineRig(policy("receipts", watch_bounces="1h"))
    try:
        mid = rig.submit("receipts", "r-1")
        rig.tick()
        assert mid.endswith("@mail.example.com>")
        moved = policy("receipts", watch_bounces="1h", message_id_domain="new.example.org")
        rig.policies = PolicySet({"receipts": moved})
        assert rig.holder.reload()
        rig.provider.deliver(bounce_of(mid))
        forged = "<job-" + "0" * 32 + "@mail.example.com>"  # the old domain, no such job
        rig.provider.deliver(bounce_of(forged))
        rig.advance_and_tick(INTERVAL)
        assert len(bounced(rig, "r-1")) == 1
    finally:
        rig.close()


def test_triage_leaves_a_bounced_job_for_a_person(rig: EngineRig) -> None:
    """Triage's rule, one copy found -> resolved as sent, settles an unknown outcome. A job
    in review for a bounce has its one copy by definition (it was confirmed): the rule
    closed every such review, unread, in the triage an operator runs after an outage
    without a filter (docs/review.md "Triage"), and the recipient who never got the
    message was never looked after."""
    mid = rig.submit("legal", "l-1")
    rig.tick()
    rig.provider.deliver(bounce_of(mid))
    rig.advance_and_tick(INTERVAL)
    assert rig.job("l-1").state is JobState.REVIEW and rig.job("l-1").reason == "bounced"
    services = Services(
        rig.ledger,
        lambda: ChannelPolicies(rig.policies),
        providers=lambda name: nullcontext(rig.provider),
    )
    for dry_run in (True, False):
        [item] = services.triage(by="op", dry_run=dry_run)
        assert (item.key, item.action) == ("l-1", "left"), item
        assert "bounce" in item.detail
    assert rig.job("l-1").state is JobState.REVIEW


def test_a_report_received_before_the_jobs_first_attempt_is_refused(rig: EngineRig) -> None:
    # A Message-ID derives from the job's key: whoever guesses a key (an order number)
    # and knows its recipient can mail the sender a report of the job before it is sent
    # (a job with a send_at, or one not submitted yet). The mailbox says when it received
    # each report; one received before the job's first claim, less the clock margin
    # (`daemon.deadline_grace`), is refused; one received after it is the job's.
    from tests.unit.engine_rig import GRACE

    from ledger.message_id import message_id_for

    rig.submit("receipts", "r-0")
    rig.tick()  # the mailbox is watched
    reads = rig.provider.report_reads
    mid = message_id_for("r-1", "mail.example.com")
    rig.provider.deliver(bounce_of(mid))  # forged: received before r-1 is even submitted
    rig.clock.advance(3 * GRACE)
    margin = rig.provider.deliver(bounce_of(mid))  # within the margin: its clock may lag
    rig.clock.advance(GRACE / 2)
    assert rig.submit("receipts", "r-1") == mid
    rig.tick()
    assert rig.job("r-1").state is JobState.CONFIRMED
    assert rig.provider.report_reads == reads  # not read yet: the interval is not over
    rig.advance_and_tick(INTERVAL)
    [event] = bounced(rig, "r-1")
    assert event.provider_message_id == margin
    rig.restart()  # read again from the window's start: still refused
    rig.advance_and_tick(INTERVAL)
    assert len(bounced(rig, "r-1")) == 1
    first = rig.job("r-1").first_attempt_at
    assert first is not None
    with pytest.raises(BounceRefused, match="before its first attempt") as refused:
        report = read_report(bounce_of(mid), domains=["mail.example.com"])
        assert isinstance(report, DeliveryReport)
        rig.job("r-1").record_bounce(
            report,
            provider_message_id="inbox-x",
            decision=RecordBounce(rig.policies["receipts"].ref),
            at=rig.clock(),
            received_at=first - timedelta(seconds=GRACE + 1),
            skew=GRACE,
        )
    assert refused.value.refusal.value == "before-send"


@pytest.mark.parametrize(
    ("status_type", "written"),
    [
        ("message/global-delivery-status", "zoe@bücher.example"),  # RFC 6533, raw UTF-8
        ("message/delivery-status", "zoe@b\\x{00FC}cher.example"),  # its 7-bit xtext form
    ],
)
def test_a_report_naming_an_internationalized_recipient_as_people_write_it_is_its_jobs(
    rig: EngineRig, status_type: str, written: str
) -> None:
    # The job keeps the recipient's domain as the wire's A-labels (xn--bcher-kva); an RFC
    # 6533 report writes it in Unicode (`utf-8;` address type): the address read from
    # the report was refused as no address, and a real bounce was recorded as none.
    from ledger.content import parse_job
    from testkit.dsn import original_headers, report

    data = {"channel": "receipts", "key": "idn-1", "subject": "s", "body": "."}
    content = parse_job({**data, "to": "Zoë <zoe@bücher.example>"})
    mid = rig.ledger.submit(content, rig.policies["receipts"].sender).message_id
    rig.tick()
    status = (
        "Reporting-MTA: dns; mx.example.invalid\r\n\r\n"
        f"Final-Recipient: utf-8; {written}\r\nAction: failed\r\nStatus: 5.1.1\r\n"
        "Diagnostic-Code: smtp; 550 5.1.1 user unknown\r\n"
    )
    raw = report(
        sender="MAILER-DAEMON@mx.example.invalid",
        to=MAILBOX,
        subject="Undelivered Mail Returned to Sender",
        parts=[
            ([f"Content-Type: {status_type}"], status.encode()),
            (["Content-Type: text/rfc822-headers"], original_headers(original(mid))),
        ],
        report_type="global-delivery-status"
        if status_type.startswith("message/global")
        else "delivery-status",
    )
    rig.provider.deliver(raw)
    rig.advance_and_tick(INTERVAL)
    [event] = bounced(rig, "idn-1")
    assert event.recipients[0]["address"] == "zoe@xn--bcher-kva.example"


def test_a_report_received_in_the_watch_s_last_interval_is_recorded_after_its_end(
    rig: EngineRig,
) -> None:
    """The mailbox received the report before the watch's end; the next read comes after
    it. The watch ends only once a read begun after its end (and the provider's clock
    margin) has gone through the mailbox, so the report is recorded, not `not-watched`."""
    mid = rig.submit("receipts", "r-1")
    rig.tick()
    rig.advance_and_tick(HOUR - 10)  # a read now: nothing yet
    rig.provider.deliver(bounce_of(mid))  # 10 s before the watch's end
    rig.advance_and_tick(30)  # the end is due; no read has covered it yet
    rig.advance_and_tick(INTERVAL)
    assert len(bounced(rig, "r-1")) == 1
    rig.advance_and_tick(INTERVAL)
    assert rig.events("r-1")[-1] == "BounceWatchEnded"


def test_a_watch_outlasts_its_end_while_sends_keep_its_mailbox_from_being_read(
    rig: EngineRig,
) -> None:
    """A mailbox that always has a send queued is not read: its watches wait for a read
    rather than end with its reports unread (as during a read outage)."""
    mid = rig.submit("receipts", "r-1")
    rig.tick()
    engine = rig.engine
    engine.bounces._sends_waiting = lambda scope: 1  # a send of the mailbox is queued
    rig.provider.deliver(bounce_of(mid))
    rig.advance_and_tick(HOUR + INTERVAL)
    rig.advance_and_tick(INTERVAL)
    assert rig.events("r-1")[-1] == "WatchingBounces"
    engine.bounces._sends_waiting = lambda scope: 0
    rig.advance_and_tick(INTERVAL)
    assert len(bounced(rig, "r-1")) == 1
    rig.advance_and_tick(INTERVAL)
    assert rig.events("r-1")[-1] == "BounceWatchEnded"


def test_a_watch_whose_channel_no_longer_watches_ends_at_its_time(make_rig: MakeRig) -> None:
    rig = make_rig(policy("receipts", watch_bounces="1h"))
    rig.submit("receipts", "r-1")
    rig.tick()
    rig.policies = PolicySet({"receipts": policy("receipts")})
    assert rig.holder.reload()
    rig.advance_and_tick(HOUR + 1)
    assert rig.events("r-1")[-1] == "BounceWatchEnded"


@pytest.mark.parametrize("restarted", [False, True], ids=["running", "restarted"])
def test_watches_waiting_for_a_read_are_not_loaded_and_hold_no_one_behind_them(
    rig: EngineRig, restarted: bool
) -> None:
    """Watches past their end whose mailbox is not read (queued sends hold its reads) stay
    due at the head of the index: the tick passes over them without loading their jobs,
    their rows saying when anything else of each is due (`other_due_at`), and so does a
    daemon started again, which holds nothing of them in memory (each was loaded once)."""
    n_jobs = rig.engine.batch_size + 5
    for n in range(n_jobs):
        rig.submit("receipts", f"r-{n:03d}")
    rig.tick()
    rig.engine.bounces._sends_waiting = lambda scope: 1
    loads = calls_of(rig, "get_job")
    rig.advance_and_tick(HOUR + INTERVAL)
    if restarted:
        rig.restart()
        rig.engine.bounces._sends_waiting = lambda scope: 1
    for _ in range(n_jobs):  # as many ticks as loading each once took
        rig.advance_and_tick(1)
    for _ in range(3):
        rig.advance_and_tick(INTERVAL)
    # One job of the mailbox names its From, once per process (`BounceWatch._address`).
    assert len(loads) <= (2 if restarted else 1), len(loads)
    row = rig.ledger.row("r-000")
    assert row is not None and row.watch_until is not None
    assert rig.events("r-204")[-1] == "WatchingBounces"


def test_a_report_whose_save_kept_conflicting_holds_the_watch_s_end(rig: EngineRig) -> None:
    """A read attributed a report, but other writers kept moving its job through every
    save it tried: the report waits for the next read, and so does the end of the watch,
    or the report would then be refused `not-watched`."""
    mid = rig.submit("receipts", "r-1")
    rig.tick()
    rig.advance_and_tick(HOUR - 10)
    rig.provider.deliver(bounce_of(mid))
    bounces = rig.engine.bounces
    commits = bounces._commits
    conflicts = [SAVE_TRIES]

    class Moving:
        def save(self, job: SendJob) -> None:
            if conflicts[0] > 0:
                conflicts[0] -= 1
                raise ConcurrentUpdate("moved")
            commits.save(job)

    bounces._commits = Moving()  # type: ignore[assignment]
    rig.advance_and_tick(30)  # the read past the end: every save of the report conflicts
    assert bounced(rig, "r-1") == []
    rig.advance_and_tick(INTERVAL)
    rig.advance_and_tick(INTERVAL)
    assert len(bounced(rig, "r-1")) == 1
    rig.advance_and_tick(INTERVAL)
    assert rig.events("r-1")[-1] == "BounceWatchEnded"


def test_a_watch_whose_mailbox_is_never_read_again_ends_by_the_bound(
    rig: EngineRig, caplog: pytest.LogCaptureFixture
) -> None:
    """A mailbox whose reads always fail (revoked credentials, a circuit that stays open)
    does not keep its watches for ever: each ends `UNREAD_INTERVALS` bounce intervals
    (and the clock margin) after its end, recorded as such, and the job is purgeable."""
    rig.submit("receipts", "r-1")
    rig.tick()
    rig.provider.fail_reads(10**6)
    bound = rig.engine.bounces.unread_bound
    for _ in range(int((HOUR + bound) // INTERVAL) - 1):
        rig.clock.advance(INTERVAL)
        rig.engine.tick()  # a failed read, or none while the circuit is open
    assert rig.events("r-1")[-1] == "WatchingBounces"
    assert not rig.job("r-1").purgeable
    with caplog.at_level("WARNING", logger="sendledger.engine"):
        rig.clock.advance(2 * INTERVAL)
        rig.engine.tick()
    [ended] = [e for e in rig.ledger.history("r-1") if isinstance(e, SendJob.BounceWatchEnded)]
    assert ended.reason == "unread"
    assert rig.job("r-1").purgeable and rig.ledger.watched() == []
    assert any("not read" in r.getMessage() and "r-1" in r.getMessage() for r in caplog.records)


def test_a_watch_read_through_ends_with_no_reason(rig: EngineRig) -> None:
    rig.submit("receipts", "r-1")
    rig.tick()
    rig.advance_and_tick(HOUR + INTERVAL)
    rig.advance_and_tick(INTERVAL)
    [ended] = [e for e in rig.ledger.history("r-1") if isinstance(e, SendJob.BounceWatchEnded)]
    assert ended.reason == ""


def test_a_daemon_down_past_the_bound_reads_the_mailbox_before_its_watches_end(
    rig: EngineRig,
) -> None:
    """The bound counts from when this process first wanted the mailbox read: a daemon
    started again long after a watch's end reads the mailbox first, and the report it
    received before that end is recorded, not lost to an end `unread`."""
    mid = rig.submit("receipts", "r-1")
    rig.tick()
    rig.provider.deliver(bounce_of(mid))
    rig.restart()
    rig.clock.advance(HOUR + 3 * rig.engine.bounces.unread_bound)  # the daemon was down
    for _ in range(3):
        rig.advance_and_tick(INTERVAL)
    assert len(bounced(rig, "r-1")) == 1
    [ended] = [e for e in rig.ledger.history("r-1") if isinstance(e, SendJob.BounceWatchEnded)]
    assert ended.reason == ""


def test_a_watch_ended_with_its_mailbox_no_longer_read_says_so(make_rig: MakeRig) -> None:
    """A watch whose channel stopped watching ends at its time, unread: its event says so
    (`reason`), rather than what a read through the mailbox would have said."""
    rig = make_rig(policy("receipts", watch_bounces="1h"))
    rig.submit("receipts", "r-1")
    rig.tick()
    rig.policies = PolicySet({"receipts": policy("receipts")})
    assert rig.holder.reload()
    rig.advance_and_tick(HOUR + 1)
    [ended] = [e for e in rig.ledger.history("r-1") if isinstance(e, SendJob.BounceWatchEnded)]
    assert ended.reason == "unread"


def test_metrics_count_the_watches_ended_unread(rig: EngineRig) -> None:
    """The operator sees watches that ended without a read of their mailbox in /metrics,
    not only in the jobs' histories and the log."""
    from daemon.api.metrics import Metrics, Sources

    metrics = Metrics(Sources(rig.ledger, {}))
    engine = engine_of(rig, "metrics", observer=metrics)
    rig.submit("receipts", "r-1")
    engine.tick()
    rig.provider.fail_reads(10**6)
    for _ in range(int((HOUR + engine.bounces.unread_bound) // INTERVAL) + 2):
        rig.clock.advance(INTERVAL)
        engine.tick()
    engine.close()
    assert rig.events("r-1")[-1] == "BounceWatchEnded"
    text = metrics.render().decode()
    assert 'sendledger_bounce_watches_ended_total{reason="unread"} 1.0' in text


def test_a_verification_due_after_the_watch_s_end_runs_at_its_time(make_rig: MakeRig) -> None:
    """A resent job is verified `verify_after` (10 min) after its confirmation; its watch
    (5 min) ended before that, and waits for a read of its mailbox (queued sends hold the
    reads). The verification runs at its time, not once the watch ends (up to
    `unread_bound` later); the watch goes on waiting, and the report its mailbox received
    before the end is still recorded by the read that comes."""
    rig = make_rig(policy("receipts", watch_bounces="5m", on_unknown="retry"))
    mid = rig.submit("receipts", "r-1")
    rig.provider.script(Scripted.lost_request())
    rig.tick()
    rig.advance_and_tick(60)  # first miss
    rig.advance_and_tick(30)  # second miss: believed, resent
    rig.tick()
    job = rig.job("r-1")
    assert job.state is JobState.CONFIRMED and job.verifying
    assert job.watch_until is not None and job.verify_at is not None
    assert job.watch_until < job.verify_at
    rig.provider.deliver(bounce_of(mid))
    rig.engine.bounces._sends_waiting = lambda scope: 1  # its mailbox is not read
    for _ in range(11):
        rig.advance_and_tick(INTERVAL)
    assert "Verified" in rig.events("r-1")  # at its time, the watch still waiting
    assert rig.events("r-1")[-1] == "Verified" and bounced(rig, "r-1") == []
    rig.engine.bounces._sends_waiting = lambda scope: 0
    rig.advance_and_tick(INTERVAL)
    assert len(bounced(rig, "r-1")) == 1
    rig.advance_and_tick(INTERVAL)
    [ended] = [e for e in rig.ledger.history("r-1") if isinstance(e, SendJob.BounceWatchEnded)]
    assert ended.reason == ""


def test_a_verification_behind_more_waiting_watches_than_a_tick_reads_past_runs_at_its_time(
    make_rig: MakeRig,
) -> None:
    """More watches wait for a read of their mailbox than a tick reads past (ten pages):
    their rows tell the index they wait (`WatchHold`), so the page leaves them out and a
    verification due behind them runs at its time, not once they end."""
    rig = make_rig(policy("receipts", watch_bounces="5m", on_unknown="retry"))
    engine = engine_of(rig, "small", batch_size=2)  # reads past 20 rows at most
    waits = [f"w-{n:02d}" for n in range(25)]
    for key in waits:
        rig.submit("receipts", key)
    engine.tick()
    engine.bounces._sends_waiting = lambda scope: 1  # its mailbox is not read
    rig.submit("receipts", "r-1")
    rig.provider.script(Scripted.lost_request())
    engine.tick()
    for seconds in (60, 30, 0):  # two misses: believed lost, resent, confirmed
        rig.clock.advance(seconds)
        engine.tick()
    job = rig.job("r-1")
    assert job.verify_at is not None and job.watch_until is not None
    assert all(rig.job(key).watch_until < job.watch_until for key in waits)  # type: ignore[operator]
    while rig.clock() <= job.verify_at + timedelta(seconds=INTERVAL):
        rig.clock.advance(INTERVAL)
        engine.tick()
    engine.close()
    assert "Verified" in rig.events("r-1")
    assert {rig.events(key)[-1] for key in waits} == {"WatchingBounces"}


def read_through_with_its_report(rig: EngineRig, key: str, reads: int) -> None:
    """Reads, one an interval, until `key`'s watch ends (at most `reads`): its report
    recorded once, and the watch ended read through, not `unread`."""
    for _ in range(reads):
        rig.advance_and_tick(INTERVAL)
        if "BounceWatchEnded" in rig.events(key):
            break
    assert len(bounced(rig, key)) == 1
    [ended] = [e for e in rig.ledger.history(key) if isinstance(e, SendJob.BounceWatchEnded)]
    assert ended.reason == ""


def test_a_read_that_keeps_making_progress_keeps_its_watches(
    rig: EngineRig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A mailbox with more reports than a read takes (`READ_LIMIT`): each read goes on
    where the last stopped, for longer than `unread_bound` past a watch's end. Reads that
    make progress keep the watch; it ends once one goes through, with the report its
    mailbox received before the end recorded, not `unread` with the report lost."""
    from daemon.engine import bounces

    monkeypatch.setattr(bounces, "READ_LIMIT", 1)
    mid = rig.submit("receipts", "r-1")
    rig.tick()
    bound = rig.engine.bounces.unread_bound
    reads = int((HOUR + bound) // INTERVAL) + 10
    for n in range(reads):  # more than the reads until then take, one each
        rig.provider.deliver(f"Subject: not a report {n}\r\n\r\nx\r\n".encode())
    rig.advance_and_tick(HOUR - 10)
    rig.provider.deliver(bounce_of(mid))  # read after all the others
    read_through_with_its_report(rig, "r-1", reads + 5)


def test_reads_that_make_no_progress_still_end_a_watch_by_the_bound(
    rig: EngineRig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reads that answer but stop before their first call (the quota kept for sends, a
    scope lost at once) make no progress: the watch ends by the bound, `unread`."""
    rig.submit("receipts", "r-1")
    rig.tick()

    def stopped(since: datetime, **kwargs: Any) -> ReportRead:
        return ReportRead(f"inbox since {since.isoformat()}", complete=False)

    monkeypatch.setattr(rig.provider, "read_reports", stopped)
    for _ in range(int((HOUR + rig.engine.bounces.unread_bound) // INTERVAL) + 2):
        rig.advance_and_tick(INTERVAL)
    [ended] = [e for e in rig.ledger.history("r-1") if isinstance(e, SendJob.BounceWatchEnded)]
    assert ended.reason == "unread"


def test_reads_refused_after_getting_on_keep_their_watches(
    rig: EngineRig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every read of a mailbox is refused (429) after it listed or read more of it, which
    the provider keeps for the next read (`ProviderError.progressed`), for longer than
    `unread_bound` past a watch's end. That progress counts when the read fails, not at
    the next read that answers: the watch waits, and once a read goes through the report
    its mailbox received before the end is recorded, not lost to an end `unread`."""
    from daemon.providers.outcomes import ProviderError

    mid = rig.submit("receipts", "r-1")
    rig.tick()
    rig.provider.deliver(bounce_of(mid))
    answer = rig.provider.read_reports
    refused = 0

    def refused_after_a_page(since: datetime, **kwargs: Any) -> ReportRead:
        nonlocal refused
        refused += 1
        exc = ProviderError("reports: 429 (scripted)", unavailable=True)
        exc.progressed = True
        raise exc

    monkeypatch.setattr(rig.provider, "read_reports", refused_after_a_page)
    for _ in range(int((HOUR + 2 * rig.engine.bounces.unread_bound) // INTERVAL)):
        rig.clock.advance(INTERVAL)
        rig.engine.tick()  # a refused read, or none while the circuit is open
    assert refused > 1
    assert "BounceWatchEnded" not in rig.events("r-1")
    monkeypatch.setattr(rig.provider, "read_reports", answer)
    read_through_with_its_report(rig, "r-1", int(rig.engine.bounces.unread_bound // INTERVAL))


def test_a_mailbox_no_longer_read_after_a_reload_is_forgotten_and_read_afresh_later(
    make_rig: MakeRig,
) -> None:
    """A reload drops the channel that watched a mailbox: what was kept of its reads
    (the provider's stopped listing, what this process had read there, its From) is
    dropped at once, not kept for ever. Watched again by a later reload, the mailbox is
    read afresh from its window's start: the report recorded before is read again and
    refused by its job, never recorded twice."""
    watching = PolicySet({"receipts": policy("receipts", watch_bounces="1h")})
    rig = make_rig(*watching.values())
    mid = rig.submit("receipts", "r-1")
    rig.tick()
    rig.provider.deliver(bounce_of(mid))
    rig.advance_and_tick(INTERVAL)
    assert len(bounced(rig, "r-1")) == 1 and rig.provider.reports_fetched == 1
    watch = rig.engine.bounces
    assert watch._mailboxes and watch._addresses
    rig.policies = PolicySet({"other": policy("other")})  # receipts removed
    assert rig.holder.reload()
    rig.advance_and_tick(1)  # within the interval: the reload alone makes it look again
    assert rig.provider.report_reads_forgotten == 1
    assert watch._mailboxes == {} and watch._reads == []
    rig.advance_and_tick(INTERVAL)
    assert rig.provider.report_reads_forgotten == 1  # once
    rig.policies = watching
    assert rig.holder.reload()
    rig.advance_and_tick(1)
    assert rig.provider.reports_fetched == 2  # afresh: nothing remembered of the first
    assert len(bounced(rig, "r-1")) == 1


def test_a_report_two_daemons_record_at_once_is_recorded_once(rig: EngineRig) -> None:
    """Two daemons on one store read the same report: the second daemon records it
    between this one's read of the job and its save. This save conflicts, the job is
    read again and refuses the report it holds already: one Bounced event, not two."""
    mid = rig.submit("receipts", "r-1")
    rig.tick()
    rig.provider.deliver(bounce_of(mid))
    other = engine_of(rig, "other")
    real_save = rig.ledger.save_job
    by_other: list[int] = []
    once = Meanwhile(lambda: by_other.append(other.tick().bounced))

    def save_job(job: SendJob, **kwargs: Any) -> None:
        if any(isinstance(e, SendJob.Bounced) for e in job.pending_events):
            once()  # between this daemon's read of the job and its save
        real_save(job, **kwargs)

    rig.ledger.save_job = save_job  # type: ignore[method-assign]
    report = rig.advance_and_tick(INTERVAL)
    assert by_other == [1] and report.bounced == 0
    assert len(bounced(rig, "r-1")) == 1


def test_a_report_whose_original_is_not_dated_as_the_job_is_refused_where_the_date_is_kept(
    rig: EngineRig,
) -> None:
    # The Message-ID derives from the key: an outsider who guesses an order number and
    # knows its recipient can write a report of the job once it is sent, throughout its
    # watch. On a provider that sends our Date unchanged (SMTP), a real report quotes the
    # job's Date, the second the job was created, which the key does not give: a report
    # quoting none, or another, is refused (`other-date`) and put on no job.
    from datetime import UTC, timezone

    from daemon.api.metrics import Metrics, Sources
    from ledger.mime import date_value

    def keeping(clock: Any) -> FakeProvider:
        return FakeProvider("fake", clock=clock, keeps_date=True)

    with EngineRig(policy("receipts", watch_bounces="1h"), provider=keeping) as kept:
        metrics = Metrics(Sources(kept.ledger, {}))
        engine = engine_of(kept, "metrics", observer=metrics)
        mid = kept.submit("receipts", "r-1")
        engine.tick()
        created = kept.job("r-1").created_on.astimezone(UTC)

        def dated(date: str | None) -> bytes:
            header = "" if date is None else f"Date: {date}\r\n"
            raw = f"From: {MAILBOX}\r\nTo: {TO}\r\n{header}Message-ID: {mid}\r\n\r\nhi\r\n"
            return rfc3464_report(raw.encode(), mailbox=MAILBOX, recipient=TO)

        kept.provider.deliver(dated(None))
        kept.provider.deliver(dated(date_value(created + timedelta(seconds=1))))
        kept.clock.advance(INTERVAL)
        engine.tick()
        assert bounced(kept, "r-1") == []
        text = metrics.render().decode()
        assert 'sendledger_bounce_reports_total{outcome="other-date"} 2.0' in text, text
        # Written again by an MTA (another zone, the day unpadded, folded): the same moment.
        again = created.astimezone(timezone(timedelta(hours=-5)))
        kept.provider.deliver(dated(f"{again.day} {again:%b %Y %H:%M:%S} -0500\r\n (EST)"))
        kept.clock.advance(INTERVAL)
        engine.tick()
        [event] = bounced(kept, "r-1")
        assert event.recipients[0]["address"] == TO
        engine.close()
    # A provider that writes a Date of its own (the default) is not asked for it.
    other = rig.submit("receipts", "r-1")
    rig.tick()
    rig.provider.deliver(bounce_of(other))
    rig.advance_and_tick(INTERVAL)
    assert len(bounced(rig, "r-1")) == 1


def test_reports_waiting_for_their_job_cost_one_look_up_per_read_not_one_each(
    rig: EngineRig,
) -> None:
    # Whoever guessed the key of a job not sent yet (its provider refusing for now) can
    # mail the sender report after report of it: each waits for the job to be watched,
    # for as long as the window lasts. Before, every waiting report was looked up in the
    # store at every read (here 50, 100, 120, 120, ...: growing by a read's worth each
    # interval); now one per job named, per read.
    rig.submit("receipts", "r-0")
    rig.tick()  # the mailbox is watched
    rig.provider.script(*[Scripted.unavailable() for _ in range(50)])
    pending = rig.submit("receipts", "pending")
    rig.tick()
    assert rig.job("pending").state is JobState.REQUESTED
    for _ in range(120):
        rig.provider.deliver(bounce_of(pending))
    looked_up = calls_of(rig, "row_by_message_id")
    reads = rig.provider.report_reads
    for _ in range(5):
        rig.clock.advance(INTERVAL)
        rig.engine.tick()
    assert rig.provider.report_reads == reads + 5
    assert rig.provider.reports_fetched >= 120  # every one read, each waiting
    assert len(looked_up) <= 5, len(looked_up)
    assert bounced(rig, "pending") == []


def test_a_report_received_while_every_attempt_so_far_was_refused_is_refused(
    rig: EngineRig,
) -> None:
    # The before-send bound was the job's first claim, even when the provider refused
    # that attempt (nothing sent): through an outage of hours, whoever guessed the key
    # could mail reports of the job that were recorded once it was sent at last. The
    # bound is now the earliest claim no Rejected answered.
    rig.submit("receipts", "r-0")
    rig.tick()  # the mailbox is watched
    rig.provider.script(Scripted.unavailable())
    mid = rig.submit("receipts", "late")
    rig.tick()
    assert rig.events("late")[-1] == "Rejected"
    rig.clock.advance(HOUR / 2)
    forged = rig.provider.deliver(bounce_of(mid))  # after the refused claim, before a send
    for _ in range(4):
        rig.advance_and_tick(HOUR / 4)
    assert rig.job("late").state is JobState.CONFIRMED
    real = rig.provider.deliver(bounce_of(mid))
    rig.advance_and_tick(INTERVAL)
    [event] = bounced(rig, "late")
    assert event.provider_message_id == real != forged
    assert rig.job("late").first_attempt_at is not None
