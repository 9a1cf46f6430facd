"""The engine as a hypothesis state machine: submit, tick (as a one-shot run does, or as the
daemon does: hand out and wait for nothing), let time pass, script the provider's answers
and its index lag, hang calls and release them later, take the provider down for a few sends
or searches (nothing sent, nothing learnt: waited out behind the circuit), crash the daemon
mid-call or between ticks, let delivery reports arrive in the sender's inbox (bounces,
delays, the same report twice, forgeries), and let an operator resolve jobs in review. The
invariants of ``docs/architecture.md`` are checked against every job's history after every
step (with the bounces': a report is recorded at most once, only a genuine one, only on a
watched confirmed job, and nothing is ever sent again because of it), and at the end every
job must settle with the copies its policy allows.

Everything runs on the memory store and the fake provider with injected time, so each
example runs hundreds of ticks in well under a second.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)
from tests.unit.engine_rig import EngineRig, policy

from daemon.doubles.fake_provider import Scripted
from ledger.job import NOT_OURS, STOPPED, WITHHELD, SendJob, TransitionError, bounced_pairs
from ledger.stores.index import index_row
from ledger.vocabulary import ConfirmedVia, JobState, Resolution
from policies.model import ChannelPolicy
from testkit.dsn import report, rfc3464_report

POLICIES = (
    policy("receipts", on_unknown="retry", watch_bounces="1h"),
    policy("alerts", on_unknown="search-then-review"),
    policy("payouts", on_unknown="search-then-review", irreversible=True),
    policy("legal", on_unknown="review", watch_bounces="2h", on_bounce="review"),
)
BY_CHANNEL = {p.channel: p for p in POLICIES}
FATES = (
    Scripted.confirmed(),
    Scripted.dropped_response(),
    Scripted.lost_request(),
    Scripted.server_error_after_send(),
    Scripted.rejected(transient=True),
    Scripted.rejected(transient=False),
    Scripted.confirmed_without_id(),
    Scripted.crash_during_call(stored=True),
    Scripted.crash_during_call(stored=False),
    Scripted.unavailable(),
    Scripted.unavailable(retry_after=45.0),
)
# Lags below search_after (60s) keep every search truthful; 200s hides a copy from both
# searches (60s + 30s) but not from the verification 600s after a resend.
LAGS = (0.0, 30.0, 200.0)
STEPS = (1.0, 10.0, 30.0, 60.0, 300.0, 700.0)
#: What may arrive in the sender's inbox about a job: genuine reports (a bounce, a delay,
#: the same report again) and forgeries that must be recorded on no job.
REPORTS = ("bounce", "delay", "again", "other-domain", "not-a-recipient", "no-headers", "huge")
GENUINE = frozenset({"bounce", "delay", "again"})
#: Here among many rules: the cheap ones (the bounce machine has them all).
CHEAP_REPORTS = tuple(kind for kind in REPORTS if kind != "huge")


class EngineMachine(RuleBasedStateMachine):
    #: The channels that may resend on their own (a duplicate there is a lag's doing).
    retry_channels: tuple[str, ...] = ("receipts",)

    def __init__(self) -> None:
        super().__init__()
        self.rig: EngineRig | None = None
        self.keys: list[str] = []
        self.ticks = 0
        self.hangs: list[threading.Event] = []  # scripted hangs not yet released
        self.genuine: dict[str, set[str]] = {}  # key -> the report ids genuinely about it
        self.last_report: dict[str, bytes] = {}

    @initialize(lag=st.sampled_from(LAGS), seed=st.integers(0, 3))
    def start(self, lag: float, seed: int) -> None:
        self.rig = EngineRig(*POLICIES, index_lag=lag, seed=seed)

    @property
    def r(self) -> EngineRig:
        assert self.rig is not None
        return self.rig

    # -- what happens -------------------------------------------------------------------

    @rule(channel=st.sampled_from(sorted(BY_CHANNEL)))
    def submit(self, channel: str) -> None:
        key = f"{channel}-{len(self.keys)}"
        self.r.submit(channel, key)
        self.keys.append(key)

    @rule(fate=st.sampled_from(FATES))
    def script(self, fate: Scripted) -> None:
        self.r.provider.script(fate)

    @precondition(lambda self: not self.hangs)  # a one-shot tick waits for every call
    @rule()
    def tick(self) -> None:
        self.r.engine.tick()
        self.ticks += 1

    @rule()
    def daemon_tick(self) -> None:
        """The daemon's tick: hand out, and (for the test) wait until every worker is done
        except those whose calls hang; a hung call holds only its own worker."""
        engine = self.r.engine
        engine.hand_out()
        assert engine.settle(busy=lambda: self.r.provider.hanging, timeout=30), "stalled"
        self.ticks += 1

    @precondition(lambda self: len(self.hangs) < self.r.concurrency)
    @rule()
    def hang_next_call(self) -> None:
        release = threading.Event()
        self.hangs.append(release)
        self.r.provider.script(Scripted.hang(release))

    @precondition(lambda self: bool(self.hangs))
    @rule()
    def release_hung_calls(self) -> None:
        self.release()

    @rule(calls=st.integers(1, 6))
    def outage(self, calls: int) -> None:
        """The provider unreachable for the next `calls` sends."""
        self.r.provider.script(*[Scripted.unavailable() for _ in range(calls)])

    def release(self) -> None:
        for event in self.hangs:
            event.set()
        self.hangs.clear()
        # Their calls return and are recorded; nothing else is due at this instant.
        self.r.engine.settle(timeout=30)

    @rule(seconds=st.sampled_from(STEPS))
    def advance(self, seconds: float) -> None:
        self.r.clock.advance(seconds)

    @rule()
    def restart(self) -> None:
        self.release()  # a stopping daemon lets its calls finish (and records them)
        self.r.restart()

    @rule(count=st.integers(1, 3))
    def searches_fail(self, count: int) -> None:
        self.r.provider.fail_searches(count)

    @rule(count=st.integers(1, 6))
    def search_outage(self, count: int) -> None:
        """The provider unreachable for the next `count` searches: they count toward the
        circuit, which then holds sends and searches alike."""
        self.r.provider.fail_searches(count, unavailable=True)

    @precondition(lambda self: bool(self.keys))
    @rule(data=st.data(), resolution=st.sampled_from(list(Resolution)))
    def operator_resolves(self, data: st.DataObject, resolution: Resolution) -> None:
        in_review = [k for k in self.keys if self.r.read(k)[0].state is JobState.REVIEW]
        if not in_review:
            return
        key = data.draw(st.sampled_from(in_review))
        try:
            self.r.ledger.update(
                key, lambda job: job.resolve(resolution, note="", by="op", at=self.r.clock())
            )
        except TransitionError:
            job = self.r.job(key)
            assert resolution is Resolution.RESEND and (job.duplicate or job.reason == "bounced")

    @precondition(lambda self: bool(self.keys))
    @rule(data=st.data(), kind=st.sampled_from(CHEAP_REPORTS))
    def report_arrives(self, data: st.DataObject, kind: str) -> None:
        """A delivery report about one job lands in the sender's inbox."""
        key = data.draw(st.sampled_from(self.keys))
        deliver_report(self.r, key, kind, self.genuine, self.last_report)

    @rule()
    def retention_purges(self) -> None:
        # Whatever is settled for good by now loses its content (ledger/redaction.py).
        self.r.ledger.purge_settled(self.r.clock(), by="retention", rule="machine")

    # -- what must always hold ------------------------------------------------------------

    @invariant()
    def histories_keep_the_invariants(self) -> None:
        if self.rig is None:
            return
        check_jobs(self.r, self.keys, self.genuine)

    @invariant()
    def the_index_is_the_events(self) -> None:
        if self.rig is None:
            return
        for key in self.keys:
            assert self.r.ledger.row(key) == index_row(self.r.read(key)[0]), key

    def teardown(self) -> None:
        if self.rig is None:
            return
        try:
            self.release()
            self.settle_everything()
        finally:
            self.release()
            self.r.close()

    def settle_everything(self) -> None:
        """Invariant 7: with a provider that answers, every job ends confirmed, in review or
        abandoned; and the copies are what each policy allows."""
        rig = self.r
        rig.provider.script()  # nothing more scripted: sends are confirmed from here
        rig.restart()
        # Faults still scripted are met first, one probe per tick while a circuit is open
        # (sends and searches share it): up to one tick per fault, then the settling.
        for _ in range(500):
            rig.clock.advance(700)
            rig.engine.tick()
            jobs = [rig.read(k)[0] for k in self.keys]
            open_jobs = [
                job.key
                for job in jobs
                if job.state not in (JobState.CONFIRMED, JobState.REVIEW, JobState.ABANDONED)
                or job.verifying
            ]
            if not open_jobs:
                break
        self.histories_keep_the_invariants()
        self.the_index_is_the_events()
        for key in self.keys:
            job, events = rig.read(key)
            assert job.settled and not job.verifying, (key, job.state, job.due_at)
            copies = rig.provider.copies_of(job.message_id)
            by_operator = any(isinstance(e, SendJob.Resolved) for e in events)
            if copies >= 2 and not by_operator:
                # A second copy only from a believed miss that the lag hid; verification
                # found it and a human looks at it.
                assert job.state is JobState.REVIEW and job.duplicate, (key, copies)
                assert job.channel in self.retry_channels
            if job.state is JobState.CONFIRMED and not by_operator:
                assert copies == 1, (key, copies)


