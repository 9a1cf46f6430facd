"""The step runner: what every engine step does around its own decision.

Load the job, check it is still due for the step (the index row that found it may be a
tick old), find its policy and provider, let the step record its events, save them with
optimistic concurrency, count. A version conflict or a refused transition means another
daemon or an operator moved the job first: the step is skipped, never retried blindly, and
the job's next due step is found by a later tick.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from daemon.engine.clock import Clock
from daemon.engine.commit import GroupCommit
from daemon.engine.observer import EngineObserver, NullObserver, notify
from daemon.engine.report import Count, Counter
from daemon.providers.base import Provider
from ledger.application import ConcurrentUpdate, Ledger, UnknownJob
from ledger.decision_types import Review
from ledger.job import SendJob, TransitionError
from ledger.stores.causes import StoreUnavailable
from ledger.vocabulary import JobState
from policies import decisions
from policies.model import ChannelPolicy

if TYPE_CHECKING:
    from daemon.engine.policy_holder import PolicyHolder

log = logging.getLogger("sendledger.engine")
T = TypeVar("T")


@dataclass
class Work:
    """One loaded job and what a step needs to act on it."""

    job: SendJob
    policy: ChannelPolicy | None
    provider: Provider | None
    now: datetime
    ledger: Ledger
    counter: Counter
    observer: EngineObserver = field(default_factory=NullObserver)
    #: How a save is made: the engine's group commit (`commit.py`), or `Ledger.save_job`.
    commits: GroupCommit | None = None
    #: The name of `provider`: the policy's, or the one the job's last attempt was made
    #: on (`provider_for`); empty when there is no policy.
    provider_name: str = ""
    _saved_state: JobState = field(init=False)

    def __post_init__(self) -> None:
        self._saved_state = self.job.state

    def count(self, name: Count) -> None:
        self.counter.bump(name)

    def save(self) -> None:
        """Append the events the step recorded (ConcurrentUpdate: another writer won)."""
        events = list(self.job.pending_events)
        if self.commits is None:
            self.ledger.save_job(self.job)
        else:
            self.commits.save(self.job)
        self.report_saved(events)

    def save_soon(
        self, then: Callable[[], None], *, always: Callable[[], None] | None = None
    ) -> None:
        """Save the step's events with the next commit, without waiting (`commit.py`:
        for what no call waits on); `then()` once they are durable, `always()` once they
        are durable or failed. A failure is counted as `save` would have made the step's
        guard count it."""
        events = list(self.job.pending_events)

        def saved(error: BaseException | None) -> None:
            try:
                if error is not None:
                    count_failure(self.job.key, error, self.counter, "the outcome's save")
                    return
                self.report_saved(events)
                then()
            finally:
                if always is not None:
                    always()

        if self.commits is None:
            try:
                self.ledger.save_job(self.job)
            except Exception as exc:
                saved(exc)
            else:
                saved(None)
        else:
            self.commits.save_soon(self.job, saved)

    def flush(self) -> None:
        """Wait until whatever `save_soon` left is durable."""
        if self.commits is not None:
            self.commits.flush()

    def report_saved(self, events: list[Any]) -> None:
        """Count and report what a save made durable."""
        before = self._saved_state
        self._saved_state = self.job.state
        notify(self.observer.saved, self.job, events)
        if self.job.state is JobState.REVIEW and before is not JobState.REVIEW:
            self.count("escalated")
            log.warning("job %s to review: %s", self.job.key, self.job.reason)
        elif self.job.state is JobState.CONFIRMED and before is not JobState.CONFIRMED:
            self.count("confirmed")
            log.info(
                "job %s confirmed (%s)", self.job.key, ", ".join(self.job.provider_message_ids)
            )

    def to_review(self, decision: Review, detail: str) -> None:
        self.job.escalate(decision, detail=detail, at=self.now)
        self.save()

    def policy_and_provider(self) -> tuple[ChannelPolicy, Provider] | None:
        """Both, or None: a job whose channel has no policy goes to review; a policy that
        names a provider this daemon does not have is a configuration error."""
        if self.policy is None:
            self.to_review(decisions.no_policy(self.job.channel), "no policy for the channel")
            return None
        if self.provider is None:
            log.error("job %s: provider %r is not configured", self.job.key, self.provider_name)
            self.count("errors")
            return None
        return self.policy, self.provider


class Step(Protocol):
    """One kind of work a tick does on the jobs of one state."""

    @property
    def state(self) -> JobState: ...

    def is_due(self, job: SendJob, now: datetime) -> bool: ...

    def run(self, work: Work) -> None: ...


def due(job: SendJob, now: datetime) -> bool:
    return job.due_at is not None and job.due_at <= now


class StepRunner:
    def __init__(
        self,
        ledger: Ledger,
        policies: PolicyHolder,
        providers: Mapping[str, Provider],
        clock: Clock,
        stopping: threading.Event,
        observer: EngineObserver | None = None,
        commits: GroupCommit | None = None,
        may_run: Callable[[Step, Work], bool] | None = None,
    ) -> None:
        """`may_run(step, work)`: whether this daemon may run `step` on the loaded job
        now (it owns the job's quota scope, `owners.py`); a job it may not is skipped."""
        self._ledger = ledger
        self._may_run = may_run
        self._commits = commits
        self._observer: EngineObserver = observer or NullObserver()
        self._policies = policies
        self._providers = providers
        self._clock = clock
        self._stopping = stopping

    def run(self, step: Step, key: str, counter: Counter) -> None:
        work = self.load(step, key, counter)
        if work is not None:
            self.guard(step, key, counter, lambda: step.run(work))

    def load(
        self, step: Step, key: str, counter: Counter, job: SendJob | None = None
    ) -> Work | None:
        """The job (read now, or as `job` was just read), if it is still due for the
        step, with its policy and provider."""
        if self._stopping.is_set():
            return None

        def load() -> Work | None:
            nonlocal job
            if job is None:
                job = self._ledger.get_job(key)
            now = self._clock()
            if job.state is not step.state or not step.is_due(job, now):
                return None
            policy = self._policies.current.get(job.channel)
            name = provider_for(job, policy)
            provider = None if name is None else self._providers.get(name)
            if provider is not None:
                # The job's own mailbox and thread (Gmail with user = "{from}").
                provider = provider.for_job(job.from_addr, job.content.thread_id)
            work = Work(
                job,
                policy,
                provider,
                now,
                self._ledger,
                counter,
                self._observer,
                self._commits,
                provider_name=name or "",
            )
            if self._may_run is not None and not self._may_run(step, work):
                return None
            return work

        return self.guard(step, key, counter, load)

    def guard(self, step: Step, key: str, counter: Counter, action: Callable[[], T]) -> T | None:
        """`action()`, or None when it failed: a conflict or refused transition is a
        skip, anything else an error; neither stops the tick."""
        try:
            return action()
        except Exception as exc:
            count_failure(key, exc, counter, type(step).__name__)
        return None


def provider_for(job: SendJob, policy: ChannelPolicy | None) -> str | None:
    """The provider a step acts on for `job`: the policy's for a send, but once an
    attempt was made, the one it was made on (`Attempted.provider`) for everything that
    follows it (the search, the history read, the draft check, the verification, the
    tidy): a copy sent there is only found there, and a channel moved to another provider
    by a reload must not make the old attempt's misses believed and the job sent twice.
    None without a policy (the job goes to review)."""
    if policy is None:
        return None
    if job.state is not JobState.REQUESTED and job.last_provider is not None:
        return job.last_provider
    return policy.provider


def count_failure(key: str, exc: BaseException, counter: Counter, where: str) -> None:
    """A step that failed: a conflict or refused transition is a skip (another writer
    moved the job first), anything else an error."""
    if isinstance(exc, ConcurrentUpdate | TransitionError | UnknownJob):
        log.debug("job %s skipped: %s", key, exc)
        counter.bump("skipped")
    elif isinstance(exc, StoreUnavailable):
        # A full disk or a read-only store fails every due job at every tick: its one
        # line names the store and why; a traceback each time would bury it.
        log.error("job %s: %s failed: %s", key, where, exc)
        counter.bump("errors")
    else:
        log.error("job %s: unexpected failure in %s", key, where, exc_info=exc)
        counter.bump("errors")
