"""Logging for a terminal, and for journald (sd-daemon level prefixes, no timestamps).

Every line is printable (docs/cli.md "Keys"): a log message carries caller-supplied values (a
key, a subject, a provider's answer), and each control or bidi character in them is
written as an escape (`ledger.display.printable`), so a log line cannot move the cursor
of the terminal showing it, forge a second line, or read backwards. A traceback keeps its
own lines, each made printable.
"""

from __future__ import annotations

import logging
import sys
from types import TracebackType
from typing import TextIO

from daemon.systemd import under_systemd
from ledger.display import printable

_ExcInfo = tuple[type[BaseException], BaseException, TracebackType | None] | tuple[None, None, None]

_SD_PREFIX = {
    logging.CRITICAL: "<2>",
    logging.ERROR: "<3>",
    logging.WARNING: "<4>",
    logging.INFO: "<6>",
    logging.DEBUG: "<7>",
}


class PrintableFormatter(logging.Formatter):
    def formatMessage(self, record: logging.LogRecord) -> str:
        # `format` sets record.message afresh for every handler, so escaping it here
        # leaves nothing behind for another handler.
        record.message = printable(record.message)
        return super().formatMessage(record)

    def formatException(self, ei: _ExcInfo) -> str:
        return _printable_lines(super().formatException(ei))

    def formatStack(self, stack_info: str) -> str:
        return _printable_lines(super().formatStack(stack_info))


def _printable_lines(text: str) -> str:
    return "\n".join(printable(line) for line in text.split("\n"))


class JournalFormatter(PrintableFormatter):
    def format(self, record: logging.LogRecord) -> str:
        # journald stamps each line itself; the prefix carries the priority.
        prefix = _SD_PREFIX.get(record.levelno, "<6>")
        message = super().format(record).replace("\n", " | ")
        return f"{prefix}{message}"


def setup_logging(
    level: str = "info", *, journal: bool | None = None, stream: TextIO | None = None
) -> None:
    """Log lines to `stream` (stderr by default; `demo` and `try` give a file, so their
    story on the terminal holds none)."""
    journal = under_systemd() if journal is None else journal
    handler = logging.StreamHandler(stream or sys.stderr)
    if journal:
        handler.setFormatter(JournalFormatter("%(levelname)s %(name)s: %(message)s"))
    else:
        handler.setFormatter(
            PrintableFormatter(
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
