"""PostgreSQL when a process opens its store: a server still starting up or in recovery
(SQLSTATE 57P03), a server with no free connection slot (53300), a refusal that stands
(docs/operations.md "Opening the store").

A systemd unit ordered After=postgresql.service starts as soon as the server's process
does, before it accepts connections. A private cluster (tests/pg_cluster.py) started as a
standby with `hot_standby = off` and nothing to replay from answers every connection with
57P03 ("the database system is not accepting connections") for as long as it is not
promoted: the state, held as long as a test needs it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TypeVar

import psycopg
import pytest
from tests.e2e.daemon_kit import DaemonProcess, NotifyListener, job, shared_fork_server
from tests.e2e.test_pg_restart import CONNECT_TIMEOUT, PostgresRig
from tests.integration.api_kit import free_port
from tests.pg_cluster import BIN, USER, PrivateCluster, require_private_cluster

from daemon.from_settings import SERVICE_START_WAIT
from daemon.systemd import START_MARGIN
from ledger.application import Ledger
from ledger.stores import postgres
from ledger.stores.causes import StoreUnavailable
from ledger.stores.postgres import OPEN_RETRY_PAUSE
from ledger.stores.url import PostgresStore, parse_store_url

#: What PostgreSQL 15 says to a connection while it is in recovery with hot_standby off.
IN_RECOVERY = "the database system is not accepting connections"
#: What it says to a connection when every slot is taken.
FULL = "sorry, too many clients already"
#: The daemon's one line when its wait begins, and when it ends.
WAIT_BEGINS = "cannot connect yet"
WAIT_ENDS = "connected after"
#: The daemon's line once it runs (daemon/runtime.py).
RUNNING = "sendledger running"


#: In the store URL of the recovering cluster, which trusts every loopback connection and
#: never asks for it: no line of a command or the daemon may show it.
PASSWORD = "s3cret-pw"


class RecoveringCluster(PrivateCluster):
    """Starts as a standby that never reaches a consistent state for readers (57P03 to
    every connection) until `promote`. `store`: its URL with a password."""

    @property
    def store(self) -> str:
        return self.url.replace(f"{USER}@", f"{USER}:{PASSWORD}@", 1)

    def start(self) -> None:
        (self.data / "standby.signal").write_text("", encoding="utf-8")
        with (self.data / "postgresql.conf").open("a", encoding="utf-8") as conf:
            conf.write("hot_standby = off\n")
        super().start()

    def promote(self) -> None:
        self._run(BIN / "pg_ctl", "-D", self.data, "-w", "promote")


class SmallCluster(PrivateCluster):
    """`SLOTS` connections in all, the last `RESERVED` for superusers (as PostgreSQL's
    default `superuser_reserved_connections`); the test's role is a superuser."""

    SLOTS = 20
    RESERVED = 3

    def start(self) -> None:
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.root} -c fsync=off "
            f"-c max_connections={self.SLOTS} -c superuser_reserved_connections={self.RESERVED}"
        )
        self._run(BIN / "pg_ctl", "-D", self.data, "-l", self.log, "-o", options, "-w", "start")

    @contextlib.contextmanager
    def filled(self, count: int = SLOTS) -> Iterator[list[psycopg.Connection[tuple[object, ...]]]]:
        """`count` slots taken while the block runs, every one by default (the list:
        close them to free some)."""
        held: list[psycopg.Connection[tuple[object, ...]]] = []
        try:
            for _ in range(count):
                held.append(psycopg.connect(self.url, connect_timeout=5))
            if count == self.SLOTS:
                with pytest.raises(psycopg.OperationalError, match=FULL):
                    psycopg.connect(self.url, connect_timeout=5).close()
            yield held
        finally:
            for conn in held:
                conn.close()


Cluster = TypeVar("Cluster", bound=PrivateCluster)


def started(cluster: Cluster) -> Iterator[Cluster]:
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.close()


