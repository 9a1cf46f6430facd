"""Issue 16, "Keys and notes": what a new key, an operator's name and a note may hold
(docs/cli.md "Keys"), and that a key stored before the rule is still read and shown escaped."""

from __future__ import annotations

import io
import json
import logging
import unicodedata
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.unit.test_job_transitions import review_job

from daemon.cli import output
from daemon.cli.audit import FORMULA_STARTS, csv_cell
from daemon.doubles.fake_time import FakeClock
from daemon.logs import JournalFormatter, PrintableFormatter
from daemon.service_layer.intake import IntakeError, decode_jobs, parse_jobs
from ledger.characters import invisible
from ledger.content import JobInputError, parse_job
from ledger.display import printable
from ledger.keys import MAX_NOTE_LENGTH, REFUSED_CATEGORIES, identifier_problem
from ledger.vocabulary import Resolution


def job(key: str, **overrides: Any) -> dict[str, Any]:
    return {
        "channel": "receipts",
        "key": key,
        "to": "bob@example.com",
        "subject": "Your receipt",
        "body": "Thanks.",
        **overrides,
    }


# -- keys -------------------------------------------------------------------------------

HOSTILE_KEYS = [
    "order\x1b[2J",  # ESC: clears the screen
    "order\x07",  # BEL
    "order\x7f",  # DEL
    "order\x9b31m",  # C1 CSI
    "order\x85",  # C1 NEL
    "invoice\u202efdp.exe",  # RIGHT-TO-LEFT OVERRIDE
    "a\u2066b\u2069",  # isolates
    "a\u200eb",  # LEFT-TO-RIGHT MARK
    "a\u200fb",  # RIGHT-TO-LEFT MARK
    "a\u061cb",  # ARABIC LETTER MARK
    "a\u200bb",  # ZERO WIDTH SPACE: looks like "ab"
    "\ufeffab",  # BOM
    "a\u2028b",  # LINE SEPARATOR
    "a\u2029b",  # PARAGRAPH SEPARATOR
    "a\tb",
    "order\u00a01",  # NO-BREAK SPACE: looks like "order 1"
    "order-1\u3164",  # HANGUL FILLER: shows as nothing
    "order-1\u034f",  # COMBINING GRAPHEME JOINER
]


@pytest.mark.parametrize("key", HOSTILE_KEYS)
def test_a_new_key_refuses_controls_bidi_and_invisible_characters(key: str) -> None:
    with pytest.raises(JobInputError) as info:
        parse_job(job(key))
    assert info.value.field == "key"
    # The reason names the character by its code point, never raw.
    assert "U+" in info.value.reason
    assert printable(info.value.reason) == info.value.reason


@pytest.mark.parametrize(
    "key", ["order-1001", "Bestellung-ä-ß", "注文-42", "order 42", "a/b:c#d", "x--as resend #"]
)
def test_ordinary_keys_are_accepted(key: str) -> None:
    assert parse_job(job(key)).key == key


@settings(deadline=None, max_examples=300)
@given(st.text(min_size=1, max_size=40))
def test_the_key_rule_is_exactly_the_refused_categories(key: str) -> None:
    bad = [c for c in key if unicodedata.category(c) in REFUSED_CATEGORIES or invisible(c)]
    problem = identifier_problem(key)
    if bad:
        assert f"U+{ord(bad[0]):04X}" in problem  # type: ignore[operator]
    elif unicodedata.normalize("NFC", key) != key:
        assert problem is not None and "NFC" in problem
    else:
        assert problem is None


def test_a_key_has_one_spelling_nfc() -> None:
    # The same word typed on two systems: e + U+0301 and U+00E9 look alike, and would be
    # two jobs (two Message-IDs): a retry that changed its spelling would send twice.
    decomposed = unicodedata.normalize("NFD", "café-1001")
    with pytest.raises(JobInputError, match="NFC") as info:
        parse_job(job(decomposed))
    assert info.value.field == "key"
    assert parse_job(job("café-1001")).key == "café-1001"


