"""A heartbeat whose COMMIT the store holds up past a server's stop (docs/operations.md
"Stopping"): its write asked whether the server stopped before the stop began, so it
commits; the stop's removal meets the row this write holds (SQLite's write lock,
PostgreSQL's row lock) and gives up after its lock wait. Before, the commit then landed and
the stopped server counted as running for `LIVE_SECONDS` (`admin copy-store` refused the
store). Now the write asks again after its commit and takes back what it wrote."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import pytest

from daemon.service_layer.loaded import PolicyAnnouncer
from ledger.application import Ledger
from ledger.stores.loaded_policies import API, LoadedPolicies, SqlLoadedPolicies
from policies.loader import PolicySet


class _Watched:
    """A cursor that notes whether a write went through it."""

    def __init__(self, cursor: Any) -> None:
        self._cursor = cursor
        self.wrote = False

    def execute(self, statement: str, params: Any = ()) -> Any:
        self.wrote = self.wrote or statement.lstrip().upper().startswith("INSERT")
        return self._cursor.execute(statement, params)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cursor, name)


def a_commit_held_past_the_stop(ledger: Ledger) -> list[LoadedPolicies]:
    """An API server's announcer on `ledger` whose first heartbeat's write is held between
    its last statement and its commit until the stop has given up on it; the rows left."""
    rows = ledger.loaded_policies()
    assert isinstance(rows, SqlLoadedPolicies)
    held, release = threading.Event(), threading.Event()
    real = rows._transaction

    @contextmanager
    def holding(*, commit: bool) -> Iterator[Any]:
        with real(commit=commit) as cursor:
            watched = _Watched(cursor)
            yield watched
            if watched.wrote and threading.current_thread().name == "loaded-policies":
                held.set()
                release.wait(10)  # the commit, held: the row's lock with it

    def transaction(*, commit: bool) -> AbstractContextManager[Any]:
        return holding(commit=commit)

    rows._transaction = transaction  # type: ignore[method-assign]
    announcer = PolicyAnnouncer(rows, "host-a", API, lambda: PolicySet({}), live_seconds=0.3)
    announcer.start()  # the start's row, written on this thread
    assert held.wait(5)
    announcer.stop(lock_wait=0.05)  # its removal meets the held row and gives up
    release.set()
    beat = announcer._thread
    assert beat is not None
    beat.join(5)
    assert not beat.is_alive()
    return rows.live(0)  # any row left, however old its heartbeat


def test_a_heartbeat_whose_commit_is_held_past_the_stop_leaves_no_row(tmp_path: Path) -> None:
    with Ledger(f"sqlite:///{tmp_path / 's.sqlite'}") as ledger:
        # The removal's lock wait: SQLite's one writer, waited for in the pool (5 s).
        recorder: Any = ledger.recorder
        recorder.datastore.pool.pool_timeout = 0.5
        assert a_commit_held_past_the_stop(ledger) == []


def _stopped_after_the_commit(then: Callable[[], None] = lambda: None) -> Callable[[], bool]:
    """`unless` for a write the stop overtook between its commit and its second look;
    `then`: what happened meanwhile."""
    asked: list[bool] = []

    def unless() -> bool:
        asked.append(True)
        if len(asked) == 1:
            return False  # in the transaction: not stopped yet
        then()
        return True

    return unless


@pytest.mark.parametrize("other_wrote", [False, True])
def test_a_commit_after_the_stop_takes_back_only_the_row_it_wrote(
    tmp_path: Path, other_wrote: bool
) -> None:
    """A process that took the name since wrote the row again: its row stays."""
    with Ledger(f"sqlite:///{tmp_path / 's.sqlite'}") as ledger:
        rows = ledger.loaded_policies()
        theirs = LoadedPolicies("host-a", API, 2.0, 200.0)
        meanwhile = (lambda: rows.write(theirs)) if other_wrote else (lambda: None)
        rows.write(
            LoadedPolicies("host-a", API, 1.0, 100.0), unless=_stopped_after_the_commit(meanwhile)
        )
        assert rows.live(0) == ([theirs] if other_wrote else [])
