"""Properties of SendJob under any sequence of commands and decisions, valid or not.

A hypothesis state machine drives one job with an injected clock that only moves forward.
Guided steps take the command the state allows with a decision a policy could make (so
deep histories with searches, resends, duplicates, counts and resolutions get explored),
usually once the job is due; random steps try any command with any decision of the kinds
it takes and any arguments. Decisions carry one of several policy references, as a policy
reloaded between steps would.

A refusal (TransitionError, or ValueError for an unknown resolution) must leave the
aggregate exactly as it was. An accepted command must have been allowed from the state it
found, and must record in one step exactly the events its decision implies, each carrying
the decision's policy. After every step the whole history must reload to the live job and
satisfy the design's invariants: one claim per outcome, no search or count before it is
due, a resend after an Unknown only after enough empty searches or a human's decision,
nothing resent after a duplicate, confirmation only from one copy or a human's 'sent',
never a job left half-way through a transition, settled jobs stay settled.
"""

from __future__ import annotations

import functools
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from tests.unit.jobs import (
    CHANNEL,
    POLICY,
    QUERY,
    Reloader,
    fields_of,
    replay,
    requested_job,
    twins,
    unchanged,
)

from daemon.doubles.fake_time import FakeClock
from ledger.decision_types import (
    Confirm,
    Duplicate,
    ResendAt,
    RetryAt,
    Review,
    SearchAgainAt,
    SearchAt,
    StopVerifying,
)
from ledger.job import JobState, SendJob, TransitionError
from ledger.vocabulary import FINAL_STATES, EscalationReason, PolicyRef, Resolution

REFS = [POLICY, PolicyRef(CHANNEL, "sha256:reloaded"), PolicyRef.missing(CHANNEL)]
refs = st.sampled_from(REFS)
reasons = st.sampled_from(list(EscalationReason))
# Seconds from "now". Negative values make invalid times.
any_offset = st.integers(min_value=-30, max_value=900)
valid_offset = st.sampled_from([0, 60, 300, 600])
copies_of = st.integers(min_value=0, max_value=3).map(lambda n: tuple(f"m{i}" for i in range(n)))


# -- steps: a command with its arguments, kept for the oracle -----------------------------


@dataclass(frozen=True)
class Step:
    command: str
    at: datetime
    run: Callable[[SendJob], object]
    decision: Any = None
    copies: tuple[str, ...] = ()
    resolution: Any = None


def claim_step(at: datetime, deadline: int) -> Step:
    def run(job: SendJob) -> None:
        job.claim(provider="support", deadline=at + timedelta(seconds=deadline), at=at)

    return Step("claim", at, run)


def response_step(at: datetime, msg_id: str, decision: Confirm) -> Step:
    def run(job: SendJob) -> None:
        job.record_response(provider_message_id=msg_id, decision=decision, at=at)

    return Step("response", at, run, decision, (msg_id,))


def unknown_step(at: datetime, decision: SearchAt | Review) -> Step:
    def run(job: SendJob) -> None:
        job.record_unknown(reason="timeout", decision=decision, at=at)

    return Step("unknown", at, run, decision)


def rejection_step(at: datetime, transient: bool, decision: RetryAt | Review) -> Step:
    def run(job: SendJob) -> None:
        job.record_rejection(
            transient=transient,
            reason="429" if transient else "400",
            status=429 if transient else 400,
            decision=decision,
            at=at,
        )

    return Step("rejection", at, run, decision)


def search_step(at: datetime, copies: tuple[str, ...], decision: Any) -> Step:
    def run(job: SendJob) -> None:
        job.record_search(query=QUERY, copies=list(copies), decision=decision, at=at)

    return Step("search", at, run, decision, copies)


def stop_step(at: datetime, decision: StopVerifying) -> Step:
    def run(job: SendJob) -> None:
        job.stop_verifying(decision, at=at)

    return Step("stop", at, run, decision)


def escalate_step(at: datetime, decision: Review) -> Step:
    def run(job: SendJob) -> None:
        job.escalate(decision, detail="d", at=at)

    return Step("escalate", at, run, decision)


