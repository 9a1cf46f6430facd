"""The session's private PostgreSQL (tests/conftest.py): its initdb and start run beside
the workers' start and collection, and a process's first PostgreSQL test waits for them."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import tests.conftest as conftest

VARIABLES = (
    "SENDLEDGER_TEST_PG_URL",
    "PYTEST_SENDLEDGER_PG_STATUS",
    "PYTEST_SENDLEDGER_PG_FAILURE",
)


class SlowCluster:
    """A stand-in SessionCluster whose initdb waits for the test's word."""

    def __init__(self, root: Path, *, initdb: bool = True) -> None:
        assert not initdb, "the controller must not initdb before its workers start"
        self.root, self.url = root, "postgresql://sendledger@127.0.0.1:1/sendledger_test"
        self.release, self.started, self.closed = threading.Event(), False, False

    def initdb(self) -> None:
        assert self.release.wait(timeout=30)

    def start(self) -> None:
        self.started = True

    def close(self) -> None:
        self.closed = True


def test_the_controller_goes_on_while_the_cluster_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Failed before: `pytest_configure` ran initdb and the start itself (2.4 s at load 4,
    before any worker started), and gave no status to wait for."""
    for name in VARIABLES:
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    monkeypatch.setattr(conftest, "PG_URL", conftest.PG_URL)  # put back afterwards
    monkeypatch.setattr(conftest, "_pg_unavailable_reason", lambda url=None: "nothing there")
    monkeypatch.setattr(conftest, "unavailable", lambda: None)
    made: list[SlowCluster] = []

    def slow(**kwargs: Any) -> SlowCluster:
        made.append(SlowCluster(tmp_path, **kwargs))
        return made[-1]

    monkeypatch.setattr(conftest, "SessionCluster", slow)
    config: Any = SimpleNamespace(
        option=SimpleNamespace(help=False, collectonly=False), stash=pytest.Stash()
    )
    conftest.pytest_configure(config)  # returns while initdb waits
    (cluster,) = made
    assert os.environ["SENDLEDGER_TEST_PG_URL"] == cluster.url
    status = Path(os.environ["PYTEST_SENDLEDGER_PG_STATUS"])
    assert not status.exists() and not cluster.started
    cluster.release.set()
    assert conftest._session_cluster_failure() is None  # waited for, and ready
    assert cluster.started and status.read_text() == conftest.READY
    conftest.pytest_unconfigure(config)
    assert cluster.closed


def test_a_cluster_that_did_not_start_is_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Failing(SlowCluster):
        def start(self) -> None:
            raise RuntimeError("pg_ctl failed (1): no\nmore")

    status = tmp_path / "session-status"
    cluster = Failing(tmp_path, initdb=False)
    cluster.release.set()
    conftest._start_session_cluster(cluster, status, "nothing there")  # type: ignore[arg-type]
    monkeypatch.setenv("PYTEST_SENDLEDGER_PG_STATUS", str(status))
    said = conftest._session_cluster_failure()
    assert said == "nothing there; a private cluster did not start: pg_ctl failed (1): no"
