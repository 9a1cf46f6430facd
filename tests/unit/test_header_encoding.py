"""The header writer and its lenient readers, function by function
(`ledger/header_encoding.py`; docs/cli.md "What is sent, exactly how"): RFC 2231
file-name segments hold whole characters, encoded words whole characters within 75
characters, folding breaks only before a space, and the readers decode what lenient
clients decode. Pure: runs on any Python >= 3.11 (`make test-py313`)."""

from __future__ import annotations

import base64
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.header_encoding import (
    LINE,
    MAX_RUN,
    client_view,
    encoded_words,
    fold,
    parameter,
    parameter_value,
    phrase,
    plain,
    unstructured,
)

SEGMENT = re.compile(r"filename\*(\d+)\*=(?:utf-8'')?(.*)")


def percent_decoded(text: str) -> bytes:
    return re.sub(rb"%([0-9A-F]{2})", lambda m: bytes([int(m.group(1), 16)]), text.encode("ascii"))


def segments(value: str) -> list[str]:
    written = parameter("filename", value)
    if len(written) == 1:
        assert written[0].startswith("filename*=utf-8''") or written[0].startswith('filename="')
        return [written[0].removeprefix("filename*=utf-8''")]
    found = [SEGMENT.fullmatch(piece) for piece in written]
    assert all(found), written
    assert [int(m.group(1)) for m in found if m] == list(range(len(written)))
    return [m.group(2) for m in found if m]


def test_a_long_non_ascii_file_name_is_split_between_characters() -> None:
    # 127b519 split "a" + 20 x "é" inside the second "é": fast-mail-parser (which decodes
    # each segment alone) showed U+FFFD there.
    name = "a" + "é" * 20 + ".txt"
    pieces = segments(name)
    assert len(pieces) == 3
    assert pieces[0] == "a" + "%C3%A9" * 9 and pieces[1] == "%C3%A9" * 10
    assert [percent_decoded(piece).decode("utf-8") for piece in pieces] == [
        "aééééééééé",
        "éééééééééé",
        "é.txt",
    ]


@settings(max_examples=200, deadline=None)
@given(st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=255))
def test_every_segment_holds_whole_characters_and_at_most_60(value: str) -> None:
    pieces = segments(value)
    if parameter("filename", value)[0].startswith('filename="'):
        assert pieces == [f'filename="{value}"']
        return
    assert all(0 < len(piece) <= 60 for piece in pieces)
    # Each alone is UTF-8 (no character cut), and together they are the name.
    assert "".join(percent_decoded(piece).decode("utf-8") for piece in pieces) == value
    written = parameter("filename", value)
    params = dict(piece.split("=", 1) for piece in written)
    assert parameter_value(params, "filename") == value


def test_a_plain_file_name_is_one_quoted_parameter_up_to_60_characters() -> None:
    assert parameter("filename", "Report (1).pdf") == ['filename="Report (1).pdf"']
    assert parameter("filename", "a" * 60) == [f'filename="{"a" * 60}"']
    assert parameter("filename", "a" * 61) == ["filename*0*=utf-8''" + "a" * 60, "filename*1*=a"]
    assert parameter("filename", "a;b") == ["filename*=utf-8''a%3Bb"]
    assert parameter("filename", "a%b") == ["filename*=utf-8''a%25b"]


@pytest.mark.parametrize(
    ("params", "shown"),
    [
        ({"filename": "a.txt"}, "a.txt"),
        ({"filename*": "utf-8''%C3%A9.txt", "filename": "other"}, "é.txt"),
        ({"filename*0*": "utf-8''%C3", "filename*1*": "%A9"}, "é"),
        ({"filename*0": "a", "filename*1": "b"}, "ab"),
        ({"filename*0*": "utf-8''a", "filename*1": "%41"}, "aA"),  # leniently decoded
        ({"filename*0*": "utf-8''a", "filename*2*": "b"}, "a"),  # a gap ends the name
        ({"filename*": "x-unknown''abc"}, "x-unknown''abc"),
        ({"filename*": "''abc"}, "abc"),
        ({"filename": "=?utf-8?q?=2E=2E?=/x"}, "../x"),  # decoded, as lenient clients do
        ({"other": "a"}, None),
        ({"filename*": "utf-8''%c3%a9"}, "é"),  # lower-case hex, as some writers send it
        ({"filename*": "utf-8''it's"}, "it's"),  # a quote after the language part is text
        ({"filename*": "utf-8''%FF.txt"}, "\ufffd.txt"),  # not UTF-8: replaced, not an error
        ({"filename*0*": "utf-8''a", "filename*1": "b", "filename*1*": "c"}, "ac"),
    ],
)
def test_a_parameter_reads_as_clients_read_it(params: dict[str, str], shown: str | None) -> None:
    assert parameter_value(params, "filename") == shown


