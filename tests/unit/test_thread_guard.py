"""The thread guard (tests/thread_guard.py): a thread a test leaves running fails the test,
named with the function it runs; one that ends within the wait does not; one a module's
fixture keeps is checked once that fixture is torn down."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from tests.thread_guard import Guard

ROOT = Path(__file__).resolve().parents[2]


def waiting_for(event: threading.Event, name: str) -> threading.Thread:
    thread = threading.Thread(target=event.wait, name=name, daemon=True)
    thread.start()
    return thread


def left_running(wait: float, name: str, excused: bool = False) -> str | None:
    """What a guard giving threads `wait` seconds says of one named `name` that a test
    left running (stopped once said)."""
    guard = Guard("fail")
    guard.wait = wait
    stop = threading.Event()
    before = guard.begin()
    waiting_for(stop, name)
    try:
        return guard.end(before, f"t::{name}", excused=excused)
    finally:
        stop.set()


def test_a_thread_left_running_is_named_with_what_it_runs() -> None:
    said = left_running(0.05, "left-behind")
    assert said is not None
    assert "'left-behind' running threading.Event.wait" in said
    assert "1 thread(s) still running" in said


def test_an_excused_test_s_threads_are_not_waited_for() -> None:
    # A warning whatever the wait: a thread that never ends held the test the whole bound.
    started = time.monotonic()
    said = left_running(60, "never-ending", excused=True)
    assert time.monotonic() - started < 30
    assert said is not None and "'never-ending'" in said and "still running 0 s" in said


def test_a_thread_that_ends_within_the_wait_is_not_a_leak() -> None:
    guard = Guard("fail")
    stop = threading.Event()
    before = guard.begin()
    waiting_for(stop, "ending")
    threading.Timer(0.05, stop.set).start()  # the timer's thread ends within the wait too
    assert guard.end(before, "t::ends") is None


def test_a_thread_kept_by_a_wider_fixture_is_checked_once_it_is_torn_down() -> None:
    guard = Guard("fail")
    guard.wait = 0.05
    stop = threading.Event()
    module_rig = object()
    guard.wider.add(module_rig)
    before = guard.begin()
    waiting_for(stop, "module-worker")
    try:
        assert guard.end(before, "t::first") is None  # its fixture still serves the next
        assert guard.end(guard.begin(), "t::second") is None
        guard.wider.discard(module_rig)  # torn down, its thread still running
        said = guard.end(guard.begin(), "t::second")
    finally:
        stop.set()
    assert said is not None and "'module-worker'" in said and "(started by t::first)" in said


def test_a_thread_said_to_live_for_the_session_is_never_checked() -> None:
    guard = Guard("fail")
    guard.wait = 0.05
    stop = threading.Event()
    before = guard.begin()
    guard.session.add(waiting_for(stop, "shared-helper"))  # as `lives_for_the_session`
    try:
        assert guard.end(before, "t::first") is None
    finally:
        stop.set()


LEAKING = """
import threading

import pytest

STOP = threading.Event()


def test_leaks() -> None:
    threading.Thread(target=STOP.wait, name="leaked-worker", daemon=True).start()


@pytest.mark.leaves_threads("not ours")
def test_excused() -> None:
    threading.Thread(target=STOP.wait, name="excused-worker", daemon=True).start()
"""


# Failing (whatever the outer run says), each test's threads given 0.2 s. No plugin but
# the guard: those `make test` loads by their entry points (schemathesis, anyio,
# hypothesis, playwright, xdist, timeout) play no part in it and took 2.2 of the 2.7 s of
# CPU each run cost.
GUARD = {
    "PYTEST_SENDLEDGER_THREAD_GUARD": "fail",
    "PYTEST_SENDLEDGER_THREAD_WAIT": "0.2",
    "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
}
# No cache, no xdist: one process, one run, nothing written beside the test file.
PLAIN = ["-p", "no:cacheprovider", "-p", "no:xdist"]


def guarded_run(folder: Path, name: str, source: str) -> subprocess.CompletedProcess[str]:
    """pytest run on `source` (written as `name` in `folder`) with the guard's hooks."""
    (folder / name).write_text(source, encoding="utf-8")
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.thread_guard", *PLAIN, name],
        cwd=folder,
        env={**os.environ, "PYTHONPATH": str(ROOT), **GUARD},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_leaking_test_errors_at_its_teardown_and_an_excused_one_warns(tmp_path: Path) -> None:
    run = guarded_run(tmp_path, "test_leaking.py", LEAKING)
    out = run.stdout
    assert run.returncode == 1, out
    assert "ERROR at teardown of test_leaks" in out
    assert "still running 0.2 s after the teardown" in out
    assert "'leaked-worker' running threading.Event.wait" in out
    assert "ThreadLeak" in out and "leaves_threads: not ours" in out
    # The excused test's thread is said at once, not after the bound (0.2 s here).
    assert "still running 0 s after the teardown:\n    'excused-worker'" in out, out
    assert "2 passed, 1 warning, 1 error" in out


SESSION_SERVER = """
import threading
from collections.abc import Iterator

import pytest

STOP = threading.Event()


@pytest.fixture(scope="session")
def server() -> Iterator[threading.Event]:
    threading.Thread(target=STOP.wait, name="session-server", daemon=True).start()
    yield STOP
    STOP.set()


def test_first_use(server: threading.Event) -> None:
    pass


def test_a_use_that_leaves_a_handler(server: threading.Event) -> None:
    threading.Thread(target=server.wait, name="handler-left", daemon=True).start()


# Last: the session's teardown (in this test's) stops the handler the test above left.
def test_second_use(server: threading.Event) -> None:
    pass
"""


def test_a_session_fixture_s_threads_live_and_what_a_test_starts_on_it_does_not(
    tmp_path: Path,
) -> None:
    run = guarded_run(tmp_path, "test_session_server.py", SESSION_SERVER)
    out = run.stdout
    assert run.returncode == 1, out
    assert "'session-server'" not in out
    assert "ERROR at teardown of test_a_use_that_leaves_a_handler" in out
    assert "'handler-left' running threading.Event.wait" in out
    assert "3 passed, 1 error" in out
