"""`make test` needs no PostgreSQL by hand: with nothing answering at SENDLEDGER_TEST_PG_URL,
a pytest session (two xdist workers) starts one private cluster, runs its PostgreSQL tests on
it with nothing skipped, and removes it at the end (tests/conftest.py)."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from pathlib import Path

from tests.pg_cluster import PrivateCluster, require_private_cluster

ROOT = Path(__file__).resolve().parents[2]
DEAD_URL = "postgresql://sendledger:sendledger@127.0.0.1:1/x"


def test_a_session_without_postgres_starts_one_private_cluster_and_removes_it() -> None:
    require_private_cluster()
    # Only the plugins this needs: xdist (two workers) and timeout (pyproject's `timeout`).
    # The others that `make test` loads by their entry points (schemathesis, anyio,
    # hypothesis's reporter) play no part in the session's cluster and cost each of the
    # three interpreters about half its start-up.
    env = {
        **os.environ,
        "SENDLEDGER_TEST_PG_URL": DEAD_URL,
        "CI": "true",
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
    }
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "xdist.plugin",
            "-p",
            "pytest_timeout",
            "-n",
            "2",
            "-p",
            "no:cacheprovider",
            "-v",
            "-rs",
            "tests/integration/test_ledger_store.py",
            "-k",
            "postgres and (submit_creates or noop or conflicts)",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    passed = re.search(r"(\d+) passed", out)
    assert passed is not None and int(passed.group(1)) >= 3, out
    assert "skipped" not in out, out
    # The controller's report header names the one cluster; workers start none.
    started = re.findall(r"private session cluster at \S+ \((\S+)\)", out)
    assert len(started) == 1, out
    assert not Path(started[0]).exists(), "the session cluster's folder was left"


def test_a_process_runs_initdb_once_and_each_private_cluster_copies_its_folder() -> None:
    """Each PrivateCluster ran initdb of its own: 1.5-4 s of CPU for each of the dozen
    tests that start one. Now one initdb a process, copied: the copies share its system
    identifier (which initdb draws anew each time), each in a folder of its own that only
    the server's user may read, as the server insists."""
    require_private_cluster()
    first, second = PrivateCluster(), PrivateCluster()
    try:
        assert first.data != second.data
        for cluster in (first, second):
            assert stat.S_IMODE(cluster.data.stat().st_mode) == 0o700
        # pg_control begins with the system identifier, 8 bytes.
        identifiers = {
            (cluster.data / "global" / "pg_control").read_bytes()[:8] for cluster in (first, second)
        }
        assert len(identifiers) == 1
    finally:
        first.close()
        second.close()