def resolve_step(at: datetime, resolution: Any) -> Step:
    def run(job: SendJob) -> None:
        job.resolve(resolution, note="n", by="alice", at=at)

    return Step("resolve", at, run, resolution=resolution)


# -- what an accepted step must have recorded ---------------------------------------------


def name(event: Any) -> str:
    return type(event).__name__


def ref_of(event: Any) -> PolicyRef | None:
    policy = getattr(event, "policy", None)
    return None if policy is None else PolicyRef(policy, event.fingerprint)


def implied(step: Step, before: dict[str, Any]) -> list[tuple[str, PolicyRef | None]]:
    """The events (and the policy each carries) the step's decision implies."""
    d = step.decision
    ref = None if d is None else d.policy
    if step.command == "claim":
        return [("Attempted", None)]
    if step.command == "response":
        return [("Confirmed", ref)]
    if step.command in ("unknown", "rejection"):
        first = "Unknown" if step.command == "unknown" else "Rejected"
        return [(first, ref), ("Escalated", ref)] if isinstance(d, Review) else [(first, ref)]
    if step.command == "search" and before["state"] is JobState.CONFIRMED:
        if isinstance(d, Duplicate):
            return [("Duplicate", ref), ("Escalated", ref)]
        return [("Verified", ref)]
    if step.command == "search":
        kinds = {
            Confirm: ["Confirmed"],
            Duplicate: ["Duplicate", "Escalated"],
            SearchAgainAt: ["SearchedMiss"],
            ResendAt: ["SearchedMiss", "Requeued"],
            Review: ["SearchedMiss", "Escalated"],
        }[type(d)]
        return [(kind, ref) for kind in kinds]
    if step.command == "stop":
        return [("Verified", ref)]
    if step.command == "escalate":
        return [("Escalated", ref)]
    assert step.command == "resolve"
    if step.resolution == Resolution.SENT:
        return [("Resolved", None), ("Confirmed", PolicyRef.operator("alice"))]
    return [("Resolved", None)]


ALLOWED_FROM = {
    "claim": {JobState.REQUESTED},
    "response": {JobState.ATTEMPTED},
    "unknown": {JobState.ATTEMPTED},
    "rejection": {JobState.ATTEMPTED},
    "search": {JobState.UNKNOWN, JobState.CONFIRMED},
    "stop": {JobState.CONFIRMED},
    "escalate": {JobState.REQUESTED, JobState.UNKNOWN},
    "resolve": {JobState.REVIEW},
}


def check_step(step: Step, before: dict[str, Any], new: list[Any]) -> None:
    """An accepted step: allowed from the state it found, and it recorded exactly what its
    decision implies, at the step's time."""
    state, due = before["state"], before["due_at"]
    assert state in ALLOWED_FROM[step.command], f"{step.command} accepted while {state}"
    if state is JobState.CONFIRMED:
        assert before["verifying"], f"{step.command} on a confirmed job with no count pending"
    if step.command in ("claim", "search", "stop"):
        assert due is not None and step.at >= due, f"{step.command} before it was due"
    got = [(name(e), ref_of(e)) for e in new]
    assert got == implied(step, before), f"{step.command} {step.decision} recorded {got}"
    assert all(e.timestamp == step.at for e in new), "a step's events at another time"
    copies, d = list(step.copies), step.decision
    for event in new:
        kind = name(event)
        if kind == "Attempted":
            assert event.attempt == before["attempts"] + 1
        elif kind == "Confirmed" and event.via == "operator":
            assert event.provider_message_ids == before["provider_message_ids"]
        elif kind == "Confirmed":
            assert event.provider_message_ids == copies and len(copies) == 1
            assert event.verify_at == d.verify_at
        elif kind == "Duplicate":
            assert event.provider_message_ids == copies and event.hits == len(copies) >= 2
        elif kind == "Verified":
            assert event.hits == (1 if isinstance(d, Confirm) else 0) == len(copies)
        elif kind == "SearchedMiss":
            assert copies == [] and event.search == before["searches"] + 1
        elif kind == "Requeued":
            assert not before["duplicate"], "resent after a duplicate"
            assert event.misses_required == d.misses_required
            assert 1 <= event.misses_required <= before["misses"] + 1
            assert event.due_at == max(d.at, step.at)
        elif kind == "Escalated":
            expected = EscalationReason.DUPLICATE if isinstance(d, Duplicate) else d.reason
            assert event.reason == expected
        elif kind == "Resolved":
            assert event.decision == step.resolution
            assert not (event.decision == Resolution.RESEND and before["duplicate"])


