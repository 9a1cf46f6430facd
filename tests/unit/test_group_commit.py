"""Group commit (daemon/engine/commit.py): the saves of several workers in one
transaction, and per job exactly what a save of its own would have done.

Another writer is made to act at the worst moment - after the engine loaded its jobs and
before a commit - by wrapping `Ledger.save_jobs` and `Ledger.save_job`; copies are counted
in the fake provider's mailbox.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.unit.engine_rig import DAEMON, EngineRig, claimed_by, policy

from daemon.doubles.fake_drafts import FakeDraftsProvider
from daemon.engine import commit as commit_module
from daemon.engine.commit import GroupCommit, _Save
from ledger.application import ConcurrentUpdate, Ledger
from ledger.job import SendJob
from ledger.vocabulary import JobState

RETRY = policy("receipts", on_unknown="retry")


@pytest.fixture
def rig() -> Iterator[EngineRig]:
    rig = EngineRig(RETRY)
    yield rig
    rig.close()


def other_daemon_claims(ledger: Ledger, key: str) -> None:
    """What another daemon's dispatch writes: its claim, with no call of ours."""
    ledger.save_job(claimed_by(ledger, key, "other"))


class SaveHook:
    """Wraps `ledger.save_jobs` and `ledger.save_job` (the engine's commits): counts the
    commits and their sizes and, before commit number `at`, lets `act` write as another
    writer would."""

    def __init__(
        self,
        ledger: Ledger,
        at: int,
        act: Callable[[Sequence[SendJob]], object],
        *,
        pause: threading.Event | None = None,
    ) -> None:
        self.calls: list[int] = []
        self._lock = threading.Lock()
        self._save_jobs, self._save_job = ledger.save_jobs, ledger.save_job
        self._at = at
        self._act = act
        self._pause = pause
        ledger.save_jobs = self  # type: ignore[method-assign]
        ledger.save_job = lambda job, **kwargs: self([job], **kwargs)  # type: ignore[method-assign]

    def __call__(self, jobs: Sequence[SendJob], **kwargs: Any) -> None:
        with self._lock:
            self.calls.append(len(jobs))
            number = len(self.calls)
        if number == self._at:
            self._act(jobs)
        if number == 1 and self._pause is not None:
            self._pause.wait(5)  # the first commit is slow: the others queue behind it
        if len(jobs) == 1:
            self._save_job(jobs[0], **kwargs)
        else:
            self._save_jobs(jobs, **kwargs)


def test_saves_that_arrive_during_a_commit_share_the_next_one(rig: EngineRig) -> None:
    for n in range(6):
        rig.submit("receipts", f"k{n}")
    jobs = [claimed_by(rig.ledger, f"k{n}", "me") for n in range(6)]
    release = threading.Event()
    hook = SaveHook(rig.ledger, 0, lambda jobs: None, pause=release)
    commits = GroupCommit(rig.ledger)
    threads = [threading.Thread(target=commits.save, args=(job,)) for job in jobs]
    threads[0].start()
    while not hook.calls:
        time.sleep(0.001)
    for thread in threads[1:]:
        thread.start()
    while len(commits._waiting) < 5:
        time.sleep(0.001)
    release.set()
    for thread in threads:
        thread.join()
    assert hook.calls == [1, 5]  # the first alone, the five that waited behind it in one
    assert all(rig.job(job.key).state is JobState.ATTEMPTED for job in jobs)


def test_a_commit_that_meets_another_writer_fails_only_that_job(rig: EngineRig) -> None:
    rig.submit("receipts", "k0")
    rig.submit("receipts", "k1")
    mine = [claimed_by(rig.ledger, "k0", "me"), claimed_by(rig.ledger, "k1", "me")]
    other_daemon_claims(rig.ledger, "k1")
    commits = GroupCommit(rig.ledger)
    batch = [_Save(job) for job in mine]
    commits._commit(batch)
    assert batch[0].error is None and isinstance(batch[1].error, ConcurrentUpdate)
    assert rig.job("k0").claimed_by == "me" and rig.job("k1").claimed_by == "other"


