"""Properties of SendJob under any sequence of commands, valid or not.

A hypothesis state machine drives one job with an injected clock that only moves
forward. Two kinds of steps: guided ones pick a command the state allows (so deep
histories with searches, requeues, duplicates and resolutions get explored), random
ones try any command with any arguments. A refusal (TransitionError, ValueError) must
leave the aggregate exactly as it was; an accepted command appends events. After every
step the collected history must replay to the live aggregate and satisfy the design's
invariants: one claim per outcome, resend after an Unknown only after enough misses or
a human, no search inside the lag window, no resend after a duplicate, confirmation only
from one copy or a human's 'sent', settled jobs stay settled.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from tests.conftest import FakeClock

from ledger.index import index_row
from ledger.job import ESCALATION_REASONS, FINAL_STATES, JobState, SendJob, TransitionError

POLICY = "receipts"
FINGERPRINT = "sha256:feedface"

Command = Callable[[], object]

# Seconds from "now". Negative values make invalid arguments; None means "no time".
any_offset = st.none() | st.integers(min_value=-30, max_value=900)
valid_offset = st.sampled_from([None, 0, 60, 300, 600])
future_offset = st.sampled_from([0, 60, 300, 600])
id_lists = st.integers(min_value=0, max_value=3).map(lambda n: [f"m{i}" for i in range(n)])


def fields_of(job: SendJob) -> dict[str, Any]:
    return {k: v for k, v in vars(job).items() if k != "_pending_events"}


def snapshot(job: SendJob) -> dict[str, Any]:
    """The aggregate's state, lists copied (the only mutable values it holds)."""
    return {k: list(v) if isinstance(v, list) else v for k, v in fields_of(job).items()}


def replay(events: list[Any]) -> SendJob:
    """A fresh aggregate from copies of the collected events."""
    first, *rest = [copy.copy(e) for e in events]
    job = first.mutate(None)
    for event in rest:
        job = event.mutate(job)
    assert isinstance(job, SendJob)
    return job


def name(event: Any) -> str:
    return type(event).__name__


class SendJobMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.job = SendJob.request(
            key="order-42",
            channel="receipts",
            to=["bob@example.com"],
            cc=[],
            reply_to=None,
            from_addr="support@example.com",
            subject="Receipt",
            body="Thanks",
            html=None,
            message_id="<job-abc@mail.example.com>",
            content_hash="sha256:1",
            policy=POLICY,
            fingerprint=FINGERPRINT,
            at=self.clock.now,
        )
        # Our own copy of the whole history: every pending event, in order.
        self.events: list[Any] = list(self.job.collect_events())
        self.final: JobState | None = None
        self.final_version = 0

    # -- plumbing ---------------------------------------------------------------------

    def at(self, offset: int | None) -> datetime | None:
        return None if offset is None else self.clock.now + timedelta(seconds=offset)

    def run(self, command: Command) -> bool:
        before = snapshot(self.job)
        try:
            command()
        except (TransitionError, ValueError):
            assert snapshot(self.job) == before, "a refused command changed the job"
            assert list(self.job.collect_events()) == [], "a refused command left events"
            return False
        new = list(self.job.collect_events())
        assert new, "an accepted command appended no event"
        self.events.extend(new)
        return True

    # Each command, with arguments drawn by `args` (valid ones for guided steps).

    def cmd_attempt(self, deadline: int) -> Command:
        now = self.clock.now
        return lambda: self.job.attempt(
            provider="support", deadline=now + timedelta(seconds=deadline), at=now
        )

    def cmd_unknown(self, search_due: int | None) -> Command:
        now, due = self.clock.now, self.at(search_due)
        return lambda: self.job.record_unknown(
            reason="timeout", search_due_at=due, policy=POLICY, fingerprint=FINGERPRINT, at=now
        )

    def cmd_miss(self, next_search: int | None) -> Command:
        now, nxt = self.clock.now, self.at(next_search)
        return lambda: self.job.record_miss(
            query="rfc822msgid:<job-abc@mail.example.com>",
            next_search_at=nxt,
            policy=POLICY,
            fingerprint=FINGERPRINT,
            at=now,
        )

    def cmd_requeue(self, misses_required: int, due: int) -> Command:
        now = self.clock.now
        return lambda: self.job.requeue(
            reason="misses believed",
            due_at=now + timedelta(seconds=due),
            misses_required=misses_required,
            policy=POLICY,
            fingerprint=FINGERPRINT,
            at=now,
        )

    def cmd_reject(self, transient: bool, retry: int | None) -> Command:
        now, retry_at = self.clock.now, self.at(retry)
        return lambda: self.job.reject(
            transient=transient,
            reason="429" if transient else "400",
            status=429 if transient else 400,
            retry_at=retry_at,
            policy=POLICY,
            fingerprint=FINGERPRINT,
            at=now,
        )

    def cmd_confirm(self, via: str, ids: list[str], verify: int | None = None) -> Command:
        now = self.clock.now
        verify_at = self.at(verify)
        return lambda: self.job.confirm(
            via=via,
            provider_message_ids=ids,
            policy=POLICY,
            fingerprint=FINGERPRINT,
            at=now,
            verify_at=verify_at,
        )

    def cmd_verify(self, hits: int, next_verify: int | None) -> Command:
        now = self.clock.now
        next_at = self.at(next_verify)
        return lambda: self.job.record_verification(
            hits=hits, next_verify_at=next_at, policy=POLICY, fingerprint=FINGERPRINT, at=now
        )

    def cmd_duplicate(self, ids: list[str]) -> Command:
        now = self.clock.now
        return lambda: self.job.record_duplicate(
            provider_message_ids=ids, policy=POLICY, fingerprint=FINGERPRINT, at=now
        )

    def cmd_escalate(self, reason: str) -> Command:
        now = self.clock.now
        return lambda: self.job.escalate(
            reason=reason, detail="d", policy=POLICY, fingerprint=FINGERPRINT, at=now
        )

    def cmd_resolve(self, decision: str) -> Command:
        now = self.clock.now
        return lambda: self.job.resolve(decision=decision, note="n", by="alice", at=now)

    # -- time -------------------------------------------------------------------------

    @rule(seconds=st.integers(min_value=0, max_value=1200))
    def advance(self, seconds: int) -> None:
        self.clock.advance(seconds)

    @precondition(lambda self: self.job.due_at is not None)
    @rule()
    def advance_to_due(self) -> None:
        due = self.job.due_at
        assert due is not None
        if due > self.clock.now:
            self.clock.now = due

    # -- guided steps -----------------------------------------------------------------

    def valid_moves(self, data: st.DataObject) -> list[Callable[[], Command]]:
        job, draw = self.job, data.draw

        def escalate() -> Command:
            reasons = ["duplicate"] if job.duplicate else ["max-attempts", "unknown-outcome"]
            return self.cmd_escalate(draw(st.sampled_from(reasons)))

        def attempt() -> Command:
            return self.cmd_attempt(30)

        def unknown() -> Command:
            return self.cmd_unknown(draw(valid_offset))

        def reject() -> Command:
            transient = draw(st.booleans())
            return self.cmd_reject(transient, draw(valid_offset) if transient else None)

        def verify_offset() -> int | None:
            # As the daemon does: a resent job's copies are counted again later.
            return draw(future_offset) if job.resent else None

        def confirm_response() -> Command:
            return self.cmd_confirm("response", ["m1"], verify_offset())

        def confirm_search() -> Command:
            return self.cmd_confirm("search", ["m1"], verify_offset())

        def verify() -> Command:
            hits = draw(st.integers(0, 1))
            return self.cmd_verify(hits, draw(valid_offset) if hits == 0 else None)

        def miss() -> Command:
            return self.cmd_miss(draw(valid_offset))

        def duplicate() -> Command:
            return self.cmd_duplicate(["m1", "m2", "m3"][: draw(st.integers(2, 3))])

        def requeue() -> Command:
            return self.cmd_requeue(draw(st.integers(1, max(job.misses, 1))), draw(future_offset))

        def resolve() -> Command:
            decisions = ["sent", "abandon"] if job.duplicate else ["sent", "resend", "abandon"]
            return self.cmd_resolve(draw(st.sampled_from(decisions)))

        if job.awaiting == "Escalated":
            return [escalate]
        if job.awaiting == "Requeued|Escalated":
            return [requeue, requeue, escalate]
        if job.state is JobState.REQUESTED:
            return [attempt]
        if job.state is JobState.ATTEMPTED:
            return [unknown, unknown, reject, confirm_response]
        if job.state is JobState.UNKNOWN:
            searches = [miss, miss, miss, confirm_search, duplicate]
            return ([requeue] if job.misses else []) + searches
        if job.state is JobState.REVIEW:
            return [resolve] if job.duplicate else [resolve, resolve, duplicate]
        if job.state is JobState.CONFIRMED and job.verifying:
            return [verify, verify, duplicate]
        return []

    def guided(self, data: st.DataObject) -> None:
        # Usually wait for the job to be due, as the daemon's sweeper does; sometimes
        # act early, which the job must refuse (a search inside the lag window, a
        # retry before its backoff).
        early = self.job.due_at is not None and self.clock.now < self.job.due_at
        if early and data.draw(st.booleans()):
            assert self.job.due_at is not None
            self.clock.now = self.job.due_at
            early = False
        moves = self.valid_moves(data)
        if moves:
            move = data.draw(st.sampled_from(moves))
            accepted = self.run(move())
            assert accepted or early, "a valid move was refused"

    @rule(data=st.data())
    def guided_step(self, data: st.DataObject) -> None:
        self.guided(data)

    @rule(data=st.data())
    def another_guided_step(self, data: st.DataObject) -> None:
        self.guided(data)

    @rule(data=st.data())
    def third_guided_step(self, data: st.DataObject) -> None:
        self.guided(data)

    # -- random steps: any command, without waiting for the job to be due ---------------

    COMMANDS = (
        "attempt",
        "unknown",
        "miss",
        "requeue",
        "reject",
        "confirm",
        "verify",
        "duplicate",
        "escalate",
        "resolve",
    )

    def any_command(self, data: st.DataObject, *, plausible: bool) -> Command:
        """A command with arguments that are plausible (well-formed, so only the
        state decides) or arbitrary (possibly malformed)."""
        draw = data.draw
        which = draw(st.sampled_from(self.COMMANDS))
        offset = valid_offset if plausible else any_offset
        ids = st.sampled_from([["m1"], ["m1", "m2"]]) if plausible else id_lists
        if which == "attempt":
            return self.cmd_attempt(30 if plausible else draw(st.integers(-5, 120)))
        if which == "unknown":
            return self.cmd_unknown(draw(offset))
        if which == "miss":
            return self.cmd_miss(draw(offset))
        if which == "requeue":
            required = draw(st.integers(1, 2) if plausible else st.integers(0, 3))
            return self.cmd_requeue(required, draw(st.integers(-30, 900)))
        if which == "reject":
            return self.cmd_reject(draw(st.booleans()), draw(offset))
        if which == "confirm":
            vias = ["response", "search", "operator"]
            via = draw(st.sampled_from(vias if plausible else [*vias, "carrier-pigeon"]))
            return self.cmd_confirm(via, draw(ids), draw(offset))
        if which == "verify":
            return self.cmd_verify(draw(st.integers(0, 3)), draw(offset))
        if which == "duplicate":
            return self.cmd_duplicate(["m1", "m2"] if plausible else draw(id_lists))
        if which == "escalate":
            reasons = sorted(ESCALATION_REASONS)
            return self.cmd_escalate(
                draw(st.sampled_from(reasons if plausible else [*reasons, "?"]))
            )
        decisions = ["sent", "resend", "abandon"]
        return self.cmd_resolve(
            draw(st.sampled_from(decisions if plausible else [*decisions, "?"]))
        )

    @rule(data=st.data())
    def random_command(self, data: st.DataObject) -> None:
        self.run(self.any_command(data, plausible=False))

    @rule(data=st.data())
    def probe_command(self, data: st.DataObject) -> None:
        self.run(self.any_command(data, plausible=True))

    # -- every command from the state reached ----------------------------------------

    def probes(self) -> list[Command]:
        return [
            self.cmd_attempt(30),
            self.cmd_unknown(300),
            self.cmd_unknown(None),
            self.cmd_miss(300),
            self.cmd_miss(None),
            self.cmd_requeue(1, 0),
            self.cmd_requeue(2, 0),
            self.cmd_reject(True, 60),
            self.cmd_reject(True, None),
            self.cmd_reject(False, None),
            *(
                self.cmd_confirm(via, ids, verify)
                for via in ("response", "search", "operator")
                for ids in (["m1"], ["m1", "m2"])
                for verify in (None, 600)
            ),
            self.cmd_verify(1, None),
            self.cmd_verify(0, 300),
            self.cmd_verify(0, None),
            self.cmd_duplicate(["m1", "m2"]),
            *(self.cmd_escalate(reason) for reason in sorted(ESCALATION_REASONS)),
            *(self.cmd_resolve(decision) for decision in ("sent", "resend", "abandon")),
        ]

    @rule()
    def every_command_here(self) -> None:
        """Try every well-formed command on a copy of the job: each is refused
        (leaving the copy unchanged) or extends the history validly."""
        live = self.job
        try:
            for command in self.probes():  # each refers to self.job when it runs
                self.job = copy.deepcopy(live)
                before = snapshot(self.job)
                try:
                    command()
                except (TransitionError, ValueError):
                    assert snapshot(self.job) == before
                    continue
                check_history([*self.events, *self.job.collect_events()])
        finally:
            self.job = live

    # -- invariants -------------------------------------------------------------------

    @invariant()
    def replay_equals_live(self) -> None:
        replayed = replay(self.events)
        assert fields_of(replayed) == fields_of(self.job)
        assert index_row(replayed) == index_row(self.job)
        assert self.job.version == len(self.events)

    @invariant()
    def state_is_one_of_six(self) -> None:
        assert isinstance(self.job.state, JobState)
        assert self.job.state.value in {
            "requested",
            "attempted",
            "unknown",
            "confirmed",
            "review",
            "abandoned",
        }

    @invariant()
    def settled_jobs_stay_settled(self) -> None:
        if self.final is None:
            # A confirmed job whose copies are still to be counted may yet turn out a
            # duplicate; it is final once that count is done (or was never due).
            done = not self.job.verifying and self.job.awaiting is None
            if self.job.state in FINAL_STATES and done:
                self.final = self.job.state
                self.final_version = self.job.version
            return
        assert self.job.state is self.final
        assert self.job.version == self.final_version, "an event after the job was final"

    @invariant()
    def history_is_valid(self) -> None:
        check_history(self.events)


