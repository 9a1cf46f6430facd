"""Every test ends with no thread it started still running (tests/unit/conftest.py loads
these hooks).

An engine left open keeps its send workers, and a server its threads, for the rest of the
session: waiting, some polling, they add load to a 2-core `pytest -n 2` run and make later
timing-sensitive tests flake, and they hide a real leak (an engine that never closes is a
daemon that never stops cleanly). After each test's teardown the threads started since its
setup began are given `WAIT` seconds to end; those still alive fail the test (an error at
teardown) naming each thread, the function it runs and where it is now.

Checked after the teardown, in a hook and not an autouse fixture: a fixture's finalizer runs
before the module-scoped fixtures are torn down, and those (a module's rig, its TestClient)
legitimately keep threads until then. While a project fixture wider than a function is set
up, the threads a test leaves are carried forward and checked once the last of those
fixtures is torn down, still named with the test that started them.

A session-scoped fixture is not waited for so (the check would wait for the session's end):
the threads started while one is set up (a server started once per session) are the
session's, expected to live and never checked; those it starts later, once a test uses it
(a connection's handler), are the test's.

A test marked `leaves_threads(reason)` is warned about instead (a leak not of the project's
making, its reason said), at once: what it leaves is only warned about, so waiting for it
changes nothing but the warning, and a thread that never ends (schemathesis keeps its event
loop and idle anyio workers for the process) held each such test the whole `WAIT`.
PYTEST_SENDLEDGER_THREAD_GUARD=warn warns for every test, =off turns the check off;
PYTEST_SENDLEDGER_THREAD_WAIT sets `WAIT`.
"""

from __future__ import annotations

import os
import sys
import sysconfig
import threading
import time
import warnings
from collections.abc import Generator, Iterable

import pytest

#: How long a test's threads have to end after its teardown (seconds). A thread that ends
#: is not waited for, so a long bound costs a passing run nothing; at load 10 on 2 cores a
#: closed engine's last worker can take seconds to be scheduled and leave.
WAIT = float(os.environ.get("PYTEST_SENDLEDGER_THREAD_WAIT", "10"))
_STDLIB = sysconfig.get_paths()["stdlib"]
_BEFORE = pytest.StashKey[frozenset[threading.Thread]]()


class ThreadLeak(UserWarning):
    """Threads a test started, still running after its teardown (warn mode)."""


def describe(thread: threading.Thread) -> str:
    """Its name, the function it runs and the line it is at now."""
    target = getattr(thread, "_target", None)  # CPython keeps it until the run ends
    if target is None:
        runs = f"{type(thread).__module__}.{type(thread).__qualname__}.run"
    else:
        module = getattr(target, "__module__", None) or "?"
        runs = f"{module}.{getattr(target, '__qualname__', repr(target))}"
    frame = sys._current_frames().get(thread.ident or -1)
    # The innermost of our frames (the stdlib's wait says nothing), else the innermost.
    ours = frame
    while ours is not None and ours.f_code.co_filename.startswith(_STDLIB):
        ours = ours.f_back
    frame = ours or frame
    where = ""
    if frame is not None:
        where = f", at {frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}"
    return f"{thread.name!r} running {runs}{where}"


def still_running(threads: Iterable[threading.Thread], wait: float) -> list[threading.Thread]:
    """Those of `threads` alive once each was given until `wait` seconds from now to end."""
    deadline = time.monotonic() + wait
    alive = []
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            alive.append(thread)
    return alive


def report(left: dict[threading.Thread, str], nodeid: str, wait: float) -> str:
    lines = [f"{len(left)} thread(s) still running {wait:g} s after the teardown:"]
    for thread, started_in in left.items():
        by = "" if started_in == nodeid else f" (started by {started_in})"
        lines.append(f"  {describe(thread)}{by}")
    lines.append("close() what the test started (an engine, a rig, a server), or use `with`")
    return "\n".join(lines)


class Guard:
    """The threads started since a test's setup began, checked after its teardown."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.wait = WAIT
        self.carried: dict[threading.Thread, str] = {}  # thread -> the test that started it
        self.wider: set[object] = set()  # project fixtures wider than a function, set up
        self.session: set[threading.Thread] = set()  # started by session fixtures' setup

    def begin(self) -> frozenset[threading.Thread]:
        return frozenset(threading.enumerate())

    def end(
        self, before: frozenset[threading.Thread], nodeid: str, excused: bool = False
    ) -> str | None:
        """What to say about the threads left (None: nothing left, or checked later);
        `excused` (the test is marked `leaves_threads`): said without waiting."""
        for thread in threading.enumerate():
            if (
                thread not in before
                and thread not in self.session
                and not isinstance(thread, threading._DummyThread)
            ):
                self.carried.setdefault(thread, nodeid)
        if self.wider or not self.carried:
            return None
        wait = 0.0 if excused else self.wait
        alive = still_running(list(self.carried), wait)
        left = {thread: self.carried[thread] for thread in alive}
        self.carried.clear()
        return report(left, nodeid, wait) if left else None


_GUARD = Guard(os.environ.get("PYTEST_SENDLEDGER_THREAD_GUARD", "fail"))


def lives_for_the_session(thread: threading.Thread) -> None:
    """`thread` serves the whole session (a helper started at first use, as a session
    fixture's would be, and stopped at exit): never checked, as a session fixture's."""
    _GUARD.session.add(thread)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "leaves_threads(reason): the thread guard warns instead of failing"
    )


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(
    fixturedef: pytest.FixtureDef[object], request: pytest.FixtureRequest
) -> Generator[None, object, object]:
    # Only the project's (a baseid): a plugin's (anyio_backend) start none.
    if fixturedef.scope in ("package", "module", "class") and fixturedef.baseid:
        _GUARD.wider.add(fixturedef)
    if fixturedef.scope != "session" or not fixturedef.baseid:
        return (yield)
    before = _GUARD.begin()
    try:
        return (yield)
    finally:
        _GUARD.session.update(set(threading.enumerate()) - before)


def pytest_fixture_post_finalizer(
    fixturedef: pytest.FixtureDef[object], request: pytest.FixtureRequest
) -> None:
    _GUARD.wider.discard(fixturedef)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    item.stash[_BEFORE] = _GUARD.begin()
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(
    item: pytest.Item, nextitem: pytest.Item | None
) -> Generator[None, None, None]:
    result = yield  # a teardown that failed is reported as itself
    before = item.stash.get(_BEFORE, None)
    if _GUARD.mode == "off" or before is None:
        return result
    excused = item.get_closest_marker("leaves_threads")
    said = _GUARD.end(before, item.nodeid, excused=excused is not None)
    if said is not None:
        if excused is not None:
            warnings.warn(ThreadLeak(f"{said}\n(leaves_threads: {excused.args[0]})"), stacklevel=1)
        elif _GUARD.mode == "warn":
            warnings.warn(ThreadLeak(said), stacklevel=1)
        else:
            pytest.fail(said, pytrace=False)
    return result
