"""The step runner: what every engine step does around its own decision.

Load the job, check it is still due for the step (the index row that found it may be a
tick old), find its policy and provider, let the step record its events, save them with
optimistic concurrency, count. A version conflict or a refused transition means another
daemon or an operator moved the job first: the step is skipped, never retried blindly, and
the job's next due step is found by a later tick.

The runner calls the step; the step saves and counts through the `Work` it is handed
(`work.py`), never through the runner.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, TypeVar

from daemon.engine.clock import Clock
from daemon.engine.observer import EngineObserver, NullObserver
from daemon.engine.report import Counter
from daemon.engine.work import Step, Work, count_failure, provider_for
from daemon.providers.base import Provider
from ledger.application import Ledger
from ledger.job import SendJob

if TYPE_CHECKING:
    from daemon.engine.commit import GroupCommit
    from daemon.engine.policy_holder import PolicyHolder

T = TypeVar("T")


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
            policies = self._policies.current
            policy = policies.get(job.channel)
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
                policies=policies,
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


__all__ = ["StepRunner"]
