"""The races tests/unit/test_group_commit.py and tests/unit/test_leases.py reason about
with the memory store and the fake provider, shown on the real stack: SQLite and
PostgreSQL stores, the real Google client, the Gmail emulator behind the fault relay.

A human's decision comes through `Services` (the API's path) on a ledger of its own, as the
API process would, and lands inside the daemon's group commit; a send hangs past its lease
while a second engine on the same store recovers and searches. Sends are counted at the
relay, copies at the emulator.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import nullcontext
from typing import Any

import pytest
from tests.integration.test_engine import (  # noqa: F401  (fixtures used by name)
    DEADLINE,
    Rig,
    RigFactory,
    emulator,
    make_rig,
)

from daemon.doubles.fake_time import FakeClock
from daemon.service_layer.services import ChannelPolicies, Refusal, ServiceError, Services
from ledger.application import Ledger
from ledger.job import JobState, SendJob
from ledger.vocabulary import ConfirmedVia, Resolution
from testkit.gmail_emulator import GmailEmulator
from testkit.relay import FaultPlan, FaultRelay

KEYS = [f"k{n}" for n in range(4)]


class InsideTheGroup:
    """Wraps the engine ledger's commits. The first commit of jobs in `state` (claims:
    attempted; outcomes: confirmed) holds until the other workers' saves queue behind it,
    so the next commit is a group of several; just before that group commits, `act` runs
    on one of its jobs (`human`), as a human's request would then. Which worker's save
    comes first is the scheduler's choice: the human's job is taken from the group."""

    def __init__(
        self, rig: Rig, act: Callable[[str], object], state: JobState = JobState.ATTEMPTED
    ) -> None:
        self.sizes: list[int] = []
        self.group: list[str] = []
        self.human = ""
        self.at = -1  # the group's index in `sizes`
        self._rig = rig
        self._act = act
        self._state = state
        self._gathered = False
        self._save_jobs, self._save_job = rig.ledger.save_jobs, rig.ledger.save_job
        rig.ledger.save_jobs = self  # type: ignore[method-assign]
        rig.ledger.save_job = lambda job, **kwargs: self([job], **kwargs)  # type: ignore[method-assign]

    def __call__(self, jobs: Sequence[SendJob], **kwargs: Any) -> None:
        self.sizes.append(len(jobs))
        ours = all(job.state is self._state for job in jobs)
        if ours and not self._gathered:
            self._gathered = True
            commits = self._rig.engine.commits
            for _ in range(5000):  # at most 5 s: the other saves queue up (not the flushes)
                if sum(1 for s in commits._waiting if s.job is not None) >= len(KEYS) - len(jobs):
                    break
                threading.Event().wait(0.001)
        keys = [job.key for job in jobs]
        if ours and len(jobs) > 1 and not self.group:
            self.group, self.human, self.at = keys, keys[-1], len(self.sizes) - 1
            self._act(self.human)
        if len(jobs) == 1:
            self._save_job(jobs[0], **kwargs)
        else:
            self._save_jobs(jobs, **kwargs)


@pytest.fixture
def api(store_url: str, clock: FakeClock) -> Iterator[Callable[[Rig], Services]]:
    """The API process's `Services` on a ledger of its own over the daemon's store."""
    ledgers: list[Ledger] = []

    def make(rig: Rig) -> Services:
        ledger = Ledger(store_url, clock=clock)
        ledgers.append(ledger)
        return Services(
            ledger,
            lambda: ChannelPolicies(rig.holder.current),
            providers=lambda name: nullcontext(rig.provider),
        )

    yield make
    for ledger in ledgers:
        ledger.close()


def submitted(rig: Rig) -> dict[str, str]:
    return {key: rig.submit("receipts", key) for key in KEYS}


def test_a_cancel_inside_the_daemons_group_commit_wins_and_its_job_is_never_sent(
    make_rig: RigFactory,  # noqa: F811
    api: Callable[[Rig], Services],
    emulator: GmailEmulator,  # noqa: F811
) -> None:
    """The human's cancel commits while the daemon's group of claims is on its way: the
    group meets it, each claim is saved alone, the cancelled job's claim is refused and
    never sent; the three others are sent once each."""
    rig = make_rig({"receipts": {"on_unknown": "retry"}})
    ids = submitted(rig)
    services = api(rig)
    cancelled: list[SendJob] = []
    hook = InsideTheGroup(
        rig, lambda key: cancelled.append(services.cancel(key, note="not wanted", by="op"))
    )
    rig.engine.tick()
    human, size = hook.human, len(hook.group)
    assert human in hook.group and size > 1, hook.sizes
    # The group met the cancel, then each of its claims was saved alone. The group is the
    # first commit when all four claims queued before it began (the scheduler's choice).
    assert hook.sizes[hook.at : hook.at + 1 + size] == [size] + [1] * size, hook.sizes
    assert [job.state for job in cancelled] == [JobState.CANCELLED]
    assert rig.state(human) is JobState.CANCELLED and not rig.of(human, "Attempted")
    assert rig.sends() == len(KEYS) - 1 and emulator.copies(ids[human]) == 0
    for key in KEYS:
        if key != human:
            assert rig.state(key) is JobState.CONFIRMED, rig.names(key)
            assert len(rig.of(key, "Attempted")) == 1 and emulator.copies(ids[key]) == 1
    rig.clock.advance(3600)
    rig.tick()  # nothing left to send, nothing resent
    assert rig.sends() == len(KEYS) - 1


def test_a_cancel_decided_on_the_version_before_the_group_commit_is_refused_and_names_it(
    make_rig: RigFactory,  # noqa: F811
    api: Callable[[Rig], Services],
    emulator: GmailEmulator,  # noqa: F811
) -> None:
    """The human looked at the job before the daemon's group of claims committed and
    cancels on that version after it did: refused with a conflict that names the claim;
    the job is sent once, its outcome recorded."""
    rig = make_rig({"receipts": {"on_unknown": "retry"}})
    ids = submitted(rig)
    services = api(rig)
    seen = {key: services.status(key)["version"] for key in KEYS}  # what the human saw
    refused: list[ServiceError] = []
    hook = InsideTheGroup(rig, lambda key: None)
    saved_group = hook._save_jobs

    def group_then_human(jobs: Sequence[SendJob], **kwargs: Any) -> None:
        saved_group(jobs, **kwargs)
        if [job.key for job in jobs] == hook.group and not refused:  # the claims' group
            try:
                services.cancel(
                    hook.human, note="not wanted", by="op", expected_version=seen[hook.human]
                )
            except ServiceError as exc:
                refused.append(exc)

    hook._save_jobs = group_then_human
    rig.engine.tick()
    assert hook.human in hook.group and len(hook.group) > 1, hook.sizes
    [error] = refused
    assert error.kind is Refusal.CONFLICT
    assert f"changed after version {seen[hook.human]}" in error.message
    assert "not cancelled" in error.message
    assert rig.sends() == len(KEYS)
    for key in KEYS:
        assert rig.state(key) is JobState.CONFIRMED, rig.names(key)
        assert rig.of(key, "Cancelled") == [] and emulator.copies(ids[key]) == 1


def test_a_resolve_inside_the_daemons_group_of_outcomes_stands_and_no_outcome_is_lost(
    make_rig: RigFactory,  # noqa: F811
    api: Callable[[Rig], Services],
    emulator: GmailEmulator,  # noqa: F811
) -> None:
    """While the daemon's group of four outcomes is on its way, another daemon's recovery
    puts one of its jobs in review and a human resolves it as sent: the group meets them,
    each outcome is saved alone, the human's decision stands (its Confirmed is the only
    one: the daemon's is refused), the three other outcomes are recorded, and nothing is
    sent again."""
    rig = make_rig({"receipts": {"on_unknown": "review"}})
    ids = submitted(rig)
    services = api(rig)
    resolved: list[SendJob] = []

    def recovered_and_resolved(key: str) -> None:
        from policies import decisions

        policy = rig.holder.current["receipts"]
        review = decisions.after_unknown(policy, now=rig.clock(), handle_reliable=True)
        services.ledger.update(
            key,
            lambda job: job.record_unknown(
                reason="recovered by another daemon", decision=review, at=rig.clock()
            ),
        )
        resolved.append(services.resolve(key, Resolution.SENT, note="I see it", by="op"))

    hook = InsideTheGroup(rig, recovered_and_resolved, JobState.CONFIRMED)
    rig.engine.tick()
    human, size = hook.human, len(hook.group)
    assert human in hook.group and size > 1, hook.sizes
    assert hook.sizes[hook.at : hook.at + 1 + size] == [size] + [1] * size  # then each alone
    assert len(resolved) == 1 and rig.state(human) is resolved[0].state
    after_claim = ["Unknown", "Escalated", "Resolved", "Confirmed"]  # the human's only
    assert rig.names(human) == ["Requested", "Attempted", *after_claim]
    assert rig.of(human, "Confirmed")[0].via == ConfirmedVia.OPERATOR
    for key in KEYS:
        if key != human:
            assert rig.state(key) is JobState.CONFIRMED, rig.names(key)
        assert len(rig.of(key, "Attempted")) == 1 and emulator.copies(ids[key]) == 1
    rig.clock.advance(3600)
    rig.tick()
    assert rig.sends() == len(KEYS) and rig.names(human)[2:] == after_claim


SLOW = "slow-1"
HANG = 4.0  # the relay holds the send this long (real time) after Gmail took it
RETRY_1M = {"on_unknown": "retry", "search_after": "1m", "search_interval": "1m"}


def test_a_send_hanging_past_its_lease_is_found_by_another_daemons_search_not_resent(
    make_rig: RigFactory,  # noqa: F811
    relay: FaultRelay,
    emulator: GmailEmulator,  # noqa: F811
) -> None:
    """Gmail takes the message and the answer hangs; the first daemon's renewals stopped
    (a store it lost), so its lease lapses on the injected clock. A second daemon on the
    same store recovers the claim (Unknown) and, after `search_after`, searches while the
    answer still hangs (the first daemon's call still waiting for it, or ended by its
    lapsed lease as soon as it looks): the one copy is found and confirmed, nothing is
    sent again, and the first daemon's late answer writes nothing."""
    relay.hang_seconds = HANG
    relay.set_plan(FaultPlan(send=["hang"]))
    first = make_rig({"receipts": RETRY_1M})
    second = make_rig()  # another daemon: its own ledger and Google client, same store
    message_id = first.submit("receipts", SLOW)
    first.engine.leases.renew_due = lambda: 0  # type: ignore[method-assign]
    started = time.monotonic()
    first.engine.hand_out()
    assert first.engine.settle(busy=lambda: 1, timeout=10)
    for _ in range(500):  # the relay forwards, then holds the answer
        if emulator.copies(message_id) == 1:
            break
        time.sleep(0.01)
    assert first.sends() == 1 and emulator.copies(message_id) == 1
    # The first daemon lost its store: its outcome, once its call ends with its lease (the
    # clock moved past it below, shared with the second daemon), lands only after the
    # second daemon's recovery, however the threads are scheduled.
    recovered = threading.Event()
    save_jobs, save_job = first.ledger.save_jobs, first.ledger.save_job

    def lost_store_jobs(jobs: Sequence[SendJob], **kwargs: Any) -> None:
        recovered.wait(10)
        save_jobs(jobs, **kwargs)

    def lost_store_job(job: SendJob, **kwargs: Any) -> None:
        recovered.wait(10)
        save_job(job, **kwargs)

    first.ledger.save_jobs = lost_store_jobs  # type: ignore[method-assign]
    first.ledger.save_job = lost_store_job  # type: ignore[method-assign]
    first.clock.advance(DEADLINE + 1)
    assert second.tick().recovered == 1
    recovered.set()
    assert second.state(SLOW) is JobState.UNKNOWN
    for _ in range(3):
        second.advance_and_tick(61)  # past `search_after`, the call still out
    assert time.monotonic() - started < HANG, "the call ended before the search: raise HANG"
    # The first daemon's call is still out, or was ended by its lease once it noticed the
    # lease had passed on its clock (docs/architecture.md "Leases": a call ends with the
    # lease it holds); either way the search, not a resend, settles the job.
    assert second.state(SLOW) is JobState.CONFIRMED
    settled = second.names(SLOW)
    assert first.engine.settle(timeout=10)  # the late answer: a dropped connection
    assert not first.engine.leases.holds(SLOW)
    assert second.names(SLOW) == settled and settled.count("Confirmed") == 1
    for rig in (first, second):
        rig.advance_and_tick(3600)
    assert first.sends() == 1 and emulator.copies(message_id) == 1
    assert second.names(SLOW) == settled
