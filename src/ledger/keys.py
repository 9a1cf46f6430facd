"""What a job key, an operator's name and an operator's note may contain (docs/cli.md "Keys").

A key names a job on terminals, in logs, on the review page and in suggested commands; a
name (`--by`) names who decided. Both are identifiers a person reads and compares, so a
character that moves a cursor, rings a bell, reorders what is shown or shows nothing at
all has no place in them: two keys that look the same must be the same key.

Refused in a new key or name: the control characters (Unicode category Cc: C0, DEL, C1),
the format characters (Cf: the bidi controls U+202A..U+202E and U+2066..U+2069, and also
the bidi marks U+200E, U+200F and U+061C, zero-width spaces and joiners, the byte order
mark, the soft hyphen: each is invisible, so it makes two different keys look alike), the
line and paragraph separators (Zl, Zp), lone surrogates (Cs: not text; a command line
that is not UTF-8 gives them), the spaces other than U+0020 (U+00A0, U+3000, ...) and the
letters that show as nothing (Hangul fillers, the combining grapheme joiner:
`characters.invisible`); and a key not in Unicode normal form NFC, whose letters with
accents would look like another spelling's. The rule is for what is *created*: a key
stored before it existed is still read, shown escaped (`ledger.display.printable`).

A note is free text: it is stored as typed (line breaks and tabs included) and escaped
wherever it is shown; only what cannot be stored as text is refused (NUL, lone
surrogates), and its length is bounded.
"""

from __future__ import annotations

import unicodedata

from ledger.characters import invisible

__all__ = ["MAX_NAME_LENGTH", "MAX_NOTE_LENGTH", "identifier_problem", "note_problem"]

#: Unicode categories an identifier (a key, a name) may not contain.
REFUSED_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})
_KINDS = {
    "Cc": "a control character",
    "Cf": "an invisible format character (bidi control or mark, zero-width character)",
    "Zl": "a line separator",
    "Zp": "a paragraph separator",
    "Cs": "a lone surrogate (not UTF-8 text)",
}
MAX_NAME_LENGTH = 200
MAX_NOTE_LENGTH = 10_000


def identifier_problem(value: str) -> str | None:
    """Why `value` may not be a new key or name (one line, without the field name), or
    None. Linear in its length."""
    for char in value:
        category = unicodedata.category(char)
        if category in REFUSED_CATEGORIES:
            return f"must not contain {_KINDS[category]} (U+{ord(char):04X})"
        if invisible(char):
            return f"must not contain a space other than U+0020 or a filler (U+{ord(char):04X})"
    if not unicodedata.is_normalized("NFC", value):
        # `café` typed as e + U+0301 looks like `café` with U+00E9: one spelling only.
        return "must be in Unicode normal form NFC (a letter and its accent as one character)"
    return None


def note_problem(value: str) -> str | None:
    """Why `value` may not be stored as a note, or None."""
    if len(value) > MAX_NOTE_LENGTH:
        return f"longer than {MAX_NOTE_LENGTH} characters"
    if "\x00" in value:
        return "must not contain NUL characters"
    for char in value:
        if 0xD800 <= ord(char) <= 0xDFFF:
            return f"must not contain a lone surrogate (U+{ord(char):04X}: not UTF-8 text)"
    return None
