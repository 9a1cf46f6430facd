"""The engine state machine of test_engine_machine.py with a Graph-like provider: every send
is answered 202 with no id (Unknown: Graph's `send` and `sendMail` name no copy) unless a
fate is scripted, and the copy is filed late (the index lag, up to past both searches).
The same invariants hold after every step, and at the end every job settles with the
copies its policy allows (docs/providers.md "Providers", Microsoft Graph column)."""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize
from tests.unit.engine_rig import EngineRig
from tests.unit.test_engine_machine import LAGS, POLICIES, EngineMachine

from daemon.doubles.fake_provider import FakeProvider, Scripted
from daemon.providers.base import SendKind, SendOutcome

#: Graph's 202: the message was accepted, no copy is known yet.
ACCEPTED_202 = Scripted(
    SendOutcome(SendKind.UNKNOWN, "send: HTTP 202 accepted, sent copy not seen yet", status=202),
    stored=True,
)


class GraphLikeProvider(FakeProvider):
    """A send without a scripted fate is a 202: stored, Unknown to the caller. A scripted
    `Scripted.confirmed()` stands for the copy read back by immutable id in time."""

    def send_raw(self, raw: bytes) -> SendOutcome:
        with self._lock:
            if not self._script:
                self._script.append(ACCEPTED_202)
        return super().send_raw(raw)


class GraphLikeMachine(EngineMachine):
    @initialize(lag=st.sampled_from(LAGS), seed=st.integers(0, 3))
    def start(self, lag: float, seed: int) -> None:
        self.rig = EngineRig(
            *POLICIES,
            seed=seed,
            provider=lambda clock: GraphLikeProvider("fake", clock=clock, index_lag=lag),
        )


def test_a_graph_like_send_is_unknown_until_its_copy_is_found() -> None:
    rig = EngineRig(*POLICIES, index_lag=30.0)
    rig.engine.close()
    rig.provider = GraphLikeProvider("fake", clock=rig.clock, index_lag=30.0)
    rig.engine = rig.new_engine()
    rig.submit("receipts", "r-1")
    rig.tick()
    assert rig.job("r-1").state.value == "unknown"
    for _ in range(20):
        rig.advance_and_tick(30)
    assert rig.job("r-1").state.value == "confirmed"
    assert rig.copies("r-1") == 1
    rig.close()


GraphLikeMachine.TestCase.settings = settings(
    max_examples=40,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestGraphLikeMachine = GraphLikeMachine.TestCase
