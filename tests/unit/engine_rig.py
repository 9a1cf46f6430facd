"""An engine on a memory store and a fake provider, with injected time: no sockets, no
files. Shared by the engine's unit tests and its state-machine test."""

from __future__ import annotations

import functools
import random
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

from tests.unit.jobs import replay

from daemon.bootstrap import Service, bootstrap
from daemon.config.settings import Settings, settings_from_dict
from daemon.doubles.fake_provider import FakeProvider
from daemon.doubles.fake_time import FakeClock
from daemon.engine import Engine, PolicyHolder, TickReport
from ledger.application import Ledger
from ledger.content import JobContent, parse_job
from ledger.job import SendJob, job_id_for
from policies.loader import PolicySet
from policies.model import ChannelPolicy

TIMEOUT = 10.0
GRACE = 5.0
#: The name on the rig's claims (every engine it builds; a real daemon always has one).
DAEMON = "rig"
BASE_POLICY: dict[str, Any] = {
    "provider": "fake",
    "from": "Support <support@example.com>",
    "message_id_domain": "mail.example.com",
    "search_after": "60s",
    "search_interval": "30s",
    "confirm_misses": 2,
    "max_attempts": 3,
    "retry_backoff": "10s",
    "retry_backoff_max": "1m",
    "verify_after": "10m",
}


def policy(channel: str, **fields: Any) -> ChannelPolicy:
    return ChannelPolicy.model_validate({**BASE_POLICY, "channel": channel, **fields})


def receipt(channel: str, key: str) -> JobContent:
    """The job every engine test submits: one recipient, a short text body."""
    return parse_job(
        {
            "channel": channel,
            "key": key,
            "to": "customer@example.net",
            "subject": f"Receipt {key}",
            "body": f"Thank you ({key}).\n",
        }
    )


def claimed_by(ledger: Ledger, key: str, daemon: str) -> SendJob:
    """The job with a claim by `daemon` recorded (not saved): what a dispatch writes."""
    job = ledger.get_job(key)
    now = ledger.clock()
    job.claim(provider="fake", deadline=now + timedelta(seconds=60), at=now, daemon=daemon)
    return job


@functools.lru_cache(maxsize=8)
def rig_settings(concurrency: int) -> Settings:
    """The daemon's own settings, so the engine is wired as `run` wires it (bootstrap):
    provider "fake" with TIMEOUT, GRACE, the other engine settings at their defaults.
    Frozen, so one per concurrency serves every rig (a state machine makes one per example)."""
    return settings_from_dict(
        {
            "store": {"url": "memory://"},
            "daemon": {"concurrency": concurrency, "deadline_grace": GRACE, "name": DAEMON},
            "providers": {
                "fake": {
                    "credentials_file": "x.json",  # never read: the fake replaces it
                    "user": "support@example.com",
                    "timeout": TIMEOUT,
                }
            },
        }
    )


