"""A job's Message-ID as each receiver reads it back out of the query we send
(docs/providers.md "The Message-ID in each query").

The Message-ID comes from the job's key (`ledger/message_id.py`), and leaves the process
in three query languages: Gmail's `q`, an IMAP `SEARCH` command and a Graph `$filter`.
Each property parses what we send the way the receiver does (the Gmail and Graph
emulators' parsers, IMAP's string syntax) and asks for exactly the id we meant: one
term, no operator, no second value. A looser match the receiver makes of that one value
is compared exactly by the provider (the integration tests).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from urllib.parse import parse_qs, quote

from hypothesis import example, given
from hypothesis import strategies as st
from imapclient.imapclient import _normalise_search_criteria  # type: ignore[import-untyped]

from daemon.providers.gmail_mailbox import search_term
from daemon.providers.graph import filter_value
from daemon.providers.outcomes import ProviderError
from ledger.message_id import message_id_for
from testkit import gmail_emulator, graph_emulator, mime_reader

_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,8}[A-Za-z0-9])?"
DOMAINS = st.from_regex(rf"{_LABEL}(?:\.{_LABEL}){{0,3}}", fullmatch=True)
KEYS = st.text(min_size=1, max_size=80)
# What a hostile value may hold where a query's syntax lives: quotes, escapes,
# brackets, operators, spaces and line breaks.
HOSTILE = st.text(st.sampled_from("ab@.<>'\"\\(){}[]*%?:- \t\r\nOR\u00e9"), max_size=16)


@given(KEYS, DOMAINS)
@example("order-42", "mail.example.com")
def test_gmail_reads_the_query_as_one_rfc822msgid_term_of_exactly_the_id(
    key: str, domain: str
) -> None:
    message_id = message_id_for(key, domain)
    query = f"rfc822msgid:{search_term(message_id)}"
    # Gmail's syntax is whitespace, quotes, parentheses, braces, a leading `-` and the
    # words OR/AND between terms: none is in the term (hex, dots, hyphens, one `@`).
    assert re.fullmatch(r"rfc822msgid:job-[0-9a-f]{32}@[A-Za-z0-9.-]+", query), query
    assert gmail_emulator._QUERY_TERM.findall(query) == [query]
    parsed = gmail_emulator._parse_query(query, {})
    assert parsed.message_ids == (mime_reader.normalize_message_id(message_id),)


def _unless_refused(build: Callable[[str], str], text: str) -> str | None:
    """What `build` makes of `text`, or None when it refuses it (a failed search)."""
    try:
        return build(text)
    except ProviderError:
        return None


@given(HOSTILE)
@example("a@b OR in:anywhere")
@example('a@b" OR "x')
def test_a_gmail_term_that_would_be_read_as_more_than_one_is_refused(text: str) -> None:
    term = _unless_refused(search_term, text)
    if term is None:
        return
    query = f"rfc822msgid:{term}"
    assert gmail_emulator._QUERY_TERM.findall(query) == [query]
    assert not any(char.isspace() or char in '"(){}' for char in term)


def _graph_reads(literal: str) -> str | None:
    """The value the Graph emulator's parser takes out of the URL we build."""
    sent = quote(f"internetMessageId eq {literal}", safe="")
    [value] = parse_qs(f"$filter={sent}", keep_blank_values=True)["$filter"]
    match = graph_emulator._FILTER.match(value)
    return None if match is None else match.group(1).replace("''", "'")


@given(KEYS, DOMAINS)
def test_graph_reads_the_filter_as_exactly_the_id(key: str, domain: str) -> None:
    message_id = message_id_for(key, domain)
    assert _graph_reads(filter_value(message_id)) == message_id


@given(HOSTILE)
@example("<a'@b>")
@example("<a' or internetMessageId ne 'x@b>")
def test_a_graph_literal_carries_every_quote_as_part_of_the_value(text: str) -> None:
    literal = _unless_refused(filter_value, text)
    if literal is None:
        return
    read = _graph_reads(literal)
    assert read is not None and read.startswith("<") and read.endswith(">")
    assert read.strip("<>") == text.strip().strip("<>")


def _imap_astring(sent: bytes) -> str:
    """An IMAP astring (RFC 3501 section 9) back to its text: a quoted string with its
    escapes, or an atom, which holds no special character."""
    text = sent.decode("ascii")
    if text.startswith('"'):
        match = re.fullmatch(r'"((?:[^"\\\r\n]|\\["\\])*)"', text)
        assert match is not None, text
        return re.sub(r"\\(.)", r"\1", match.group(1))
    assert not re.search(r'[(){ %*"\\\]\x00-\x1f\x7f]', text), text
    return text


@given(KEYS, DOMAINS)
def test_imap_reads_the_search_as_header_message_id_and_exactly_the_id(
    key: str, domain: str
) -> None:
    message_id = message_id_for(key, domain)
    sent = _normalise_search_criteria(["HEADER", "Message-ID", message_id])
    assert sent[:2] == [b"HEADER", b"Message-ID"] and len(sent) == 3
    assert _imap_astring(sent[2]) == message_id