# -- the machine ----------------------------------------------------------------------------


class SendJobMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        # The job keeps its whole history as pending events: nothing collects them.
        self.job = requested_job(self.clock)
        self.final: JobState | None = None
        self.final_version = 0
        self.most_attempts = 0
        self.reloader = Reloader()

    def at(self, offset: int) -> datetime:
        return self.clock.now + timedelta(seconds=offset)

    def run(
        self, step: Step, job: SendJob | None = None, before: dict[str, Any] | None = None
    ) -> bool:
        """`before`: `fields_of(job)`, when the caller knows it already."""
        job = job or self.job
        before, start = before or fields_of(job), len(job.pending_events)
        try:
            step.run(job)
        except (TransitionError, ValueError):
            assert unchanged(job, before), f"a refused {step.command} changed the job"
            assert len(job.pending_events) == start, f"a refused {step.command} left events"
            return False
        check_step(step, before, list(job.pending_events[start:]))
        return True

    # -- time -------------------------------------------------------------------------

    @rule(seconds=st.integers(min_value=0, max_value=1200))
    def advance(self, seconds: int) -> None:
        self.clock.advance(seconds)

    @precondition(lambda self: self.job.due_at is not None)
    @rule()
    def advance_to_due(self) -> None:
        due = self.job.due_at
        assert due is not None
        self.clock.now = max(self.clock.now, due)

    # -- guided steps: what the daemon (or a human) would do in this state -------------

    def valid_moves(self, draw: Callable[[Any], Any]) -> list[Callable[[], Step]]:
        job, now = self.job, self.clock.now

        def claim() -> Step:
            return claim_step(now, 30)

        def escalate_requested() -> Step:
            reason = draw(st.sampled_from([EscalationReason.MAX_ATTEMPTS, "no-policy"]))
            return escalate_step(now, Review(draw(refs), EscalationReason(reason)))

        def confirm() -> Confirm:
            # As the policy does: a resent job's copies are counted again later.
            verify = self.at(draw(valid_offset)) if job.resent else None
            return Confirm(draw(refs), verify)

        def response() -> Step:
            return response_step(now, "r1", confirm())

        def unknown() -> Step:
            if draw(st.integers(0, 2)):
                return unknown_step(now, SearchAt(draw(refs), self.at(draw(valid_offset))))
            return unknown_step(now, Review(draw(refs), EscalationReason.UNKNOWN_OUTCOME))

        def rejection() -> Step:
            if not draw(st.booleans()):
                return rejection_step(now, False, Review(draw(refs), EscalationReason.REJECTED))
            if draw(st.booleans()):
                return rejection_step(now, True, RetryAt(draw(refs), self.at(draw(valid_offset))))
            return rejection_step(now, True, Review(draw(refs), EscalationReason.MAX_ATTEMPTS))

        def search() -> Step:
            copies = draw(st.sampled_from([(), (), (), ("m1",), ("m1", "m2"), ("m1", "m2", "m3")]))
            if len(copies) == 1:
                return search_step(now, copies, confirm())
            if copies:
                return search_step(now, copies, Duplicate(draw(refs)))
            ref, kind = (
                draw(refs),
                draw(st.sampled_from(["again"] * 3 + ["resend"] * 2 + ["review"])),
            )
            if kind == "again":
                return search_step(now, (), SearchAgainAt(ref, self.at(draw(valid_offset))))
            if kind == "resend":
                required = draw(st.integers(1, job.misses + 1))
                return search_step(now, (), ResendAt(ref, self.at(draw(valid_offset)), required))
            return search_step(now, (), Review(ref, EscalationReason.UNKNOWN_OUTCOME))

        def unreliable_handle() -> Step:
            return escalate_step(now, Review(draw(refs), EscalationReason.HANDLE_UNRELIABLE))

        def count() -> Step:
            copies, ref = draw(copies_of), draw(refs)
            if len(copies) == 1:
                return search_step(now, copies, Confirm(ref))
            if copies:
                return search_step(now, copies, Duplicate(ref))
            again = SearchAgainAt(ref, self.at(draw(valid_offset)))
            return search_step(now, (), draw(st.sampled_from([again, StopVerifying(ref)])))

        def stop() -> Step:
            return stop_step(now, StopVerifying(PolicyRef.missing(CHANNEL)))

        def resolve() -> Step:
            allowed = [Resolution.SENT, Resolution.ABANDON]
            if not job.duplicate:
                allowed += [Resolution.RESEND] * 3
            return resolve_step(now, draw(st.sampled_from(allowed)))

        # Weighted towards the steps that keep the job open, so histories get deep.
        if job.state is JobState.REQUESTED:
            return [claim] * 5 + [escalate_requested]
        if job.state is JobState.ATTEMPTED:
            return [response] + [unknown] * 3 + [rejection] * 2
        if job.state is JobState.UNKNOWN:
            return [search] * 6 + [unreliable_handle]
        if job.state is JobState.REVIEW:
            return [resolve]
        if job.state is JobState.CONFIRMED and job.verifying:
            return [count, count, count, stop]
        return []

    def guided(self, data: st.DataObject) -> None:
        # Usually wait for the job to be due, as the daemon's tick does; sometimes act
        # early, which the job must refuse for a claim, a search or a count.
        due = self.job.due_at
        if due is not None and self.clock.now < due and data.draw(st.booleans()):
            self.clock.now = due
        early = due is not None and self.clock.now < due
        moves = self.valid_moves(data.draw)
        if moves:
            step = data.draw(st.sampled_from(moves))()
            accepted = self.run(step)
            needs_due = step.command in ("claim", "search", "stop")
            assert accepted or (early and needs_due), f"a valid {step.command} was refused"

    @rule(data=st.data())
    def guided_step(self, data: st.DataObject) -> None:
        self.guided(data)

    @rule(data=st.data())
    def another_guided_step(self, data: st.DataObject) -> None:
        self.guided(data)

    @rule(data=st.data(), steps=st.integers(min_value=2, max_value=12))
    def guided_run(self, data: st.DataObject, steps: int) -> None:
        """Several guided steps, each once the job is due, with every invariant checked
        after each: the deep histories (misses, resends, counts, resolutions)."""
        for _ in range(steps):
            self.clock.now = max(self.clock.now, self.job.due_at or self.clock.now)
            self.guided(data)
            self.check_everything()
            if data.draw(st.booleans()):
                self.every_command_here()

    # -- random steps: any command, any decision of the kinds it takes, any time -------

    def any_step(self, data: st.DataObject) -> Step:
        draw, now = data.draw, self.clock.now

        def later() -> datetime:
            return self.at(draw(any_offset))

        ref = draw(refs)
        review = Review(ref, draw(reasons))
        which = draw(st.sampled_from(sorted(ALLOWED_FROM)))
        if which == "claim":
            return claim_step(now, draw(st.integers(-5, 120)))
        if which == "response":
            verify = draw(st.none() | any_offset)
            msg_id = draw(st.sampled_from(["r1", ""]))
            return response_step(now, msg_id, Confirm(ref, None if verify is None else later()))
        if which == "unknown":
            after_unknown: list[SearchAt | Review] = [SearchAt(ref, later()), review]
            return unknown_step(now, draw(st.sampled_from(after_unknown)))
        if which == "rejection":
            after_rejection: list[RetryAt | Review] = [RetryAt(ref, later()), review]
            return rejection_step(now, draw(st.booleans()), draw(st.sampled_from(after_rejection)))
        if which == "search":
            verify = draw(st.none() | any_offset)
            decision = draw(
                st.sampled_from(
                    [
                        Confirm(ref, None if verify is None else later()),
                        Duplicate(ref),
                        SearchAgainAt(ref, later()),
                        ResendAt(ref, later(), draw(st.integers(-1, 3))),
                        review,
                        StopVerifying(ref),
                    ]
                )
            )
            return search_step(now, draw(copies_of), decision)
        if which == "stop":
            return stop_step(now, StopVerifying(ref))
        if which == "escalate":
            return escalate_step(now, review)
        return resolve_step(now, draw(st.sampled_from([*Resolution, "maybe"])))

    @rule(data=st.data())
    def random_step(self, data: st.DataObject) -> None:
        self.run(self.any_step(data))

    # -- every plausible command from the state reached --------------------------------

    @staticmethod
    @functools.lru_cache(maxsize=256)
    def probes(now: datetime) -> tuple[Step, ...]:
        """The same at one instant for every job (steps and decisions are frozen): built
        once per instant, not per call."""
        later = now + timedelta(seconds=300)
        review = Review(POLICY, EscalationReason.UNKNOWN_OUTCOME)
        search_decisions = [
            Confirm(POLICY),
            Confirm(POLICY, later),
            Duplicate(POLICY),
            SearchAgainAt(POLICY, later),
            *(ResendAt(POLICY, now, n) for n in (0, 1, 2, 3)),
            review,
            StopVerifying(POLICY),
        ]
        return (
            claim_step(now, 30),
            response_step(now, "r1", Confirm(POLICY)),
            response_step(now, "r1", Confirm(POLICY, later)),
            unknown_step(now, SearchAt(POLICY, later)),
            unknown_step(now, review),
            rejection_step(now, True, RetryAt(POLICY, later)),
            rejection_step(now, True, review),
            rejection_step(now, False, review),
            rejection_step(now, False, RetryAt(POLICY, later)),
            *(
                search_step(now, copies, decision)
                for decision in search_decisions
                for copies in [(), ("m1",), ("m1", "m2")]
            ),
            stop_step(now, StopVerifying(POLICY)),
            *(escalate_step(now, Review(POLICY, reason)) for reason in EscalationReason),
            *(resolve_step(now, resolution) for resolution in Resolution),
        )

    @rule()
    def every_command_here(self) -> None:
        """Each plausible command, on a twin of the job, now and once the job is due:
        refused (leaving the twin as it was) or recording what its decision implies and
        a valid history."""
        history = list(self.job.pending_events)
        times = {self.clock.now, max(self.clock.now, self.job.due_at or self.clock.now)}
        # Each probe on its own copy of the replayed job, as `replay(history)` would give.
        twin = twins(replay(history))
        before = fields_of(twin())
        for at in sorted(times):
            for step in self.probes(at):
                job = twin()
                if self.run(step, job, before):
                    check_history([*history, *job.pending_events])

    # -- invariants -------------------------------------------------------------------

    def check_everything(self) -> None:
        self.replay_equals_live()
        self.counters_never_go_back()
        self.never_half_way()
        self.settled_jobs_stay_settled()
        self.history_is_valid()

    @invariant()
    def replay_equals_live(self) -> None:
        reloaded = self.reloader.reload(self.job.pending_events)
        assert fields_of(reloaded) == fields_of(self.job)
        assert self.job.version == len(self.job.pending_events)

    @invariant()
    def counters_never_go_back(self) -> None:
        job = self.job
        assert job.attempts >= self.most_attempts, "attempts decreased"
        self.most_attempts = job.attempts
        assert 0 <= job.round_attempts <= job.attempts
        assert 0 <= job.misses <= job.searches

    @invariant()
    def never_half_way(self) -> None:
        """Each state has what its next step needs: nothing waits for an event that only
        a second command would record."""
        job = self.job
        assert isinstance(job.state, JobState)
        if job.state in (JobState.REQUESTED, JobState.ATTEMPTED, JobState.UNKNOWN):
            assert job.due_at is not None, f"{job.state} with nothing due"
        if job.state is JobState.CONFIRMED:
            assert (job.due_at is not None) == job.verifying
        else:
            assert not job.verifying
        if job.state in (JobState.REVIEW, JobState.ABANDONED):
            assert job.due_at is None
        if job.duplicate:
            assert job.state in (JobState.REVIEW, JobState.CONFIRMED, JobState.ABANDONED)
            assert len(job.provider_message_ids) >= 2

    @invariant()
    def settled_jobs_stay_settled(self) -> None:
        job = self.job
        if self.final is None:
            # A confirmed job whose copies are still to be counted may yet turn out a
            # duplicate; it is final once that count is done (or was never due).
            if job.state in FINAL_STATES and not job.verifying:
                self.final, self.final_version = job.state, job.version
            return
        assert job.state is self.final
        assert job.version == self.final_version, "an event after the job was final"

    @invariant()
    def history_is_valid(self) -> None:
        check_history(self.job.pending_events)


