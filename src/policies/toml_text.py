"""The operator's TOML (the config file, the channel policy files) read as TOML defines it
(docs/configuration.md "Bounds, URLs, addresses and files").

TOML's integers are 64-bit ("if an integer cannot be represented losslessly, an error must
be thrown", TOML 1.0), but `tomllib` reads any number of digits, and each failure of that
is a failure past the parser: an integer of more than 4300 digits stopped `int()` with a
ValueError that is no TOMLDecodeError (an "unexpected failure" naming no file, and every
channel of `submit` refused with the one file), and one past a float's range stopped a
duration's `float()` with an OverflowError. :func:`parse_toml` refuses both where the
file is read, as a TOMLDecodeError naming the key, so each reader's own refusal of a file
that is no TOML (naming the file) holds for them.
"""

from __future__ import annotations

import sys
import tomllib
from typing import Any

from ledger.display import printable

__all__ = ["INT64", "parse_toml"]

#: The integers TOML has.
INT64 = range(-(2**63), 2**63)


def parse_toml(text: str) -> dict[str, Any]:
    """`tomllib.loads(text)`; tomllib.TOMLDecodeError (one line) for an integer past
    64 bits as well as for what tomllib refuses. A document nested past the parser's
    recursion still raises RecursionError, as from tomllib."""
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        raise
    except ValueError:
        # int()'s refusal of a long text: the only ValueError tomllib lets through.
        limit = sys.get_int_max_str_digits()
        raise tomllib.TOMLDecodeError(
            f"an integer of more than {limit} digits (TOML integers are 64-bit)"
        ) from None
    huge = _huge_integer(document)
    if huge is not None:
        path, digits = huge
        # A key is any text (quoted keys): shown escaped and cut, the refusal one line.
        raise tomllib.TOMLDecodeError(
            f"{printable(path)[:200]}: an integer of {digits} (TOML integers are 64-bit)"
        )
    return document


def _huge_integer(document: dict[str, Any]) -> tuple[str, str] | None:
    # Walked with a stack, not recursively: tomllib took the nesting, this must too.
    stack: list[tuple[str, object]] = [("", document)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, dict):
            stack.extend((f"{path}.{name}" if path else name, v) for name, v in value.items())
        elif isinstance(value, list):
            stack.extend((f"{path}[{i}]", v) for i, v in enumerate(value))
        elif isinstance(value, int) and not isinstance(value, bool) and value not in INT64:
            return path, _digits(value)
    return None


def _digits(value: int) -> str:
    try:
        return f"{len(str(abs(value)))} digits"
    except ValueError:
        # Written in hex, octal or binary, int() read it whatever its length, but str()
        # writes no more decimal digits than int() reads (a ValueError past the parser).
        return f"more than {sys.get_int_max_str_digits()} digits"
