"""On PostgreSQL, a daemon whose API port is taken asks whether its name is held by the
running daemons' rows (`pg_locks` beside them), never by taking the advisory lock: held
even for an instant, it refused a daemon of the name starting then, on any host
(tests/unit/test_port_refusal_name.py on the other stores)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from tests.unit.test_port_refusal_name import (
    refused_as_running,
    refused_without_taking_the_name,
    taken,  # noqa: F401  (the fixture, used by name)
)

from ledger.application import Ledger


@pytest.mark.parametrize("refused", [refused_without_taking_the_name, refused_as_running])
def test_a_start_refused_at_its_port_asks_after_its_name_without_taking_it(
    pg_url: str,
    taken: int,  # noqa: F811
    tmp_path: Path,
    refused: Callable[[Ledger, int, Path], None],
) -> None:
    with Ledger(pg_url) as ledger:
        refused(ledger, taken, tmp_path)