@pytest.fixture
def recovering() -> Iterator[RecoveringCluster]:
    require_private_cluster()
    yield from started(RecoveringCluster(prefix="sendledger-pg-recovering-"))


@pytest.fixture
def small() -> Iterator[SmallCluster]:
    require_private_cluster()
    yield from started(SmallCluster(prefix="sendledger-pg-small-"))


def with_connect_timeout(rig: PostgresRig, seconds: int) -> None:
    text = rig.config.read_text(encoding="utf-8")
    old = f'connect_timeout = "{CONNECT_TIMEOUT}s"'
    assert old in text
    rig.config.write_text(text.replace(old, f'connect_timeout = "{seconds}s"'), encoding="utf-8")


#: A `store.connect_timeout` that a refusal at once answers well within.
LONG_CONNECT_TIMEOUT = 20


def lines_with(daemon: DaemonProcess, words: str) -> list[str]:
    return [line for line in daemon.stderr_text().splitlines() if words in line]


def alive_past_connect_timeout(daemon: DaemonProcess) -> None:
    """Alive well past `store.connect_timeout`, the wait of a command: a daemon that gave
    up at it has exited meanwhile."""
    until = time.monotonic() + CONNECT_TIMEOUT + 2.0
    while time.monotonic() < until and daemon.alive():
        time.sleep(0.2)
    assert daemon.alive(), daemon.tail()


def test_run_waits_for_a_server_in_recovery_and_starts_once_it_accepts(
    tmp_path: Path, recovering: RecoveringCluster
) -> None:
    """It exited 1 after `store.connect_timeout` (2 s here), without a word meanwhile."""
    with PostgresRig(tmp_path, recovering.store) as rig:
        daemon = rig.start_daemon()
        alive_past_connect_timeout(daemon)
        recovering.promote()
        rig.wait_for(lambda: bool(lines_with(daemon, RUNNING)), "the daemon to run")
        waits = lines_with(daemon, WAIT_BEGINS)
        assert len(waits) == 1, daemon.tail()  # one line for the wait, none per try
        assert IN_RECOVERY in waits[0], waits
        assert f"waiting up to {SERVICE_START_WAIT} s for it" in waits[0], waits
        assert f"store postgresql://sendledger@127.0.0.1:{recovering.port}/postgres" in waits[0]
        assert len(lines_with(daemon, WAIT_ENDS)) == 1, daemon.tail()
        assert PASSWORD not in daemon.stderr_text()
        assert daemon.terminate() == 0, daemon.tail()


def test_run_stopped_while_it_waits_for_the_server_exits_at_once(
    tmp_path: Path, recovering: RecoveringCluster
) -> None:
    """`systemctl stop` during the start's wait: nothing in flight, exit 0 at once."""
    with PostgresRig(tmp_path, recovering.store) as rig:
        daemon = rig.start_daemon()
        rig.wait_for(lambda: bool(lines_with(daemon, WAIT_BEGINS)), "the wait to begin")
        stopped = time.monotonic()
        assert daemon.terminate(timeout=10) == 0, daemon.tail()
        assert time.monotonic() - stopped < 3.0


def test_a_command_tries_a_server_in_recovery_for_connect_timeout_then_says_one_line(
    tmp_path: Path, recovering: RecoveringCluster
) -> None:
    """57P03 is no refusal that stands (libpq's ping tells it from a wrong password or a
    missing database, which fail at once): a command tries for `store.connect_timeout`,
    and no longer, then exits 1 with one line naming the store. Both doors: `status`
    asks whether the store exists, `submit` opens it."""
    with PostgresRig(tmp_path, recovering.store) as rig:
        store = f"store postgresql://sendledger@127.0.0.1:{recovering.port}/postgres"
        for argv, stdin in ((["status", "k-1"], None), (["submit", "-"], json.dumps(job("k-1")))):
            started = time.monotonic()
            said = rig.cli(*argv, stdin=stdin, check=False)
            took = time.monotonic() - started
            assert said.returncode == 1, said.stderr
            assert said.stderr.startswith(f"sendledger: {store}: cannot connect ("), said.stderr
            assert IN_RECOVERY in said.stderr and said.stderr.count("\n") == 1, said.stderr
            assert PASSWORD not in said.stderr
            assert CONNECT_TIMEOUT <= took < CONNECT_TIMEOUT + 4.0, (argv, took)