def test_a_claim_that_meets_another_writer_is_not_sent(rig: EngineRig) -> None:
    rig.submit("receipts", "k0")
    rig.submit("receipts", "k1")

    def claimed_by_another(jobs: Sequence[SendJob]) -> None:
        for job in jobs:
            other_daemon_claims(rig.ledger, job.key)

    SaveHook(rig.ledger, 1, claimed_by_another)
    report = rig.tick()
    # The first commit held one claim (k0 or k1): the other writer took it first.
    assert rig.provider.sends == 1 and report.sent == 1 and report.skipped == 1
    states = sorted((rig.job(k).claimed_by, rig.job(k).state.value) for k in ("k0", "k1"))
    assert states == [("other", "attempted"), (DAEMON, "confirmed")]


def test_an_outcome_that_meets_another_writer_leaves_the_other_writers_events(
    rig: EngineRig,
) -> None:
    rig.submit("receipts", "k0")

    def recovered_elsewhere(jobs: Sequence[SendJob]) -> None:
        # Another daemon's recovery (its deadline passed, say) records Unknown first.
        job = rig.ledger.get_job("k0")
        job.record_unknown(
            reason="recovered elsewhere",
            decision=retry_search(rig),
            at=rig.clock(),
        )
        rig.ledger.save_job(job)

    SaveHook(rig.ledger, 2, recovered_elsewhere)  # commit 1: the claim; 2: the outcome
    report = rig.tick()
    assert rig.provider.sends == 1 and report.sent == 1 and report.skipped == 1
    # The response lost to the other writer: its Unknown stands, a search will count
    # the one copy our call made.
    assert rig.job("k0").state is JobState.UNKNOWN and rig.copies("k0") == 1


def retry_search(rig: EngineRig) -> Any:
    from policies import decisions

    return decisions.after_unknown(RETRY, now=rig.clock(), handle_reliable=True)


def test_a_store_failure_on_the_claim_save_sends_nothing(rig: EngineRig) -> None:
    rig.submit("receipts", "k0")
    rig.submit("receipts", "k1")
    failed: list[int] = []

    def fail(jobs: Sequence[SendJob]) -> None:
        failed.append(len(jobs))
        raise OSError("disk full")

    hook = SaveHook(rig.ledger, 1, fail)
    report = rig.engine.tick()
    assert report.errors == failed[0]  # every claim of the failed commit
    assert rig.provider.sends == 2 - failed[0] and len(hook.calls) >= 1
    # The next tick sends the rest (the failure wrote nothing).
    rig.tick()
    assert rig.provider.sends == 2
    assert all(rig.job(k).state is JobState.CONFIRMED for k in ("k0", "k1"))


@settings(max_examples=40, deadline=None)
@given(
    jobs=st.integers(1, 9),
    concurrency=st.integers(1, 4),
    taken=st.sets(st.integers(0, 8)),
    commit=st.integers(1, 6),
)
def test_jobs_another_writer_claims_before_a_commit_are_never_sent_by_it(
    jobs: int, concurrency: int, taken: set[int], commit: int
) -> None:
    """Whichever jobs another writer claims just before commit number `commit` (those of
    the commit and others): none of them is sent by this engine, every other job is sent
    exactly once, and each job has as many Attempted events as calls were made for it plus
    the other writer's claims."""
    rig = EngineRig(RETRY, concurrency=concurrency)
    try:
        keys = [f"k{n}" for n in range(jobs)]
        for key in keys:
            rig.submit("receipts", key)
        wanted = sorted(keys[n] for n in taken if n < jobs)
        stolen: set[str] = set()

        def steal(_jobs: Sequence[SendJob]) -> None:
            for key in wanted:
                if rig.ledger.get_job(key).state is JobState.REQUESTED:  # not ours already
                    other_daemon_claims(rig.ledger, key)
                    stolen.add(key)

        SaveHook(rig.ledger, commit, steal)
        rig.tick()
        for key in keys:
            attempted = rig.events(key).count("Attempted")
            ours = rig.provider.sends_by_message_id[rig.job(key).message_id]
            if key in stolen:
                assert ours == 0 and attempted == 1 and rig.job(key).claimed_by == "other"
            else:
                assert ours == 1 == attempted and rig.job(key).state is JobState.CONFIRMED
    finally:
        rig.close()