# -- properties of a history (a list of events, oldest first) ---------------------------


def check_history(events: list[Any]) -> None:
    nothing_after_final(events)
    one_claim_per_outcome(events)
    attempts_are_numbered_and_due(events)
    resend_after_unknown_only_after_misses_or_a_human(events)
    searches_never_before_due(events)
    nothing_resent_after_a_duplicate(events)
    decisions_are_recorded_whole(events)
    only_a_count_reopens_a_confirmed_job(events)
    confirmed_only_from_one_copy_or_a_human(events)
    decisions_carry_the_policy(events)


def nothing_after_final(events: list[Any]) -> None:
    for index, event in enumerate(events):
        final = (
            (name(event) == "Confirmed" and event.verify_at is None)
            or (name(event) == "Verified" and event.next_verify_at is None)
            or (name(event) == "Resolved" and event.decision == "abandon")
        )
        if final:
            assert index == len(events) - 1, f"{name(events[index + 1])} after a final event"


def one_claim_per_outcome(events: list[Any]) -> None:
    # An Attempted is followed by its outcome, and only one claim is open at a time.
    for index, event in enumerate(events[:-1]):
        if name(event) == "Attempted":
            after = events[index + 1]
            assert name(after) in ("Confirmed", "Unknown", "Rejected"), f"{name(after)} next"
            if name(after) == "Confirmed":
                assert after.via == "response"