def test_the_api_waits_for_a_server_in_recovery_as_run_does(
    tmp_path: Path, recovering: RecoveringCluster
) -> None:
    """`sendledger api` is a service too: the same wait at its start, then it serves."""
    with PostgresRig(tmp_path, recovering.store, api_port=free_port()) as rig:
        log = tmp_path / "api.log"
        server = shared_fork_server()
        pid = server.start(["--config", str(rig.config), "api"], rig.dir, log, env=rig.child_env())

        def said(words: str) -> int:
            try:
                return log.read_text(encoding="utf-8", errors="replace").count(words)
            except FileNotFoundError:  # the forked process has not opened it yet
                return 0

        try:
            rig.wait_for(lambda: said(WAIT_BEGINS) > 0, "the wait to begin")
            recovering.promote()
            rig.wait_for(lambda: said("sendledger api on http://") > 0, "the API to serve")
            assert said(WAIT_BEGINS) == 1 and said(WAIT_ENDS) == 1 and said(PASSWORD) == 0
        finally:
            os.kill(pid, signal.SIGTERM)
            server.exited(pid, timeout=15)


def test_run_waits_for_a_free_connection_slot(tmp_path: Path, small: SmallCluster) -> None:
    """A full server frees a slot within seconds as a rule; the daemon exited 1 at once
    (then systemd started it again 5 s later, RestartSec)."""
    with PostgresRig(tmp_path, small.url) as rig, small.filled() as held:
        daemon = rig.start_daemon()
        alive_past_connect_timeout(daemon)
        for conn in held:
            conn.close()
        rig.wait_for(lambda: bool(lines_with(daemon, RUNNING)), "the daemon to run")
        waits = lines_with(daemon, WAIT_BEGINS)
        assert len(waits) == 1 and FULL in waits[0], daemon.tail()
        assert daemon.terminate() == 0, daemon.tail()


def test_a_command_on_a_full_server_fails_at_once(tmp_path: Path, small: SmallCluster) -> None:
    """A command does not wait for a slot (docs/operations.md "Opening the store"): its
    one line at once, well within a long `store.connect_timeout`."""
    with PostgresRig(tmp_path, small.url) as rig, small.filled():
        with_connect_timeout(rig, LONG_CONNECT_TIMEOUT)
        started = time.monotonic()
        said = rig.cli("status", "k-1", check=False)
        assert time.monotonic() - started < LONG_CONNECT_TIMEOUT / 2
        assert said.returncode == 1, said.stderr
        assert FULL in said.stderr and said.stderr.count("\n") == 1, said.stderr


def test_run_on_a_missing_database_fails_at_once_without_waiting(
    tmp_path: Path, small: SmallCluster
) -> None:
    """The start's wait is for a server that may accept later, never for a refusal that
    stands: a missing database (as a wrong password, a missing role) ends `run` at once,
    exit 1, with the one line and no line of a wait."""
    missing = small.url.rsplit("/", 1)[0] + "/sendledger_no_such_db"
    with PostgresRig(tmp_path, missing) as rig:
        with_connect_timeout(rig, LONG_CONNECT_TIMEOUT)
        started = time.monotonic()
        daemon = rig.start_daemon()
        assert daemon.wait(30) == 1, daemon.tail()
        assert time.monotonic() - started < LONG_CONNECT_TIMEOUT / 2
        assert lines_with(daemon, 'database "sendledger_no_such_db" does not exist'), daemon.tail()
        assert not lines_with(daemon, WAIT_BEGINS), daemon.tail()