def test_save_jobs_is_all_or_nothing_and_keeps_pending_events(rig: EngineRig) -> None:
    rig.submit("receipts", "k0")
    rig.submit("receipts", "k1")
    mine = [claimed_by(rig.ledger, "k0", "me"), claimed_by(rig.ledger, "k1", "me")]
    other_daemon_claims(rig.ledger, "k1")
    with pytest.raises(ConcurrentUpdate):
        rig.ledger.save_jobs(mine)
    assert rig.job("k0").state is JobState.REQUESTED  # nothing of the batch was written
    assert [len(job.pending_events) for job in mine] == [1, 1]
    rig.ledger.save_job(mine[0])  # alone, the one nobody else touched is written
    assert rig.job("k0").claimed_by == "me" and mine[0].pending_events == []


# -- an outcome rides on the next commit (`GroupCommit.save_soon`) ------------------------


def test_a_send_outcome_shares_the_commit_of_the_workers_next_claim() -> None:
    rig = EngineRig(RETRY, concurrency=1)
    try:
        for n in range(3):
            rig.submit("receipts", f"k{n}")
        hook = SaveHook(rig.ledger, 0, lambda jobs: None)
        report = rig.tick()
        # claim k0; outcome k0 + claim k1; outcome k1 + claim k2; outcome k2 (the flush
        # before the worker sleeps): 4 transactions for 3 jobs, not 6.
        assert hook.calls == [1, 2, 2, 1]
        assert report.confirmed == 3 and report.sent == 3
        assert all(rig.job(f"k{n}").state is JobState.CONFIRMED for n in range(3))
    finally:
        rig.close()


@settings(max_examples=15, deadline=None)
@given(jobs=st.integers(1, 12), concurrency=st.integers(1, 4))
def test_every_claim_is_stored_before_its_call(jobs: int, concurrency: int) -> None:
    """Invariant 1 with outcomes left to the next commit: at the moment of each call the
    store already holds this daemon's claim on the job, and after the tick every outcome
    is stored."""
    rig = EngineRig(RETRY, concurrency=concurrency)
    try:
        keys = {rig.submit("receipts", f"k{n}"): f"k{n}" for n in range(jobs)}
        seen: list[tuple[JobState, str | None]] = []
        send = rig.provider.send_raw

        def checked_send(raw: bytes) -> Any:
            message_id = next(mid for mid in keys if mid.encode() in raw)
            stored = rig.ledger.get_job(keys[message_id])
            seen.append((stored.state, stored.claimed_by))
            return send(raw)

        rig.provider.send_raw = checked_send  # type: ignore[method-assign]
        report = rig.tick()
        assert seen == [(JobState.ATTEMPTED, DAEMON)] * jobs
        assert report.confirmed == jobs
        assert all(rig.job(key).state is JobState.CONFIRMED for key in keys.values())
    finally:
        rig.close()


def test_save_soon_waits_for_the_next_commit_or_a_flush(rig: EngineRig) -> None:
    for n in range(2):
        rig.submit("receipts", f"k{n}")
    hook = SaveHook(rig.ledger, 0, lambda jobs: None)
    commits = GroupCommit(rig.ledger)
    told: list[BaseException | None] = []
    commits.save_soon(claimed_by(rig.ledger, "k0", "me"), told.append)
    assert told == [] and rig.job("k0").state is JobState.REQUESTED  # nothing written yet
    commits.save(claimed_by(rig.ledger, "k1", "me"))
    assert hook.calls == [2] and told == [None]
    assert rig.job("k0").claimed_by == "me" == rig.job("k1").claimed_by
    commits.flush()  # nothing left: no transaction
    assert hook.calls == [2]


