"""What a step acts on: one loaded job and the means to save and count what it does.

The step runner (`runner.py`) loads the job into a `Work` and hands it to a step
(`dispatch.py`, `search.py`, ...); the step records its events on the job, then saves
and counts through the `Work`. A step calls this module, which calls no step back but
for one: the `then` a step hands `save_soon` to report an outcome saved with the next
commit, which the commit calls (`commit.py`), or this module at once when the engine has
no group commit (unit tests, bench/pipeline.py: one_commit_per_save).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from daemon.engine.commit import GroupCommit, LeftToRecovery, Then
from daemon.engine.observer import EngineObserver, NullObserver, notify
from daemon.engine.report import Count, Counter
from daemon.providers.base import Provider
from ledger.application import ConcurrentUpdate, Ledger, UnknownJob
from ledger.decision_types import Review
from ledger.display import quoted
from ledger.job import FACTS, SendJob, TransitionError
from ledger.stores.causes import StoreUnavailable
from ledger.stores.index import Withdrawn
from ledger.stores.unchanged import Unchanged
from ledger.vocabulary import JobState
from policies import decisions
from policies.model import ChannelPolicy

if TYPE_CHECKING:
    from policies.loader import PolicySet

log = logging.getLogger("sendledger.engine")


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
    #: The set `policy` was read from (`PolicyHolder.current` then; None: not known): a
    #: step tells a reload since by it (`Dispatch._reloaded`).
    policies: PolicySet | None = None
    #: What the next save's decision was made on, as read from the store (the provider's
    #: handle unmarked): that save holds to it (`Ledger.save_job`), and it alone.
    unchanged: Unchanged | None = None
    _saved_state: JobState = field(init=False)

    def __post_init__(self) -> None:
        self._saved_state = self.job.state

    def count(self, name: Count) -> None:
        self.counter.bump(name)

    def save(self) -> None:
        """Append the events the step recorded (ConcurrentUpdate: another writer won;
        `Changed`: what `unchanged` names changed since it was read, nothing stored)."""
        events = list(self.job.pending_events)
        unchanged, self.unchanged = self.unchanged, None  # the next save's is another's
        if unchanged is not None and self.commits is not None:
            # Alone, not in a batch: another job's save never withdrawn with it; what
            # waits for a commit is made durable first, and a stop's window holds.
            self.commits.save_alone(self.job, unchanged)
        elif unchanged is not None:
            self.ledger.save_job(self.job, unchanged=unchanged)
        elif self.commits is None:
            self.ledger.save_job(self.job)
        else:
            self.commits.save(self.job)
        self.report_saved(events)

    def beside_facts(self, seen: int) -> bool:
        """After the step's save conflicted: whether the other writers appended only
        facts beside the job's state since version `seen` (`FACTS`: a person's check,
        drafts deleted). The job as they left it is then this Work's, for the step to
        record its answer again on it: what it learnt and did at the provider still
        holds. False after anything else (a decision, an attempt): the job untouched."""
        now = self.ledger.get_job(self.job.key)
        if any(not isinstance(e, FACTS) for e in self.ledger.history(now.key)[seen : now.version]):
            return False
        self.job = now
        return True

    def save_soon(self, then: Then) -> None:
        """Save the step's events with the next commit, without waiting (`commit.py`:
        for what no call waits on); `then(error)` once they are durable (None) or failed,
        on the committing thread. The step's own `then` reports them (`report_saved`)."""
        if self.commits is None:
            try:
                self.ledger.save_job(self.job)
            except Exception as exc:
                then(exc)
            else:
                then(None)
        else:
            self.commits.save_soon(self.job, then)

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
            log.warning("job %s to review: %s", self.job.key, quoted(self.job.reason))
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
    elif isinstance(exc, StoreUnavailable | LeftToRecovery | Withdrawn):
        # A full disk or a read-only store fails every due job at every tick: its one
        # line names the store and why; a traceback each time would bury it. So does a
        # save a stopping daemon left to recovery or whose wait it gave up (`commit.py`).
        log.error("job %s: %s failed: %s", key, where, quoted(exc))
        counter.bump("errors")
    else:
        log.error("job %s: unexpected failure in %s", key, where, exc_info=exc)
        counter.bump("errors")


__all__ = ["Step", "Work", "count_failure", "due", "provider_for"]
