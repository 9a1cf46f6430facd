"""The send workers (daemon/engine/sends.py): no waste, and no turn of their loop lost.

Idle workers sleep: with nothing to send, a worker wakes only at its idle wait or when
something changes, never because another idle worker went to sleep. They used to wake
each other in turn for as long as they were idle: a core's worth of CPU in an idle
daemon, and the interpreter lock taken from busy workers.

Many workers load due jobs in queries of several keys (`LOAD_MIN`), not one query per key
or two.

A worker that runs out of offered keys while more were due reads the next ones itself,
instead of waiting for the next tick.

A crash in a send (a BaseException: an interpreter exit, not a failed call) reaches the
caller of `tick`, and the worker it happened in goes on serving."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import pytest
from tests.unit.engine_rig import EngineRig, policy

from daemon.engine import sends
from ledger.vocabulary import JobState


def test_idle_workers_do_not_wake_each_other() -> None:
    rig = EngineRig(policy("receipts"), concurrency=4)
    try:
        workers: Any = rig.engine._sends
        looks = 0
        lock = threading.Lock()
        pick = workers._pick

        def counted() -> Any:
            nonlocal looks
            with lock:
                looks += 1
            return pick()

        workers._pick = counted
        rig.engine.hand_out()  # nothing due: every worker goes idle
        time.sleep(0.2)
        with lock:
            looks = 0
        time.sleep(1.0)
        with lock:
            seen = looks
        # Each of the 4 wakes about once per idle wait (0.5 s): 8 looks in a second,
        # a few more for the wake-ups of the tick above; thousands when they ping-pong.
        assert seen <= 4 * (1.0 / sends.IDLE_WAIT + 2), seen
    finally:
        rig.close()


def test_an_idle_engine_still_sends_what_is_submitted() -> None:
    rig = EngineRig(policy("receipts"), concurrency=4)
    try:
        rig.engine.hand_out()
        time.sleep(0.1)  # idle
        for n in range(6):
            rig.submit("receipts", f"k{n}")
        report = rig.tick()
        assert report.confirmed == 6 and rig.provider.sends == 6
    finally:
        rig.close()


def test_many_workers_load_several_keys_per_query() -> None:
    rig = EngineRig(policy("receipts"), concurrency=16)
    try:
        for n in range(64):
            rig.submit("receipts", f"k{n}")
        sizes: list[int] = []
        get_jobs = rig.ledger.get_jobs

        def counted(keys: Sequence[str]) -> Any:
            sizes.append(len(keys))
            return get_jobs(keys)

        rig.ledger.get_jobs = counted  # type: ignore[method-assign]
        report = rig.tick()
        assert report.confirmed == 64 and rig.provider.sends == 64
        # 64 keys for 16 workers: at least LOAD_MIN per query, so at most 64 / 8 queries
        # (one to four keys per query before: 44).
        assert sum(sizes) == 64 and len(sizes) <= 64 // 8, sizes
    finally:
        rig.close()


def test_workers_read_the_next_due_jobs_when_the_offer_was_cut_short() -> None:
    rig = EngineRig(policy("receipts"), concurrency=2)
    try:
        daemon = rig.settings.daemon.model_copy(update={"batch_size": 2})
        rig.settings = rig.settings.model_copy(update={"daemon": daemon})
        rig.restart()
        for n in range(7):
            rig.submit("receipts", f"k{n}")
        reads: list[int] = []
        due = rig.ledger.due

        def counted(state: JobState | str, *args: Any, **kwargs: Any) -> Any:
            rows = due(state, *args, **kwargs)
            if state is JobState.REQUESTED:
                reads.append(len(rows))
            return rows

        rig.ledger.due = counted  # type: ignore[method-assign]
        report = rig.tick()  # offers 2 keys; the workers read the other 5 themselves
        assert report.confirmed == 7 and rig.provider.sends == 7
        assert reads[0] == 2 and len(reads) >= 3, reads
    finally:
        rig.close()


class Killed(BaseException):
    """What an exit raises in a thread (SystemExit, KeyboardInterrupt): no Exception."""


def test_a_crash_in_a_send_reaches_the_tick_and_the_worker_goes_on() -> None:
    rig = EngineRig(policy("receipts"), concurrency=1)
    try:
        rig.submit("receipts", "k0")
        send = rig.provider.send_raw

        def killed(raw: bytes) -> Any:
            raise Killed

        rig.provider.send_raw = killed  # type: ignore[method-assign]
        rig.engine.hand_out()
        with pytest.raises(Killed):
            rig.engine.settle(timeout=10)  # what `tick` waits with (`SendWorkers.drain`)
        # The claim is left to recovery, as after a real crash.
        assert rig.job("k0").state is JobState.ATTEMPTED
        rig.provider.send_raw = send  # type: ignore[method-assign]
        rig.submit("receipts", "k1")
        rig.engine.hand_out()
        assert rig.engine.settle(timeout=10)  # the one worker is still there
        assert rig.job("k1").state is JobState.CONFIRMED and rig.provider.sends == 1
    finally:
        rig.close()
