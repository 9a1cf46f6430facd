"""Bounces as a hypothesis state machine: jobs on watched channels sent (some answers
lost), reports arriving in the sender's inbox (bounces, delays, the same report again,
forgeries) before and after each job's confirmation, two daemons reading the one mailbox,
restarts, time passing the watch's end, an operator resolving what went to review. After
every step every job's history keeps the engine's invariants and the bounces' (a report
recorded at most once, only a genuine one, only while its confirmed job is watched, and
nothing sent again because of it); at the end every watch has ended and every job is
settled.

The engine machine (`test_engine_machine.py`) has the report rule too, among many; here
the reports are most of what happens, so the rare interleavings are reached."""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from tests.unit.engine_rig import EngineRig
from tests.unit.test_engine_machine import (
    BY_CHANNEL,
    REPORTS,
    check_jobs,
    deliver_report,
)

from daemon.doubles.fake_provider import Scripted
from daemon.engine import Engine
from ledger.job import TransitionError
from ledger.stores.index import index_row
from ledger.vocabulary import JobState, Resolution

WATCHED = ("receipts", "legal")
FATES = (Scripted.confirmed(), Scripted.dropped_response(), Scripted.lost_request())


class BounceMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.rig: EngineRig | None = None
        self.other: Engine | None = None  # a second daemon on the same store and mailbox
        self.keys: list[str] = []
        self.genuine: dict[str, set[str]] = {}
        self.last_report: dict[str, bytes] = {}

    @initialize()
    def start(self) -> None:
        self.rig = EngineRig(*BY_CHANNEL.values())
        self.other = self.rig.new_engine("second")

    @property
    def r(self) -> EngineRig:
        assert self.rig is not None
        return self.rig

    @rule(channel=st.sampled_from(WATCHED), fate=st.sampled_from(FATES))
    def submit(self, channel: str, fate: Scripted) -> None:
        key = f"{channel}-{len(self.keys)}"
        self.r.provider.script(fate)
        self.r.submit(channel, key)
        self.keys.append(key)

    @rule()
    def tick(self) -> None:
        self.r.engine.tick()

    @rule()
    def both_daemons_tick(self) -> None:
        assert self.other is not None
        self.r.engine.hand_out()
        self.other.hand_out()
        self.r.engine.settle(timeout=30)
        self.other.settle(timeout=30)

    @rule(seconds=st.sampled_from((30.0, 60.0, 300.0, 1800.0)))
    def advance(self, seconds: float) -> None:
        self.r.clock.advance(seconds)

    @rule()
    def restart(self) -> None:
        self.r.restart()

    @precondition(lambda self: bool(self.keys))
    @rule(data=st.data(), kind=st.sampled_from(REPORTS))
    def report_arrives(self, data: st.DataObject, kind: str) -> None:
        key = data.draw(st.sampled_from(self.keys))
        deliver_report(self.r, key, kind, self.genuine, self.last_report)

    @precondition(lambda self: bool(self.keys))
    @rule(pick=st.integers(0, 99), resolution=st.sampled_from(list(Resolution)))
    def operator_resolves(self, pick: int, resolution: Resolution) -> None:
        # Which jobs are in review depends on two daemons' threads: the job is drawn by an
        # index alike every run, so a replay draws what the first run drew.
        in_review = [k for k in self.keys if self.r.read(k)[0].state is JobState.REVIEW]
        if not in_review:
            return
        key = in_review[pick % len(in_review)]
        try:
            self.r.ledger.update(
                key, lambda job: job.resolve(resolution, note="", by="op", at=self.r.clock())
            )
        except TransitionError:
            job = self.r.job(key)
            assert resolution is Resolution.RESEND and (job.duplicate or job.reason == "bounced")

    @invariant()
    def histories_keep_the_invariants(self) -> None:
        if self.rig is None:
            return
        check_jobs(self.r, self.keys, self.genuine)
        for key in self.keys:
            assert self.r.ledger.row(key) == index_row(self.r.read(key)[0]), key

    def teardown(self) -> None:
        if self.rig is None:
            return
        try:
            # Until every job is settled and every watch over (one confirmed late starts
            # its watch late): half an hour a tick, a day at the most.
            for _ in range(48):
                self.r.clock.advance(1800)
                self.r.engine.tick()
                jobs = [self.r.read(key)[0] for key in self.keys]
                if all(job.settled and job.watch_until is None for job in jobs):
                    break
            self.histories_keep_the_invariants()
            for key in self.keys:
                job, _ = self.r.read(key)
                assert job.settled and job.watch_until is None, (key, job.state)
                if job.state is JobState.CONFIRMED:
                    assert job.due_at is None and job.purgeable, key
            assert self.r.ledger.watched() == []
        finally:
            if self.other is not None:
                self.other.close()
            self.r.close()


BounceMachine.TestCase.settings = settings(
    max_examples=30,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestBounceMachine = BounceMachine.TestCase
