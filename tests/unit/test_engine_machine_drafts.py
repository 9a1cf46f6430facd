"""The engine state machine of test_engine_machine.py with a drafts provider (`send_via =
"drafts"`, docs/providers.md "Gmail setup"), keeping our Message-ID or replacing it: besides
every scripted fate and crash, a daemon may die between creating a draft and saving it, the
draft step and the draft's check may fail (the provider down, or answering 5xx),
drafts.create may be refused, and a person may delete a job's draft. The same invariants
hold after every step; at the end every job settles, and a job confirmed without a human has
exactly one copy, whether or not the provider kept our Message-ID."""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize, precondition, rule
from tests.unit.engine_rig import EngineRig
from tests.unit.test_engine_machine import LAGS, POLICIES, EngineMachine

from daemon.doubles.fake_drafts import FakeDraftsProvider
from ledger.vocabulary import ConfirmedVia, JobState


def drafts_rig(lag: float, seed: int, *, replaces: bool) -> EngineRig:
    return EngineRig(
        *POLICIES,
        seed=seed,
        provider=lambda clock: FakeDraftsProvider(
            "fake", clock=clock, index_lag=lag, replaces_message_id=replaces
        ),
    )


class DraftsMachine(EngineMachine):
    @initialize(lag=st.sampled_from(LAGS), seed=st.integers(0, 3), replaces=st.booleans())
    def start(self, lag: float, seed: int, replaces: bool) -> None:
        self.rig = drafts_rig(lag, seed, replaces=replaces)

    @property
    def drafts(self) -> FakeDraftsProvider:
        provider = self.r.provider
        assert isinstance(provider, FakeDraftsProvider)
        return provider

    @rule()
    def crash_after_a_create(self) -> None:
        self.drafts.crash_on_create()

    @rule(count=st.integers(1, 2))
    def draft_checks_fail(self, count: int) -> None:
        self.drafts.fail_checks(count)

    @rule(count=st.integers(1, 6))
    def draft_checks_unavailable(self, count: int) -> None:
        self.drafts.checks_unavailable(count)

    @rule(count=st.integers(1, 6), unavailable=st.booleans())
    def draft_creates_fail(self, count: int, unavailable: bool) -> None:
        """The draft step before the claim fails (an outage, or a 5xx): no claim, no
        attempt used, and an outage is waited out behind the circuit."""
        if unavailable:
            self.drafts.creates_unavailable(count)
        else:
            self.drafts.fail_creates(count)

    @rule()
    def a_create_is_refused(self) -> None:
        self.drafts.refuse_creates(1)

    @precondition(lambda self: bool(self.keys))
    @rule(data=st.data())
    def a_person_deletes_a_draft(self, data: st.DataObject) -> None:
        held = sorted(self.drafts.held_drafts)
        if held:
            self.drafts.delete_by_person(data.draw(st.sampled_from(held)))


DraftsMachine.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestDraftsMachine = DraftsMachine.TestCase


def test_a_dropped_reply_settles_through_the_draft_without_a_search() -> None:
    for replaces in (False, True):
        rig = drafts_rig(200.0, 0, replaces=replaces)  # the index would hide the copy
        rig.submit("legal", "l-1")  # on_unknown = "review": the draft answers anyway
        from daemon.doubles.fake_provider import Scripted

        rig.provider.script(Scripted.dropped_response())
        rig.tick()
        job = rig.job("l-1")
        assert job.state is JobState.CONFIRMED, rig.events("l-1")
        assert rig.provider.searches == 0
        assert rig.copies("l-1") == 1
        confirmed = [e for e in rig.ledger.history("l-1") if type(e).__name__ == "Confirmed"]
        assert confirmed[-1].via == ConfirmedVia.DRAFT
        rig.close()