# -- properties of a history (a list of events, oldest first) ---------------------------


def check_history(events: list[Any]) -> None:
    nothing_after_final(events)
    one_claim_per_outcome(events)
    attempts_are_numbered_and_due(events)
    resend_after_unknown_only_after_misses_or_a_human(events)
    searches_never_inside_the_lag_window(events)
    nothing_resent_after_a_duplicate(events)
    awaited_escalation_comes_next(events)
    only_verification_reopens_a_confirmed_job(events)
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


def only_verification_reopens_a_confirmed_job(events: list[Any]) -> None:
    # After a Confirmed: only Verified (hits 0 or 1) or a Duplicate, and only when the
    # confirmation scheduled a count (after a resend), no sooner than it was due.
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
        assert event.timestamp >= due, "copies counted before verify_after"
        if kind == "Duplicate":
            due = None
        else:
            assert event.hits in (0, 1)
            due = event.next_verify_at


def one_claim_per_outcome(events: list[Any]) -> None:
    # Between two Attempted events: an outcome (Unknown, Rejected) or a human's resend.
    open_claim = False
    for event in events:
        kind = name(event)
        if kind == "Attempted":
            assert not open_claim, "two Attempted without an outcome between them"
            open_claim = True
        elif kind in ("Unknown", "Rejected") or (kind == "Resolved" and event.decision == "resend"):
            open_claim = False


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
        elif kind == "Rejected" and event.retry_at is not None:
            due = event.retry_at
        elif kind == "Requeued":
            due = event.due_at
        elif kind == "Resolved" and event.decision == "resend":
            due = event.timestamp


