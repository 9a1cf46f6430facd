"""Fixtures shared by every tier: stores (SQLite file, PostgreSQL schema), clocks, the
Hypothesis profile, and the session's PostgreSQL.

PostgreSQL: the tests use the server at SENDLEDGER_TEST_PG_URL (every test makes its own
schema). When none answers there, the session starts a private PostgreSQL 15 cluster in a
temporary folder (tests/pg_cluster.py), points SENDLEDGER_TEST_PG_URL at it and stops it at
the end. `pytest_configure` of the controlling process picks its port and URL, before
pytest-xdist starts its workers, which inherit the variable: one cluster per session however
many workers. Its initdb and start run in a thread meanwhile, beside the workers' start and
collection (they took 2.4 s at load 4, every run, before the first worker started); a
process waits for them at its first `require_postgres`, which reads how they ended.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

import pytest
from hypothesis import HealthCheck, settings

from daemon.doubles.fake_time import FakeClock
from tests.frozen_collection import pytest_collection  # noqa: F401  (a hook)
from tests.pg_cluster import SessionCluster, unavailable
from tests.xdist_groups import pytest_collection_modifyitems  # noqa: F401  (a hook)

PG_URL = os.environ.get(
    "SENDLEDGER_TEST_PG_URL", "postgresql://sendledger:sendledger@127.0.0.1:5432/sendledger_test"
)
IN_CI = os.environ.get("CI", "").lower() not in ("", "0", "false", "no")


def skip_unless_ci(reason: str) -> NoReturn:
    """Skip the test for `reason`; under CI=true, where nothing may skip, fail it."""
    if IN_CI:
        pytest.fail(f"CI is set, nothing may skip: {reason}")
    pytest.skip(reason)


# One Hypothesis profile for every property test, loaded before any test module is imported
# (so every `@given` and every `@settings` inherits it): no per-example deadline, since two
# cores shared by many runs make any wall-clock limit a coin toss, and the too_slow health
# check off for the same reason; derandomized, and each failure printed with its reproduction
# blob. Derandomized examples still depend on the modules loaded before (Hypothesis draws some
# integers from their constants): docs/development.md "Property tests". A `@settings` may change
# the example count, never bring a deadline back. HYPOTHESIS_PROFILE=explore draws fresh
# random examples (still no deadline) for a local bug hunt.
settings.register_profile(
    "sendledger",
    deadline=None,
    derandomize=True,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "explore", deadline=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "sendledger"))


class TimedOut(BaseException):
    """pytest-timeout's limit (pyproject.toml: 300 s a test), reached. Its own handler
    raises pytest's Failed from SIGALRM in whatever runs; inside a Hypothesis test that is
    taken for a failure of the example it interrupted, which is then shrunk and replayed
    (it passes): a FlakyFailure, listed first, with a blob that does not reproduce, while
    the failure whose shrinking took that long comes second. Hypothesis lets through what
    is neither an Exception nor Failed, so a BaseException ends the test as itself. Not a
    SendledgerError: that is an Exception, which Hypothesis would catch the same way."""


def _in_a_finalizer(frame: FrameType | None) -> bool:
    """Whether `frame` runs in a finalizer or a gc callback, whose exceptions Python prints
    and drops."""
    while frame is not None:
        if frame.f_code.co_name in ("__del__", "gc_callback"):
            return True
        frame = frame.f_back
    return False


_OURS = str(Path(__file__).resolve().parents[1])


def _in_hypothesis(frame: FrameType | None) -> bool:
    """Whether `frame` runs for Hypothesis's own code (drawing, recording, shrinking), not
    a test's: the first frame out from it that is Hypothesis's or this repository's says
    (the standard library's and other packages' are what either called)."""
    while frame is not None:
        name = frame.f_code.co_filename
        if f"{os.sep}hypothesis{os.sep}" in name:
            return True
        if name.startswith(_OURS) and f"{os.sep}site-packages{os.sep}" not in name:
            return False
        frame = frame.f_back
    return False


# optionalhook: `make test-py313` runs these tests where pytest-timeout is not installed.
@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_timeout_set_timer(item: pytest.Item, settings: Any) -> bool | None:
    """pytest-timeout's signal method, raising TimedOut; its other cases are its own."""
    in_main = threading.current_thread() is threading.main_thread()
    if settings.method != "signal" or not in_main:
        return None

    put_off = [0]

    def on_alarm(signum: int, frame: FrameType | None) -> None:
        if _in_a_finalizer(frame) or (_in_hypothesis(frame) and put_off[0] < 40):
            # Raised there it is "ignored" (unraisable) and the test runs on untimed, as
            # when the alarm lands in Hypothesis's gc callback; raised in the middle of
            # Hypothesis drawing an example, its replay draws otherwise and it reports a
            # FlakyStrategyDefinition: raised a moment later (2 s at most in all).
            put_off[0] += 1
            signal.setitimer(signal.ITIMER_REAL, 0.05)
            return
        # As pytest-timeout does: where every thread was, then the test ends.
        faulthandler.dump_traceback(all_threads=True)
        raise TimedOut(f"Timeout (>{settings.timeout}s) from pytest-timeout")

    def cancel() -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)

    item.cancel_timeout = cancel  # type: ignore[attr-defined]
    signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, settings.timeout)
    return True


