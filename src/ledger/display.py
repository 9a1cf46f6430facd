"""Text on its way to a terminal, a log, a web page or a shell: nothing in it acts.

A job's key, note or subject is a caller's text. Printed raw it can move a terminal's
cursor (ESC), ring it (BEL), reverse what a reader sees (bidi controls) or, pasted as a
command, run another one. Every place that shows such text or suggests a command goes
through these two functions (docs/cli.md "Message fields and validation", "Keys").

And a moment as every door shows it (`iso`): the command line, the HTTP API, the
service layer's read models and sentences, the webhooks' status.
"""

from __future__ import annotations

import shlex
import unicodedata
from datetime import UTC, datetime

from ledger.characters import BIDI_CONTROLS, cut_mark


def _escaped(char: str) -> str:
    code = ord(char)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def printable(text: str) -> str:
    """`text` with every control character (C0, DEL, C1), line or paragraph separator,
    bidi control and lone surrogate written as a backslash escape; a backslash that
    could be read as the start of one is doubled. Linear in the text's length."""
    out: list[str] = []
    for char in text:
        if char == "\\":
            out.append("\\\\")
            continue
        category = unicodedata.category(char)
        if category in ("Cc", "Zl", "Zp", "Cs") or char in BIDI_CONTROLS:
            out.append(_escaped(char))
        else:
            out.append(char)
    return "".join(out)


#: The most characters of another's text (a provider's or a server's answer, a webhook
#: receiver's, an error about them) that a log line quotes (docs/operations.md "Logs and
#: retention"): the length the providers' own summaries are cut to.
MAX_QUOTED = 300


def quoted(text: object) -> str:
    """`text` (or an error's words) as a log line quotes it: its first `MAX_QUOTED`
    characters, the rest counted (`... [N more characters]`). A provider's 10 MB error
    body, logged at every retry, would otherwise fill the journal. Not escaped: the log's
    formatter escapes the whole line (`daemon/logs.py`)."""
    words = str(text)
    if len(words) <= MAX_QUOTED:
        return words
    return words[:MAX_QUOTED] + cut_mark(len(words) - MAX_QUOTED)


def command_line(*argv: str) -> str:
    """A command for a human to paste: every argument shell-quoted, then made printable
    (a key written before keys refused control characters still shows as an escape,
    never as the character itself)."""
    return " ".join(printable(shlex.quote(arg)) for arg in argv)


def iso(value: datetime | float | None) -> str | None:
    """A moment (a datetime, or seconds since the epoch) as every door writes it: UTC,
    ISO 8601 to the millisecond, with `Z`; None stays None."""
    if value is None:
        return None
    if isinstance(value, int | float):
        value = datetime.fromtimestamp(value, UTC)
    return value.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