def attempts_are_numbered_and_due(events: list[Any]) -> None:
    due: datetime | None = events[0].timestamp
    number = 0
    for event in events:
        kind = name(event)
        if kind == "Attempted":
            number += 1
            assert event.attempt == number
            assert due is not None and event.timestamp >= due, "attempted before due"
            assert event.deadline > event.timestamp
            due = None
        elif kind in ("Unknown", "Rejected"):
            assert event.attempt == number, f"{kind} for another attempt"
            if kind == "Rejected" and event.retry_at is not None:
                assert event.transient, "a permanent rejection retried"
                due = event.retry_at
        elif kind == "Requeued":
            due = event.due_at
        elif kind == "Resolved" and event.decision == "resend":
            due = event.timestamp


def resend_after_unknown_only_after_misses_or_a_human(events: list[Any]) -> None:
    # Invariant 2: after an Unknown, a new Attempted needs enough SearchedMiss events then
    # Requeued, or a human's resend.
    misses = 0
    after_unknown = False
    allowed = True
    for event in events:
        kind = name(event)
        if kind == "Unknown":
            after_unknown, allowed, misses = True, False, 0
        elif kind == "SearchedMiss":
            misses += 1
        elif kind == "Requeued":
            assert after_unknown, "requeued without an Unknown"
            assert 1 <= event.misses_required <= misses, "requeued before enough misses"
            allowed = True
        elif kind == "Resolved" and event.decision == "resend":
            allowed = True
        elif kind == "Attempted":
            assert allowed or not after_unknown, "resent after Unknown without misses"
            after_unknown, allowed = False, True


