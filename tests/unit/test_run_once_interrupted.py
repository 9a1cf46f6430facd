"""`sendledger run --once` interrupted (Ctrl-C) while a worker is in a job's draft step:
like the daemon's stop (docs/operations.md "Stopping"), no new provider call starts after
it; the calls in flight end, and the job is left for the next run."""

from __future__ import annotations

import signal

import pytest
from tests.unit.engine_rig import EngineRig
from tests.unit.engine_rig import policy as rig_policy

from daemon.doubles.fake_drafts import FakeDraftsProvider
from daemon.runtime import run_once
from ledger.vocabulary import JobState


def test_ctrl_c_during_the_draft_step_of_a_one_shot_run_starts_no_send() -> None:
    rig = EngineRig(
        rig_policy("receipts"), provider=lambda clock: FakeDraftsProvider("fake", clock=clock)
    )
    provider = rig.provider
    assert isinstance(provider, FakeDraftsProvider)
    stopping = rig.engine._stopping

    def interrupt() -> None:  # on the send worker, inside drafts.create
        provider.during_create = None
        signal.raise_signal(signal.SIGINT)  # Ctrl-C: KeyboardInterrupt in the main thread
        # The main thread reads it while this call is still running. The signal lands on
        # this thread, and the main thread runs its handler at its next poll (50 ms): on a
        # loaded machine that took over 3 s once. The wait ends when the stop is seen, so a
        # long bound costs a passing run nothing.
        assert stopping.wait(60), "the main thread never saw the Ctrl-C"

    try:
        rig.submit("receipts", "k1")
        provider.during_create = interrupt
        with pytest.raises(KeyboardInterrupt):
            run_once(rig.service)
        assert provider.drafts_created == 1
        assert provider.draft_sends == 0, rig.events("k1")
        assert rig.job("k1").state is JobState.REQUESTED
    finally:
        rig.close()
