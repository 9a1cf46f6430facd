"""What one tick did, counted across the worker threads."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Literal

Count = Literal[
    "sent",
    "confirmed",
    "unknown",
    "rejected",
    "unavailable",
    "searched",
    "tidied",
    "bounced",
    "escalated",
    "recovered",
    "skipped",
    "errors",
]


@dataclass
class TickReport:
    sent: int = 0
    confirmed: int = 0
    unknown: int = 0
    rejected: int = 0
    unavailable: int = 0  # rejections that proved the provider unavailable (not counted)
    searched: int = 0
    tidied: int = 0  # settled jobs whose unsent drafts were looked for and deleted
    bounced: int = 0  # delivery reports recorded on their jobs (Bounced)
    escalated: int = 0
    recovered: int = 0
    skipped: int = 0
    errors: int = 0

    def add(self, other: TickReport) -> None:
        for name in vars(self):
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def busy(self) -> bool:
        return any(vars(self).values())


@dataclass
class Counter:
    """A TickReport that several worker threads bump at once."""

    report: TickReport = field(default_factory=TickReport)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def bump(self, name: Count, by: int = 1) -> None:
        with self.lock:
            setattr(self.report, name, getattr(self.report, name) + by)

    def take(self) -> TickReport:
        """What was counted since the last take, and a fresh count from here."""
        with self.lock:
            report, self.report = self.report, TickReport()
        return report
