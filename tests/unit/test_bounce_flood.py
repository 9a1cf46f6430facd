"""A flood of delivery reports about one job (docs/how-it-works.md "Bounces: what a report
proves"): on Gmail and Graph a report naming a job's Message-ID and one of its recipients
is taken for the job's, and anyone who guessed the key can mail any number of them, each
with its own id. The job records at most one Bounced per (recipient, permanence), decided
in the aggregate; the rest are refused as `repeated` and counted. The aggregate over
sequences of reports (hypothesis), then the engine on the memory store and the fake
provider's inbox, time injected."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.unit.engine_rig import EngineRig, policy
from tests.unit.jobs import reload, replay
from tests.unit.test_bounces import engine_of

from daemon.api.metrics import Metrics, Sources
from daemon.engine import Engine
from ledger.content import parse_job
from ledger.decision_types import RecordBounce
from ledger.delivery_reports import BouncedRecipient, DeliveryReport, ReportRefusal
from ledger.job import BounceRefused, SendJob
from testkit.dsn import rfc3464_report

MAILBOX = "support@example.com"
TO = "customer@example.net"
CC = "accounts@example.org"
INTERVAL = 60.0
#: What a report may name: the job's two recipients (one as a report may spell it) and
#: an address the job never wrote to.
ADDRESSES = (TO, CC, "Customer@Example.NET", "stranger@example.org")


@pytest.fixture(scope="module")
def watched() -> Iterator[tuple[list[Any], str]]:
    """The history of a confirmed, watched job to two recipients, and its Message-ID."""
    with EngineRig(policy("receipts", watch_bounces="1h")) as rig:
        content = parse_job(
            {"channel": "receipts", "key": "r-1", "to": TO, "cc": CC, "subject": "s", "body": "b"}
        )
        mid = rig.ledger.submit(content, rig.policies["receipts"].sender).message_id
        rig.tick()
        job, events = rig.read("r-1")
        assert job.watch_until is not None
        yield list(events), mid


def report(mid: str, report_id: str, named: list[tuple[str, bool]]) -> DeliveryReport:
    return DeliveryReport(
        report_id=report_id,
        original_message_id=mid,
        reporter="dns; mx.example.net",
        recipients=tuple(
            BouncedRecipient(
                address=address,
                status="5.1.1" if permanent else "4.4.7",
                action="failed" if permanent else "delayed",
                diagnostic="",
            )
            for address, permanent in named
        ),
    )


REPORTS = st.lists(
    st.tuples(
        st.integers(0, 5),  # the report's id, from a few: the same report read again
        st.lists(st.tuples(st.sampled_from(ADDRESSES), st.booleans()), min_size=1, max_size=4),
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(reports=REPORTS)
def test_a_job_records_each_recipient_s_bounce_of_each_kind_once_whatever_arrives(
    watched: tuple[list[Any], str], reports: list[tuple[int, list[tuple[str, bool]]]]
) -> None:
    history, mid = watched
    job = replay(history)
    ours = {TO, CC}
    ids: set[str] = set()
    pairs: set[tuple[str, bool]] = set()
    policy_ref = RecordBounce(policy("receipts", watch_bounces="1h").ref)
    for number, (pick, named) in enumerate(reports):
        report_id = f"<r{pick}@mx.example.net>"
        own = [(a.lower(), p) for a, p in named if a.lower() in ours]
        new = [pair for pair in dict.fromkeys(own) if pair not in pairs]
        expected: ReportRefusal | None = None
        if report_id in ids:
            expected = ReportRefusal.RECORDED_ALREADY
        elif not own:
            expected = ReportRefusal.NOT_A_RECIPIENT
        elif not new:
            expected = ReportRefusal.REPEATED
        try:
            job.record_bounce(
                report(mid, report_id, named),
                provider_message_id=f"inbox-{number}",
                decision=policy_ref,
                at=job.modified_on,
            )
        except BounceRefused as refused:
            assert refused.refusal is expected, (named, refused)
            continue
        assert expected is None, named
        ids.add(report_id)
        pairs.update(new)
        *_, event = job.pending_events
        assert isinstance(event, SendJob.Bounced)
        assert [(r["address"].lower(), r["permanent"]) for r in event.recipients] == new
    events = job.collect_events()
    bounces = [e for e in events if isinstance(e, SendJob.Bounced)]
    assert len(bounces) <= 2 * len(ours)
    assert job.bounced_pairs == frozenset(pairs)
    # As the store gives the events back, the job knows what it recorded.
    assert reload([*history, *events]).bounced_pairs == frozenset(pairs)


def metered(rig: EngineRig) -> tuple[Engine, Metrics, str]:
    """An engine on the rig counting into metrics, and the Message-ID of the job r-1 it
    sent and watches."""
    metrics = Metrics(Sources(rig.ledger, {}))
    engine = engine_of(rig, "metrics", observer=metrics)
    mid = rig.submit("receipts", "r-1")
    engine.tick()
    return engine, metrics, mid


def test_a_flood_of_reports_about_one_recipient_adds_two_events_and_counts_the_rest() -> None:
    with EngineRig(policy("receipts", watch_bounces="1h")) as rig:
        engine, metrics, mid = metered(rig)
        original = f"From: {MAILBOX}\r\nTo: {TO}\r\nMessage-ID: {mid}\r\n\r\nhi\r\n".encode()
        for n in range(30):
            delayed = {"status": "4.4.7", "action": "delayed"} if n % 3 == 0 else {}
            rig.provider.deliver(rfc3464_report(original, mailbox=MAILBOX, recipient=TO, **delayed))
        rig.clock.advance(INTERVAL)
        assert engine.tick().errors == 0
        events = [e for e in rig.ledger.history("r-1") if isinstance(e, SendJob.Bounced)]
        assert sorted(e.permanent for e in events) == [False, True]
        text = metrics.render().decode()
        assert 'sendledger_bounce_reports_total{outcome="recorded"} 2.0' in text
        assert 'sendledger_bounce_reports_total{outcome="repeated"} 28.0' in text
