"""The overview chart (daemon/api/overview.py) counts the last day's events per hour, and
reads only the recent part of the event log (`Ledger.recent_start`)."""

from __future__ import annotations

from tests.unit.engine_rig import EngineRig, policy

from daemon.api.overview import hourly_chart
from daemon.doubles.fake_provider import Scripted

LEGAL = policy("legal", on_unknown="review")


def test_the_chart_counts_sends_unknowns_and_reviews_per_hour() -> None:
    rig = EngineRig(LEGAL)
    try:
        rig.submit("legal", "old")
        rig.tick()  # two days ago: outside the window
        rig.clock.advance(2 * 86400)
        start = rig.ledger.recent_start(rig.clock.now.replace(minute=0))
        assert start > 1  # the old job's events are skipped, not read
        for n in range(3):
            rig.submit("legal", f"sent-{n}")
        rig.tick()
        rig.clock.advance(3600)
        rig.submit("legal", "lost")
        rig.provider.script(Scripted.lost_request())
        rig.tick()
        chart = hourly_chart(rig.ledger, until=rig.clock.now, hours=24)
        assert chart.counts["sends"][-2:] == [3, 0]
        assert chart.counts["unknowns"][-1] == 1 and chart.counts["reviews"][-1] == 1
        assert sum(chart.counts["sends"]) == 3  # "old" is two days back
        assert chart.peak == 3 and len(chart.bars) == 3
        assert all(0 <= bar.y <= chart.baseline for bar in chart.bars)
    finally:
        rig.close()


def test_recent_start_of_an_empty_store_is_the_first_id() -> None:
    rig = EngineRig(LEGAL)
    try:
        assert rig.ledger.recent_start(rig.clock.now) == 1
        assert hourly_chart(rig.ledger, until=rig.clock.now).bars == []
    finally:
        rig.close()