def check_jobs(rig: EngineRig, keys: list[str], genuine: dict[str, set[str]]) -> None:
    """Every job's history keeps the invariants (`check_history`) and the bounces'."""
    provider = rig.provider
    for key in keys:
        job, events = rig.read(key)
        check_history(
            job,
            events,
            sends=provider.sends_by_message_id[job.message_id],
            answered=provider.answered_searches[job.message_id],
        )
        check_bounces(job, events, genuine=genuine.get(key, set()))


def check_history(
    job: SendJob,
    events: list[Any],
    *,
    sends: int,
    answered: int,
    history_answered: int = 0,
    stored: Mapping[str, str] | None = None,
    policies: Mapping[str, ChannelPolicy] = BY_CHANNEL,
) -> None:
    """The invariants on one job's history. `history_answered`: the reads of its mailbox's
    history that got an answer; `stored`: each copy's Message-ID as the provider stored
    it, by provider id (what a Confirmed via history is held against)."""
    policy = policies.get(job.channel)
    attempted = [e for e in events if isinstance(e, SendJob.Attempted)]
    # Invariant 1: every provider call had a durable claim before it, and one claim per call
    # (but for a claim whose send the circuit withheld, or that was no longer its daemon's
    # to make by the time it was saved, or came after a stop: its Rejected says so).
    withheld = sum(
        1
        for e in events
        if isinstance(e, SendJob.Rejected) and e.reason in (WITHHELD, NOT_OURS, STOPPED)
    )
    assert len(attempted) == sends + withheld, (job.key, len(attempted), sends, withheld)
    # A failed (or held) search is never a miss: each believed miss had an answered search.
    misses = sum(1 for e in events if isinstance(e, SendJob.SearchedMiss))
    assert misses <= answered, (job.key, misses, answered)
    # Nor is a failed history read: each HistoryMissed had an answered read.
    history_misses = sum(1 for e in events if isinstance(e, SendJob.HistoryMissed))
    assert history_misses <= history_answered, (job.key, history_misses, history_answered)
    unknown_at = None
    believed_at = None  # a believed HistoryMissed since the Unknown: the index wait is over
    counted = 0  # calls since the job was (re)opened, less those refused as unavailable
    misses_since_unknown = 0
    resend_allowed = True
    after_duplicate = False
    purged = False
    for event in events:
        # A purge is the last thing that ever happens to a job.
        assert not purged, (job.key, "an event after the purge", type(event).__name__)
        if isinstance(event, SendJob.Purged):
            purged = True
            assert job.content == job.content.redacted() and not job.content.to
        elif isinstance(event, SendJob.Unknown):
            unknown_at, misses_since_unknown, resend_allowed = event.timestamp, 0, False
            believed_at = None
        elif isinstance(event, SendJob.HistoryMissed):
            assert unknown_at is not None and policy is not None
            if event.believed:
                # Believed only on a channel that opted in, and only after its window.
                assert policy.history_after is not None, job.key
                assert event.timestamp >= unknown_at + timedelta(seconds=policy.history_after)
                believed_at = event.timestamp
        elif isinstance(event, SendJob.SearchedMiss):
            assert unknown_at is not None and policy is not None
            # The first search waits out the index lag (or follows a believed history miss).
            waited = unknown_at + timedelta(seconds=policy.search_after)
            assert event.timestamp >= (waited if believed_at is None else believed_at), job.key
            misses_since_unknown += 1
        elif isinstance(event, SendJob.Requeued):
            # Invariant 2: a resend after an unknown only after enough believed misses, and
            # invariant 5: never on an irreversible channel without a human.
            assert policy is not None and policy.on_unknown == "retry"
            assert not policy.irreversible
            assert misses_since_unknown >= policy.confirm_misses
            resend_allowed = True
        elif isinstance(event, SendJob.Resolved):
            if event.decision == Resolution.RESEND:
                assert not after_duplicate
                resend_allowed = True
                counted = 0
        elif isinstance(event, SendJob.Rejected):
            resend_allowed = True  # not sent: trying again is safe
            if event.unavailable:
                # An outage is waited out: it never counts against max_attempts.
                assert event.transient and event.retry_at is not None, job.key
                counted -= 1
        elif isinstance(event, SendJob.Escalated):
            # No channel here bounds the wait (give_up_after): an outage never escalates.
            assert event.reason != "provider-unavailable", job.key
            if event.reason == "max-attempts":
                assert policy is not None and counted >= policy.max_attempts, (job.key, counted)
        elif isinstance(event, SendJob.DraftPending):
            resend_allowed = True  # the draft is still there: nothing was sent
        elif isinstance(event, SendJob.Attempted):
            counted += 1
            assert resend_allowed, (job.key, "an attempt after an unknown without a resend")
            # Invariant 4: nothing is ever sent again after a duplicate.
            assert not after_duplicate, job.key
            resend_allowed = False
        elif isinstance(event, SendJob.Confirmed):
            # Invariant 3: exactly one copy, unless a human said so.
            if event.via != ConfirmedVia.OPERATOR:
                assert len(event.provider_message_ids) == 1
            if event.via == ConfirmedVia.HISTORY:
                # ... and through the history, a copy whose stored header is exactly ours.
                assert stored is not None, job.key
                [copy] = event.provider_message_ids
                assert stored[copy] == job.message_id, (job.key, copy, stored[copy])
        elif isinstance(event, SendJob.Duplicate):
            after_duplicate = True
            assert event.hits >= 2
    if job.state is JobState.ATTEMPTED:
        assert attempted, job.key