def searches_never_before_due(events: list[Any]) -> None:
    # A search inside the index lag (or a count before verify_after) proves nothing.
    due: datetime | None = None
    for event in events:
        kind = name(event)
        searched = kind in ("SearchedMiss", "Duplicate") or (
            kind == "Confirmed" and event.via == "search"
        )
        if searched or kind == "Verified":
            assert due is not None, f"{kind} without a scheduled search"
            assert event.timestamp >= due, f"{kind} before its search was due"
        if kind == "Unknown":
            due = event.search_due_at
        elif kind == "SearchedMiss":
            assert event.query == QUERY
            due = event.next_search_at
        elif kind == "Confirmed":
            due = event.verify_at
        elif kind == "Verified":
            due = event.next_verify_at


def nothing_resent_after_a_duplicate(events: list[Any]) -> None:
    seen_duplicate = False
    for event in events:
        kind = name(event)
        if kind == "Duplicate":
            seen_duplicate = True
            assert event.hits == len(event.provider_message_ids) >= 2
        elif seen_duplicate:
            # A duplicate job can only be resolved as sent or abandoned.
            assert kind in ("Escalated", "Resolved", "Confirmed"), f"{kind} after a Duplicate"
            assert not (kind == "Resolved" and event.decision == "resend"), "resend after dup"


