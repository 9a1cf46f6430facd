"""The facts the engine rests on are checked under `python -O` too (ledger/exceptions.py
`BrokenInvariant`): an `assert` vanishes there, and the wrong value went on into a
decision or an event (a review with no reason, a draft check of no draft), failing later
and elsewhere, or not at all. A run under -O in a process of its own."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ledger.exceptions import BrokenInvariant, known, of_type

ROOT = Path(__file__).resolve().parents[2]

#: A resend its searches decided, claimed once its handle was found replacing
#: Message-IDs (tests/unit/test_races_readback.py), with a policy decision that breaks
#: its word: no review before the search of an unreliable handle.
SCRIPT = textwrap.dedent(
    """
    import logging, sys
    assert False, "this runs under -O: asserts are gone"
    from tests.unit.engine_rig import EngineRig, policy
    from tests.unit.test_races_readback import another_worker_marks, unknown_with_its_copy
    from daemon.engine import dispatch
    from ledger.vocabulary import JobState

    logging.basicConfig(stream=sys.stdout, level=logging.ERROR)
    rig = EngineRig(policy("receipts", on_unknown="retry"))
    rig.provider.replaces_message_id = True
    unknown_with_its_copy(rig)
    rig.tick()  # the misses believed: requeued
    print("REQUEUED", rig.job("k1").state is JobState.REQUESTED)
    another_worker_marks(rig)
    dispatch.decisions.before_search = lambda *a, **k: None
    rig.tick()
    print("STATE", rig.job("k1").state.value, "COPIES", rig.copies("k1"))
    rig.close()
    """
)


def test_a_broken_decision_is_named_under_python_o_not_written() -> None:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'src'}"}
    done = subprocess.run(
        [sys.executable, "-O", "-c", SCRIPT], cwd=ROOT, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, timeout=60,
    )  # fmt: skip
    out = done.stdout
    assert done.returncode == 0, out
    assert "REQUEUED True" in out, out
    assert "job k1: unexpected failure in Dispatch" in out, out
    assert "BrokenInvariant: an unreliable handle sends a job to review before its search" in out
    assert "STATE requested COPIES 1" in out, out


def test_the_checks_name_the_fact() -> None:
    assert known(0, "zero is there") == 0
    with pytest.raises(BrokenInvariant, match="the draft is recorded"):
        known(None, "the draft is recorded")
    with pytest.raises(BrokenInvariant, match="the job's events: int, not str"):
        of_type(3, str, "the job's events")