def deliver_report(
    rig: EngineRig, key: str, kind: str, genuine: dict[str, set[str]], last: dict[str, bytes]
) -> None:
    """A report of `kind` (REPORTS) about the job `key` into the fake provider's inbox; a
    genuine one's id is added to `genuine[key]`."""
    job, _ = rig.read(key)
    to = job.content.to[0] if job.content.to else "customer@example.net"
    mid = job.message_id
    if kind == "again" and key in last:
        rig.provider.deliver(last[key])  # another copy of the same report
        return
    if kind == "other-domain":
        mid = mid.replace("mail.example.com", "evil.example")
    if kind == "not-a-recipient":
        to = "someone-else@example.org"
    headers = f"From: x\r\nTo: {to}\r\nMessage-ID: {mid}\r\n\r\n".encode()
    if kind == "no-headers":
        raw = report(
            sender="MAILER-DAEMON@x",
            to="support@example.com",
            subject="failed",
            parts=[(["Content-Type: text/plain"], headers)],
        )
    else:
        delayed = {"status": "4.4.7", "action": "delayed"} if kind == "delay" else {}
        raw = rfc3464_report(headers, mailbox="support@example.com", recipient=to, **delayed)
    if kind == "huge":
        raw += b"x" * (3 * 1024 * 1024)
    if kind in GENUINE:
        report_id = raw.split(b"\r\nMessage-ID: ", 1)[1].split(b"\r\n", 1)[0].decode()
        genuine.setdefault(key, set()).add(report_id)
        last[key] = raw
    rig.provider.deliver(raw)


