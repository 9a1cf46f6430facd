"""A module's name says what it holds (docs/architecture.md "Layers and what each may
import"): no two modules of the distribution share a basename, so a traceback, a log line or
a grep names one file."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

SRC = Path(__file__).parents[2] / "src"


def test_no_two_modules_share_a_basename() -> None:
    places: defaultdict[str, list[str]] = defaultdict(list)
    for path in sorted(SRC.rglob("*.py")):
        if path.name != "__init__.py":
            places[path.name].append(str(path.relative_to(SRC)))
    doubled = {name: where for name, where in places.items() if len(where) > 1}
    assert doubled == {}
