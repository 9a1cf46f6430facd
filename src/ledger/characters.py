"""Which characters text bound for a header may not carry, and which show as nothing:
one place for the address parser (`addresses.py`), the job's fields (`content.py`), the
attachments' names (`attachments.py`), the proof of what goes on the wire
(`wire_check.py`) and what is shown to a person (`display.py`, the CLI's output). No
imports of ours: the lowest layer of the ledger's checks."""

from __future__ import annotations

import re
import unicodedata
from json.encoder import encode_basestring_ascii

__all__ = [
    "BIDI_CONTROLS",
    "MAX_RECORDED",
    "cut_mark",
    "invisible",
    "recorded",
    "storable",
    "unsafe_character",
]

#: Explicit direction overrides, embeddings and isolates: they reorder what a reader sees
#: ("Trojan Source"), so a display name or subject could show one thing and say another.
#: Left-to-right and right-to-left marks (U+200E, U+200F) stay allowed: mixed-direction
#: text needs nothing more, and a mark cannot reorder a run.
BIDI_CONTROLS = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
#: Letters that show as nothing (Hangul fillers) and the combining grapheme joiner: with the
#: format characters (category Cf) and the spaces other than U+0020 (Zs), what
#: :func:`invisible` calls invisible.
_FILLERS = frozenset("\u034f\u115f\u1160\u3164\uffa0")

# Exactly the characters unsafe_character describes (category Cc is C0, DEL and C1; Zl and
# Zp are U+2028 and U+2029; Cs the surrogates): one regex search instead of a category
# lookup per character, so a long value costs microseconds.
_UNSAFE = re.compile(
    "[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff" + "".join(sorted(BIDI_CONTROLS)) + "]"
)


def unsafe_character(value: str) -> str | None:
    """A description of the first character that may not appear in a header value (a
    subject, a display name), or None. Refused: control characters (NUL, TAB, VT, FF,
    NEL, ...: the C0 and C1 sets and DEL), the Unicode line and paragraph separators
    (U+2028, U+2029: some mail software breaks lines there), bidi controls
    (:data:`BIDI_CONTROLS`) and lone surrogates (they cannot be encoded)."""
    found = _UNSAFE.search(value)
    if found is None:
        return None
    char = found.group()
    category = unicodedata.category(char)
    if category == "Cc":
        return f"a control character (U+{ord(char):04X})"
    if category in ("Zl", "Zp"):
        return f"a line separator (U+{ord(char):04X})"
    if char in BIDI_CONTROLS:
        return f"a bidi control character (U+{ord(char):04X})"
    return f"a lone surrogate (U+{ord(char):04X})"


#: What no store can keep in text: a lone surrogate has no UTF-8 (the event's encoding
#: fails), and PostgreSQL's text holds no NUL.
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def storable(text: str) -> str:
    """`text` with each character no store can keep (a lone surrogate, NUL) replaced by
    U+FFFD: for the words of others that the ledger records as they came (a provider's
    error, a copy's subject as a mailbox decoded it)."""
    return _UNSTORABLE.sub("\ufffd", text)


#: The longest another's text (a provider's error body, an SMTP reply, a Graph error, a
#: search's failure) may be where it is recorded and served (an event's `reason` or
#: `detail`, a service's refusal), counted as its JSON string writes it with every
#: character outside printable ASCII escaped (`\uXXXX`, a character beyond U+FFFF as two):
#: the longest form any reader gets, so the store's UTF-8, the API's and a webhook's
#: JSON, and the command line's escaped lines, are never longer (docs/how-it-works.md
#: "Another's words").
MAX_RECORDED = 2000

#: Characters that belong to the one before them: cut before one, the character it
#: modifies would be kept without it (an accent, a variation selector, a skin tone).
_EMOJI_MODIFIERS = range(0x1F3FB, 0x1F400)
_ZWJ = "\u200d"


def _joins_previous(text: str, at: int) -> bool:
    char = text[at]
    return (
        unicodedata.category(char).startswith("M")
        or char == _ZWJ
        or text[at - 1] == _ZWJ
        or ord(char) in _EMOJI_MODIFIERS
    )


def _json_length(char: str) -> int:
    return len(encode_basestring_ascii(char)) - 2  # without its quotes


def recorded(text: str, limit: int = MAX_RECORDED) -> str:
    """`text` as the ledger records another's words: `storable`, and at most `limit`
    (:data:`MAX_RECORDED`) long as ASCII JSON writes it. Longer, its start is kept, then
    `... [N more characters]` (N of the whole text's characters, as a log line's
    `ledger.display.quoted` writes it), the mark counted in the limit; the start ends
    before a combining sequence (a letter and its accents, an emoji and its modifiers),
    never inside one, unless that one sequence is longer than the room. A 10 MB error
    body, recorded at every retry, would otherwise fill the store and every answer that
    serves it. Costs what the start costs, whatever the length of `text`."""
    if len(text) * 12 <= limit:  # 12: the longest one character can be written
        return storable(text)
    head = storable(text[:limit])  # every character is written at least 1 long
    if len(text) <= limit and len(encode_basestring_ascii(head)) - 2 <= limit:
        return head
    room = limit - len(cut_mark(len(text)))  # the most the mark can take
    kept, used = 0, 0
    for char in head:
        used += _json_length(char)
        if used > room:
            break
        kept += 1
    start = kept
    while kept > 0 and _joins_previous(head, kept):
        kept -= 1
    if kept == 0:  # one sequence longer than the room: cut it, rather than keep nothing
        kept = start
    return head[:kept] + cut_mark(len(text) - kept)


def cut_mark(cut: int) -> str:
    """What ends a text cut short, `cut` of its characters left out: the one mark of a
    recorded reason, a quoted log line and a bounded log record."""
    return f"... [{cut} more characters]"


def invisible(char: str) -> bool:
    """Whether `char` shows as nothing, or as a space that is not U+0020: a format
    character (U+200B ZERO WIDTH SPACE, U+FEFF, U+00AD SOFT HYPHEN, ...), another space
    (U+00A0, U+3000, ...), a Hangul filler or the combining grapheme joiner."""
    return char in _FILLERS or (char != " " and unicodedata.category(char) in ("Cf", "Zs"))
