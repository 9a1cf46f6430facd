"""`sendledger submit` reads at most `api.max_body` bytes of its file or stdin, as the API
reads of a request body (docs/cli.md "Exit codes"): a larger one is exit 2 naming it,
nothing written. It was read whole into memory: `submit /dev/zero` until the machine ran
out of it."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from tests.e2e.test_cli_intake import job

LIMIT = 1000


def bounded(cli: Any) -> None:
    with cli.config.open("a", encoding="utf-8") as config:
        config.write(f'\n[api]\nmax_body = "{LIMIT}"\n')


def padded(key: str, size: int) -> str:
    """A valid job, padded with spaces to `size` bytes."""
    text = json.dumps(job(key))
    return text + " " * (size - len(text))


@pytest.mark.parametrize("through", ["file", "stdin"])
def test_a_job_file_past_max_body_is_refused_naming_it(cli: Any, through: str) -> None:
    bounded(cli)
    path = cli.root / "big.json"
    path.write_text(padded("big", LIMIT + 1), encoding="utf-8")
    if through == "file":
        result = cli.run("submit", str(path))
        where = str(path)
    else:
        result = cli.run("submit", "-", stdin=path.read_text(encoding="utf-8"))
        where = "stdin"
    assert result.code == 2, result
    said = f"sendledger: job: {where}: larger than api.max_body ({LIMIT} bytes)"
    assert result.error_lines == [said]
    assert not (cli.root / "ledger.sqlite").exists()  # nothing written, not even a store
    # At the bound exactly, the same job is taken.
    path.write_text(padded("big", LIMIT), encoding="utf-8")
    assert cli.run("submit", str(path)).code == 0


def test_submit_dev_zero_ends_at_once(cli: Any) -> None:
    bounded(cli)
    started = time.monotonic()
    result = cli.run("submit", "/dev/zero")
    assert result.code == 2, result
    said = f"sendledger: job: /dev/zero: larger than api.max_body ({LIMIT} bytes)"
    assert result.error_lines == [said]
    assert time.monotonic() - started < 10
