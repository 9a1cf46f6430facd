"""`sendledger demo` says "12 jobs submitted" once they are: a submit that fails (here the
first) leaves no such line behind it (docs/operations.md "What the demo shows")."""

from __future__ import annotations

import io
import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from daemon.tools import demo
from daemon.tools.ctrl_c import CtrlC
from ledger.application import Ledger


class _Refused(Exception):
    pass


@pytest.fixture
def root_logging() -> Iterator[None]:
    # The demo points the root logger at its work folder's daemon.log: put it back after.
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in root.handlers:
        if handler not in handlers:
            handler.close()
    root.handlers[:], root.level = handlers, level


def test_the_submitted_line_comes_after_the_submits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, root_logging: None
) -> None:
    out = io.StringIO()
    said_before: list[str] = []

    def refuse(self: Ledger, *args: Any, **kwargs: Any) -> Any:
        said_before.append(out.getvalue())
        raise _Refused

    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(Ledger, "submit", refuse)
    with pytest.raises(_Refused):
        demo._demo(tmp_path, lag=0.5, limit=5.0, as_json=False, ctrl_c=CtrlC())
    assert said_before and "work folder" in said_before[0], out.getvalue()
    assert "jobs submitted" not in out.getvalue()
