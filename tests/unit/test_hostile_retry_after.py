"""A provider's Retry-After is its answer, not ours to believe whole (docs/operations.md
"Outages and quotas"): "1e12", or an HTTP-date in the year 9999, is a wait past the end of
the calendar. The job's retry was bounded by `decisions.MAX_RETRY_AFTER` (a week), but the
circuit's probe, a search's next try and a report read's next read took it as said:
`now + timedelta(...)` overflowed in the worker, and a wait short of overflowing (ten
years) held the scope's sends until a restart. The engine on the memory store and the fake
provider, time injected; the header's parser on anything a server could write."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st
from tests.unit.engine_rig import EngineRig, policy

from daemon.doubles.fake_provider import Scripted
from daemon.providers.classify import parse_retry_after
from ledger.vocabulary import JobState
from policies.decisions import MAX_RETRY_AFTER

FAR = [1e12, 10 * 365 * 86400.0]  # past the calendar's end; ten years


def test_a_circuit_opened_with_a_wait_past_the_calendar_probes_within_the_bound() -> None:
    for retry_after in FAR:
        rig = EngineRig(policy("receipts"))
        try:
            rig.provider.script(*[Scripted.unavailable(retry_after=retry_after)] * 3)
            for n in range(3):
                rig.submit("receipts", f"k-{n}")
                rig.tick()
            [circuit] = rig.engine.open_circuits()
            assert circuit.next_probe is not None
            assert circuit.next_probe <= rig.clock() + timedelta(seconds=MAX_RETRY_AFTER)
            rig.advance_and_tick(MAX_RETRY_AFTER + 1)  # the probe: answered, all go
            rig.tick()
            assert all(rig.job(f"k-{n}").state is JobState.CONFIRMED for n in range(3))
        finally:
            rig.close()


def test_a_report_read_refused_with_a_wait_past_the_calendar_waits_the_bound() -> None:
    # Before: the next read's moment overflowed in the worker, was never set, and the
    # mailbox was read again at the next tick, against the provider's word to wait.
    rig = EngineRig(policy("receipts", watch_bounces="1h"))
    try:
        rig.submit("receipts", "r-1")
        rig.tick()  # confirmed, watched
        reads = rig.provider.report_reads
        rig.provider.fail_reads(1, retry_after=1e12)
        rig.clock.advance(60)
        rig.tick(errors=1)  # the read, refused: counted as an error, as any failed read
        assert rig.provider.report_reads == reads + 1
        rig.advance_and_tick(60)
        assert rig.provider.report_reads == reads + 1  # it waits
        rig.advance_and_tick(MAX_RETRY_AFTER)
        assert rig.provider.report_reads == reads + 2
    finally:
        rig.close()


def test_a_search_refused_with_a_wait_past_the_calendar_is_asked_again_within_the_bound() -> None:
    # Before: the search's own wait overflowed in the check worker: the job was asked
    # again at the next tick, against the provider's word, each time an error.
    rig = EngineRig(policy("receipts"))
    try:
        rig.submit("receipts", "u-1")
        rig.provider.script(Scripted.dropped_response())
        rig.tick()
        assert rig.job("u-1").state is JobState.UNKNOWN
        rig.provider.fail_searches(1, retry_after=1e12)
        rig.clock.advance(60)
        rig.tick(errors=1)
        searches = rig.provider.searches
        rig.advance_and_tick(60)
        assert rig.provider.searches == searches  # it waits
        rig.advance_and_tick(MAX_RETRY_AFTER)
        assert rig.provider.searches == searches + 1
        assert rig.job("u-1").state is JobState.CONFIRMED
    finally:
        rig.close()


@given(
    st.text(max_size=60)
    | st.floats(allow_nan=True, allow_infinity=True).map(repr)
    | st.integers(min_value=-(10**30), max_value=10**30).map(str)
    | st.datetimes(timezones=st.just(UTC)).map(lambda d: d.strftime("%a, %d %b %Y %H:%M:%S GMT"))
)
def test_any_retry_after_is_none_or_a_wait_within_the_bound(text: str) -> None:
    now = datetime(2026, 11, 1, 9, 0, tzinfo=UTC)
    wait = parse_retry_after(text, now=now.timestamp)
    if wait is not None:
        assert math.isfinite(wait) and 0.0 <= wait <= MAX_RETRY_AFTER
        assert now + timedelta(seconds=wait) <= now + timedelta(seconds=MAX_RETRY_AFTER)
