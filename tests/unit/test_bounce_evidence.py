"""Every recorded bounce says it is unverified (docs/how-it-works.md "Bounces: what a
report proves"): a report is mail, and on Gmail and Graph one naming a job's Message-ID
and a recipient is written as easily by whoever guessed the job's key, on SMTP + IMAP by
whoever saw the message. `history --json` and the events route (the event's record), the
job page's and `history`'s timeline, the `bounced` webhook, the metric and the review
guidance each say so. The engine on the memory store and the fake provider's inbox,
time injected."""

from __future__ import annotations

from tests.unit.engine_rig import EngineRig, policy
from tests.unit.test_bounce_flood import metered
from tests.unit.test_bounces import bounce_of, bounced

from daemon.service_layer import guidance
from daemon.service_layer.read_models import event_record, timeline_details
from daemon.webhooks.events import payload
from ledger.vocabulary import EscalationReason

INTERVAL = 60.0


def test_a_recorded_bounce_is_said_unverified_wherever_it_is_shown() -> None:
    with EngineRig(policy("receipts", watch_bounces="1h")) as rig:
        engine, metrics, mid = metered(rig)
        rig.provider.deliver(bounce_of(mid))
        rig.clock.advance(INTERVAL)
        assert engine.tick().errors == 0
        engine.close()
        [event] = bounced(rig, "r-1")
        record = event_record(event)  # history --json, GET /v1/jobs/{key}/events
        assert record["verified"] is False
        details = dict(timeline_details(record))  # the job page, `history`
        assert details["verified"].startswith("false (unverified: a report is mail")
        body = payload("bounced", rig.job("r-1"), event, "evt_x")
        assert body["verified"] is False
        text = metrics.render().decode()
        assert 'sendledger_bounces_total{kind="permanent",verified="false"} 1.0' in text
    assert "unverified" in guidance.MEANING[EscalationReason.BOUNCED]
    # Another type's record is as it was, its webhook's `verified` null.
    requested = rig.ledger.history("r-1")[0]
    assert "verified" not in event_record(requested)
    assert payload("confirmed", rig.job("r-1"), requested, "evt_y")["verified"] is None