@settings(deadline=None, max_examples=300)
@given(st.text(min_size=1, max_size=40).filter(lambda k: identifier_problem(k) is None))
def test_an_accepted_key_shows_as_itself_apart_from_backslashes(key: str) -> None:
    # Nothing a new key holds needs escaping on a terminal: what is shown is what is typed.
    assert printable(key) == key.replace("\\", "\\\\")


# -- names and notes ---------------------------------------------------------------------


def test_resolve_refuses_a_name_with_controls_and_a_note_that_is_not_text() -> None:
    clock = FakeClock()
    for by, note, field in [
        ("alice\x1b]0;pwned\x07", "", "by"),
        ("bob\u202e", "", "by"),
        ("a" * 201, "", "by"),
        ("alice", "nul\x00", "note"),
        ("alice", "bad bytes \udcff", "note"),
        ("alice", "x" * (MAX_NOTE_LENGTH + 1), "note"),
    ]:
        job_ = review_job(clock)
        with pytest.raises(JobInputError) as info:
            job_.resolve(Resolution.ABANDON, note=note, by=by, at=clock.now)
        assert info.value.field == field
        assert not job_.collect_events()[-1:] or job_.state.value == "review"


def test_a_note_is_free_text_stored_as_typed() -> None:
    clock = FakeClock()
    job_ = review_job(clock)
    note = "checked twice\nsee ticket\t#42 \u202e (an operator's own text)"
    job_.resolve(Resolution.ABANDON, note=note, by="alice", at=clock.now)
    assert job_.state.value == "abandoned"


# -- printing ---------------------------------------------------------------------------

RAW = "k\x1b[31m\u202e\u2028\x9b\x7f"


def test_tables_key_values_and_errors_show_controls_escaped(
    capsys: pytest.CaptureFixture[str],
) -> None:
    table = output.table([{"key": RAW, "tags": [RAW]}], ["key", "tags"])
    lines = output.key_values([("key", RAW)])
    output.error(f"unknown job {RAW}")
    shown = table + lines + capsys.readouterr().err
    for char in "\x1b\u202e\u2028\x9b\x7f":
        assert char not in shown
    assert "k\\x1b[31m\\u202e\\u2028\\x9b\\x7f" in lines


def test_json_output_escapes_what_json_leaves_raw_and_decodes_to_the_same_value(
    capsys: pytest.CaptureFixture[str],
) -> None:
    value = {"key": RAW + "\udcff\u2066é注"}
    output.print_json(value)
    for text in (output.dumps(value), capsys.readouterr().out):
        assert text.isprintable() or set(text) - set(text.replace("\n", "")) <= {"\n"}
        assert all(c.isprintable() for c in text.replace("\n", ""))
        assert json.loads(text) == value
        assert "é注" in text  # what is printable stays readable


@settings(deadline=None, max_examples=300)
@given(st.text(max_size=30))
def test_json_output_never_carries_what_printable_would_escape(text: str) -> None:
    dumped = output.dumps({"v": text})
    assert json.loads(dumped) == {"v": text}
    assert printable(dumped.replace("\\", "")) == dumped.replace("\\", "")


def log_line(formatter: logging.Formatter, message: str, *args: object, exc: bool = False) -> str:
    record = logging.LogRecord("sendledger", logging.WARNING, __file__, 1, message, args, None)
    if exc:
        try:
            raise ValueError(f"boom {RAW}")
        except ValueError:
            import sys

            record.exc_info = sys.exc_info()
    return formatter.format(record)


@pytest.mark.parametrize("formatter", [PrintableFormatter("%(message)s"), JournalFormatter()])
def test_every_log_line_escapes_caller_values(formatter: logging.Formatter) -> None:
    line = log_line(formatter, "job %s: %s", RAW + "\nforged line", "x", exc=True)
    for char in "\x1b\u202e\u2028\x9b\x7f":
        assert char not in line
    assert "\\x0aforged line" in line
    # The traceback keeps its own lines (journald joins them), each one printable.
    assert "boom k\\x1b" in line


