"""Logging for a terminal, and for journald (sd-daemon level prefixes, no timestamps)."""

from __future__ import annotations

import logging
import sys

from daemon.systemd import under_systemd

_SD_PREFIX = {
    logging.CRITICAL: "<2>",
    logging.ERROR: "<3>",
    logging.WARNING: "<4>",
    logging.INFO: "<6>",
    logging.DEBUG: "<7>",
}


class JournalFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        # journald stamps each line itself; the prefix carries the priority.
        prefix = _SD_PREFIX.get(record.levelno, "<6>")
        message = super().format(record).replace("\n", " | ")
        return f"{prefix}{message}"


def setup_logging(level: str = "info", *, journal: bool | None = None) -> None:
    journal = under_systemd() if journal is None else journal
    handler = logging.StreamHandler(sys.stderr)
    if journal:
        handler.setFormatter(JournalFormatter("%(levelname)s %(name)s: %(message)s"))
    else:
        handler.setFormatter(
            logging.Formatter(
                "%(asctime)s %(levelname)-7s %(name)s: %(message)s", "%Y-%m-%dT%H:%M:%S"
            )
        )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # APScheduler logs every run at INFO; keep its warnings and errors only.
    # A tick longer than the interval makes it warn about every skipped run; the daemon
    # reports stuck ticks itself (watchdog, STATUS=), so keep only its errors.
    logging.getLogger("apscheduler").setLevel(logging.ERROR)
    logging.getLogger("googleapiclient.discovery_cache").setLevel(logging.ERROR)
