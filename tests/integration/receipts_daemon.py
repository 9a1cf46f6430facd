"""A daemon's service on a store a test opened: job k1 of the channel `receipts`
submitted, the fake provider, the test's clock."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from tests.unit.engine_rig import policy, receipt

from daemon.bootstrap import Service, bootstrap
from daemon.config.settings import Settings
from daemon.doubles.fake_provider import FakeProvider
from daemon.doubles.fake_time import FakeClock
from ledger.application import Ledger
from ledger.stores.url import PostgresStore
from policies.loader import PolicySet


@contextmanager
def receipts_service(
    settings: Settings, spec: PostgresStore, clock: FakeClock, provider: FakeProvider
) -> Iterator[tuple[Ledger, Service]]:
    """The ledger on `spec` and the service built on it with `provider`, k1 submitted."""
    policies = PolicySet({"receipts": policy("receipts")})
    with Ledger(spec, clock=clock) as ledger:
        ledger.submit(receipt("receipts", "k1"), policy("receipts").sender)
        yield (
            ledger,
            bootstrap(
                settings,
                ledger=ledger,
                policy_loader=lambda: policies,
                providers={"fake": provider},
                clock=clock,
                elapsed=clock.elapsed,
            ),
        )
