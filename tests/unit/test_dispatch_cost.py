"""What one dispatch of a confirmed send does beside its call and its commits, counted
(issue 30 (a), docs/performance.md "Where a job's CPU goes now"): each count is CPU on
every job, and a count does not depend on the machine's load as a timing does.

Engine runs use the fake provider on a memory store with injected time (engine_rig.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager

import pytest
from tests.unit.engine_rig import EngineRig, policy

import daemon.engine.dispatch as dispatching
from daemon.providers.base import calls_end_in


@pytest.fixture
def rig() -> Iterator[EngineRig]:
    with EngineRig(policy("receipts")) as made:
        # One read back (the first send always is), then none: the sends of a running
        # daemon past its first ones.
        made.provider.readback_first = 1
        made.provider.readback_rate = 0.0
        _send(made, 1)
        assert made.engine.health.readbacks == 1
        yield made


def _send(rig: EngineRig, count: int) -> None:
    sent = rig.provider.sends
    for i in range(sent, sent + count):
        rig.submit("receipts", f"job-{i:03d}")
    rig.tick()
    assert rig.provider.sends == sent + count


def test_a_confirmed_send_not_read_back_bounds_its_one_call(
    rig: EngineRig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lease's bound on the calls made under a claim (`calls_end_in`) is entered for
    the send, and for the read-back only when one is made: before, every confirmed send
    entered it a second time around the sampler's no."""
    entered: list[object] = []

    def counted(left: Callable[[], float] | None) -> AbstractContextManager[None]:
        entered.append(left)
        return calls_end_in(left)

    monkeypatch.setattr(dispatching, "calls_end_in", counted)
    _send(rig, 5)
    assert rig.engine.health.readbacks == 1
    assert len(entered) == 5
