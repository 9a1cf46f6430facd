"""Humans and the engine together, as a hypothesis state machine: jobs are submitted, the
provider's answers scripted, time passes, and operators check, resolve (resend included),
triage and cancel through the service layer at any moment.

With an index lag shorter than the channels' `search_after`, what a search finds is the
truth, and then (docs/review.md "Review"):
- a human's decision never makes a second copy: no message is ever stored twice;
- a cancelled job is never attempted;
- every human resend follows a search, recorded in the same step, that found nothing;
- triage confirms a job only when exactly one copy exists.
"""

from __future__ import annotations

import itertools
from contextlib import nullcontext, suppress

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from tests.unit.engine_rig import EngineRig, policy

from daemon.doubles.fake_provider import Scripted
from daemon.service_layer.services import TRIAGE_NOTE, ChannelPolicies, ServiceError, Services
from ledger.job import SendJob
from ledger.vocabulary import JobState, Resolution

POLICIES = (
    policy("legal", on_unknown="review", irreversible=True),
    policy("alerts", on_unknown="search-then-review"),
)
FATES = (
    Scripted.confirmed(),
    Scripted.dropped_response(),
    Scripted.lost_request(),
    Scripted.server_error_after_send(),
    Scripted.rejected(transient=True),
    Scripted.crash_during_call(stored=True),
    Scripted.crash_during_call(stored=False),
)


class ReviewMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.keys: list[str] = []
        self.rig: EngineRig | None = None

    @initialize(lag=st.sampled_from([0.0, 30.0]))
    def start(self, lag: float) -> None:
        self.rig = EngineRig(*POLICIES, index_lag=lag)
        self.services = Services(
            self.rig.ledger,
            lambda: ChannelPolicies(self.rig.policies),  # type: ignore[union-attr]
            providers=lambda name: nullcontext(self.r.provider),
        )

    @property
    def r(self) -> EngineRig:
        assert self.rig is not None
        return self.rig

    @rule(channel=st.sampled_from(["legal", "alerts"]))
    def submit(self, channel: str) -> None:
        key = f"{channel}-{len(self.keys)}"
        self.r.submit(channel, key)
        self.keys.append(key)

    @rule(arrived=st.booleans())
    def an_outage_sends_one_to_review(self, arrived: bool) -> None:
        """A send on the review channel whose answer is lost: its copy arrived or not."""
        self.r.provider.script(Scripted.dropped_response() if arrived else Scripted.lost_request())
        self.submit("legal")
        self.r.engine.tick()
        self.r.clock.advance(61)

    @rule(fate=st.sampled_from(FATES))
    def script(self, fate: Scripted) -> None:
        self.r.provider.script(fate)

    @rule()
    def tick(self) -> None:
        self.r.engine.tick()

    @rule(seconds=st.sampled_from([1.0, 30.0, 61.0, 300.0]))
    def advance(self, seconds: float) -> None:
        self.r.clock.advance(seconds)

    @rule()
    def restart(self) -> None:
        self.r.restart()

    @precondition(lambda self: bool(self.keys))
    @rule(data=st.data(), decision=st.sampled_from(list(Resolution)), check_first=st.booleans())
    def operator(self, data: st.DataObject, decision: Resolution, check_first: bool) -> None:
        key = data.draw(st.sampled_from(self.keys))
        try:
            if check_first:
                self.services.check(key, by="op")
            self.services.resolve(key, decision, note="", by="op")
        except ServiceError:
            pass  # refused: a sentence, and nothing changed that should not have

    @precondition(lambda self: bool(self.keys))
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        with suppress(ServiceError):
            self.services.cancel(data.draw(st.sampled_from(self.keys)), note="", by="op")

    @rule(dry_run=st.booleans())
    def triage(self, dry_run: bool) -> None:
        self.services.triage(by="ops", dry_run=dry_run)

    @invariant()
    def humans_never_make_a_second_copy(self) -> None:
        if self.rig is None:
            return
        for key in self.keys:
            job, events = self.r.read(key)
            assert self.r.provider.copies_of(job.message_id) <= 1, key
            names = [type(e).__name__ for e in events]
            if "Cancelled" in names:
                assert "Attempted" not in names[names.index("Cancelled") :], key
                assert job.state is JobState.CANCELLED
            for before, event in itertools.pairwise(events):
                if isinstance(event, SendJob.Resolved) and event.decision == Resolution.RESEND:
                    assert isinstance(before, SendJob.Checked), key
                    assert before.provider_message_ids == [] and before.timestamp == (
                        event.timestamp
                    )
                if isinstance(event, SendJob.Resolved) and event.note == TRIAGE_NOTE:
                    assert isinstance(before, SendJob.Checked)
                    assert len(before.provider_message_ids) == 1, key

    def teardown(self) -> None:
        if self.rig is not None:
            self.rig.close()


ReviewMachine.TestCase.settings = settings(
    max_examples=40,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestReviewMachine = ReviewMachine.TestCase
