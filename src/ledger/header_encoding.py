"""Header text written by sendledger's own code, and read back the way a mail client
reads it (docs/cli.md "Message fields and validation", docs/architecture.md "The message").

A caller's text (a subject, a display name, an ``X-*`` value, a file name) reaches the
wire in one of two forms, chosen by :func:`plain`:

* as typed, when it is printable ASCII, starts and ends with a non-space and holds no
  ``=?`` (nothing a client could take for an encoded word) and no run longer than
  :data:`MAX_RUN` (a line can only be folded at a space);
* otherwise as RFC 2047 encoded words (UTF-8, base64), or for a file name as an RFC 2231
  parameter (UTF-8, percent-encoded), so that a client shows exactly the characters
  typed: a typed ``=?utf-8?q?...?=`` is shown as those characters, never decoded.

Everything here is linear in the text's length, and nothing is parsed or decoded by the
standard library's ``email`` package (which decodes encoded words while it builds a
message, and on some Python versions writes a decoded CR LF out raw).

The readers (:func:`client_view`, :func:`parameter_value`) are deliberately lenient where
clients are: an encoded word is decoded wherever it appears, in either form and any case,
so a proof that compares what they return with the job also covers a lenient client.
"""

from __future__ import annotations

import base64
import binascii
import codecs
import re
from collections.abc import Iterable, Iterator

#: Longest line we write where we can choose (RFC 5322's "should"); 998 is the "must".
LINE = 78
MAX_LINE = 998
#: Longest run without a space written as typed; a longer run is encoded (folded anywhere).
MAX_RUN = 900
_CRLF = "\r\n"
# Room in one encoded word: "=?utf-8?b?" + base64 + "?=" within 75 characters (RFC 2047).
_PREFIX = "=?utf-8?b?"
_SUFFIX = "?="
_MAX_WORD_BYTES = 45  # 60 base64 characters: a word of 72
# An encoded word as lenient clients find it: anywhere, any case, either form.
ENCODED_WORD = re.compile(r"=\?([^?\s]+)\?([bBqQ])\?([^?\s]*)\?=")
_ONLY_SPACE = re.compile(r"[ \t]*")
# RFC 2231 attribute-char: what a percent-encoded parameter value writes as it is.
_ATTRIBUTE_CHARS = frozenset(
    b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789!#$&+-.^_`|~"
)
# A file name written as a plain quoted parameter: a conservative set, so that no reader
# unquotes, percent-decodes or word-decodes it into something else.
_PLAIN_NAME = re.compile(r"[A-Za-z0-9._()+,-]+(?: [A-Za-z0-9._()+,-]+)*")
_SEGMENT = 60  # characters of a percent-encoded value per RFC 2231 continuation


def plain(text: str) -> bool:
    """Whether `text` is written as typed (see the module's docstring)."""
    return (
        text != ""
        and text.isascii()
        and text.isprintable()
        and "=?" not in text
        and text[0] != " "
        and text[-1] != " "
        and all(len(run) <= MAX_RUN for run in text.split(" "))
    )


def _utf8_length(char: str) -> int:
    code = ord(char)
    return 1 if code < 0x80 else 2 if code < 0x800 else 3 if code < 0x10000 else 4


def _chunks(text: str, first: int) -> Iterator[str]:
    # Whole characters per word (RFC 2047 forbids splitting one), `first` bytes in the
    # first word and _MAX_WORD_BYTES in the others.
    start, used, limit = 0, 0, first
    for index, char in enumerate(text):
        size = _utf8_length(char)
        if used and used + size > limit:
            yield text[start:index]
            start, used, limit = index, 0, _MAX_WORD_BYTES
        used += size
    yield text[start:]