def test_save_soon_reports_a_conflict_to_its_caller_only(rig: EngineRig) -> None:
    rig.submit("receipts", "k0")
    rig.submit("receipts", "k1")
    commits = GroupCommit(rig.ledger)
    told: list[BaseException | None] = []
    commits.save_soon(claimed_by(rig.ledger, "k0", "me"), told.append)
    other_daemon_claims(rig.ledger, "k0")
    commits.save(claimed_by(rig.ledger, "k1", "me"))  # does not raise: k1 is saved
    assert len(told) == 1 and isinstance(told[0], ConcurrentUpdate)
    assert rig.job("k0").claimed_by == "other" and rig.job("k1").claimed_by == "me"


def test_save_soon_without_deferral_saves_at_once(rig: EngineRig) -> None:
    rig.submit("receipts", "k0")
    commits = GroupCommit(rig.ledger, defer=False)
    told: list[BaseException | None] = []
    commits.save_soon(claimed_by(rig.ledger, "k0", "me"), told.append)
    assert told == [None] and rig.job("k0").claimed_by == "me"


def test_no_outcome_waits_behind_a_draft_step() -> None:
    """On a drafts provider the next job's claim starts with a provider call (find or
    create its draft) that may take its whole timeout: the previous job's outcome, left for
    the next commit, is durable before that call starts, not after it."""
    rig = EngineRig(RETRY, concurrency=1)
    try:
        rig.engine.close()
        rig.provider = FakeDraftsProvider("fake", clock=rig.clock)
        rig.engine = rig.new_engine()
        for n in range(3):
            rig.submit("receipts", f"k{n}")
        stored_before_create: list[list[JobState]] = []
        create = rig.provider.create_draft

        def watched_create(raw: bytes) -> Any:
            rows = [rig.ledger.get_job(f"k{n}").state for n in range(3)]
            stored_before_create.append(rows)
            return create(raw)

        rig.provider.create_draft = watched_create  # type: ignore[method-assign]
        report = rig.tick()
        assert report.confirmed == 3
        settled = [s for s in stored_before_create if JobState.ATTEMPTED in s]
        assert settled == [], stored_before_create  # no outcome was still in memory
    finally:
        rig.close()


class OnTheWay:
    """A worker whose claim is on its way (`GroupCommit.coming`) until `arrive` or
    `give_up` lets it save its claim, or end its block without one."""

    def __init__(self, commits: GroupCommit, job: SendJob, *, flush: bool = False) -> None:
        self._go = threading.Event()
        self._announced = threading.Event()
        self._save = True
        self._flush = flush
        self._thread = threading.Thread(target=self._work, args=(commits, job))
        self._thread.start()
        assert self._announced.wait(5)

    def _work(self, commits: GroupCommit, job: SendJob) -> None:
        with commits.coming():
            if self._flush:  # before a draft step's call, say
                commits.flush()
            self._announced.set()
            assert self._go.wait(5)
            if self._save:
                commits.save(job)

    def arrive(self) -> None:
        self._go.set()
        self._thread.join(5)

    def give_up(self) -> None:
        self._save = False
        self.arrive()


class Gathering:
    """The group commit's clock: real seconds, and an event set once a commit has started
    gathering (the gathering is the only reader of that clock)."""

    def __init__(self) -> None:
        self.started = threading.Event()

    def __call__(self) -> float:
        self.started.set()
        return time.monotonic()


def save_in_thread(commits: GroupCommit, job: SendJob) -> threading.Thread:
    thread = threading.Thread(target=commits.save, args=(job,))
    thread.start()
    return thread


def test_a_commit_waits_for_the_claims_on_their_way_and_commits_when_they_arrive(
    rig: EngineRig,
) -> None:
    """A worker rendering its claim when another's commit starts: the commit waits for it
    (well within a long window) and both claims are durable in one transaction."""
    for n in range(2):
        rig.submit("receipts", f"k{n}")
    jobs = [claimed_by(rig.ledger, f"k{n}", "me") for n in range(2)]
    hook = SaveHook(rig.ledger, 0, lambda jobs: None)
    gathering = Gathering()
    commits = GroupCommit(rig.ledger, window=5.0, clock=gathering)
    other = OnTheWay(commits, jobs[1])
    started = time.monotonic()
    first = save_in_thread(commits, jobs[0])
    assert gathering.started.wait(5)
    other.arrive()
    first.join(5)
    assert hook.calls == [2] and commits.gathered == 1
    assert time.monotonic() - started < 4.0  # done when the claim came, not at the window
    assert all(rig.job(job.key).state is JobState.ATTEMPTED for job in jobs)


