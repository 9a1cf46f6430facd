"""`xdist_group` marks hold under `--dist loadgroup` (tests/xdist_groups.py): every test of
a group runs in one worker, whatever pytest keeps node ids in."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

GROUPED_MODULE = """\
import pytest

pytestmark = pytest.mark.xdist_group("servers")


def test_one() -> None:
    pass


def test_two() -> None:
    pass
"""
MIXED_MODULE = """\
import time

import pytest


@pytest.mark.xdist_group("servers")
@pytest.mark.parametrize("n", range(3))
def test_grouped(n: int) -> None:
    pass


@pytest.mark.parametrize("n", range(6))
def test_free(n: int) -> None:
    time.sleep(0.05)
"""


def test_every_test_of_a_group_runs_in_one_worker(tmp_path: Path) -> None:
    """Failed with pytest 9.2 and pytest-xdist 3.8 before the hook: the group's five tests
    went to both workers, ids without their `@servers`."""
    (tmp_path / "conftest.py").write_text(
        "from tests.xdist_groups import pytest_collection_modifyitems  # noqa: F401\n",
        encoding="utf-8",
    )
    (tmp_path / "test_grouped.py").write_text(GROUPED_MODULE, encoding="utf-8")
    (tmp_path / "test_mixed.py").write_text(MIXED_MODULE, encoding="utf-8")
    # Only xdist: the other plugins' entry points only slow the three interpreters down.
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    command = [sys.executable, "-m", "pytest", "-p", "xdist.plugin", "-p", "no:cacheprovider"]
    proc = subprocess.run(
        [*command, "-n", "2", "--dist", "loadgroup", "-v", str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ran = re.findall(r"^\[(gw\d)\] .* PASSED (\S+)", proc.stdout, re.MULTILINE)
    assert len(ran) == 2 + 3 + 6, proc.stdout
    workers: dict[str, set[str]] = defaultdict(set)
    for worker, nodeid in ran:
        workers["servers" if nodeid.endswith("@servers") else nodeid].add(worker)
    assert len(workers["servers"]) == 1, proc.stdout
    grouped = [nodeid for _, nodeid in ran if nodeid.endswith("@servers")]
    assert len(grouped) == 5, proc.stdout