def test_the_daemons_handler_uses_the_printable_formatter() -> None:
    from daemon.logs import setup_logging

    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        for journal in (False, True):
            setup_logging(journal=journal)
            stream = io.StringIO()
            handler = root.handlers[0]
            assert isinstance(handler, logging.StreamHandler)
            handler.setStream(stream)
            logging.getLogger("sendledger").warning("key %s", RAW)
            assert "\x1b" not in stream.getvalue() and "k\\x1b" in stream.getvalue()
    finally:
        root.handlers[:], level = saved
        root.setLevel(level)


# -- CSV --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "cell"),
    [
        ('=HYPERLINK("http://evil.example","x")', '\'=HYPERLINK("http://evil.example","x")'),
        ("+1+cmd|' /C calc'!A0", "'+1+cmd|' /C calc'!A0"),
        ("-2+3", "'-2+3"),
        ("@SUM(A1)", "'@SUM(A1)"),
        ("\t=1", "'\\x09=1"),
        ("order-1", "order-1"),
        (3, "3"),
        (None, ""),
    ],
)
def test_csv_cells_are_never_formulas(value: object, cell: str) -> None:
    assert csv_cell(value) == cell


@settings(deadline=None, max_examples=300)
@given(st.one_of(st.text(max_size=30), st.integers(), st.none()))
def test_csv_neutralizer(value: object) -> None:
    cell = csv_cell(value)
    assert not cell.startswith(FORMULA_STARTS)
    assert printable(cell.removeprefix("'")) == cell.removeprefix("'") or "\\" in cell
    shown = "" if value is None else printable(str(value))
    assert cell in (shown, "'" + shown)
    assert (cell != shown) == ("" if value is None else str(value)).startswith(FORMULA_STARTS)


# -- duplicate names in job JSON ----------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ('{"to": "a@example.com", "to": "b@example.com"}', "job.to"),
        ('{"headers": {"X-Tag": "a", "X-Tag": "b"}}', "job.headers.X-Tag"),
        ('{"attachments": [{"filename": "a", "filename": "b"}]}', "job.attachments[0].filename"),
        ('[{"key": "x"}, {"key": "y", "key": "z"}]', "job[1].key"),
    ],
)
def test_a_name_given_twice_is_refused_naming_it(text: str, where: str) -> None:
    with pytest.raises(IntakeError) as info:
        parse_jobs(decode_jobs(text))
    assert str(info.value.problems[-1]).startswith(f"{where}: given twice")


def test_without_duplicates_decoding_is_json_loads() -> None:
    text = json.dumps([job("a", headers={"X-Tag": "t"}), job("b")])
    assert decode_jobs(text) == json.loads(text)
    assert [j.key for j in parse_jobs(decode_jobs(text))] == ["a", "b"]


@pytest.mark.parametrize("text", ["[" * 100_000, "1" * 5000, '{"key": ' + "9" * 5000 + "}"])
def test_what_json_cannot_decode_is_one_decode_error(text: str) -> None:
    with pytest.raises(json.JSONDecodeError):
        decode_jobs(text)
    with pytest.raises(UnicodeDecodeError):
        decode_jobs(b"\xff")


@pytest.mark.parametrize("name", ["ops\x1b[2J", "ops\u202e", "o\u200bps", "x" * 201])
def test_a_token_name_is_checked_like_a_key(tmp_path: Any, name: str) -> None:
    from daemon.api.auth import TokenBook, TokenFileError

    path = tmp_path / "tokens"
    path.write_text(f"{name}:0123456789abcdef0123\n", encoding="utf-8")
    with pytest.raises(TokenFileError) as info:
        TokenBook.from_file(path)
    assert ":1: the name " in str(info.value)
    assert "0123456789abcdef" not in str(info.value)
