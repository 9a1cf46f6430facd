"""`admin copy-store`'s Ctrl-C is answered while SQLite waits for a lock in C
(docs/operations.md "Moving to PostgreSQL"): a Python signal handler runs only between
two Python steps, and SQLite's busy timeout (30 s; 5 s here) is one C call. A second
Ctrl-C during the last read's wait for the write lock, and a third during the read of
the destination after a second, were answered only once that wait ended. The signals
are sent to this process by a timer thread once the wait has begun, on SQLite files."""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.integration.test_copy_store_final_read import insert_held
from tests.unit.test_copy_store import at_the_mark
from tests.unit.test_copy_store_ctrl_c import a_store_and_its_config, copy

import daemon.service_layer.copy_store as copying
import ledger.stores.sqlite as sqlite_store
from daemon.exit_codes import EXIT_INTERRUPTED
from ledger.stores.keycheck import COPY_STARTED, SqlKeyChecks
from ledger.stores.url import SqliteStore

#: The busy timeout here: long enough that an answer within `PROMPT` is not the wait's end.
BUSY = 5
#: What "at once" allows, on a loaded machine.
PROMPT = 2.0


def ctrl_c_in(seconds: float, times: int) -> threading.Thread:
    """SIGINT sent to this process `times` times, 0.2 s apart, from `seconds` on."""

    def press() -> None:
        time.sleep(seconds)
        for _ in range(times):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.2)

    presser = threading.Thread(target=press, name="ctrl-c")
    presser.start()
    return presser


@contextlib.contextmanager
def held_whole(store: Path) -> Iterator[None]:
    """`store` locked by another connection against readers and writers alike."""
    with contextlib.closing(
        sqlite3.connect(store, isolation_level=None, check_same_thread=False)
    ) as holder:
        holder.execute("PRAGMA locking_mode = EXCLUSIVE")
        holder.execute("BEGIN EXCLUSIVE")
        holder.execute("COMMIT")  # the lock stays, in this mode, until the connection ends
        yield


def test_a_second_ctrl_c_during_the_last_read_s_wait_ends_the_copy_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A save holds the source's write lock as the copy is marked finished: the last read
    waits for it. Ctrl-C twice during that wait: the copy ends within a second or so,
    unfinished, exit 130. Before, only once the busy timeout ran out (then exit 1)."""
    monkeypatch.setattr(sqlite_store, "BUSY_TIMEOUT", BUSY)
    config = a_store_and_its_config(tmp_path)
    presses: list[threading.Thread] = []
    with contextlib.ExitStack() as held:

        def hold_and_press() -> None:
            held.enter_context(insert_held(tmp_path / "ledger.sqlite"))
            presses.append(ctrl_c_in(0.3, times=2))

        began = at_the_mark(monkeypatch, SqlKeyChecks, hold_and_press)
        started = time.monotonic()
        assert copy(config) == EXIT_INTERRUPTED
        took = time.monotonic() - started
    presses[0].join()
    assert began
    assert took < PROMPT, took
    assert "is marked an unfinished copy" in capsys.readouterr().err
    # The mark the copy left: unfinished (nothing opens it).
    assert copying.left_at(SqliteStore(tmp_path / "copy.sqlite")) == COPY_STARTED


def test_a_third_ctrl_c_during_the_read_of_the_destination_ends_it_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """After a second Ctrl-C the command reads what the copy left at the destination;
    another process holds it, and the read waits SQLite's busy timeout. A third Ctrl-C
    then exits at once, exit 130, with the line saying it could not be read. Before,
    only once the wait ran out."""
    monkeypatch.setattr(sqlite_store, "BUSY_TIMEOUT", BUSY)
    config = a_store_and_its_config(tmp_path)
    read = copying.left_at
    presses: list[threading.Thread] = []
    with contextlib.ExitStack() as held:

        def held_while_read(*args: object) -> str | None:
            held.enter_context(held_whole(tmp_path / "copy.sqlite"))
            presses.append(ctrl_c_in(0.3, times=1))
            return read(*args)  # type: ignore[arg-type]

        def second_ctrl_c() -> None:
            signal.raise_signal(signal.SIGINT)
            signal.raise_signal(signal.SIGINT)

        monkeypatch.setattr(copying, "left_at", held_while_read)
        at_the_mark(monkeypatch, SqlKeyChecks, second_ctrl_c)
        started = time.monotonic()
        assert copy(config) == EXIT_INTERRUPTED
        took = time.monotonic() - started
        presses[0].join()
        said = capsys.readouterr().err
    assert took < PROMPT, took
    assert "could not be read (Ctrl-C again)" in said, said
