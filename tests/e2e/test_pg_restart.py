"""The database restarts under a running daemon: it reconnects, and loses or doubles nothing.

A private PostgreSQL 15 cluster (tests/pg_cluster.py; never the shared one on 5432,
which other tests use at the same time) is stopped for a few seconds mid-run, then started
again, while jobs flow through the fault relay to the Gmail emulator. Effects are counted at
the emulator (copies) and the relay (provider calls), never in the daemon's records.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.e2e.daemon_kit import NotifyListener, Rig, job
from tests.pg_cluster import PrivateCluster, require_private_cluster

from ledger.application import Ledger

JOBS = 60
# 100 quota units a send: 6 sends/s, so the jobs are still flowing when the database stops.
QUOTA = 600
# `[store] connect_timeout`, libpq's least: a connection's wait while the database is down.
CONNECT_TIMEOUT = 2
# `[daemon] status_interval`: systemd's STATUS= line, a store read of its own, comes this
# often (5 s by default), so that several of them fall in the outage.
STATUS_INTERVAL = 0.2
STATUS_UNREACHABLE = "STATUS=jobs: unknown, store unreachable"


class PostgresRig(Rig):
    """The daemon rig on a PostgreSQL store (the base rig writes a SQLite one)."""

    def __init__(self, folder: Path, store: str, **kwargs: object) -> None:
        super().__init__(folder, **kwargs)  # type: ignore[arg-type]
        self.store = store
        text = self.config.read_text(encoding="utf-8")
        text = text.replace(
            'url = "sqlite:///ledger.sqlite"\n',
            f'url = "{store}"\npool_size = 3\nmax_overflow = 2\nlock_timeout = "2s"\n'
            f'connect_timeout = "{CONNECT_TIMEOUT}s"\n',
        )
        self.config.write_text(text, encoding="utf-8")
        self._pg_ledger: Ledger | None = None

    @property
    def ledger(self) -> Ledger:
        if self._pg_ledger is None:
            self._pg_ledger = Ledger(self.store)
        return self._pg_ledger

    def forget_ledger(self) -> None:
        """The test's own reader: closed before the restart, reopened after."""
        if self._pg_ledger is not None:
            self._pg_ledger.close()
            self._pg_ledger = None

    def close(self) -> None:
        self.forget_ledger()
        super().close()


def _last_status(notify_socket: NotifyListener) -> str:
    return [line for line in notify_socket.lines() if line.startswith("STATUS=")][-1]


@pytest.fixture
def cluster() -> Iterator[PrivateCluster]:
    require_private_cluster()
    with PrivateCluster() as pg:
        yield pg


@pytest.mark.parametrize(
    ("mode", "down"), [("fast", 3.0), ("immediate", STATUS_INTERVAL + CONNECT_TIMEOUT + 2.0)]
)
def test_database_restart_mid_run(
    tmp_path: Path, cluster: PrivateCluster, notify_socket: NotifyListener, mode: str, down: float
) -> None:
    """`fast`: the server ends every session and shuts down cleanly; `immediate`: as a
    crash, and down for longer than the status line's period (`status_interval`) plus a
    connection's wait (`connect_timeout`, 2 s), so that store calls, the status line's
    among them, fail for a while: systemd is told the store is unreachable, and told the
    counts again once it answers (the status thread outlived the failures).
    Then up: every job confirmed with one copy, one provider call per Attempted event (or
    a Rejected "not sent" when the call could not connect), the daemon alive throughout
    and holding its name again."""
    with PostgresRig(
        tmp_path,
        cluster.url,
        concurrency=4,
        quota=QUOTA,
        tick="100ms",
        timeout="2s",
        daemon_extra=f'status_interval = "{STATUS_INTERVAL}s"',
    ) as rig:
        keys = [f"pg-restart-{i:03d}" for i in range(JOBS)]
        rig.submit([job(key) for key in keys])
        daemon = rig.start_daemon(
            {"SENDLEDGER_DAEMON__NAME": "restart-a", "NOTIFY_SOCKET": str(notify_socket.path)}
        )
        rig.wait_for(
            lambda: rig.ledger.counts(("confirmed",)).get("confirmed", 0) >= 5,
            "the first confirmations",
        )
        assert cluster.advisory_locks() == 1
        confirmed_before = rig.ledger.counts(("confirmed",)).get("confirmed", 0)
        rig.forget_ledger()
        cluster.stop(mode)
        assert confirmed_before < JOBS - 10, "the restart must fall mid-run"
        time.sleep(down)
        assert daemon.alive(), daemon.tail()
        # Its read fails after about a connection's wait: a loaded machine's later one
        # lengthens the outage rather than failing the test.
        rig.wait_for(lambda: notify_socket.count(STATUS_UNREACHABLE) >= 1, "STATUS= to say so")
        cluster.start()

        rig.wait_settled(keys, timeout=90)
        assert daemon.alive(), daemon.tail()
        # The identity lock went with the old session; the daemon holds its name again.
        rig.wait_for(lambda: cluster.advisory_locks() == 1, "the name to be held again")
        rig.wait_for(
            lambda: _last_status(notify_socket).startswith("STATUS=jobs: requested 0,"),
            "the counts in STATUS= again",
        )

        states = collections.Counter(rig.state(key) for key in keys)
        assert states == {"confirmed": JOBS}, (states, daemon.tail())
        for key in keys:
            assert rig.copies(key) == 1, (key, rig.types(key))
        histories = [rig.history(key) for key in keys]
        attempted = sum(1 for h in histories for r in h if r["type"] == "Attempted")
        # A call that never reached the relay (connect refused or timed out on a loaded
        # machine) is recorded as Rejected "not sent": a claim with a call all the same.
        not_sent = sum(
            1
            for h in histories
            for r in h
            if r["type"] == "Rejected" and "not sent" in str(r["reason"])
        )
        calls = len(rig.sends())
        assert attempted - not_sent == calls, (attempted, not_sent, calls, daemon.tail())
        assert daemon.terminate() == 0, daemon.tail()
