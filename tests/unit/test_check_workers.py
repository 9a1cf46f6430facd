"""The check workers' bookkeeping (daemon/engine/tick.py `CheckWorkers`): a task drained is
free to be handed out again at once, even while its future's done callback has not run yet
(it runs on the worker's thread after `wait` woke the tick: late on a loaded machine), and
that late callback never frees the key of the run handed out after it."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import Future
from typing import cast

import pytest

from daemon.engine.report import Counter
from daemon.engine.runner import StepRunner
from daemon.engine.tick import CheckWorkers


@pytest.fixture
def workers() -> Iterator[CheckWorkers]:
    # One worker: the second run waits for the first run's callback to end on that thread.
    pool = CheckWorkers(cast(StepRunner, None), Counter(), workers=1, name="t")
    yield pool
    pool.close()


def test_a_drained_task_is_handed_out_again_though_its_callback_is_late(
    workers: CheckWorkers, monkeypatch: pytest.MonkeyPatch
) -> None:
    submitted, release = threading.Event(), threading.Event()
    first_forgotten, gate = threading.Event(), threading.Event()
    original = CheckWorkers._done

    def late_done(self: CheckWorkers, key: str, future: Future[None]) -> None:
        on_worker = threading.current_thread().name.startswith("check@t")
        if on_worker:
            release.wait(10)  # the worker's thread is slow to run the callback
        original(self, key, future)
        if on_worker:
            first_forgotten.set()

    monkeypatch.setattr(CheckWorkers, "_done", late_done)
    runs: list[int] = []

    def first() -> None:
        submitted.wait(10)  # ends after its callback is registered: run on the worker
        runs.append(1)

    workers.submit_task("bounces:a", first)
    submitted.set()
    workers.drain()
    assert workers.running() == 0  # forgotten by the drain, not by the late callback

    def second() -> None:
        gate.wait(10)
        runs.append(2)

    workers.submit_task("bounces:a", second)  # the next tick's offer
    release.set()  # the first run's callback comes now: it must not free the second's key
    assert first_forgotten.wait(10)
    assert workers.running() == 1
    workers.submit_task("bounces:a", lambda: runs.append(3))  # once at a time
    gate.set()
    workers.drain()
    assert runs == [1, 2] and workers.running() == 0