# -- plain text and encoded words ------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "is_plain"),
    [
        ("Your receipt", True),
        ("", False),
        (" lead", False),
        ("trail ", False),
        ("a=?b", False),
        ("a=b?c", True),
        ("é", False),
        ("a\x7fb", False),
        ("x" * MAX_RUN, True),
        ("x" * (MAX_RUN + 1), False),
        ("a " + "x" * (MAX_RUN + 1), False),
    ],
)
def test_what_is_written_as_typed(text: str, is_plain: bool) -> None:
    assert plain(text) is is_plain


def word_text(word: str) -> bytes:
    assert word.startswith("=?utf-8?b?") and word.endswith("?=")
    return base64.b64decode(word[len("=?utf-8?b?") : -2])


@settings(max_examples=200, deadline=None)
@given(
    text=st.text(st.characters(exclude_categories=["Cs"]), min_size=1, max_size=200),
    room=st.integers(0, 100),
)
def test_encoded_words_hold_whole_characters_within_75(text: str, room: int) -> None:
    words = encoded_words(text, room)
    assert all(len(word) <= 75 for word in words)
    assert all(len(word_text(word)) <= 45 for word in words)
    # Each word alone decodes (no character cut), and together they are the text.
    assert "".join(word_text(word).decode("utf-8") for word in words) == text
    assert client_view(" ".join(words)) == text


def test_the_first_word_fits_its_room_and_the_others_72() -> None:
    words = encoded_words("é" * 60, 30)
    assert len(words[0]) <= 30 and word_text(words[0]).decode() == "é" * 6
    assert all(len(word) == 72 for word in words[1:-1])
    # At least one character, whatever the room.
    assert word_text(encoded_words("🎉🎉", 0)[0]).decode() == "🎉"
    assert word_text(encoded_words("🎉x", 0)[0]).decode() == "🎉x"


def test_folding_breaks_only_before_a_space_within_the_width() -> None:
    tokens = ["word"] * 30
    folded = fold("Subject", tokens)
    lines = folded.split("\r\n")
    assert all(len(line) <= LINE for line in lines)
    assert all(line.startswith(" ") for line in lines[1:])
    assert "".join(lines) == "Subject: " + " ".join(tokens)
    assert fold("X", ["a" * 100, "b"]) == "X: " + "a" * 100 + "\r\n b"
    # An empty token (two spaces in a row) never starts a line.
    assert fold("X", ["a" * 80, "", "b"]) == "X: " + "a" * 80 + " \r\n b"
    assert fold("Subject", ["a"], width=10) == "Subject: a"
    assert fold("Subject", ["ab", "cd"], width=12) == "Subject: ab\r\n cd"


def test_unstructured_text_is_as_typed_or_encoded() -> None:
    assert unstructured("Subject", "Your receipt") == "Subject: Your receipt"
    encoded = unstructured("Subject", "Grüße")
    assert encoded == "Subject: =?utf-8?b?R3LDvMOfZQ==?="
    long = unstructured("Subject", "é" * 100)
    assert all(len(line) <= LINE for line in long.split("\r\n"))


@pytest.mark.parametrize(
    ("name", "tokens"),
    [
        ("Alice Smith", ["Alice", "Smith"]),
        ("O'Brien", ["O'Brien"]),
        ("J. Smith", ['"J. Smith"']),
        ('Say "hi"', ['"Say \\"hi\\""']),
        ("a\\b", ['"a\\\\b"']),
        ("Zoë", ["=?utf-8?b?Wm/Dqw==?="]),
        ("a  b", ['"a  b"']),
    ],
)
def test_a_display_name_is_atoms_one_quoted_string_or_encoded_words(
    name: str, tokens: list[str]
) -> None:
    assert phrase(name, LINE) == tokens


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("=?utf-8?b?R3LDvMOfZQ==?= =?utf-8?b?IQ==?=", "Grüße!"),  # the space between words goes
        ("=?utf-8?q?a_b?=", "a b"),
        ("=?UTF-8?Q?=C3=A9?=", "é"),
        ("x =?utf-8?b?QQ==?= y", "x A y"),
        ("=?utf-8*en?q?a?=", "a"),  # an RFC 2231 language suffix
        ("=?x-unknown?q?a?=", "=?x-unknown?q?a?="),  # not decoded: shown as it is
        ("=?utf-8?b?QQ==?=  \t=?utf-8?b?Qg==?=", "AB"),
        ("=?utf-8?b?QQ==?=x=?utf-8?b?Qg==?=", "AxB"),
        ("=?utf-8?b?QQ?=", "A"),  # unpadded base64, as clients take it
        ("=?x-unknown?q?a?= =?utf-8?q?b?=", "=?x-unknown?q?a?= b"),
    ],
)
def test_client_view_decodes_every_word_as_lenient_clients_do(text: str, shown: str) -> None:
    assert client_view(text) == shown