def test_a_commit_stops_waiting_for_a_worker_that_makes_no_claim(rig: EngineRig) -> None:
    for n in range(2):
        rig.submit("receipts", f"k{n}")
    hook = SaveHook(rig.ledger, 0, lambda jobs: None)
    gathering = Gathering()
    commits = GroupCommit(rig.ledger, window=5.0, clock=gathering)
    other = OnTheWay(commits, claimed_by(rig.ledger, "k0", "other"))  # never saved
    started = time.monotonic()
    first = save_in_thread(commits, claimed_by(rig.ledger, "k1", "me"))
    assert gathering.started.wait(5)
    other.give_up()  # its job was not to be sent now: no claim
    first.join(5)
    assert hook.calls == [1] and time.monotonic() - started < 4.0
    assert rig.job("k1").claimed_by == "me"


def test_a_worker_that_flushes_before_a_call_is_no_longer_waited_for(rig: EngineRig) -> None:
    """A worker whose claim needs a provider call first (a draft step, a history mark's
    fetch) flushes before it: its claim may be that call's timeout away, so a commit
    starting meanwhile does not wait for it."""
    for n in range(2):
        rig.submit("receipts", f"k{n}")
    hook = SaveHook(rig.ledger, 0, lambda jobs: None)
    commits = GroupCommit(rig.ledger, window=5.0, busy=lambda: False)
    other = OnTheWay(commits, claimed_by(rig.ledger, "k1", "me"), flush=True)
    started = time.monotonic()
    commits.save(claimed_by(rig.ledger, "k0", "me"))
    assert hook.calls == [1] and time.monotonic() - started < 4.0
    other.arrive()
    assert hook.calls == [1, 1]


def test_a_gathering_commit_waits_no_longer_than_its_window(rig: EngineRig) -> None:
    for n in range(2):
        rig.submit("receipts", f"k{n}")
    hook = SaveHook(rig.ledger, 0, lambda jobs: None)
    commits = GroupCommit(rig.ledger, window=0.2)
    other = OnTheWay(commits, claimed_by(rig.ledger, "k1", "me"))  # a draft step, say
    started = time.monotonic()
    commits.save(claimed_by(rig.ledger, "k0", "me"))
    waited = time.monotonic() - started
    assert hook.calls == [1] and commits.gathered == 1
    assert 0.19 <= waited < 5.0
    assert rig.job("k0").claimed_by == "me"  # durable when save returns, as always
    other.arrive()
    assert hook.calls == [1, 1]


def test_no_commit_gathers_when_no_claim_is_on_its_way(rig: EngineRig) -> None:
    """Saves one after the other, or from workers that announced nothing (in their calls):
    each commit starts at once, however long the window."""
    for n in range(2):
        rig.submit("receipts", f"k{n}")
    hook = SaveHook(rig.ledger, 0, lambda jobs: None)
    commits = GroupCommit(rig.ledger, window=60.0, clock=lambda: 0.0)  # time stands still
    for n in range(2):
        with commits.coming():
            commits.save(claimed_by(rig.ledger, f"k{n}", "me"))  # its own claim, arrived
    assert hook.calls == [1, 1] and commits.gathered == 0


