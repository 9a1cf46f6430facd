"""The commands' checks and triages in the daemon's `/metrics` (docs/http-api.md
"Metrics"): `review check` and `review triage` run in processes of their own, which end
before any scrape; the daemon counts what they recorded, from the event log, when
Prometheus scrapes. Before, they were counted nowhere."""

from __future__ import annotations

from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families
from tests.e2e.daemon_kit import Rig

from ledger.decision_types import Review
from ledger.vocabulary import EscalationReason, PolicyRef
from testkit.mailservers import free_port

LEGAL = {
    "provider": "gmail",
    "from": "Legal <legal@shop.example>",
    "message_id_domain": "mail.shop.example",
    "on_unknown": "review",
}
KEYS = ("notice-1", "notice-2")


def checks_recorded(url: str) -> dict[tuple[str, str], float]:
    text = httpx.get(url + "/metrics", timeout=5).text
    return {
        (s.labels["purpose"], s.labels["result"]): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "sendledger_checks_recorded_total"
    }


def test_the_daemon_counts_the_checks_and_triages_the_commands_recorded(tmp_path: Path) -> None:
    with Rig(tmp_path, lag=0.0, api_port=free_port(), policies={"legal": LEGAL}) as rig:
        rig.submit(
            [
                {"channel": "legal", "key": key, "to": "a@example.com", "subject": "s", "body": "b"}
                for key in KEYS
            ]
        )
        review = Review(PolicyRef("legal", "f"), EscalationReason.UNKNOWN_OUTCOME)
        for key in KEYS:  # in review before the daemon starts: it sends neither
            rig.ledger.update(key, lambda j: j.escalate(review, detail="t", at=rig.ledger.clock()))
        rig.start_daemon()
        url = rig.wait_api()
        assert set(checks_recorded(url).values()) == {0.0}
        rig.cli("review", "check", KEYS[0])
        rig.cli("review", "triage")  # no copy of either: both left, each search recorded
        counted = checks_recorded(url)
    assert counted[("check", "miss")] == 1
    assert counted[("triage", "miss")] == 2
    assert sum(counted.values()) == 3