def resend_after_unknown_only_after_misses_or_a_human(events: list[Any]) -> None:
    # Invariant 2: after an Unknown, a new Attempted needs confirm_misses SearchedMiss
    # events then Requeued, or a human's resend.
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


def searches_never_inside_the_lag_window(events: list[Any]) -> None:
    search_due: datetime | None = None
    for event in events:
        kind = name(event)
        if kind == "Unknown":
            search_due = event.search_due_at
        elif kind == "SearchedMiss" or (kind == "Confirmed" and event.via == "search"):
            assert search_due is not None, "searched without a scheduled search"
            assert event.timestamp >= search_due, "searched before the index caught up"
            if kind == "SearchedMiss":
                search_due = event.next_search_at


def nothing_resent_after_a_duplicate(events: list[Any]) -> None:
    seen_duplicate = False
    for event in events:
        kind = name(event)
        if kind == "Duplicate":
            seen_duplicate = True
            assert event.hits == len(event.provider_message_ids) >= 2
        elif seen_duplicate:
            assert kind not in ("Attempted", "Requeued"), f"{kind} after a Duplicate"
            assert not (kind == "Resolved" and event.decision == "resend"), "resend after dup"


def awaited_escalation_comes_next(events: list[Any]) -> None:
    for before, after in itertools.pairwise(events):
        awaits = (
            name(before) == "Duplicate"
            or (name(before) == "Rejected" and before.retry_at is None)
            or (name(before) == "Unknown" and before.search_due_at is None)
        )
        if awaits:
            assert name(after) == "Escalated", f"{name(after)} after {name(before)}"