def check_bounces(job: SendJob, events: list[Any], *, genuine: set[str]) -> None:
    """A report is recorded at most once, only a genuine one, only while the confirmed job
    is watched; and nothing of what was sent changes because of it: no send follows, and
    the only state change is to review on a channel that asks for it."""
    policy = BY_CHANNEL.get(job.channel)
    recorded: set[str] = set()
    pairs: set[tuple[str, bool]] = set()
    watching = False
    bounced = False
    for index, event in enumerate(events):
        if isinstance(event, SendJob.Confirmed | SendJob.Escalated | SendJob.BounceWatchEnded):
            watching = False
        if isinstance(event, SendJob.WatchingBounces):
            assert isinstance(events[index - 1], SendJob.Confirmed), job.key
            watching = True
        elif isinstance(event, SendJob.Bounced):
            assert watching, (job.key, "a bounce on a job not watched")
            assert event.dsn_id not in recorded, (job.key, "a report recorded twice")
            assert event.dsn_id in genuine, (job.key, "a forged report recorded")
            recorded.add(event.dsn_id)
            for pair in bounced_pairs(event.recipients):
                assert pair not in pairs, (job.key, "a recipient's bounce recorded twice")
                pairs.add(pair)
            bounced = True
            follows = events[index + 1] if index + 1 < len(events) else None
            if isinstance(follows, SendJob.Escalated):
                assert follows.reason == "bounced" and event.permanent, job.key
                assert policy is not None and policy.on_bounce == "review", job.key
        elif bounced:
            # The message was sent: a bounce never leads to another send.
            assert not isinstance(event, SendJob.Attempted | SendJob.Requeued | SendJob.Unknown), (
                job.key,
                type(event).__name__,
            )


EngineMachine.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestEngineMachine = EngineMachine.TestCase
