"""Printing for humans and for machines (--json).

Whatever reaches a terminal goes through here, and nothing in it acts on the terminal
(docs/cli.md "Keys"): table cells, key/value lines and error lines are made printable
(`ledger.display.printable`); JSON escapes, besides what `json` itself escapes (C0), DEL,
the C1 controls, the line and paragraph separators, the bidi controls and lone surrogates
as `\\uXXXX`, so `--json` output decodes to the same values and shows nothing raw.
And as a net under every other `print` of the command line (a history line, a suggested
command), :func:`guard_streams` makes stdout and stderr escape any such character that
still reaches them (line breaks and tabs pass). Moments are written by
`ledger.display.iso`, which every door shares.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, TextIO

from ledger.characters import BIDI_CONTROLS
from ledger.display import iso, printable

#: What `printable` escapes and `json.dumps(ensure_ascii=False)` leaves raw. JSON text has
#: these characters only inside strings, where `\\uXXXX` is the same character.
_RAW_IN_JSON = re.compile(
    "[\x7f-\x9f\u2028\u2029\ud800-\udfff" + "".join(sorted(BIDI_CONTROLS)) + "]"
)


#: What the guarded streams escape: every character `printable` escapes but LF and TAB.
_UNSAFE_ON_A_TERMINAL = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff" + "".join(sorted(BIDI_CONTROLS)) + "]"
)


class _PrintableStream:
    """A text stream that writes what `printable` would escape as its escape."""

    def __init__(self, inner: TextIO) -> None:
        self._inner = inner

    def write(self, text: str) -> int:
        self._inner.write(_UNSAFE_ON_A_TERMINAL.sub(lambda m: printable(m.group()), text))
        return len(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def guard_streams() -> None:
    """Route sys.stdout and sys.stderr through :class:`_PrintableStream` (once)."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, _PrintableStream):
            setattr(sys, name, _PrintableStream(stream))


def _json_printable(text: str) -> str:
    return _RAW_IN_JSON.sub(lambda match: f"\\u{ord(match.group()):04x}", text)


def error(message: str) -> None:
    print(f"sendledger: {printable(message)}", file=sys.stderr, flush=True)


def no_job_of_channel(channel: str) -> None:
    """Said on stderr beside an empty answer to `--channel C` when no job has channel C: a
    typo (`reciepts`) would otherwise read as "nothing to review" (docs/cli.md)."""
    error(
        f"no job in the store has channel {channel!r}: check its spelling "
        "(`sendledger policy check` lists the channels)"
    )


def _default(value: object) -> object:
    if isinstance(value, datetime):
        return iso(value)
    if isinstance(value, set | frozenset | tuple):
        return list(value)
    return str(value)


def dumps(value: object) -> str:
    return _json_printable(json.dumps(value, default=_default, ensure_ascii=False))


def print_json(value: object) -> None:
    print(_json_printable(json.dumps(value, default=_default, ensure_ascii=False, indent=2)))


def table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> str:
    cells = [[_cell(row.get(c)) for c in columns] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(line.rstrip() for line in lines)


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, datetime):
        return iso(value) or "-"
    if isinstance(value, list | tuple):
        return printable(",".join(str(v) for v in value)) or "-"
    if isinstance(value, dict):  # `purged`: "at=... by=ops", not Python's repr
        return " ".join(f"{k}={_cell(v)}" for k, v in value.items()) or "-"
    return printable(str(value))


def key_values(pairs: Iterable[tuple[str, object]]) -> str:
    items = [(k, _cell(v)) for k, v in pairs]
    width = max((len(k) for k, _ in items), default=0)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in items)
