"""What a log line quotes of another's text is bounded and escaped (docs/operations.md
"Logs and retention"): a provider's hostile answer (10 MB, line breaks, ANSI escapes, a
NUL) makes log lines of bounded length with nothing in them unescaped."""

from __future__ import annotations

import logging
import sys
import time
import unicodedata
from collections.abc import Iterator

import pytest
from tests.unit.engine_rig import EngineRig, policy

from daemon.doubles.fake_provider import Scripted
from daemon.logs import MAX_MESSAGE, MAX_TRACEBACK, JournalFormatter, PrintableFormatter
from daemon.providers.outcomes import SendKind, SendOutcome
from ledger.display import MAX_QUOTED, quoted

#: A provider's answer as a hostile (or broken) server may write it: 10 MB, every line
#: a forged log line, terminal escapes, a NUL.
HOSTILE = "550 no\n2026-01-01T00:00:00 ERROR   forged: \x1b[2J\x1b]0;pwned\x07\x00 " * 200_000
#: A prefix's room: a moment, a level, a logger's name, a job's key.
PREFIX = 120

TERMINAL = PrintableFormatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s")
JOURNAL = JournalFormatter("%(levelname)s %(name)s: %(message)s")


class _Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def kept() -> Iterator[_Kept]:
    handler = _Kept()
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def _unescaped(text: str) -> list[str]:
    return [c for c in text if unicodedata.category(c) in ("Cc", "Zl", "Zp", "Cs")]


def _assert_bounded_and_printable(record: logging.LogRecord) -> None:
    line = JOURNAL.format(record)
    assert len(line) <= PREFIX + MAX_MESSAGE + MAX_TRACEBACK, len(line)
    assert len(line.encode("utf-8")) < 48 * 1024  # journald's LineMax: one entry
    assert not _unescaped(line), _unescaped(line)[:5]
    lines = TERMINAL.format(record).split("\n")
    assert len(lines[0]) <= PREFIX + MAX_MESSAGE
    assert sum(len(line) for line in lines) <= PREFIX + MAX_MESSAGE + MAX_TRACEBACK
    assert not [line for line in lines if _unescaped(line)]


@pytest.mark.parametrize(
    "fate",
    [
        Scripted.rejected(transient=False, reason=HOSTILE),
        Scripted(SendOutcome(SendKind.UNKNOWN, HOSTILE), stored=False),
    ],
    ids=["rejected", "unknown"],
)
def test_a_hostile_provider_answer_makes_short_printable_log_lines(
    fate: Scripted, kept: _Kept
) -> None:
    """The send's line (`job K rejected (REASON)`, `job K outcome unknown (REASON)`)
    quotes the first MAX_QUOTED characters of the answer; it quoted all 10 MB, at every
    retry."""
    rig = EngineRig(policy("receipts"))
    try:
        rig.submit("receipts", "k1")
        rig.provider.script(fate)
        rig.tick()
    finally:
        rig.close()
    quoting = [r for r in kept.records if "forged" in r.getMessage()]
    assert quoting, [r.getMessage()[:80] for r in kept.records]
    for record in quoting:
        length = len(record.getMessage())
        assert length <= PREFIX + len(quoted(HOSTILE)), (record.msg, length)
        _assert_bounded_and_printable(record)


def _failed_record(words: str) -> logging.LogRecord:
    try:
        raise RuntimeError(words)
    except RuntimeError:
        return logging.getLogger("sendledger.engine").makeRecord(
            "sendledger.engine", logging.ERROR, __file__, 1, "job %s: send worker failed",
            ("k1",), sys.exc_info(),
        )  # fmt: skip


def test_a_traceback_quoting_a_hostile_answer_keeps_its_start_and_its_error() -> None:
    """An exception whose words are the answer, logged with its traceback: the traceback
    is cut in its middle, its first line and the error's type kept, each line escaped."""
    record = _failed_record(HOSTILE)
    _assert_bounded_and_printable(record)
    lines = TERMINAL.format(record).split("\n")
    assert lines[1] == "Traceback (most recent call last):"
    assert any(line.startswith("RuntimeError: 550 no") for line in lines)
    assert any(line.startswith("... [") and line.endswith(" lines cut]") for line in lines)


def test_a_traceback_another_formatter_kept_on_the_record_is_escaped_too() -> None:
    """`logging.Formatter` keeps a record's traceback text for the next handler: one made
    by a plain formatter first (another handler's) was written as it was."""
    record = _failed_record("550 no\x1b[2J\n2026-01-01T00:00:00 ERROR forged")
    logging.Formatter().format(record)  # another handler's, first
    assert "\x1b" in (record.exc_text or "")
    _assert_bounded_and_printable(record)
    assert "\x1b" in (record.exc_text or "")  # left as it was found, for that handler


def test_a_short_answer_is_quoted_whole_and_a_long_one_says_how_much_is_cut() -> None:
    assert quoted("550 mailbox full") == "550 mailbox full"
    assert quoted(ValueError("refused")) == "refused"
    long = "x" * (MAX_QUOTED + 5)
    assert quoted(long) == "x" * MAX_QUOTED + "... [5 more characters]"


def test_a_10_mb_message_is_formatted_in_milliseconds() -> None:
    """Only what is shown is escaped: a 10 MB message was escaped whole (seconds)."""
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "%s", (HOSTILE,), None)
    started = time.perf_counter()
    line = JOURNAL.format(record)
    assert time.perf_counter() - started < 0.5
    assert line.endswith(" more characters]") and len(line) <= PREFIX + MAX_MESSAGE
