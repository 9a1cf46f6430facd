"""The metrics observer counts what the engine does (fake provider, memory store, injected
clock): sends by outcome, searches by result, escalations, the index lag, tick and call
durations."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families
from tests.unit.engine_rig import GRACE, TIMEOUT, EngineRig, policy

from daemon.api.metrics import Metrics, Sources
from daemon.doubles.fake_history import FakeHistoryProvider
from daemon.doubles.fake_provider import Scripted
from daemon.engine import Engine


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