def _pg_unavailable_reason(url: str | None = None) -> str | None:
    url = url or PG_URL
    try:
        import psycopg
    except ImportError:  # pragma: no cover
        return "psycopg is not installed"
    try:
        with psycopg.connect(url, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except Exception as exc:
        return f"PostgreSQL not reachable at {url.split('@')[-1]}: {exc}".splitlines()[0]
    return None


_SESSION_CLUSTER = pytest.StashKey[SessionCluster]()
_STARTING = pytest.StashKey[threading.Thread]()
# Why neither SENDLEDGER_TEST_PG_URL nor a private cluster can serve, as the controller found
# it; passed to xdist workers in the environment.
_FAILURE_VARIABLE = "PYTEST_SENDLEDGER_PG_FAILURE"
# The file in which the session cluster's start says how it ended ("ready", or why not),
# once it has: written whole (renamed into place), read by `require_postgres`.
_STATUS_VARIABLE = "PYTEST_SENDLEDGER_PG_STATUS"
READY = "ready"
# How long a process waits for the session cluster's initdb and start (seconds).
START_WAIT = 120.0


def _start_session_cluster(cluster: SessionCluster, status: Path, unreachable: str) -> None:
    try:
        cluster.initdb()
        cluster.start()
        said = READY
    except Exception as exc:  # reported by require_postgres, test by test
        said = f"{unreachable}; a private cluster did not start: {exc}".splitlines()[0]
    written = status.with_name(status.name + ".part")
    written.write_text(said, encoding="utf-8")
    written.replace(status)


def _session_cluster_failure() -> str | None:
    """Why the session's private cluster cannot serve (None: it can, or there is none),
    once its start has ended."""
    status = os.environ.get(_STATUS_VARIABLE)
    if not status:
        return None
    path = Path(status)
    deadline = time.monotonic() + START_WAIT
    while not path.exists():
        if time.monotonic() > deadline:
            return f"the session's private cluster did not start within {START_WAIT:.0f} s"
        time.sleep(0.05)
    said = path.read_text(encoding="utf-8")
    return None if said == READY else said


def pytest_configure(config: pytest.Config) -> None:
    """In the controlling process only (an xdist worker has `workerinput`): when nothing
    answers at PG_URL, start the session's private cluster and point PG_URL at it."""
    global PG_URL
    if hasattr(config, "workerinput") or config.option.help or config.option.collectonly:
        return
    os.environ.pop(_FAILURE_VARIABLE, None)
    os.environ.pop(_STATUS_VARIABLE, None)
    reason = _pg_unavailable_reason()
    if reason is None:
        return
    why_not = unavailable()
    if why_not is None:
        try:
            cluster = SessionCluster(initdb=False)  # its folder, port and URL
        except Exception as exc:  # reported by require_postgres, test by test
            why_not = f"a private cluster did not start: {exc}".splitlines()[0]
        else:
            status = cluster.root / "session-status"
            starting = threading.Thread(
                target=_start_session_cluster,
                args=(cluster, status, reason),
                name="session-cluster",
                daemon=True,
            )
            starting.start()
            config.stash[_SESSION_CLUSTER] = cluster
            config.stash[_STARTING] = starting
            PG_URL = cluster.url
            os.environ["SENDLEDGER_TEST_PG_URL"] = cluster.url
            os.environ[_STATUS_VARIABLE] = str(status)
            return
    os.environ[_FAILURE_VARIABLE] = f"{reason}; {why_not}"


def pytest_unconfigure(config: pytest.Config) -> None:
    starting = config.stash.get(_STARTING, None)
    if starting is not None:
        starting.join(timeout=START_WAIT)
    cluster = config.stash.get(_SESSION_CLUSTER, None)
    if cluster is not None:
        cluster.close()


def pytest_report_header(config: pytest.Config) -> str:
    cluster = config.stash.get(_SESSION_CLUSTER, None)
    if cluster is not None:
        return f"postgresql: private session cluster at {cluster.url} ({cluster.root})"
    return f"postgresql: {PG_URL.split('@')[-1]}"


_PG_REASON: list[str | None] = []


def require_postgres() -> None:
    """Skip without PostgreSQL, with the reason; under CI a skip is a failure."""
    if not _PG_REASON:
        _PG_REASON.append(
            os.environ.get(_FAILURE_VARIABLE)
            or _session_cluster_failure()
            or _pg_unavailable_reason()
        )
    reason = _PG_REASON[0]
    if reason is None:
        return
    if IN_CI:
        pytest.fail(f"CI is set, PostgreSQL tests must run: {reason}")
    pytest.skip(f"{reason} (set SENDLEDGER_TEST_PG_URL or start PostgreSQL 15)")


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A fresh schema in the test database; dropped afterwards."""
    require_postgres()
    import psycopg

    schema = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    try:
        yield f"{PG_URL}?schema={schema}"
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'ledger.sqlite'}"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def full_backlog_port() -> Iterator[int]:
    """A loopback port whose listen queue is full, so a new SYN gets no answer and
    connect() times out (Linux): a connect timeout, the one failure that looks like a read
    timeout. Skips where the kernel accepts connections beyond the backlog."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    port = server.getsockname()[1]
    fillers: list[socket.socket] = []
    try:
        for _ in range(4):
            probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            probe.settimeout(0.2)
            fillers.append(probe)
            try:
                probe.connect(("127.0.0.1", port))
            except TimeoutError:
                break
        else:
            pytest.skip("this kernel accepts connections beyond the listen backlog")
        yield port
    finally:
        for sock in fillers:
            sock.close()
        server.close()