def decisions_are_recorded_whole(events: list[Any]) -> None:
    """What one decision implies is recorded together: nothing waits for a second step."""
    for index, event in enumerate(events):
        kind = name(event)
        after: Any = events[index + 1] if index + 1 < len(events) else None
        then = None if after is None else name(after)
        if kind == "Duplicate":
            assert then == "Escalated" and after.reason == "duplicate", "Duplicate unescalated"
        elif (kind == "Unknown" and event.search_due_at is None) or (
            kind == "Rejected" and event.retry_at is None
        ):
            assert then == "Escalated", f"{kind} without a follow-up, then {then}"
        elif kind == "SearchedMiss" and event.next_search_at is None:
            assert then in ("Requeued", "Escalated"), f"believed misses, then {then}"
        elif kind == "Resolved" and event.decision == "sent":
            assert then == "Confirmed" and after.via == "operator"
        if kind == "Requeued":
            previous = events[index - 1]
            assert name(previous) == "SearchedMiss" and previous.next_search_at is None


def only_a_count_reopens_a_confirmed_job(events: list[Any]) -> None:
    # After a Confirmed: only Verified (hits 0 or 1) or a Duplicate, and only when the
    # confirmation scheduled a count (after a resend).
    due = None
    for event in events:
        kind = name(event)
        if kind == "Confirmed":
            due = event.verify_at
            if due is not None:
                assert event.via in ("response", "search")
            continue
        if due is None:
            continue
        assert kind in ("Verified", "Duplicate"), f"{kind} after a confirmation"
        if kind == "Duplicate":
            due = None
        else:
            assert event.hits in (0, 1)
            assert event.hits == 0 or event.next_verify_at is None, "one copy ends the count"
            due = event.next_verify_at


def confirmed_only_from_one_copy_or_a_human(events: list[Any]) -> None:
    confirmations = [i for i, e in enumerate(events) if name(e) == "Confirmed"]
    # A second confirmation only by a human, after a count found a duplicate.
    assert len(confirmations) <= 2
    if len(confirmations) == 2:
        assert events[confirmations[1]].via == "operator"
        assert "Duplicate" in [name(e) for e in events[confirmations[0] : confirmations[1]]]
    for index in confirmations:
        event, previous = events[index], events[index - 1]
        assert event.via in ("response", "search", "operator")
        if event.via == "operator":
            assert name(previous) == "Resolved" and previous.decision == "sent"
            continue
        assert len(event.provider_message_ids) == 1, "confirmed without exactly one copy"
        if event.via == "response":
            assert name(previous) == "Attempted"
        else:
            last = [name(e) for e in events[:index] if name(e) in ("Attempted", "Unknown")]
            assert last[-1] == "Unknown"


def decisions_carry_the_policy(events: list[Any]) -> None:
    for event in events:
        ref = ref_of(event)
        if name(event) in ("Attempted", "Resolved"):
            assert ref is None
            continue
        assert ref is not None and ref.name, f"{name(event)} without a policy"
        # An empty fingerprint only where no policy was loaded (the channel stands in).
        assert ref.fingerprint or ref == PolicyRef.missing(CHANNEL)


# -- a review for a bounce needs the bounce, one for a duplicate the copies -------------


def job_in(state: JobState, clock: FakeClock) -> SendJob:
    """A job in `state` (requested, attempted or unknown), reached as the daemon would."""
    job = requested_job(clock)
    if state is not JobState.REQUESTED:
        claim_step(clock.now, 30).run(job)
    if state is JobState.UNKNOWN:
        unknown_step(clock.now, SearchAt(POLICY, clock.now)).run(job)
    assert job.state is state
    return job


