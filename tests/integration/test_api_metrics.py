"""The metrics observer counts what the engine does (fake provider, memory store, injected
clock): sends by outcome, searches by result, escalations, the index lag, tick and call
durations."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from tests.unit.engine_rig import GRACE, TIMEOUT, EngineRig, policy, receipt
from tests.unit.test_services import LEGAL, OTHER, in_review

from daemon.api.metrics import Metrics, Sources
from daemon.api.recorded_metrics import RecordedByPeople
from daemon.doubles.fake_history import FakeHistoryProvider
from daemon.doubles.fake_provider import Scripted
from daemon.engine import Engine
from daemon.service_layer.services import ChannelPolicies, Services
from ledger.application import Ledger
from ledger.decision_types import Review
from ledger.vocabulary import EscalationReason, PolicyRef, Resolution


def samples(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = metrics.render().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def observed(rig: EngineRig) -> Metrics:
    """The rig's engine replaced by one that reports to a new registry (closed with the
    rig), returned."""
    metrics = Metrics(Sources(rig.ledger, {"fake": rig.provider}))
    rig.engine.close()
    rig.engine = rig.own(
        Engine(
            rig.ledger,
            rig.holder,
            {"fake": rig.provider},
            provider_timeouts={"fake": TIMEOUT},
            clock=rig.clock,
            elapsed=rig.clock.elapsed,
            deadline_grace=GRACE,
            observer=metrics,
        )
    )
    return metrics


def test_the_observer_counts_sends_searches_escalations_and_the_lag() -> None:
    rig = EngineRig(policy("receipts", on_unknown="search-then-review"))
    metrics = observed(rig)
    try:
        rig.provider.script(Scripted.confirmed(), Scripted.dropped_response())
        rig.submit("receipts", "a")
        rig.tick()
        rig.submit("receipts", "b")
        rig.tick()
        rig.advance_and_tick(3600)  # past search_after: the search finds b's one copy
        found = samples(metrics)
    finally:
        rig.close()
    assert found[("sendledger_sends_total", (("outcome", "confirmed"), ("provider", "fake")))] == 1
    assert found[("sendledger_sends_total", (("outcome", "unknown"), ("provider", "fake")))] == 1
    assert found[("sendledger_searches_total", (("result", "hit"),))] == 1
    assert found[("sendledger_index_lag_seconds_count", ())] == 1
    assert found[("sendledger_index_lag_seconds_sum", ())] >= 3600
    assert found[("sendledger_tick_duration_seconds_count", ())] == 3
    calls = (
        "sendledger_provider_call_duration_seconds_count",
        (("operation", "send"), ("provider", "fake")),
    )
    assert found[calls] == 2
    assert found[("sendledger_jobs", (("state", "confirmed"),))] == 2


def test_a_claim_released_with_no_call_made_is_counted_as_no_send() -> None:
    # Before, its Rejected counted as a send refused (`rejected-transient`).
    rig = EngineRig(policy("receipts"))
    metrics = observed(rig)
    try:
        rig.provider.script(Scripted.stopped_before_send(), Scripted.unavailable())
        rig.submit("receipts", "a")
        rig.tick()
        rig.advance_and_tick(60)  # due again: the provider refuses it, unavailable
        found = samples(metrics)
    finally:
        rig.close()
    refused = ("sendledger_sends_total", (("outcome", "rejected-transient"), ("provider", "fake")))
    assert found[refused] == 1, rig.events("a")


def test_history_reads_are_counted_by_what_they_settled() -> None:
    """docs/http-api.md "Metrics": a lost reply confirmed through the mailbox's history is
    a `hit` (no search counted), a lost request a `miss`, an expired start `unusable`."""
    rig = EngineRig(policy("receipts", on_unknown="search-then-review"))
    rig.engine.close()
    rig.provider = history = FakeHistoryProvider("fake", clock=rig.clock)
    metrics = observed(rig)
    try:
        rig.provider.script(Scripted.dropped_response(), Scripted.lost_request())
        rig.submit("receipts", "hit")
        rig.submit("receipts", "miss")
        rig.tick()
        rig.provider.script(Scripted.dropped_response())
        rig.submit("receipts", "expired")
        history.fail_history(1)
        rig.tick(errors=1)  # its read failed: no information, counted nowhere
        history.expire_history()
        rig.advance_and_tick(2)
        found = samples(metrics)
    finally:
        rig.close()
    for result in ("hit", "miss", "unusable"):
        assert found[("sendledger_history_reads_total", (("result", result),))] == 1, result
    assert ("sendledger_searches_total", (("result", "hit"),)) not in found


def test_a_verification_given_up_without_a_search_counts_no_search() -> None:
    """A confirmed job still to be verified whose channel lost its policy is given up
    without a search (Verified, 0 hits): no search was made, so no miss is counted."""
    from policies.loader import PolicySet

    rig = EngineRig(policy("receipts", on_unknown="retry"))
    metrics = observed(rig)
    try:
        rig.provider.script(Scripted.lost_request())
        rig.submit("receipts", "v")
        rig.tick()
        for _ in range(6):
            rig.advance_and_tick(60)
        assert rig.job("v").verifying
        before = samples(metrics)
        rig.policies = PolicySet({})
        assert rig.holder.reload()
        rig.advance_and_tick(3600)
        assert not rig.job("v").verifying
        assert rig.events("v")[-1] == "Verified"
        found = samples(metrics)
    finally:
        rig.close()
    miss = ("sendledger_searches_total", (("result", "miss"),))
    assert found.get(miss) == before.get(miss)


def test_checks_and_decisions_of_every_door_are_counted_once_from_the_log() -> None:
    """docs/http-api.md "Metrics": what the command line records (a `Services` of its own,
    which reports to no registry, as `review check|triage|resolve` build it) is counted
    by the serving process at its scrape, from the events in the store; a check made
    through its own API door once too, beside its search; what was recorded before the
    process started, and a second scrape, add nothing. Before, the commands' checks,
    triages and decisions were counted nowhere."""
    rig = EngineRig(LEGAL, OTHER)
    try:
        for key, copies in (("before", 1), ("one", 1), ("none", 0), ("two", 2)):
            in_review(rig, key, copies=copies)
        command_line = Services(
            rig.ledger,
            lambda: ChannelPolicies(rig.policies),
            providers=lambda name: nullcontext(rig.provider),
        )
        command_line.check("before", by="ops")  # recorded before the process started
        metrics = Metrics(Sources(rig.ledger, {"fake": rig.provider}))
        api = Services(
            rig.ledger,
            lambda: ChannelPolicies(rig.policies),
            providers=lambda name: nullcontext(rig.provider),
            on_search=metrics.door_search,
        )
        command_line.check("two", by="ops")
        api.check("none", by="ops")
        command_line.resolve("before", Resolution.ABANDON, note="gone", by="ops")
        first = samples(metrics)
        triaged = {item.key: item.action for item in command_line.triage(by="ops")}
        assert triaged == {"one": "resolved-sent", "none": "left", "two": "left"}
        samples(metrics)
        found = samples(metrics)
    finally:
        rig.close()
    checks = "sendledger_checks_recorded_total"
    resolutions = "sendledger_resolutions_recorded_total"

    def counted(at: dict[Any, float], name: str, **labels: str) -> float:
        return at[(name, tuple(sorted(labels.items())))]

    assert counted(first, checks, purpose="check", result="duplicate") == 1  # the command's
    assert counted(first, checks, purpose="check", result="miss") == 1  # the API's, once
    assert counted(first, checks, purpose="check", result="hit") == 0  # before the start
    assert counted(first, resolutions, decision="abandon") == 1
    assert counted(first, resolutions, decision="sent") == 0
    # The API's search is in the process's own searches too; the command's is not.
    assert counted(first, "sendledger_searches_total", result="miss") == 1
    assert ("sendledger_searches_total", (("result", "duplicate"),)) not in first
    for result in ("hit", "miss", "duplicate"):
        assert counted(found, checks, purpose="triage", result=result) == 1
    assert counted(found, checks, purpose="check", result="duplicate") == 1  # read once
    assert counted(found, resolutions, decision="sent") == 1  # the triage's
    assert counted(found, resolutions, decision="abandon") == 1
    assert counted(found, resolutions, decision="resend") == 0


@pytest.mark.parametrize("writers", [1, 4])
def test_the_recorded_counts_read_the_log_of_sqlite_and_postgresql(
    store_url: str, writers: int
) -> None:
    """On the real stores, checks and decisions recorded by several writers at once are
    each counted once, over scrapes made while they write (on PostgreSQL the log is read
    only as far as it is final, as the webhooks read it)."""
    review = Review(PolicyRef("receipts", "f"), EscalationReason.UNKNOWN_OUTCOME)
    keys = [f"k{i}" for i in range(12)]
    with Ledger(store_url) as ledger:
        for key in keys:
            ledger.submit(receipt("receipts", key), policy("receipts").sender)
            ledger.update(key, lambda j: j.escalate(review, detail="t", at=ledger.clock()))
        collector = RecordedByPeople(ledger)

        def decide(key: str) -> None:
            ledger.update(
                key,
                lambda j: j.record_check(
                    by="ops", purpose="check", query="q", copies=[], at=ledger.clock()
                ),
            )
            ledger.update(
                key,
                lambda j: j.resolve(Resolution.ABANDON, note="n", by="ops", at=ledger.clock()),
            )
            list(collector.collect())  # a scrape while the others write

        with ThreadPoolExecutor(writers) as pool:
            list(pool.map(decide, keys))
        families = {f.name: f for f in collector.collect()}
    checks = {
        (s.labels["purpose"], s.labels["result"]): s.value
        for s in families["sendledger_checks_recorded"].samples
    }
    assert checks[("check", "miss")] == len(keys)
    assert sum(checks.values()) == len(keys)
    decisions = {
        s.labels["decision"]: s.value for s in families["sendledger_resolutions_recorded"].samples
    }
    assert decisions == {"abandon": len(keys), "resend": 0, "sent": 0}


def test_a_store_unreachable_at_the_start_is_counted_from_the_first_scrape(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The server starts whatever the store says (/healthz reports it): the counts begin
    at the first scrape that reads the log."""
    rig = EngineRig(LEGAL, OTHER)
    try:
        in_review(rig, "a", copies=0)
        recorder = rig.ledger.recorder

        def down() -> int:
            raise OSError("store down")

        with monkeypatch.context() as patched:
            patched.setattr(recorder, "max_notification_id", down)
            metrics = Metrics(Sources(rig.ledger, {"fake": rig.provider}))
        assert samples(metrics)[("sendledger_checks_recorded_total", CHECK_MISS)] == 0
        Services(
            rig.ledger,
            lambda: ChannelPolicies(rig.policies),
            providers=lambda name: nullcontext(rig.provider),
        ).check("a", by="ops")
        assert samples(metrics)[("sendledger_checks_recorded_total", CHECK_MISS)] == 1
    finally:
        rig.close()


CHECK_MISS = (("purpose", "check"), ("result", "miss"))
