"""The engine: one tick runs four steps over the jobs that are due.

dispatch (requested) -> recover (attempted past its deadline) -> sweep (unknown, search
due) -> verify (confirmed after a resend, count due). Each step reads the job index for
its due jobs only, so a tick's work grows with what is due, not with the history; the
jobs of a step run on a small thread pool because provider calls wait on the network.
Dispatch uses group commit (`wave.py`): the claims that refill the free workers and the
outcomes of the calls that returned are saved in one transaction.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor

from daemon.engine.clock import Clock
from daemon.engine.dispatch import Dispatch
from daemon.engine.health import ProviderHealth
from daemon.engine.observer import EngineObserver, NullObserver, ObservedProvider, notify
from daemon.engine.policy_holder import PolicyHolder
from daemon.engine.recover import Recover, RecoverOwnClaims
from daemon.engine.report import Counter, TickReport
from daemon.engine.runner import Step, StepRunner
from daemon.engine.search import SearchBackoff, Sweep, Verify
from daemon.engine.wave import DispatchWave
from daemon.providers.base import Provider
from ledger.application import Ledger


class Engine:
    def __init__(
        self,
        ledger: Ledger,
        policies: PolicyHolder,
        providers: Mapping[str, Provider],
        *,
        provider_timeouts: Mapping[str, float],
        clock: Clock | None = None,
        concurrency: int = 4,
        batch_size: int = 200,
        deadline_grace: float = 30.0,
        rng: random.Random | None = None,
        observer: EngineObserver | None = None,
        daemon_name: str = "",
    ) -> None:
        self.ledger = ledger
        self.daemon_name = daemon_name
        self.policies = policies
        self.providers = providers
        self.clock: Clock = clock or ledger.clock
        self.batch_size = batch_size
        self.health = ProviderHealth(ledger, self.clock)
        self._stopping = threading.Event()
        self.observer: EngineObserver = observer or NullObserver()
        # Only the steps' calls are timed: `providers` stays what the caller gave.
        called: Mapping[str, Provider] = (
            providers
            if observer is None
            else {name: ObservedProvider(p, observer) for name, p in providers.items()}
        )
        self._runner = StepRunner(
            ledger, policies, called, self.clock, self._stopping, self.observer
        )
        backoff = SearchBackoff()
        self._dispatch = Dispatch(
            self.health,
            self.clock,
            provider_timeouts=provider_timeouts,
            deadline_grace=deadline_grace,
            rng=rng or random.Random(),
            stopping=self._stopping,
            daemon=daemon_name,
        )
        self._steps: tuple[Step, ...] = (
            self._dispatch,
            Recover(self.health),
            Sweep(self.health, backoff, self.clock),
            Verify(backoff, self.clock),
        )
        self._pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="send")
        # At most `concurrency` claims out: every claimed job has a worker at once.
        self._waves = DispatchWave(ledger, self._runner, self._dispatch, self._pool, concurrency)

    def stop(self) -> None:
        """Start no new provider call; the ones in flight finish and are recorded."""
        self._stopping.set()

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def unreliable_providers(self) -> list[str]:
        return self.health.unreliable()

    def recover_own_claims(self) -> TickReport:
        """At start-up, with this daemon's name held (`Ledger.hold_identity`): its own
        claims left by an earlier process have no call in flight; Unknown now."""
        counter = Counter()
        self.health.refresh(self.providers)
        step = RecoverOwnClaims(self.health, self.daemon_name)
        for row in self.ledger.jobs(state=step.state):
            self._runner.run(step, row.key, counter)
        return counter.report

    def tick(self) -> TickReport:
        started = time.perf_counter()
        counter = Counter()
        self.health.refresh(self.providers)
        for step in self._steps:
            rows = self.ledger.due(step.state, self.clock(), self.batch_size)
            if step is self._dispatch:
                self._waves.run(rows, counter)
                continue
            futures = [self._pool.submit(self._runner.run, step, row.key, counter) for row in rows]
            for future in futures:
                future.result()
        elapsed = time.perf_counter() - started
        notify(lambda: self.observer.tick_done(elapsed, counter.report))
        return counter.report
