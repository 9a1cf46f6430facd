"""The engine state machine of test_engine_machine.py with a provider that reads its
mailbox's history (docs/architecture.md "The history handle"), its history lagging or not,
and a channel that believes a history miss (`history_after`): besides every scripted fate
(lost replies and lost requests more often than the others: they are what the history
answers), crash and outage, the history reads fail (as a 5xx, or unavailable), every start
given so far expires, and claims get no historyId. The provider keeps our Message-ID: one
that replaces it sends every unknown outcome to review once its read-back caught it, before
any read (tests/unit/test_engine_history.py), and one not caught yet is the case the docs do
not promise ("Not promised" in docs/how-it-works.md), whose copies the history never
confirms either (the same file).
The same invariants hold after every step, extended: a HistoryMissed only for an answered
read, a believed one only on a channel that opted in and after its window, the first search
no sooner than `search_after` after the Unknown unless a believed history miss came first,
and a Confirmed via history only with exactly one copy whose stored Message-ID is exactly
the job's (invariant 3). At the end every job settles with the copies its policy allows."""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize, invariant, precondition, rule
from tests.unit.engine_rig import EngineRig, policy
from tests.unit.test_engine_machine import (
    FATES,
    LAGS,
    POLICIES,
    EngineMachine,
    check_bounces,
    check_history,
)

from daemon.doubles.fake_history import FakeHistoryProvider
from daemon.doubles.fake_provider import Scripted
from ledger.vocabulary import ConfirmedVia, JobState

#: A retry channel that believes a history miss 10 s after the Unknown (search_after 60 s).
FAST = policy("fast", on_unknown="retry", history_after="10s")
HISTORY_POLICIES = (*POLICIES, FAST)
BY_CHANNEL = {p.channel: p for p in HISTORY_POLICIES}
#: Below `history_after` (a believed miss is true), and past it (a copy shown late).
HISTORY_LAGS = (0.0, 5.0, 45.0)
#: What the history answers, three times as often as the other fates.
HISTORY_FATES = (*[Scripted.dropped_response(), Scripted.lost_request()] * 3, *FATES)


def history_rig(lag: float, history_lag: float, seed: int) -> EngineRig:
    return EngineRig(
        *HISTORY_POLICIES,
        seed=seed,
        provider=lambda clock: FakeHistoryProvider(
            "fake", clock=clock, index_lag=lag, history_lag=history_lag
        ),
    )


class HistoryMachine(EngineMachine):
    retry_channels = ("receipts", "fast")

    @initialize(
        lag=st.sampled_from(LAGS), history_lag=st.sampled_from(HISTORY_LAGS), seed=st.integers(0, 3)
    )
    def start(self, lag: float, history_lag: float, seed: int) -> None:
        self.rig = history_rig(lag, history_lag, seed)

    @property
    def history(self) -> FakeHistoryProvider:
        provider = self.r.provider
        assert isinstance(provider, FakeHistoryProvider)
        return provider

    # The channels that search (and so read the history) more often than `legal`.
    @rule(channel=st.sampled_from([*sorted(BY_CHANNEL), "fast", "receipts", "alerts"]))
    def submit(self, channel: str) -> None:
        key = f"{channel}-{len(self.keys)}"
        self.r.submit(channel, key)
        self.keys.append(key)

    @rule(fate=st.sampled_from(HISTORY_FATES))
    def script(self, fate: Scripted) -> None:
        self.r.provider.script(fate)

    @rule(sent=st.booleans(), count=st.integers(1, 3))
    def replies_lost(self, sent: bool, count: int) -> None:
        """The next sends' replies are lost: `sent` (the copy stored) or not."""
        fate = Scripted.dropped_response() if sent else Scripted.lost_request()
        self.r.provider.script(*[fate] * count)

    # What the history is for, in one step each (a rule per fate: the examples drawn are
    # derandomized, and a drawn boolean would mostly be the simplest one): a job submitted
    # and sent with its reply lost (after whatever was scripted before), then one tick, in
    # which its history is read.
    @precondition(lambda self: not self.hangs)
    @rule(channel=st.sampled_from(["fast", "alerts", "receipts"]))
    def a_sent_copys_reply_is_lost(self, channel: str) -> None:
        self.sent_with(channel, Scripted.dropped_response())

    @precondition(lambda self: not self.hangs)
    @rule(channel=st.sampled_from(["fast", "alerts", "receipts"]))
    def a_request_is_lost(self, channel: str) -> None:
        self.sent_with(channel, Scripted.lost_request())

    def sent_with(self, channel: str, fate: Scripted) -> None:
        self.submit(channel)
        self.r.provider.script(fate)
        self.tick()

    @rule(count=st.integers(1, 4), unavailable=st.booleans())
    def history_reads_fail(self, count: int, unavailable: bool) -> None:
        self.history.fail_history(count, unavailable=unavailable)

    @rule()
    def history_expires(self) -> None:
        self.history.expire_history()

    @rule()
    def a_claim_gets_no_history_id(self) -> None:
        self.history.fail_marks(1)

    @invariant()
    def histories_keep_the_invariants(self) -> None:
        if self.rig is None:
            return
        provider = self.history
        stored = {copy.provider_message_id: copy.message_id for copy in provider.copies}
        for key in self.keys:
            job, events = self.r.read(key)
            check_history(
                job,
                events,
                sends=provider.sends_by_message_id[job.message_id],
                answered=provider.answered_searches[job.message_id],
                history_answered=provider.answered_history[job.message_id],
                stored=stored,
                policies=BY_CHANNEL,
            )
            check_bounces(job, events, genuine=self.genuine.get(key, set()))


HistoryMachine.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestHistoryMachine = HistoryMachine.TestCase


def test_a_dropped_reply_settles_through_the_history_before_the_index_shows_it() -> None:
    rig = history_rig(200.0, 0.0, 0)  # the index would hide the copy
    try:
        rig.submit("alerts", "a-1")
        rig.provider.script(Scripted.dropped_response())
        rig.tick()
        assert rig.job("a-1").state is JobState.CONFIRMED, rig.events("a-1")
        assert rig.provider.searches == 0 and rig.copies("a-1") == 1
        confirmed = [e for e in rig.ledger.history("a-1") if type(e).__name__ == "Confirmed"]
        assert confirmed[-1].via == ConfirmedVia.HISTORY
    finally:
        rig.close()