def test_a_claim_is_not_held_for_a_worker_in_its_call() -> None:
    """Two send workers on a machine with cores to spare: one is in its provider call,
    which returns only once the other's claim is durable. The other's commit must not wait
    for the worker in its call (whose next claim is a whole call away): it commits at
    once, whatever the window."""
    rig = EngineRig(RETRY, concurrency=2)
    try:
        rig.engine.commits.window = 5.0
        rig.engine.commits.busy = lambda: False  # cores to spare, whatever the load here
        for n in range(2):
            rig.submit("receipts", f"k{n}")
        send = rig.provider.send_raw
        stored = threading.Event()
        waited: list[float] = []

        def first_call_waits(raw: bytes) -> Any:
            if not waited:
                started = time.monotonic()
                waited.append(0.0)
                for _ in range(400):  # the other job's claim, durable meanwhile
                    if all(rig.job(f"k{n}").state is not JobState.REQUESTED for n in range(2)):
                        stored.set()
                        break
                    time.sleep(0.005)
                waited[0] = time.monotonic() - started
            return send(raw)

        rig.provider.send_raw = first_call_waits  # type: ignore[method-assign]
        report = rig.tick()
        assert stored.is_set() and waited[0] < 1.5
        assert report.confirmed == 2
    finally:
        rig.close()


def test_on_a_busy_machine_a_commit_gathers_every_workers_claim(rig: EngineRig) -> None:
    """CPU scarce: while saves arrive less than two windows apart, the first of several
    waits until every saver has its claim in (well before the window ends), none of them
    announced, and all are durable together: one transaction for three claims."""
    for n in range(4):
        rig.submit("receipts", f"k{n}")
    jobs = [claimed_by(rig.ledger, f"k{n}", "me") for n in range(4)]
    hook = SaveHook(rig.ledger, 0, lambda jobs: None)
    commits = GroupCommit(rig.ledger, savers=3, window=5.0, busy=lambda: True)
    commits.save(jobs[0])  # the first save knows no gap yet: committed at once
    assert hook.calls == [1] and commits.gathered == 0
    started = time.monotonic()
    threads = [save_in_thread(commits, job) for job in jobs[1:]]
    for thread in threads:
        thread.join()
    assert hook.calls == [1, 3] and commits.gathered == 1
    assert time.monotonic() - started < 4.0  # done when the third came, not at the window
    assert all(rig.job(job.key).state is JobState.ATTEMPTED for job in jobs)


class CountedWaits(threading.Condition):
    """The gathering commit's condition, counting its waits: each wait after the first
    is a wake-up that found its commit could not start yet."""

    def __init__(self, lock: threading.Lock) -> None:
        super().__init__(lock)
        self.waits = 0

    def wait(self, timeout: float | None = None) -> bool:
        self.waits += 1
        return super().wait(timeout)


def test_a_gathering_commit_is_woken_once_every_claim_is_in(rig: EngineRig) -> None:
    """On a busy machine the first of four savers gathers the other three's claims: it is
    woken once, when the last is in, not at every arrival (each wake-up a thread switch
    that finds nothing to do)."""
    for n in range(5):
        rig.submit("receipts", f"k{n}")
    jobs = [claimed_by(rig.ledger, f"k{n}", "me") for n in range(5)]
    hook = SaveHook(rig.ledger, 0, lambda jobs: None)
    commits = GroupCommit(rig.ledger, savers=4, window=5.0, busy=lambda: True)
    counted = commits._arrivals = CountedWaits(commits._lock)
    commits.save(jobs[0])  # the first save knows no gap yet: committed at once
    threads = []
    for job in jobs[1:]:
        threads.append(save_in_thread(commits, job))
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # this one's save waits with the others'
            with commits._lock:
                if len(commits._waiting) == len(threads):
                    break
            time.sleep(0.001)
        time.sleep(0.02)  # a gatherer woken by this arrival would wait again meanwhile
    for thread in threads:
        thread.join(5)
    assert hook.calls == [1, 4] and commits.gathered == 1
    assert counted.waits == 1


def test_on_a_busy_machine_no_commit_gathers_when_saves_come_far_apart(
    rig: EngineRig,
) -> None:
    for n in range(2):
        rig.submit("receipts", f"k{n}")
    hook = SaveHook(rig.ledger, 0, lambda jobs: None)
    seconds = iter(range(100))
    apart = GroupCommit(
        rig.ledger, savers=4, window=0.002, clock=lambda: float(next(seconds)), busy=lambda: True
    )
    apart.save(claimed_by(rig.ledger, "k0", "me"))
    apart.save(claimed_by(rig.ledger, "k1", "me"))  # a second after the last: no wait
    assert hook.calls == [1, 1] and apart.gathered == 0


