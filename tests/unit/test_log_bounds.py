"""What a log line quotes of another's text is bounded and escaped (docs/operations.md
"Logs and retention"): a provider's hostile answer (10 MB, line breaks, ANSI escapes, a
NUL) makes log lines of bounded length with nothing in them unescaped."""

from __future__ import annotations

import io
import logging
import sys
import threading
import time
import unicodedata
from collections.abc import Iterator, Mapping
from contextlib import nullcontext
from types import SimpleNamespace
from typing import cast

import pytest
from tests.unit.engine_rig import EngineRig, policy

from daemon.doubles.fake_provider import Scripted
from daemon.logs import (
    MAX_MESSAGE,
    MAX_TRACEBACK,
    JournalFormatter,
    PrintableFormatter,
    setup_logging,
)
from daemon.providers.outcomes import SearchResult, SendKind, SendOutcome
from daemon.service_layer.services import ChannelPolicies, ServiceError, Services
from daemon.webhooks.delivery import Outcome
from daemon.webhooks.delivery_threads import WebhookThreads
from daemon.webhooks.worker import Deliverer, Hook
from ledger.application import Ledger
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
    _assert_quoted_briefly(quoting, len(quoting) or 1)


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


def test_a_search_failing_with_a_hostile_answer_logs_a_short_line(kept: _Kept) -> None:
    """A review check whose provider fails in a way of its own (not a ProviderError):
    `search for ID failed: ...` quoted its words whole."""
    rig = EngineRig(policy("receipts"))
    try:
        rig.submit("receipts", "k1")
        rig.provider.script(Scripted.dropped_response())
        rig.tick()

        def fails(message_id: str) -> SearchResult:
            raise RuntimeError(HOSTILE)

        rig.provider.search = fails  # type: ignore[method-assign]
        services = Services(
            rig.ledger,
            lambda: ChannelPolicies(rig.policies, {}),
            providers=lambda name: nullcontext(rig.provider),
        )
        with pytest.raises(ServiceError):
            services.check("k1", by="bob")
    finally:
        rig.close()
    _assert_quoted_briefly([r for r in kept.records if r.msg.startswith("search for")])


def test_a_webhook_thread_failing_with_a_hostile_error_logs_a_short_line(kept: _Kept) -> None:
    """A webhook's pass failing (its store unreachable, say) with an error that quotes
    another's text at length: `webhook NAME: ERROR` quoted it whole."""
    threads = WebhookThreads(cast(Ledger, None), [], owner="a", poll=0.01)

    class _Failing:
        hook = SimpleNamespace(name="crm")

        def pass_once(self) -> bool:
            threads._stop.set()
            raise RuntimeError(HOSTILE)

        def release(self) -> None:
            raise RuntimeError(HOSTILE)

    threads._run(cast(Deliverer, _Failing()))
    _assert_quoted_briefly([r for r in kept.records if r.msg.startswith("webhook %s")], 2)


def test_a_receivers_hostile_refusal_logs_a_short_line(kept: _Kept) -> None:
    """A receiver refusing a delivery with a long answer: `webhook NAME: event N not
    delivered (attempt N): ERROR` quoted all the poster handed back."""
    rig = EngineRig(policy("receipts"))
    try:
        rig.submit("receipts", "k1")
        rig.provider.script(Scripted.rejected(transient=False, reason="550 no such user"))
        rig.tick()

        def refuses(url: str, body: bytes, headers: Mapping[str, str], timeout: float) -> Outcome:
            return Outcome(False, 400, HOSTILE)

        hook = Hook(
            "crm", "https://hooks.example.com/x", "whsec_" + "A" * 32, frozenset({"rejected"})
        )
        Deliverer(rig.ledger, hook, owner="a", poster=refuses, clock=time.time).pass_once()
    finally:
        rig.close()
    _assert_quoted_briefly([r for r in kept.records if "not delivered" in r.msg])


def _assert_quoted_briefly(records: list[logging.LogRecord], count: int = 1) -> None:
    assert len(records) == count, [r.msg for r in records]
    for record in records:
        length = len(record.getMessage())
        assert length <= PREFIX + len(quoted(HOSTILE)), (record.msg, length)
        _assert_bounded_and_printable(record)


def test_a_threads_uncaught_hostile_error_is_one_bounded_escaped_record(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A thread that dies of an error quoting another's text: the standard library
    printed its traceback straight to stderr, past the formatter, whole and unescaped."""
    monkeypatch.setattr(threading, "excepthook", threading.__excepthook__)
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", list(root.handlers))
    monkeypatch.setattr(root, "level", root.level)
    written = io.StringIO()
    setup_logging("info", journal=True, stream=written)

    def dies() -> None:
        raise RuntimeError(HOSTILE)

    thread = threading.Thread(target=dies, name="webhook-crm")
    thread.start()
    thread.join()
    [line] = written.getvalue().splitlines()
    assert line.startswith("<3>ERROR sendledger: thread webhook-crm failed: RuntimeError | ")
    assert len(line) <= PREFIX + MAX_MESSAGE + MAX_TRACEBACK and not _unescaped(line)