@pytest.mark.parametrize("char", ["\x7f", "\x80", "\u07ff", "\u0800", "\uffff", "\U00010000"])
def test_every_word_but_the_last_is_as_full_as_whole_characters_allow(char: str) -> None:
    size = len(char.encode("utf-8"))
    words = encoded_words(char * 100, LINE)
    held = [len(word_text(word)) for word in words]
    assert sum(held) == 100 * size
    assert all(45 - size < count <= 45 for count in held[:-1]), held
    assert all(count % size == 0 for count in held)


@pytest.mark.parametrize(
    ("room", "first"),
    [(0, 6), (20, 6), (23, 6), (24, 9), (27, 9), (28, 12), (60, 36), (75, 45), (200, 45)],
)
def test_the_first_word_takes_what_its_room_allows(room: int, first: int) -> None:
    words = encoded_words("a" * 100, room)
    assert len(word_text(words[0])) == first
    assert len(words[0]) <= max(room, 20)


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("=?utf-8?q?=c3=a9?=", "é"),  # lower-case hex
        ("=?utf-8?q?a=5Fb?=", "a_b"),  # an encoded underscore stays one
        ("=?utf-8?q?=FF?=", "\ufffd"),  # not UTF-8: replaced
        ("=?utf-8?b?/w==?=", "\ufffd"),
        ("=?utf-8?b?QUI?=", "AB"),  # one padding character missing
        ("=?utf-8?b?QQ?=\t=?utf-8?b?Qg==?=", "AB"),  # a tab between words goes too
        ("=?utf-8?b?QQ==?= x =?utf-8?b?Qg==?=", "A x B"),  # text between words stays
    ],
)
def test_words_decode_in_either_form(text: str, shown: str) -> None:
    assert client_view(text) == shown


@pytest.mark.parametrize("text", ["a\tb", "a\x00b", "tab\t"])
def test_text_with_a_control_character_is_encoded(text: str) -> None:
    assert not plain(text)
    assert unstructured("Subject", text).startswith("Subject: =?utf-8?b?")


def test_long_plain_text_with_spaces_stays_plain_and_folds_at_its_spaces() -> None:
    text = "ab " * 400 + "ab"  # 1,202 characters, no run longer than two
    assert plain(text)
    written = unstructured("Subject", text)
    assert all(len(line) <= LINE for line in written.split("\r\n"))
    assert written.replace("\r\n", "") == "Subject: " + text
    # Two spaces in a row stay two: the text is written exactly as typed.
    assert unstructured("Subject", "a  b") == "Subject: a  b"


def test_a_line_of_exactly_the_width_is_not_broken() -> None:
    assert fold("X", ["a", "b" * 73]) == "X: a " + "b" * 73  # 78 characters
    assert fold("X", ["a", "b" * 74]) == "X: a\r\n " + "b" * 74


def test_the_first_encoded_word_fills_the_room_after_the_header_name() -> None:
    # "X-Ab: " leaves 72 characters: a word of 45 bytes (22 x "é" and no more).
    first = unstructured("X-Ab", "é" * 100).split("\r\n")[0]
    assert first.startswith("X-Ab: =?utf-8?b?") and len(first) <= LINE
    assert word_text(first.removeprefix("X-Ab: ")).decode() == "é" * 22
    words = phrase("é" * 40, 30)
    assert len(words[0]) <= 30 and word_text(words[0]).decode() == "é" * 6


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("=?utf-8*en*x?q?a?=", "a"),  # only the charset before the first "*" counts
        ("=?utf-8?b?QU!JD?=", "ABC"),  # a character outside base64 is skipped, as clients do
    ],
)
def test_a_word_is_decoded_as_lenient_clients_decode_it(text: str, shown: str) -> None:
    assert client_view(text) == shown