class EngineRig:
    def __init__(
        self,
        *policies: ChannelPolicy,
        index_lag: float = 0.0,
        seed: int = 0,
        concurrency: int = 2,
        provider: Callable[[FakeClock], FakeProvider] | None = None,
        store: str = "memory://",
    ) -> None:
        """`provider`: makes the rig's provider on its clock (default: a FakeProvider with
        `index_lag`), before the engine is built on it. `store`: the ledger's URL (a
        test of files gives a SQLite one)."""
        self.clock = FakeClock(datetime(2026, 11, 1, 9, 0, tzinfo=UTC))
        self.ledger = Ledger(store, clock=self.clock)
        if provider is None:
            self.provider = FakeProvider("fake", clock=self.clock, index_lag=index_lag)
        else:
            self.provider = provider(self.clock)
        self.policies = PolicySet({p.channel: p for p in policies})
        self.seed = seed
        self.settings = rig_settings(concurrency)
        self.concurrency = concurrency
        self._read: dict[str, tuple[SendJob, list[Any]]] = {}
        self._ids: dict[str, UUID] = {}
        self.others: dict[str, FakeProvider] = {}  # providers beside "fake" (`add_provider`)
        # Every engine built on the rig, each closed by `close` (its workers stopped).
        self._engines: list[Engine] = []
        self.service = self.new_service()
        self.engine = self.service.engine

    @property
    def holder(self) -> PolicyHolder:
        return self.service.policies

    def new_service(self, name: str = DAEMON) -> Service:
        settings = self.settings
        if name != DAEMON:
            daemon = settings.daemon.model_copy(update={"name": name})
            settings = settings.model_copy(update={"daemon": daemon})
        service = bootstrap(
            settings,
            ledger=self.ledger,
            policy_loader=lambda: self.policies,
            policies=self.policies,
            providers={"fake": self.provider, **self.others},
            clock=self.clock,
            elapsed=self.clock.elapsed,
            rng=random.Random(self.seed),
            # Engine tests race engines for one job on purpose; sharing the scopes
            # between daemons has tests of its own (tests/unit/test_scope_owners.py).
            share_scopes=False,
        )
        self.own(service.engine)
        return service

    def own(self, engine: Engine) -> Engine:
        """`engine` (built on the rig's store by a test) is closed with the rig."""
        self._engines.append(engine)
        return engine

    def new_engine(self, name: str = DAEMON) -> Engine:
        """Another daemon's engine on the same store and provider (named `name`)."""
        return self.new_service(name).engine

    def add_provider(self, name: str) -> FakeProvider:
        """A second provider (`name`, on the rig's clock) a reloaded policy can move a
        channel to; the daemon restarts with it (nothing was in flight)."""
        self.others[name] = FakeProvider(name, clock=self.clock)
        self.restart()
        return self.others[name]

    def restart(self) -> None:
        """The daemon dies and a new one starts on the same store (memory outlives it)."""
        self.engine.close()  # not the provider: the fake's mailbox outlives the daemon
        self.service = self.new_service()
        self.engine = self.service.engine

    def close(self) -> None:
        """Every engine built on the rig closed, then the store. Closing an engine twice
        (a test's own `close`, then this) is harmless."""
        for engine in self._engines:
            engine.close()
        self.ledger.close()

    def __enter__(self) -> EngineRig:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def submit(self, channel: str, key: str) -> str:
        found = self.policies.get(channel)
        ref = found or policy(channel)
        sender = ref.sender
        return self.ledger.submit(receipt(channel, key), sender).message_id

    def tick(self, *, errors: int = 0) -> TickReport:
        report = self.engine.tick()
        assert report.errors == errors, report
        return report

    def advance_and_tick(self, seconds: float) -> TickReport:
        self.clock.advance(seconds)
        return self.tick()

    def job(self, key: str) -> SendJob:
        return self.ledger.get_job(key)

    def read(self, key: str) -> tuple[SendJob, list[Any]]:
        """The job `key` and its history as the store has them, for a caller that only
        reads them (a state machine's invariants, after every step): decoded from the store
        again only when it holds a newer event of the job than the last read (events are
        only appended; a purge rewrites them in the transaction that appends Purged), so
        each job is decoded once per change instead of once per read. UnknownJob as
        `Ledger.history`."""
        job_id = self._ids.get(key)
        if job_id is None:
            job_id = self._ids[key] = job_id_for(key)
        last = self.ledger.recorder.select_events(job_id, desc=True, limit=1)
        known = self._read.get(key)
        if known is not None and last and known[0].version == last[0].originator_version:
            return known
        events = self.ledger.history(key)
        # The job as `Ledger.get_job` projects it, from the events just read.
        self._read[key] = found = (replay(events), events)
        return found

    def events(self, key: str) -> list[str]:
        return [type(event).__name__ for event in self.ledger.history(key)]

    def copies(self, key: str) -> int:
        return self.provider.copies_of(self.job(key).message_id)
