"""Logging for a terminal, and for journald (sd-daemon level prefixes, no timestamps).

Every line is printable (docs/cli.md "Keys"): a log message carries caller-supplied values (a
key, a subject, a provider's answer), and each control or bidi character in them is
written as an escape (`ledger.display.printable`), so a log line cannot move the cursor
of the terminal showing it, forge a second line, or read backwards. A traceback keeps its
own lines, each made printable.

And every record is bounded, whatever it quotes: its message at most `MAX_MESSAGE`
characters and its traceback (or stack) `MAX_TRACEBACK`, escapes included, each cut
marked. A line that quotes another's text cuts it shorter first (`ledger.display.quoted`);
this is what holds for the lines that do not (an exception's words in a traceback).
"""

from __future__ import annotations

import logging
import sys
import threading
from types import TracebackType
from typing import TextIO

from daemon.systemd import under_systemd
from ledger.characters import cut_mark
from ledger.display import printable

_ExcInfo = tuple[type[BaseException], BaseException, TracebackType | None] | tuple[None, None, None]

_SD_PREFIX = {
    logging.CRITICAL: "<2>",
    logging.ERROR: "<3>",
    logging.WARNING: "<4>",
    logging.INFO: "<6>",
    logging.DEBUG: "<7>",
}


#: The most characters of a record's message, escapes included.
MAX_MESSAGE = 4_000
#: The most characters of a record's traceback or stack, escapes included: its start and
#: its end (where the error is) are kept.
MAX_TRACEBACK = 8_000
#: Of `MAX_TRACEBACK`, what its start keeps.
_TRACEBACK_HEAD = 2_000


class PrintableFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        # `logging.Formatter.format` keeps a traceback's text on the record (exc_text)
        # and writes a kept one as it is: one another handler's formatter made would
        # reach this log unescaped and whole. Each formatting here makes its own, and
        # leaves the record as it found it.
        kept = record.exc_text
        if record.exc_info:
            record.exc_text = None
        elif kept:
            record.exc_text = _bounded_lines(kept)  # a record from another process
        try:
            return super().format(record)
        finally:
            record.exc_text = kept

    def formatMessage(self, record: logging.LogRecord) -> str:
        # `format` sets record.message afresh for every handler, so escaping it here
        # leaves nothing behind for another handler.
        record.message = _bounded(record.message, MAX_MESSAGE)
        return super().formatMessage(record)

    def formatException(self, ei: _ExcInfo) -> str:
        return _bounded_lines(super().formatException(ei))

    def formatStack(self, stack_info: str) -> str:
        return _bounded_lines(super().formatStack(stack_info))


#: Room for a cut's mark (`... [N more characters]`, `... [N lines cut]`).
_MARK = 40
#: A line break of a traceback as the journal writes it, and as its length is counted.
_BREAK = " | "


def _bounded(text: str, limit: int) -> str:
    """`printable(text)` in at most `limit` characters, cut between two escapes, the cut
    marked. Only what can be shown is escaped: a 10 MB text costs no more than a short one."""
    shown = printable(text[:limit])
    if len(text) <= limit and len(shown) <= limit:
        return shown
    room = max(0, limit - _MARK)
    pieces: list[str] = []
    used = 0
    for char in text[:room]:
        piece = printable(char)
        if used + len(piece) > room:
            break
        pieces.append(piece)
        used += len(piece)
    return "".join(pieces) + cut_mark(len(text) - len(pieces))


def _bounded_lines(text: str) -> str:
    """The lines of a traceback, each printable, in at most `MAX_TRACEBACK` characters:
    when longer, its first lines and its last (the error), the lines between counted."""
    lines = text.split("\n")
    if len(text) <= MAX_TRACEBACK:
        shown = [printable(line) for line in lines]
        if sum(len(line) + len(_BREAK) for line in shown) <= MAX_TRACEBACK + len(_BREAK):
            return "\n".join(shown)
    head = _lines_within(lines, _TRACEBACK_HEAD)
    rest = lines[len(head) :]
    tail = _lines_within(rest[::-1], MAX_TRACEBACK - _TRACEBACK_HEAD - _MARK)[::-1]
    return "\n".join([*head, f"... [{len(rest) - len(tail)} lines cut]", *tail])


def _lines_within(lines: list[str], budget: int) -> list[str]:
    """The first of `lines`, printable, the last one cut to what is left of `budget`."""
    shown: list[str] = []
    for line in lines:
        if budget < 2 * _MARK:
            break
        shown.append(_bounded(line, budget - len(_BREAK)))
        budget -= len(shown[-1]) + len(_BREAK)
    return shown


class JournalFormatter(PrintableFormatter):
    def format(self, record: logging.LogRecord) -> str:
        # journald stamps each line itself; the prefix carries the priority.
        prefix = _SD_PREFIX.get(record.levelno, "<6>")
        message = super().format(record).replace("\n", _BREAK)
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
    if threading.excepthook is threading.__excepthook__:
        # The standard library prints a thread's uncaught error straight to stderr, its
        # words unescaped and whole; a hook someone else set (a test runner's) is kept.
        threading.excepthook = _log_uncaught
    # APScheduler logs every run at INFO; keep its warnings and errors only.
    # A tick longer than the interval makes it warn about every skipped run; the daemon
    # reports stuck ticks itself (watchdog, STATUS=), so keep only its errors.
    logging.getLogger("apscheduler").setLevel(logging.ERROR)
    logging.getLogger("googleapiclient.discovery_cache").setLevel(logging.ERROR)


def _log_uncaught(args: threading.ExceptHookArgs) -> None:
    """A thread's uncaught error as a log record: escaped and bounded like any other."""
    if args.exc_type is SystemExit:
        return  # as the standard library's hook: a thread's exit, no error
    name = "?" if args.thread is None else args.thread.name
    error = None if args.exc_value is None else (args.exc_type, args.exc_value, args.exc_traceback)
    logging.getLogger("sendledger").error(
        "thread %s failed: %s", name, args.exc_type.__name__, exc_info=error
    )