def test_a_role_that_is_no_superuser_waits_for_a_slot_not_kept_for_superusers(
    small: SmallCluster, caplog: pytest.LogCaptureFixture
) -> None:
    """What a daemon's role (no superuser) meets on a full server: the last slots are
    kept for superusers, "remaining connection slots are reserved for ..." (53300 too).
    The store's open at a service's start (`PostgresStore.start_wait`) waits for a slot,
    saying so once."""
    with psycopg.connect(small.url, autocommit=True) as admin:
        admin.execute("CREATE ROLE app LOGIN")
        admin.execute("GRANT CREATE ON SCHEMA public TO app")
    spec = parse_store_url(small.url.replace(f"{USER}@", "app@", 1))
    assert isinstance(spec, PostgresStore)
    spec = dataclasses.replace(spec, connect_timeout=CONNECT_TIMEOUT, start_wait=30)
    opened: list[Ledger] = []
    caplog.set_level(logging.INFO, logger="sendledger.store")
    with small.filled(small.SLOTS - small.RESERVED) as held:
        opener = threading.Thread(target=lambda: opened.append(Ledger(spec)), daemon=True)
        opener.start()
        opener.join(CONNECT_TIMEOUT + 2.0)
        assert opener.is_alive() and not opened  # a command's open had failed at once
        for conn in held[:8]:  # the store's pool and its own connections
            conn.close()
        opener.join(30)
    assert opened, "the open gave up"
    opened[0].close()
    said = [r.getMessage() for r in caplog.records if r.name == "sendledger.store"]
    waits = [line for line in said if WAIT_BEGINS in line]
    assert len(waits) == 1, said
    assert "remaining connection slots are reserved" in waits[0], waits
    assert sum(WAIT_ENDS in line for line in said) == 1, said


def test_systemd_is_told_of_the_wait_for_a_server_in_recovery(
    tmp_path: Path, recovering: RecoveringCluster, notify_socket: NotifyListener
) -> None:
    """Under a unit (NOTIFY_SOCKET) each try again extends the start's timeout past the
    next word (EXTEND_TIMEOUT_USEC) with a STATUS= naming the store without its
    password; once connected STATUS= is cleared, then READY=1. Without it a
    `store.connect_timeout` above about 75 s outlasted TimeoutStartSec (90 s): systemd
    killed a start that would have connected."""
    with PostgresRig(tmp_path, recovering.store) as rig:
        daemon = rig.start_daemon({"NOTIFY_SOCKET": str(notify_socket.path)})
        rig.wait_for(lambda: notify_socket.count("EXTEND_TIMEOUT_USEC=") >= 3, "three tries")
        recovering.promote()
        rig.wait_for(lambda: notify_socket.count("READY=1") == 1, "READY=1")
        store = f"postgresql://sendledger@127.0.0.1:{recovering.port}/postgres"
        waiting = f"STATUS=waiting for PostgreSQL at {store} (starting up)"
        messages = notify_socket.messages
        ready = next(n for n, m in enumerate(messages) if "READY=1" in m)
        waits = [n for n, m in enumerate(messages) if waiting in m]
        cleared = [n for n, m in enumerate(messages) if "STATUS=" in m]
        assert len(waits) >= 3 and waits == list(range(len(waits))), messages
        assert cleared[:1] == [len(waits)] and len(waits) < ready, messages  # cleared, then ready
        # The next word comes within a pause and a try with its ping, each bounded by
        # connect_timeout: each extension outlasts that.
        least = (OPEN_RETRY_PAUSE + 2 * CONNECT_TIMEOUT + START_MARGIN) * 1_000_000
        for message in messages[: len(waits) + 1]:
            extend = [line for line in message if line.startswith("EXTEND_TIMEOUT_USEC=")]
            assert len(extend) == 1 and int(extend[0].split("=")[1]) >= least, message
        assert not any(PASSWORD in line for line in notify_socket.lines())
        assert daemon.terminate() == 0, daemon.tail()