def encoded_words(text: str, first_room: int = LINE) -> list[str]:
    """`text` as RFC 2047 encoded words (UTF-8, base64), whole characters in each; the
    first fits `first_room` characters (at least one character of any size), the others
    72. Whitespace between encoded words is not part of the text, so the words may be
    folded apart; decoding them gives back exactly `text`."""
    room = (max(first_room - len(_PREFIX) - len(_SUFFIX), 8) // 4) * 3
    return [
        _PREFIX + base64.b64encode(chunk.encode("utf-8")).decode("ascii") + _SUFFIX
        for chunk in _chunks(text, min(room, _MAX_WORD_BYTES))
        if chunk
    ]


def fold(name: str, tokens: Iterable[str], width: int = LINE) -> str:
    """A header line `name: tokens...`, the tokens joined by single spaces and the line
    broken (CRLF) only before a space, where a line would pass `width`: unfolding gives
    back the tokens joined by spaces. A token is never broken; an empty token (two spaces
    in a row) never starts a line."""
    lines: list[str] = []
    current = f"{name}:"
    start = True
    for token in tokens:
        chunk = " " + token
        if not start and token and len(current) + len(chunk) > width:
            lines.append(current)
            current = chunk
        else:
            current += chunk
        start = False
    lines.append(current)
    return _CRLF.join(lines)


def within_lines(header: str) -> bool:
    """Whether every line of a folded `header` is within SMTP's 998 octets. A line is
    folded only before a space that precedes a word, so a run of spaces stays on one line
    (a line of spaces alone is no fold): a long enough run passes the limit."""
    return max(map(len, header.split(_CRLF))) <= MAX_LINE


def unstructured(name: str, text: str) -> str:
    """A header carrying free text (Subject, an ``X-*`` value): as typed when
    :func:`plain` and it folds within the line limit, else encoded words."""
    if plain(text):
        typed = fold(name, text.split(" "))
        if within_lines(typed):
            return typed
    return fold(name, encoded_words(text, LINE - len(name) - 2))


# -- display names ------------------------------------------------------------------------

_ATOM_WORD = re.compile(r"[A-Za-z0-9'_-]+")


def phrase(display_name: str, first_room: int) -> list[str]:
    """A display name as the tokens of an RFC 5322 phrase: plain words when each is an
    atom, one quoted string when it is other printable ASCII, else encoded words. A
    quoted string holding ``=?`` is never written (clients decode encoded words inside
    quotes too)."""
    words = display_name.split(" ")
    if plain(display_name) and all(_ATOM_WORD.fullmatch(word) for word in words):
        return words
    if plain(display_name):
        quoted = display_name.replace("\\", "\\\\").replace('"', '\\"')
        return [f'"{quoted}"']
    return encoded_words(display_name, first_room)


# -- RFC 2231 parameters ------------------------------------------------------------------


def _percent(text: str) -> str:
    return "".join(
        chr(byte) if byte in _ATTRIBUTE_CHARS else f"%{byte:02X}" for byte in text.encode("utf-8")
    )


def _segments(value: str) -> Iterator[str]:
    # Whole characters per segment: one character is at most 12 percent-encoded ("%F0%9F%8E%89").
    segment = ""
    for char in value:
        encoded = _percent(char)
        if segment and len(segment) + len(encoded) > _SEGMENT:
            yield segment
            segment = ""
        segment += encoded
    yield segment


def parameter(name: str, value: str) -> list[str]:
    """`name=value` as header parameters: one quoted parameter for a plain file name, else
    RFC 2231 ``name*=utf-8''...`` (split into ``name*0*``, ``name*1*``, ... continuations
    of at most 60 characters, each holding whole characters: readers that decode each
    segment alone, as fast-mail-parser does, would otherwise show U+FFFD). No plain
    fallback is written next to the encoded form: readers that prefer the plain one
    (Python's compat32 parser among them) would show another name than the job's."""
    if _PLAIN_NAME.fullmatch(value) and len(value) <= _SEGMENT:
        return [f'{name}="{value}"']
    segments = list(_segments(value))
    if len(segments) == 1:
        return [f"{name}*=utf-8''{segments[0]}"]
    first = "utf-8''"
    return [
        f"{name}*{index}*={first if index == 0 else ''}{segment}"
        for index, segment in enumerate(segments)
    ]


# -- reading it back ----------------------------------------------------------------------


def _decode_word(charset: str, form: str, text: str) -> str | None:
    charset = charset.split("*", 1)[0]  # RFC 2231 language suffix
    try:
        if form in "bB":
            data = base64.b64decode(text + "=" * (-len(text) % 4), validate=False)
        else:
            data = re.sub(
                rb"=([0-9A-Fa-f]{2})",
                lambda m: bytes([int(m.group(1), 16)]),
                text.replace("_", " ").encode("ascii"),
            )
        codecs.lookup(charset)
        return data.decode(charset, "replace")
    except (LookupError, ValueError, binascii.Error, UnicodeError):
        return None


def client_view(text: str) -> str:
    """What a lenient client shows for an unfolded header text: every encoded word
    decoded wherever it appears (in either form, any case, any known charset), the
    spaces between two encoded words dropped (RFC 2047 section 6.2)."""
    out: list[str] = []
    last = 0
    previous_word = False
    for match in ENCODED_WORD.finditer(text):
        between = text[last : match.start()]
        decoded = _decode_word(match.group(1), match.group(2), match.group(3))
        if decoded is None:
            out.append(between + match.group(0))
            previous_word = False
        else:
            if not (previous_word and _ONLY_SPACE.fullmatch(between)):
                out.append(between)
            out.append(decoded)
            previous_word = True
        last = match.end()
    out.append(text[last:])
    return "".join(out)


def _percent_decode(text: str) -> bytes:
    return re.sub(
        rb"%([0-9A-Fa-f]{2})", lambda m: bytes([int(m.group(1), 16)]), text.encode("ascii")
    )


def parameter_value(params: dict[str, str], name: str) -> str | None:
    """The value of parameter `name` as a client reads it: the RFC 2231 form (single or
    continued) when present, else the plain one, then encoded words decoded (many clients
    do that to file names, against RFC 2231)."""
    if f"{name}*" in params:
        value = _extended(params[f"{name}*"])
    elif f"{name}*0*" in params or f"{name}*0" in params:
        pieces: list[str] = []
        index = 0
        while f"{name}*{index}*" in params or f"{name}*{index}" in params:
            extended = f"{name}*{index}*"
            pieces.append(params[extended if extended in params else f"{name}*{index}"])
            index += 1
        value = _extended("".join(pieces)) if f"{name}*0*" in params else "".join(pieces)
    elif name in params:
        value = params[name]
    else:
        return None
    return client_view(value)


def _extended(value: str) -> str:
    charset, _, rest = value.partition("'")
    _language, _, encoded = rest.partition("'")
    try:
        return _percent_decode(encoded).decode(charset or "ascii", "replace")
    except LookupError:
        return value
