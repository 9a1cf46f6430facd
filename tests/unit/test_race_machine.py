"""Races between people, leases and the daemon, explored as a hypothesis state machine
(docs/architecture.md "Leases", "Drafts never outlive their job"; docs/review.md "Two
people, one job").

The actors: send workers whose calls outlast their lease (slow but answering) or time out
(a hang); this daemon's recovery and a second daemon's, on the same store and provider;
two people acting through two doors (check, resend, sent, abandon, cancel, triage), one
of them in the middle of the other's decision (while its search is out at the provider,
or on the version the person's page showed); a person cancelling during a draft step; a
person's check while a send is in flight; and the provider, sending through messages,
through Gmail-like drafts or Graph-like drafts.

Mostly the provider's index has no lag, so its searches tell the truth and every second
copy is a race the daemon lost; with a lag, a second copy may come of a believed miss,
and verification must then find it. After every step: at most one copy per job; a job's claim is
never recovered by this daemon while its call is alive; the store never records "not
sent" or "unsent" after the attempt whose call made the job's copy; a cancelled job has no
copy; a settled job whose drafts were tidied has no unsent draft; and everything the
engine state machine checks of a history. At the end every job settles and leaves no
draft behind.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import nullcontext

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)
from tests.unit.engine_rig import GRACE, TIMEOUT, EngineRig, policy
from tests.unit.test_engine_machine import check_history

from daemon.doubles.fake_drafts import FakeDraftsProvider, FakeGraphProvider
from daemon.doubles.fake_provider import FakeProvider, Scripted
from daemon.engine import Engine
from daemon.service_layer.services import ChannelPolicies, ServiceError, Services
from ledger.job import NOT_OURS, STOPPED, WITHHELD, SendJob
from ledger.vocabulary import FINAL_STATES, JobState, Resolution

POLICIES = (
    policy("receipts", on_unknown="retry"),
    policy("alerts", on_unknown="search-then-review"),
    policy("legal", on_unknown="review", pending_draft="review"),
)
FATES = (
    Scripted.confirmed(),
    Scripted.dropped_response(),
    Scripted.lost_request(),
    Scripted.server_error_after_send(),
    Scripted.rejected(transient=True),
    Scripted.unavailable(),
    Scripted.timed_out(),
    Scripted.timed_out(stored=True),
)
#: Why a claim made no provider call (`Dispatch.send`): its Rejected has no call behind it.
CALL_NOT_MADE = (WITHHELD, NOT_OURS, STOPPED)
ACTIONS = ("check", "resend", "sent", "abandon", "cancel", "triage")
SEARCHING = frozenset({"check", "resend", "triage"})  # what searches before it decides
STEPS = (1.0, 5.0, (TIMEOUT + GRACE) / 2, 61.0, 300.0)
#: Which actors an example lets loose: people deciding, calls and daemons, or all of them
#: (fewer rules at a time reach the deep interleavings sooner).
FOCUS = ("people", "calls", "all")
KINDS: dict[str, type[FakeProvider]] = {
    "messages": FakeProvider,
    "drafts": FakeDraftsProvider,
    "graph": FakeGraphProvider,
}


class RaceMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.rig: EngineRig | None = None
        self.other: Engine | None = None  # a second daemon, once it first ticks
        self.keys: list[str] = []
        self.hangs: list[threading.Event] = []

    @initialize(
        kind=st.sampled_from(sorted(KINDS)),
        focus=st.sampled_from(FOCUS),
        lag=st.sampled_from((0.0, 0.0, 30.0)),
        seed=st.integers(0, 3),
    )
    def start(self, kind: str, focus: str, lag: float, seed: int) -> None:
        self.rig = EngineRig(
            *POLICIES,
            seed=seed,
            concurrency=2,
            provider=lambda clock: KINDS[kind]("fake", clock=clock, index_lag=lag),
        )
        self.kind = kind
        self.focus = focus
        self.lag = lag

    @property
    def r(self) -> EngineRig:
        assert self.rig is not None
        return self.rig

    def door(self) -> Services:
        drafts = frozenset() if self.kind == "messages" else frozenset({"fake"})
        return Services(
            self.r.ledger,
            lambda: ChannelPolicies(self.r.policies),
            providers=lambda name: nullcontext(self.r.provider),
            draft_providers=drafts,
        )

    # -- the provider and the daemons ----------------------------------------------------

    @rule(channel=st.sampled_from([p.channel for p in POLICIES]))
    def submit(self, channel: str) -> None:
        key = f"{channel}-{len(self.keys)}"
        self.r.submit(channel, key)
        self.keys.append(key)

    @precondition(lambda self: self.focus != "calls")
    @rule(fate=st.sampled_from((Scripted.lost_request(), Scripted.dropped_response())))
    def a_job_waits_for_a_person(self, fate: Scripted) -> None:
        """A legal job whose one send went unanswered: in review, its index caught up
        (where people's decisions race), with or without a copy."""
        key = f"review-{len(self.keys)}"
        self.r.submit("legal", key)
        self.keys.append(key)
        self.r.provider.script(fate)
        self.tick(self.r.engine)
        self.r.clock.advance(61)

    @rule(fate=st.sampled_from(FATES))
    def script(self, fate: Scripted) -> None:
        self.r.provider.script(fate)

    @precondition(lambda self: self.focus != "people" and len(self.hangs) < self.r.concurrency)
    @rule(channel=st.sampled_from([p.channel for p in POLICIES]), ticks=st.integers(0, 3))
    def a_slow_call(self, channel: str, ticks: int) -> None:
        """A new job's call that answers only when released, slower than its lease: it
        goes out, then `ticks` daemon ticks pass half a lease apart while it runs."""
        release = threading.Event()
        self.hangs.append(release)
        self.r.provider.script(Scripted.slow(release))
        self.submit(channel)
        self.tick(self.r.engine, may_hang=True)
        for _ in range(ticks):
            self.r.clock.advance((TIMEOUT + GRACE) / 2)
            self.tick(self.r.engine)

    @precondition(lambda self: bool(self.hangs))
    @rule()
    def slow_calls_answer(self) -> None:
        self.release()

    @rule(seconds=st.sampled_from(STEPS))
    def advance(self, seconds: float) -> None:
        self.r.clock.advance(seconds)

    @rule()
    def daemon_tick(self) -> None:
        self.tick(self.r.engine)

    @precondition(lambda self: self.focus != "people")
    @rule()
    def other_daemon_tick(self) -> None:
        """A second daemon on the same store: it may take a claim only once its lease
        lapsed (the first daemon did not tick, so did not renew, for that long)."""
        if self.other is None:
            self.other = self.r.new_engine(name="other")
        self.tick(self.other)

    @precondition(lambda self: self.focus != "people" and self.r.provider.hanging > 0)
    @rule()
    def the_first_daemon_stalls(self) -> None:
        """The first daemon loses the store while its call is out: no renewal reaches it,
        the lease lapses, and the second daemon recovers the claim and sweeps it, all
        before the call lands."""
        self.r.clock.advance(TIMEOUT + GRACE + 1)
        self.other_daemon_tick()
        self.other_daemon_tick()

    def tick(self, engine: Engine, *, may_hang: bool = False) -> None:
        if not (may_hang or self.hangs):
            # One tick to completion, its steps in order: the same state on every run of
            # an example (with hand_out a check may or may not see what a send just wrote).
            engine.tick()
            return
        engine.hand_out()
        # Its own hung calls only: a worker of this engine between its claim and its call
        # must be waited for even while the other engine's call hangs.
        name = engine.daemon_name
        assert engine.settle(busy=lambda: self.r.provider.hanging_of(name), timeout=30), "stalled"

    def release(self) -> None:
        for event in self.hangs:
            event.set()
        self.hangs.clear()
        for engine in (self.r.engine, self.other):
            if engine is not None:
                engine.settle(timeout=30)

    # -- people ----------------------------------------------------------------------------

    def act(self, action: str, key: str, by: str, door: Services, seen: int | None) -> bool:
        """One person's action through one door; whether it changed the job."""
        before = self.r.read(key)[0].version
        try:
            if action == "check":
                door.check(key, by=by)
            elif action == "cancel":
                door.cancel(key, note="", by=by, expected_version=seen)
            elif action == "triage":
                door.triage(by=by)
            else:
                decision = Resolution(action)
                door.resolve(key, decision, note="", by=by, expected_version=seen)
        except ServiceError:
            pass  # a refusal (conflict, not in review, no search possible): nothing decided
        return self.r.read(key)[0].version != before

    @precondition(lambda self: bool(self.keys))
    @rule(data=st.data(), action=st.sampled_from(ACTIONS))
    def a_person_acts(self, data: st.DataObject, action: str) -> None:
        key = data.draw(st.sampled_from(self.keys))
        self.act(action, key, "alice", self.door(), None)

    @precondition(lambda self: self.focus != "calls" and bool(self.keys))
    @rule(
        data=st.data(),
        # Alice's action is most often the one whose search Bob can act inside: a resend.
        first=st.sampled_from(("resend", "resend", "resend", *ACTIONS)),
        second=st.sampled_from(ACTIONS),
        same=st.booleans(),
        daemon_between=st.sampled_from((None, *FATES)),
    )
    def two_doors(
        self,
        data: st.DataObject,
        first: str,
        second: str,
        same: bool,
        daemon_between: Scripted | None,
    ) -> None:
        """Bob acts (and the daemon ticks, its next call meeting `daemon_between`) in the
        middle of Alice's decision: while her search's answer is on its way, or after
        her page showed the job. Her decision must not hold for a job that moved."""
        # The jobs in review depend on what threads did, so the draw must not: an index
        # drawn alike every run, taken modulo the candidates (hypothesis replays draws).
        candidates = self.in_review() or self.keys
        key = candidates[data.draw(st.integers(0, 63)) % len(candidates)]
        second = first if same else second  # the same action twice: the race
        alice, bob = self.door(), self.door()
        seen = self.r.read(key)[0].version
        moved: list[bool] = []

        def bob_acts() -> None:
            moved.append(self.act(second, key, "bob", bob, None))
            if daemon_between is not None:
                self.r.provider.script(daemon_between)
                self.tick(self.r.engine)

        resolutions_before = self.resolutions(key)
        if first in SEARCHING:
            self.meanwhile(bob_acts)
            self.act(first, key, "alice", alice, None)
            self.r.provider.during_search = None
        else:
            bob_acts()
            self.act(first, key, "alice", alice, seen)
        decided = self.resolutions(key)[len(resolutions_before) :]
        if moved and moved[0] and first in ("sent", "abandon", "resend", "cancel"):
            # Bob's action moved the job after Alice looked: hers is refused.
            assert decided.count("alice") == 0, (key, first, second, decided)

    def in_review(self) -> list[str]:
        return [k for k in self.keys if self.r.read(k)[0].state is JobState.REVIEW]

    def meanwhile(self, action: Callable[[], None]) -> None:
        provider = self.r.provider

        def once() -> None:
            provider.during_search = None
            action()

        provider.during_search = once

    def resolutions(self, key: str) -> list[str]:
        return [
            e.by for e in self.r.read(key)[1] if isinstance(e, SendJob.Resolved | SendJob.Cancelled)
        ]

    @precondition(lambda self: bool(self.hangs) and bool(self.keys))
    @rule()
    def a_check_during_a_call(self) -> None:
        """A person checks a job whose send is in flight: reading changes nothing."""
        provider = self.r.provider
        live = [k for k in self.keys if provider.in_flight[self.r.read(k)[0].message_id] > 0]
        if not live:
            return
        drafts = self.unsent_drafts()
        self.act("check", live[0], "carol", self.door(), None)
        assert self.unsent_drafts() == drafts, "a check deleted a draft"

    @precondition(lambda self: self.kind == "drafts" and self.focus != "people" and bool(self.keys))
    @rule(data=st.data())
    def a_cancel_during_the_draft_step(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(self.keys))
        provider = self.r.provider
        assert isinstance(provider, FakeDraftsProvider)

        def cancel() -> None:
            provider.during_create = None
            self.act("cancel", key, "dave", self.door(), None)

        provider.during_create = cancel
        self.tick(self.r.engine)
        provider.during_create = None

    @precondition(lambda self: self.kind != "messages" and self.focus != "people")
    @rule()
    def a_create_answer_is_lost(self) -> None:
        """The next draft is made but its answer never comes: a draft nobody recorded."""
        provider = self.r.provider
        assert isinstance(provider, FakeDraftsProvider)
        provider.lose_create_answers(1)

    def unsent_drafts(self) -> int:
        provider = self.r.provider
        if not isinstance(provider, FakeDraftsProvider):
            return 0
        return sum(provider.unsent_drafts(self.r.read(k)[0].message_id) for k in self.keys)

    # -- what must always hold ------------------------------------------------------------

    @invariant()
    def nothing_was_sent_twice_or_recorded_unsent(self) -> None:
        if self.rig is None:
            return
        provider = self.r.provider
        for key in self.keys:
            job, events = self.r.read(key)
            copies = provider.copies_of(job.message_id)
            # A second copy only where the index lag hid the first from a search that
            # was believed (the provider's own doing; verification then finds it).
            assert copies <= 1 or self.lag > 0, (key, copies, [type(e).__name__ for e in events])
            if job.state is JobState.CANCELLED:
                assert copies == 0, key
            made_by = provider.stored_by_call.get(job.message_id, [])
            attempts = calls = 0
            for event in events:
                if isinstance(event, SendJob.Attempted):
                    attempts += 1
                    calls += 1
                if isinstance(event, SendJob.Rejected) and event.reason in CALL_NOT_MADE:
                    # A claim whose call was never made (withheld by its circuit, no longer
                    # its daemon's, a stop): the provider's next call is the next attempt's.
                    calls -= 1
                unsent = isinstance(event, SendJob.DraftPending) or (
                    isinstance(event, SendJob.Rejected) and event.attempt == attempts
                )
                # "Not sent" after attempt N: none of the calls made so far made the copy.
                assert not (unsent and any(call <= calls for call in made_by)), (
                    key,
                    type(event).__name__,
                    attempts,
                    calls,
                    made_by,
                )
            check_history(
                job,
                events,
                sends=provider.sends_by_message_id[job.message_id],
                answered=provider.answered_searches[job.message_id],
            )

    @invariant()
    def no_live_claim_is_recovered_by_its_own_daemon(self) -> None:
        if self.rig is None or self.other is not None:
            return  # with a second daemon, a lapsed lease is taken legitimately
        for key in self.keys:
            job = self.r.read(key)[0]
            if self.r.provider.in_flight[job.message_id] > 0:
                assert job.state is JobState.ATTEMPTED, (key, job.state)

    @invariant()
    def a_tidied_job_leaves_no_draft(self) -> None:
        if self.rig is None or not isinstance(self.r.provider, FakeDraftsProvider):
            return
        for key in self.keys:
            job = self.r.read(key)[0]
            done = job.state in FINAL_STATES and job.tidy_at is None and job.due_at is None
            if done and self.kind != "messages" and self.tidied(key):
                assert self.r.provider.unsent_drafts(job.message_id) == 0, key

    def tidied(self, key: str) -> bool:
        return any(
            isinstance(e, SendJob.DraftsDeleted) and e.why == "tidy" for e in self.r.read(key)[1]
        )

    def teardown(self) -> None:
        if self.rig is None:
            return
        try:
            self.release()
            self.settle_everything()
        finally:
            self.release()
            if self.other is not None:
                self.other.close()
            self.r.close()

    def settle_everything(self) -> None:
        rig = self.r
        rig.provider.script()
        provider = rig.provider
        if isinstance(provider, FakeDraftsProvider):
            provider.during_create = None
        provider.during_search = None
        for _ in range(200):
            rig.clock.advance(700)
            rig.engine.tick()
            if all(self.settled(k) for k in self.keys):
                break
        # A job left in review by a human's choice: a last person resolves it.
        door = self.door()
        for key in self.keys:
            if rig.read(key)[0].state is JobState.REVIEW:
                self.act("abandon", key, "closer", door, None)
        # Their drafts are tidied a few per tick (the check workers' batch): tick until
        # nothing is due, not a fixed number of times.
        for _ in range(200):
            rig.clock.advance(700)
            rig.engine.tick()
            if all(rig.read(k)[0].due_at is None for k in self.keys):
                break
        self.nothing_was_sent_twice_or_recorded_unsent()
        for key in self.keys:
            job = rig.read(key)[0]
            assert job.state in FINAL_STATES and job.due_at is None, (key, job.state, job.due_at)
            if provider.copies_of(job.message_id) >= 2:
                assert job.duplicate, (key, rig.events(key))  # found and shown to a human
            if isinstance(provider, FakeDraftsProvider):
                assert provider.unsent_drafts(job.message_id) == 0, (key, rig.events(key))

    def settled(self, key: str) -> bool:
        job = self.r.read(key)[0]
        return job.state in (*FINAL_STATES, JobState.REVIEW) and job.due_at is None


class PeopleRace(RaceMachine):
    """Only people and the daemon: two doors deciding on one job, the daemon between."""

    @initialize(kind=st.sampled_from(sorted(KINDS)), seed=st.integers(0, 3))
    def start(self, kind: str, seed: int) -> None:
        super().start(kind, "people", 0.0, seed)


class CallsRace(RaceMachine):
    """Only calls and daemons: slow calls, a daemon that stalls, another that recovers,
    checks and cancels while calls and draft steps run."""

    @initialize(kind=st.sampled_from(sorted(KINDS)), seed=st.integers(0, 3))
    def start(self, kind: str, seed: int) -> None:
        super().start(kind, "calls", 0.0, seed)


def _settings(examples: int) -> settings:
    return settings(
        max_examples=examples,
        stateful_step_count=25,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )


RaceMachine.TestCase.settings = _settings(100)
PeopleRace.TestCase.settings = _settings(120)
CallsRace.TestCase.settings = _settings(120)
TestRaceMachine = RaceMachine.TestCase
TestPeopleRace = PeopleRace.TestCase
TestCallsRace = CallsRace.TestCase


def test_the_machine_knows_every_provider_kind() -> None:
    assert set(KINDS) == {"messages", "drafts", "graph"}
    assert all(issubclass(kind, FakeProvider) for kind in KINDS.values())
