"""Retention (docs/configuration.md "Retention"): the daemon's periodic purge
(`[retention]`). What a purge does to a job is `Ledger.purge` (`ledger/redaction.py`);
`sendledger admin purge` is `daemon/cli/admin_purge.py`. This module decides which jobs,
when, and says what it did."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta

from ledger.application import Ledger, PurgeResult
from ledger.display import iso
from policies.durations import format_duration

log = logging.getLogger("sendledger.retention")


class RetentionJob:
    """What the daemon's scheduler runs every `[retention] every`: purge the jobs that
    settled for good longer than `purge_after` seconds ago."""

    def __init__(
        self,
        ledger: Ledger,
        purge_after: float,
        *,
        daemon_name: str,
        stop: Callable[[], bool] = lambda: False,
    ) -> None:
        self.ledger = ledger
        self.purge_after = purge_after
        self.by = f"daemon {daemon_name}" if daemon_name else "daemon"
        self.rule = f"[retention] purge_after = {format_duration(purge_after)}"
        self.stop = stop

    def run(self) -> PurgeResult:
        before = self.ledger.clock() - timedelta(seconds=self.purge_after)

        def progress(count: int) -> None:
            log.info("retention: %d jobs purged so far", count)

        result = self.ledger.purge_settled(
            before, by=self.by, rule=self.rule, progress=progress, stop=self.stop
        )
        if result.purged or result.skipped:
            log.info(
                "retention: purged %d jobs settled before %s%s",
                result.purged,
                iso(before),
                f" ({result.skipped} changed meanwhile: next run)" if result.skipped else "",
            )
        if not result.scrubbed:
            # The purged text is still in the store's files (a SQLite WAL that readers
            # kept busy): the next run scrubs again, whether or not it purges.
            log.warning(
                "retention: the store's files could not be scrubbed now (readers busy):"
                " the next run tries again"
            )
        return result


__all__ = ["RetentionJob"]
