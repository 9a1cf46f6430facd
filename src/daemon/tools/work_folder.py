"""What `demo` and `try` share of their command line: the folder each writes and keeps,
and a duration option within bounds, each refused (exit 2) naming the option."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from daemon.exit_codes import bad_input


def kept_folder(chosen: str | None, *, option: str, prefix: str, what: str) -> Path:
    """`chosen` (created), else a new folder in the temporary folder; never one that
    already holds a config or a store: a second run would meet the first run's jobs
    (the same keys) and show nothing."""
    if chosen is None:
        return Path(tempfile.mkdtemp(prefix=prefix))
    folder = Path(os.path.abspath(chosen))
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise bad_input(f"{option}: cannot create {folder}: {exc.strerror}") from None
    for name in ("sendledger.toml", "ledger.sqlite"):
        if (folder / name).exists():
            raise bad_input(
                f"{option}: {folder} already holds {what} ({name}); choose a new folder"
            )
    return folder


def seconds_option(option: str, value: str, low: float, high: float) -> float:
    from policies.durations import DurationError, parse_duration

    try:
        seconds = parse_duration(value)
    except DurationError as exc:
        raise bad_input(f"{option}: {exc}") from None
    if not low <= seconds <= high:
        raise bad_input(f"{option}: must be between {low:g}s and {high:g}s, got {value!r}")
    return seconds


__all__ = ["kept_folder", "seconds_option"]
