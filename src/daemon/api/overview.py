"""The overview page's chart: sends, unknowns, duplicates and reviews per hour over the
last day, counted from the event log (docs/review.md "Review page")."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from ledger.application import Ledger

#: (series, the SendJob event counted, colour): a send is a confirmation.
SERIES = (
    ("sends", "Confirmed", "#2e7d32"),
    ("unknowns", "Unknown", "#f9a825"),
    ("duplicates", "Duplicate", "#c62828"),
    ("reviews", "Escalated", "#6a1b9a"),
)
WIDTH, HEIGHT, TOP, BOTTOM, LEFT = 720, 180, 10, 24, 30
#: The chart a 390 px phone shows (docs/review.md "Review page"): drawn at the width it is
#: shown, so its 11 px labels stay 11 px instead of shrinking with a scaled-down SVG.
NARROW = 340


@dataclass(frozen=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    colour: str
    title: str


@dataclass(frozen=True)
class Chart:
    hours: list[datetime]
    counts: dict[str, list[int]]
    bars: list[Bar]
    peak: int
    labels: list[tuple[float, str]]  # x, "HH:00"
    series: tuple[tuple[str, str, str], ...] = SERIES
    width: int = WIDTH
    height: int = HEIGHT
    baseline: float = HEIGHT - BOTTOM
    left: int = LEFT

    def resized(self, width: int, label_every: int) -> Chart:
        """The same counts drawn `width` wide, an hour label every `label_every` hours."""
        return _drawn(self.hours, self.counts, width, label_every)


def hourly_chart(ledger: Ledger, *, until: datetime, hours: int = 24) -> Chart:
    start = (until - timedelta(hours=hours - 1)).replace(minute=0, second=0, microsecond=0)
    slots = [start + timedelta(hours=i) for i in range(hours)]
    counts = {name: [0] * hours for name, _, _ in SERIES}
    by_event = {event: name for name, event, _ in SERIES}
    first = ledger.recent_start(start)
    # Up to now included: the last slot is the current hour (later events are not counted).
    for event in ledger.job_events(types=list(by_event), since=start, first=first):
        slot = int((event.timestamp - start).total_seconds() // 3600)
        if 0 <= slot < hours:
            counts[by_event[type(event).__name__]][slot] += 1
    return _drawn(slots, counts, WIDTH, 4)


def _drawn(slots: list[datetime], counts: dict[str, list[int]], width: int, every: int) -> Chart:
    hours = len(slots)
    peak = max([1, *(max(values) for values in counts.values())])
    plot = HEIGHT - TOP - BOTTOM
    slot_width = (width - LEFT) / hours
    bar_width = slot_width / (len(SERIES) + 1)
    bars = []
    for s, (name, _, colour) in enumerate(SERIES):
        for i, value in enumerate(counts[name]):
            if value:
                height = plot * value / peak
                bars.append(
                    Bar(
                        x=LEFT + i * slot_width + (s + 0.5) * bar_width,
                        y=HEIGHT - BOTTOM - height,
                        width=bar_width,
                        height=height,
                        colour=colour,
                        title=f"{slots[i]:%H}:00 {name}: {value}",
                    )
                )
    labels = [
        (LEFT + i * slot_width, f"{slot:%H}:00") for i, slot in enumerate(slots) if i % every == 0
    ]
    return Chart(slots, counts, bars, peak, labels, width=width)


__all__ = ["NARROW", "SERIES", "Chart", "hourly_chart"]
