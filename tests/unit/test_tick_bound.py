"""A tick that waits for a slow but healthy store is not a stuck scheduler
(daemon/config/tick_bound.py, docs/operations.md "Running under systemd"): neither the
watchdog's feed nor `/healthz` gives up on it before its waits are over."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from fastapi.testclient import TestClient

from daemon.api.app import create_app
from daemon.api.build import api_context
from daemon.bootstrap import bootstrap
from daemon.config.settings import Settings, settings_from_dict
from daemon.config.tick_bound import tick_limit, tick_store_wait
from daemon.doubles.fake_provider import FakeProvider
from daemon.runtime import Daemon
from ledger.application import Ledger
from policies.loader import PolicySet

#: A PostgreSQL store whose lock waits were raised to 20 s (its stop raised with them, as
#: `daemon/config/stop_bound.py` requires): nothing connects to it here.
SLOW_STORE = {
    "url": "postgresql://sendledger@127.0.0.1:1/mail",
    "lock_timeout": "20s",
    "connect_timeout": "10s",
}


def _settings(store: dict[str, str], api: dict[str, str] | None = None) -> Settings:
    daemon = {"tick": "1s", "name": "n1", "stop_timeout": "120s"}
    return settings_from_dict({"store": store, "daemon": daemon, "api": api or {}})


@contextmanager
def _daemon(settings: Settings) -> Iterator[Daemon]:
    """A daemon on `settings`, built on a memory store (its engine's workers stopped
    after), never served: its watchdog's measure is read with its last tick's end set."""
    with Ledger("memory://") as ledger:
        service = bootstrap(
            settings,
            ledger=ledger,
            policy_loader=PolicySet,
            providers={"fake": FakeProvider("fake", clock=ledger.clock)},
        )
        try:
            yield Daemon(service, settings.daemon.tick)
        finally:
            service.engine.stop()
            service.close()


def test_a_tick_waiting_out_its_store_s_lock_waits_still_feeds_the_watchdog() -> None:
    """Five lock waits of 20 s, two connections of 10 s and the renewals: 125 s. The
    limit was ten ticks or a minute, and the shipped unit's `WatchdogSec=60` after it:
    a tick of 125 s was killed by systemd in the middle of its provider calls."""
    with _daemon(_settings(SLOW_STORE)) as daemon:
        waits = tick_store_wait(_settings(SLOW_STORE).store)
        assert waits == 5 * 20 + 2 * 10 + 5
        daemon.health.last_tick_end = time.monotonic() - (waits - 1)
        assert daemon._healthy(), "a tick still within its store's waits is taken for a hang"
        daemon.health.last_tick_end = time.monotonic() - (1 + waits + 1)
        assert not daemon._healthy(), "a tick past every wait it may meet is stuck"


def test_the_limit_counts_the_interval_before_the_slow_tick_began() -> None:
    """The age is measured from the last tick's end, and the next tick begins up to one
    `daemon.tick` later (the scheduler's interval): a tick that waits out all its store's
    waits ends `tick` + those waits after the last one ended, and is not stuck then."""
    settings = _settings(SLOW_STORE)
    tick = 5.0  # below the waits' tenth, so the waits are the limit
    waits = tick_store_wait(settings.store)
    assert waits == 125
    assert tick_limit(tick, settings.store) > tick + waits - 0.5


def test_healthz_gives_a_slow_store_s_tick_the_same_limit(tmp_path: Path) -> None:
    (tmp_path / "api-tokens").write_text("ops:a-token-of-the-test\n")
    api = {"listen": "127.0.0.1:8080", "token_file": str(tmp_path / "api-tokens")}
    settings = _settings(SLOW_STORE, api)
    with _daemon(settings) as daemon:
        service = daemon.service
        ctx = api_context(
            settings, service.ledger, service.engine.policies, {}, tick_age=lambda: 100.0
        )
        with TestClient(create_app(ctx)) as client:
            scheduler = client.get("/healthz").json()["checks"]["scheduler"]
    assert scheduler is True, "a tick 100 s into its store's waits fails /healthz"


def test_other_stores_and_the_defaults_keep_ten_ticks_or_a_minute() -> None:
    memory = _settings({"url": "memory://"}).store
    assert tick_store_wait(memory) is None
    assert tick_limit(1.0, memory) == 60.0
    assert tick_limit(30.0, memory) == 300.0
    default_pg = _settings({"url": SLOW_STORE["url"]}).store
    assert tick_store_wait(default_pg) == 5 * 5 + 2 * 10 + 5  # within the minute
    assert tick_limit(1.0, default_pg) == 60.0