def confirmed_only_from_one_copy_or_a_human(events: list[Any]) -> None:
    confirmations = [i for i, e in enumerate(events) if name(e) == "Confirmed"]
    # A second confirmation only by a human, after a verification found a duplicate.
    assert len(confirmations) <= 2
    if len(confirmations) == 2:
        assert events[confirmations[1]].via == "operator"
        assert "Duplicate" in [name(e) for e in events[confirmations[0] : confirmations[1]]]
    for index in confirmations:
        event, previous = events[index], events[index - 1]
        assert event.via in ("response", "search", "operator")
        if event.via == "response":
            assert len(event.provider_message_ids) == 1, "confirmed without exactly one copy"
            assert name(previous) == "Attempted"
        elif event.via == "search":
            assert len(event.provider_message_ids) == 1, "confirmed without exactly one copy"
            last = [name(e) for e in events[:index] if name(e) in ("Attempted", "Unknown")]
            assert last[-1] == "Unknown"
        else:
            assert name(previous) == "Resolved" and previous.decision == "sent"


def decisions_carry_the_policy(events: list[Any]) -> None:
    for event in events:
        if name(event) in (
            "Requested",
            "Unknown",
            "SearchedMiss",
            "Requeued",
            "Rejected",
            "Confirmed",
            "Verified",
            "Duplicate",
            "Escalated",
        ):
            assert event.policy and event.fingerprint


SendJobMachine.TestCase.settings = settings(
    max_examples=200,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestSendJobMachine = SendJobMachine.TestCase