def fill_the_rest(cluster: SmallCluster) -> list[psycopg.Connection[tuple[object, ...]]]:
    """Every slot the store's connections left free, taken."""
    held: list[psycopg.Connection[tuple[object, ...]]] = []
    while True:
        try:
            held.append(psycopg.connect(cluster.url, connect_timeout=5))
        except psycopg.OperationalError as exc:
            assert FULL in str(exc)
            return held


#: The moments of a start at which the server fills up again, after its first connection.
MOMENTS = ("the pool's first connection", "the schema upgrade", "the identity lock")


@pytest.mark.parametrize("moment", MOMENTS)
def test_every_connection_of_a_start_waits_for_a_free_slot(
    small: SmallCluster,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    moment: str,
) -> None:
    """A server that fills up again after the start's first connection: the pool's first
    connection (the store's key check), the schema upgrade's and the identity lock's wait
    for a slot as the first did, saying so once. They failed the start: the pool after
    `connect_timeout` (its own tries), the other two at once (their connect was direct).
    The moment is a hook, not a timer: the slots are taken just before that connection
    and freed once its wait has begun."""
    spec = parse_store_url(small.url)
    assert isinstance(spec, PostgresStore)
    spec = dataclasses.replace(spec, connect_timeout=CONNECT_TIMEOUT, start_wait=30)
    Ledger(spec).close()  # the store exists: its next open upgrades it
    held: list[psycopg.Connection[tuple[object, ...]]] = []
    caplog.set_level(logging.INFO, logger="sendledger.store")

    def waits() -> list[str]:
        said = [r.getMessage() for r in caplog.records if r.name == "sendledger.store"]
        return [line for line in said if WAIT_BEGINS in line]

    def free_once_waiting() -> None:
        until = time.monotonic() + 30
        while not waits() and time.monotonic() < until:
            time.sleep(0.05)
        for conn in held:
            conn.close()

    prepare, upgrade = postgres.prepare_schema, postgres.upgrade_schema

    def prepare_then_fill(store: PostgresStore) -> bool:
        exists = prepare(store)
        held.extend(fill_the_rest(small))
        return exists

    def fill_then_upgrade(store: PostgresStore) -> None:
        held.extend(fill_the_rest(small))
        upgrade(store)

    if moment == MOMENTS[0]:
        monkeypatch.setattr(postgres, "prepare_schema", prepare_then_fill)
    elif moment == MOMENTS[1]:
        monkeypatch.setattr(postgres, "upgrade_schema", fill_then_upgrade)
    freer = threading.Thread(target=free_once_waiting, daemon=True)
    freer.start()
    try:
        with Ledger(spec) as ledger:
            if moment == MOMENTS[2]:
                held.extend(fill_the_rest(small))
            ledger.hold_identity("startwait").release()
    finally:
        freer.join(35)
        for conn in held:
            conn.close()
    assert held, "the server was never full"
    assert len(waits()) == 1 and FULL in waits()[0], waits()


def test_a_start_whose_pool_finds_no_slot_past_its_wait_says_the_one_line(
    small: SmallCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the wait the pool's first connection fails the start as the first connection
    would: the store's one line with the server's words, not the pool's "couldn't get a
    connection after N sec"."""
    spec = parse_store_url(small.url)
    assert isinstance(spec, PostgresStore)
    spec = dataclasses.replace(spec, connect_timeout=CONNECT_TIMEOUT, start_wait=3)
    held: list[psycopg.Connection[tuple[object, ...]]] = []
    prepare = postgres.prepare_schema

    def prepare_then_fill(store: PostgresStore) -> bool:
        exists = prepare(store)
        held.extend(fill_the_rest(small))
        return exists

    monkeypatch.setattr(postgres, "prepare_schema", prepare_then_fill)
    started = time.monotonic()
    try:
        with pytest.raises(StoreUnavailable) as refused:
            Ledger(spec)
    finally:
        for conn in held:
            conn.close()
    assert 3 <= time.monotonic() - started < 3 + 3 * CONNECT_TIMEOUT
    said = str(refused.value)
    assert said.startswith(f"store {spec.describe()}: cannot connect (") and FULL in said, said