@pytest.mark.parametrize(
    ("reason", "refusal"),
    [(EscalationReason.BOUNCED, "delivery report"), (EscalationReason.DUPLICATE, "two or more")],
)
@pytest.mark.parametrize(
    ("state", "step"),
    [
        (JobState.REQUESTED, lambda at, review: escalate_step(at, review)),
        (JobState.ATTEMPTED, lambda at, review: unknown_step(at, review)),
        (JobState.ATTEMPTED, lambda at, review: rejection_step(at, True, review)),
        (JobState.ATTEMPTED, lambda at, review: rejection_step(at, False, review)),
        (JobState.UNKNOWN, lambda at, review: search_step(at, (), review)),
        (JobState.UNKNOWN, lambda at, review: escalate_step(at, review)),
    ],
    ids=["escalate-requested", "unknown", "transient", "permanent", "search", "escalate-unknown"],
)
def test_only_its_own_event_sends_a_job_to_review_as_bounced_or_duplicate(
    state: JobState,
    step: Callable[[datetime, Review], Step],
    reason: EscalationReason,
    refusal: str,
) -> None:
    """A job in review as bounced was sent and a report says it bounced: it may not be
    resent (`SendJob.resolve`), triage leaves it, the review page counts its confirmed
    copy. One in review as a duplicate holds the copies a search found, which the review
    page and guidance count. The machine found a requested job escalated with a Review
    for a bounce (a random step), whose resend a human could then never choose: either
    review is refused from every command but its own event's (a delivery report, a search
    finding two copies), before anything is recorded."""
    clock = FakeClock()
    job = job_in(state, clock)
    before, start = fields_of(job), len(job.pending_events)
    with pytest.raises(TransitionError, match=refusal):
        step(clock.now, Review(POLICY, reason)).run(job)
    assert unchanged(job, before)
    assert len(job.pending_events) == start


# -- a timeout inside a property test ---------------------------------------------------


@dataclass(frozen=True)
class TimeoutSettings:
    """What pytest-timeout hands its set_timer hook (its Settings), for a short timeout."""

    timeout: float = 0.3
    method: str = "signal"
    func_only: bool = False
    disable_debugger_detection: bool = True


def test_a_timeout_inside_a_property_test_is_reported_as_the_timeout(
    request: pytest.FixtureRequest,
) -> None:
    """pytest-timeout (300 s, pyproject.toml) raised pytest's Failed from SIGALRM in
    whatever ran. Inside a Hypothesis test that is a failure of the example it landed in:
    shrunk, replayed (it passes) and reported as a FlakyFailure listed before the failure
    whose shrinking ran that long (TestSendJobMachine in CI: "2 distinct failures", the
    real one cut from the log). The timeout must end the test as itself, at once."""

    @given(st.integers())
    @settings(max_examples=10**6, database=None, derandomize=True)
    def slow(n: int) -> None:
        time.sleep(0.002)

    if not request.config.pluginmanager.has_plugin("timeout"):
        pytest.skip("pytest-timeout is not loaded")
    # One ITIMER_REAL per process: this test's own limit is put back afterwards.
    outer_handler = signal.getsignal(signal.SIGALRM)
    outer_left, _ = signal.getitimer(signal.ITIMER_REAL)
    item = request.node
    started = time.monotonic()
    try:
        request.config.hook.pytest_timeout_set_timer(item=item, settings=TimeoutSettings())
        with pytest.raises(BaseException) as raised:
            slow()
    finally:
        request.config.hook.pytest_timeout_cancel_timer(item=item)
        signal.signal(signal.SIGALRM, outer_handler)
        if outer_left:
            signal.setitimer(signal.ITIMER_REAL, max(outer_left - (time.monotonic() - started), 1))
    assert "Timeout (>0.3s)" in str(raised.value), repr(raised.value)
    assert type(raised.value).__name__ == "TimedOut", repr(raised.value)
    assert time.monotonic() - started < 5, "shrunk or replayed after the timeout"


SendJobMachine.TestCase.settings = settings(
    max_examples=200,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestSendJobMachine = SendJobMachine.TestCase
