"""Durations as operators write them: "250ms", "30s", "5m", "1h", "1d" or plain seconds."""

from __future__ import annotations

import math
import re
import sys

from ledger.exceptions import Refusal, SendledgerError

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
# ASCII digits only: Python's \d and float() take any script's digits (U+0663, U+FF13),
# which an operator's file would then mean without showing it.
_PATTERN = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*(ms|s|m|h|d)?\s*\Z", re.ASCII)


class DurationError(SendledgerError, ValueError):
    kind = Refusal.BAD_INPUT


#: What every refusal of a value that is no duration at all ends with: what to write.
_WRITE = "(use e.g. 250ms, 30s, 5m, 1h, 1d or seconds)"


def parse_duration(value: object) -> float:
    """Seconds as a float. Raises DurationError with a message fit for one line of output."""
    if isinstance(value, bool):
        # As the TOML file spells it (`timeout = true`), not as Python does (True).
        raise DurationError(f"not a duration: {str(value).lower()} {_WRITE}")
    if isinstance(value, int | float):
        # An integer past a float's range is no finite number either (not OverflowError).
        seconds = float(value) if abs(value) <= sys.float_info.max else math.inf
    elif isinstance(value, str):
        match = _PATTERN.match(value)
        if match is None:
            raise DurationError(f"not a duration: {value!r} {_WRITE}")
        seconds = float(match.group(1)) * _UNITS[match.group(2) or "s"]
    else:
        raise DurationError(f"not a duration: {value!r} {_WRITE}")
    if not math.isfinite(seconds) or seconds < 0:
        raise DurationError(f"duration must be a finite number >= 0: {value!r}")
    return seconds


def parse_duration_within(value: object, low: float, high: float) -> float:
    """:func:`parse_duration`, and from `low` to `high` seconds: every duration an operator
    sets has a range (docs/configuration.md "Bounds, URLs, addresses and files"), so that a typo
    such as "99999999999999d" is refused where it is written, not an overflow or a wait forever
    later. Raises DurationError."""
    seconds = parse_duration(value)
    if not low <= seconds <= high:
        span = f"from {format_duration(low)} to {format_duration(high)}"
        raise DurationError(f"{span} expected, got {value!r}")
    return seconds


def unitless_number(value: object) -> str | None:
    """The number, as written, of a duration written without its unit ("90", 90), else
    None: a bare number is seconds, which is not always what the person meant."""
    if isinstance(value, str):
        bare = _PATTERN.match(value)
        return bare.group(1) if bare is not None and bare.group(2) is None else None
    if isinstance(value, int | float) and not isinstance(value, bool):
        return f"{value:g}" if abs(value) <= sys.float_info.max else None
    return None


def parse_duration_with_unit(value: object, low: float, high: float) -> float:
    """:func:`parse_duration_within`, and a number must say its unit: for how long a purge
    waits, a bare number (seconds) is read in the wrong unit at a cost that cannot be
    undone (`admin purge --older-than 90`, meant as 90 days, purged every job settled more
    than 90 seconds ago). Raises DurationError."""
    number = unitless_number(value)
    if number is None:
        return parse_duration_within(value, low, high)
    raise DurationError(
        f"{value!r} has no unit: write {number}d for {number} days "
        f"(or {number}h, {number}m, {number}s)"
    )


def format_duration(seconds: float) -> str:
    if seconds < 1:
        return f"{round(seconds * 1000)}ms"
    for unit in ("d", "h", "m"):
        size = _UNITS[unit]
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"
