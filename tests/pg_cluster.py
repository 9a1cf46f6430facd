"""A private PostgreSQL 15 cluster for one test: initdb into a temporary folder, a loopback
port, started and stopped with pg_ctl.

Tests that stop or restart the database must never touch the shared cluster on 5432 that
other tests use in parallel. As root, the server runs as the `postgres` OS user (PostgreSQL
refuses to run as root); otherwise as the current user. `unavailable()` says why a cluster
cannot be made here (no binaries, no such user); `require_private_cluster` skips with it
outside CI and fails under CI=true. `SessionCluster` is the one the whole test session uses
when no PostgreSQL answers at SENDLEDGER_TEST_PG_URL (see tests/conftest.py).

A process runs initdb once, into a folder of its own it never starts a server on, and each
cluster's data folder is a copy of it: a dozen tests start a cluster of their own, and
initdb took 1.5-4 s of CPU each (the bootstrap, the catalogs, the collations), a copy of
its 39 MB a fraction of that.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import threading
from pathlib import Path
from types import TracebackType
from typing import Self

import pytest

BIN = Path(os.environ.get("SENDLEDGER_TEST_PG_BIN", "/usr/lib/postgresql/15/bin"))
USER = "sendledger"


def _as_server_user() -> list[str]:
    return ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []


def unavailable() -> str | None:
    """Why no private cluster can run here, or None."""
    for tool in ("initdb", "pg_ctl"):
        if not (BIN / tool).is_file():
            return f"no {BIN / tool} (PostgreSQL 15 server binaries)"
    if os.geteuid() == 0:
        if shutil.which("runuser") is None:
            return "running as root without runuser to start PostgreSQL as another user"
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and there is no `postgres` OS user to run the server"
    return None


def require_private_cluster() -> None:
    """Skip with the reason when no private cluster can run here; under CI=true a skip
    is a failure."""
    reason = unavailable()
    if reason is None:
        return
    if os.environ.get("CI", "").lower() not in ("", "0", "false", "no"):
        pytest.fail(f"CI is set, the PostgreSQL restart tests must run: {reason}")
    pytest.skip(reason)


_TEMPLATE_LOCK = threading.Lock()
_TEMPLATE: list[Path] = []  # this process's pristine data folder, once made


def _server_owned_folder(prefix: str) -> Path:
    root = Path(tempfile.mkdtemp(prefix=prefix))
    if os.geteuid() == 0:
        entry = pwd.getpwnam("postgres")
        os.chown(root, entry.pw_uid, entry.pw_gid)
    return root


def _run(cwd: Path, *args: str | Path) -> None:
    """`args` as the server's user, in `cwd`; a failure raises with its words."""
    result = subprocess.run(
        [*_as_server_user(), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
    )
    if result.returncode != 0:
        raise RuntimeError(
            f"{Path(str(args[0])).name} failed ({result.returncode}): "
            f"{result.stderr.strip() or result.stdout.strip()}"
        )


def _initdb(root: Path, data: Path) -> None:
    """A new cluster's data folder `data`, in `root` (owned by the server's user)."""
    _run(
        root,
        BIN / "initdb",
        "-D",
        data,
        "-U",
        USER,
        "--auth=trust",  # loopback only, a throw-away cluster
        "-E",
        "UTF8",
        "--no-sync",
    )


def _remove_if_made_here(root: Path, maker: int) -> None:
    # A child forked from this process (a fork server's command) that exits through
    # sys.exit runs these handlers too: the template is still in use here.
    if os.getpid() == maker:
        shutil.rmtree(root, ignore_errors=True)


def _template() -> Path:
    """This process's initdb'd data folder, never started (made at the first call,
    removed at exit): what every cluster's data folder is copied from."""
    with _TEMPLATE_LOCK:
        if not _TEMPLATE:
            root = _server_owned_folder("sendledger-pg-template-")
            atexit.register(_remove_if_made_here, root, os.getpid())
            _initdb(root, root / "data")
            _TEMPLATE.append(root / "data")
        return _TEMPLATE[0]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PrivateCluster:
    """`with PrivateCluster() as pg:` initdb + start; `pg.url`; `pg.stop()`, `pg.start()`."""

    def __init__(self, prefix: str = "sendledger-pg-", *, initdb: bool = True) -> None:
        """`initdb=False`: the folder, port and URL only; `initdb()` before `start()`."""
        self.root = _server_owned_folder(prefix)
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.port = _free_port()
        self.url = f"postgresql://{USER}@127.0.0.1:{self.port}/postgres"
        if initdb:
            self.initdb()

    def initdb(self) -> None:
        """A fresh data folder: a copy of this process's initdb'd one (modes and owner
        kept, as the server insists on a folder only its user may read)."""
        self._run("cp", "-a", _template(), self.data)

    def _run(self, *args: str | Path) -> None:
        _run(self.root, *args)

    def start(self) -> None:
        # fsync off: only an operating-system crash would lose data, and the tests stop
        # the server, not the machine. synchronous_commit stays on: with it off, a commit
        # acknowledged before an immediate stop can vanish, which no client can guard against.
        # max_connections 300, not 100: the session's cluster serves every xdist worker,
        # and on a loaded machine the backends of closed connections linger a moment; a
        # test that opens eight processes' stores at once met "too many clients already".
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.root} "
            "-c fsync=off -c full_page_writes=off -c max_connections=300"
        )
        self._run(BIN / "pg_ctl", "-D", self.data, "-l", self.log, "-o", options, "-w", "start")

    def stop(self, mode: str = "fast") -> None:
        """`fast`: the server ends every session (clients see 57P01) and shuts down;
        `immediate`: as a crash, no shutdown checkpoint."""
        self._run(BIN / "pg_ctl", "-D", self.data, "-m", mode, "-w", "stop")

    def advisory_locks(self) -> int:
        """The session advisory locks held: a daemon's name (`Ledger.hold_identity`), on a
        connection of its own in no transaction. A write's turn at the job index
        (`pg_advisory_xact_lock`) is held inside one, for as long as that write, and is
        not counted."""
        import psycopg

        with psycopg.connect(self.url, connect_timeout=3) as conn:
            row = conn.execute(
                "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
                "WHERE l.locktype = 'advisory' AND a.xact_start IS NULL"
            ).fetchone()
            return int(row[0]) if row else 0

    def close(self) -> None:
        with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
            self.stop("immediate")  # fails when it is not running
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class SessionCluster(PrivateCluster):
    """A private cluster standing in for the shared one: started once per test session
    (by the pytest controller, before any xdist worker starts), with the database the
    shared cluster's URL names, `sendledger_test`, owned by the superuser `sendledger`."""

    DATABASE = "sendledger_test"

    def __init__(self, *, initdb: bool = True) -> None:
        super().__init__(prefix="sendledger-pg-session-", initdb=initdb)
        self.url = f"postgresql://{USER}@127.0.0.1:{self.port}/{self.DATABASE}"

    def initdb(self) -> None:
        # The controller makes no other cluster: a template would only add its copy.
        _initdb(self.root, self.data)

    def start(self) -> None:
        super().start()
        import psycopg

        admin = f"postgresql://{USER}@127.0.0.1:{self.port}/postgres"
        with psycopg.connect(admin, autocommit=True, connect_timeout=10) as conn:
            exists = conn.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", (self.DATABASE,)
            ).fetchone()
            if exists is None:
                conn.execute(f'CREATE DATABASE "{self.DATABASE}"')
