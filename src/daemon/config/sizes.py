"""Sizes in settings: "40MB", "512KiB", "1000" (bytes), from 1 byte to :data:`MAX_SIZE`."""

from __future__ import annotations

import re

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
}
#: The largest size any setting takes (docs/configuration.md "Bounds, URLs, addresses and files"):
#: no message or request body sendledger handles comes near it, and a bigger value is a typo.
MAX_SIZE = 1_000_000_000
# ASCII only, as durations (policies/durations.py): \d and float() take any script's digits.
_SIZE = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*([a-z]*)", re.ASCII)


def parse_size(value: object) -> int:
    """Bytes from an int or a string with an optional unit (B, KB, MB, GB: powers of
    1000; KiB, MiB, GiB: powers of 1024), at most :data:`MAX_SIZE`."""
    if isinstance(value, bool):
        raise ValueError("a size: a number of bytes or e.g. '40MB'")
    if isinstance(value, int):
        amount: float = value
    elif isinstance(value, str) and (match := _SIZE.fullmatch(value.strip().lower())):
        number, unit = match.groups()
        if unit not in _UNITS:
            raise ValueError(f"unknown size unit {unit!r} (B, KB, MB, GB, KiB, MiB, GiB)")
        amount = float(number) * _UNITS[unit]
    else:
        raise ValueError(f"not a size: {value!r} (a number of bytes or e.g. '40MB')")
    if amount < 1:
        raise ValueError("a size must be at least 1 byte")
    if amount > MAX_SIZE:
        raise ValueError(f"a size must be at most 1GB, got {value!r}")
    return int(amount)