def test_with_cores_to_spare_a_commit_does_not_wait_for_unannounced_savers(
    rig: EngineRig,
) -> None:
    """The same close saves as on a busy machine, nobody's claim on its way: each commit
    starts at once."""
    for n in range(3):
        rig.submit("receipts", f"k{n}")
    hook = SaveHook(rig.ledger, 0, lambda jobs: None)
    commits = GroupCommit(rig.ledger, savers=4, window=60.0, busy=lambda: False)
    for n in range(3):
        commits.save(claimed_by(rig.ledger, f"k{n}", "me"))
    assert hook.calls == [1, 1, 1] and commits.gathered == 0


def test_the_machine_is_busy_when_its_load_exceeds_its_cores(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cores = commit_module._cpus()
    load = [cores + 0.5]
    monkeypatch.setattr("daemon.engine.commit.os.getloadavg", lambda: (load[0], 0.0, 0.0))
    assert commit_module.machine_busy()
    load[0] = float(cores)
    assert not commit_module.machine_busy()


def test_the_load_is_read_at_most_once_a_second(monkeypatch: pytest.MonkeyPatch) -> None:
    reads: list[int] = []

    def loadavg() -> tuple[float, float, float]:
        reads.append(1)
        return (1000.0, 0.0, 0.0)

    monkeypatch.setattr("daemon.engine.commit.os.getloadavg", loadavg)
    now = [0.0]
    watch = commit_module._LoadWatch(lambda: now[0])
    assert watch() and watch()
    now[0] = commit_module.LOAD_FOR - 0.001
    assert watch() and len(reads) == 1
    now[0] = commit_module.LOAD_FOR
    assert watch() and len(reads) == 2


def test_an_outcome_whose_save_fails_after_the_call_is_recovered_never_resent(
    rig: EngineRig,
) -> None:
    """The call succeeded, then the store failed on the commit holding its outcome: the
    outcome is not kept in memory; the claim stays durable, its lease is released, and
    recovery at the deadline searches and finds the one copy instead of sending again."""
    rig.submit("receipts", "k0")

    def fail(jobs: Sequence[SendJob]) -> None:
        raise OSError("disk full")

    SaveHook(rig.ledger, 2, fail)  # commit 1: the claim; 2: the outcome
    report = rig.engine.tick()
    assert rig.provider.sends == 1 and report.errors == 1
    assert rig.job("k0").state is JobState.ATTEMPTED
    for _ in range(6):
        rig.advance_and_tick(600)
    assert rig.provider.sends == 1 and rig.copies("k0") == 1
    assert rig.job("k0").state is JobState.CONFIRMED


def test_every_outcome_of_a_failed_group_is_told_once_with_its_own_answer(
    rig: EngineRig,
) -> None:
    """A group's transaction fails (one job met another writer); each save is tried
    alone: each `then` runs exactly once, with its own job's answer, and the caller who
    waited is told only of its own."""
    keys = [f"k{n}" for n in range(4)]
    for key in keys:
        rig.submit("receipts", key)
    commits = GroupCommit(rig.ledger)
    told: dict[str, list[BaseException | None]] = {key: [] for key in keys[:3]}
    for key in keys[:3]:
        commits.save_soon(claimed_by(rig.ledger, key, "me"), told[key].append)
    other_daemon_claims(rig.ledger, "k1")
    hook = SaveHook(rig.ledger, 0, lambda jobs: None)
    commits.save(claimed_by(rig.ledger, "k3", "me"))  # does not raise: k3 is saved
    commits.flush()
    assert hook.calls == [4, 1, 1, 1, 1]  # the group, then each alone
    assert told["k0"] == [None] and told["k2"] == [None]
    assert len(told["k1"]) == 1 and isinstance(told["k1"][0], ConcurrentUpdate)
    owners = [rig.job(key).claimed_by for key in keys]
    assert owners == ["me", "other", "me", "me"]
