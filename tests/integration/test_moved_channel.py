"""A channel moved to another provider by a reload, its jobs' attempts left on the old one
(daemon/engine/owners.py, docs/performance.md "Several daemons"): the job index keeps the
provider of each job's attempt (`IndexRow.attempt_provider`), so every daemon sharing the
store knows the old provider's scope has work, whichever daemon made the attempt; a store
of an earlier release gains the column when opened, and the daemon's start fills it."""

from __future__ import annotations

import random
import sqlite3
import threading
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from tests.unit.engine_rig import BASE_POLICY, receipt

from daemon.doubles.fake_provider import FakeProvider, Scripted
from daemon.doubles.fake_time import FakeClock
from daemon.engine import Engine, PolicyHolder
from daemon.providers.base import SearchResult
from ledger.application import Ledger
from ledger.content import parse_job
from ledger.stores.index import INDEX_TABLE
from ledger.vocabulary import JobState
from policies.loader import PolicySet
from policies.model import ChannelPolicy

START = datetime(2026, 11, 1, 9, 0, tzinfo=UTC)
LEASE = 120.0  # longer than the search's wait (`search_after`, 60 s): the scopes stay put
GRACE = 3.0
TIMEOUT = 2.0
MAILBOX = "support@example.com"


class Searches(FakeProvider):
    """Records the daemon whose worker made each search (its threads are named after it)."""

    def __init__(self, name: str, clock: FakeClock) -> None:
        super().__init__(name, clock=clock)
        self.searched_by: list[str] = []

    def search(self, message_id: str) -> SearchResult:
        name = threading.current_thread().name
        self.searched_by.append(name.rpartition("@")[2].partition("_")[0])
        return super().search(message_id)


def channels(c0_on: str) -> PolicySet:
    """`c0` on `c0_on`, `c1` on `p0`: both send from one mailbox."""
    return PolicySet(
        {
            channel: ChannelPolicy.model_validate(
                {**BASE_POLICY, "channel": channel, "provider": provider}
            )
            for channel, provider in (("c0", c0_on), ("c1", "p0"))
        }
    )


@pytest.mark.postgres
def test_a_moved_channels_job_is_searched_on_its_old_provider_by_that_scopes_owner(
    pg_url: str,
) -> None:
    """Two daemons on one PostgreSQL store. `a` sends `k0` of `c0` on `p0`, its outcome
    unknown; a reload moves `c0` to `p1`; `a` gives `p0` up and `c`, which never loaded
    `k0`, takes it for `c1`'s work. When `k0`'s search comes due, `c` makes it on `p0`
    within a round: its round knows from the index that `k0` spends `p0`. (Before, `c`
    did not read `c0`'s rows, and `a`, which did, was refused `p0`: the job waited until
    `c` let `p0` go, a lease after its own work ended.)"""
    clock = FakeClock(START)
    policies = [channels("p0")]
    providers = {name: Searches(name, clock) for name in ("p0", "p1")}
    ledgers = [Ledger(pg_url, clock=clock) for _ in range(2)]
    engines = {
        name: Engine(
            ledger,
            PolicyHolder(lambda: policies[0]),
            dict(providers),
            provider_timeouts={"p0": TIMEOUT, "p1": TIMEOUT},
            clock=clock,
            elapsed=clock.elapsed,  # the calls' bounds on the test's clock, as its renewals
            deadline_grace=GRACE,
            rng=random.Random(1),
            daemon_name=name,
            scope_lease=LEASE,
        )
        for name, ledger in zip("ac", ledgers, strict=True)
    }
    a, c = engines["a"], engines["c"]
    for engine in engines.values():
        assert engine.owners is not None
        # The daemons hold their clocks to the store's (`clock_off`): here, the test's.
        engine.owners._store.store_time = lambda: clock().timestamp()  # type: ignore[method-assign]
    try:
        providers["p0"].script(Scripted.dropped_response())
        content = receipt("c0", "k0")
        ledgers[0].submit(content, policies[0]["c0"].sender_for(content.sender))
        a.tick()  # `a`, alone, takes `p0` and sends: the outcome is unknown
        job = ledgers[0].get_job("k0")
        assert job.state is JobState.UNKNOWN and job.due_at is not None
        policies[0] = channels("p1")
        assert a.policies.reload() and c.policies.reload()
        # `c1`'s work keeps `p0` wanted past `k0`'s search (due within a lease).
        later = (job.due_at + timedelta(seconds=40)).isoformat()
        k1 = parse_job(
            {"channel": "c1", "key": "k1", "to": "customer@example.net", "subject": "k1"}
            | {"body": "b\n", "send_at": later}
        )
        ledgers[1].submit(k1, policies[0]["c1"].sender_for(k1.sender))
        assert a.owners is not None and c.owners is not None
        a.owners._release(["p0"], clock().timestamp())
        clock.advance(GRACE + 0.1)
        c.tick()
        a.tick()
        assert c.owners.owned() == ["p0"] and "p0" not in a.owners.owned()
        clock.advance((job.due_at - clock()).total_seconds())  # the search is due
        c.tick()  # one round of `c`
        assert providers["p0"].searched_by == ["c"]
        for _ in range(3):
            a.tick()
            c.tick()
        assert ledgers[0].get_job("k0").state is JobState.CONFIRMED
        assert set(providers["p0"].searched_by) == {"c"}
        assert providers["p1"].searched_by == []
    finally:
        for engine in engines.values():
            engine.close()
        for ledger in ledgers:
            ledger.close()


def test_a_store_of_an_earlier_release_gains_the_attempts_provider(store_url: str) -> None:
    """Its index has no `attempt_provider`: opening the store adds the column and gives
    each requested job "" (its next call is its channel's); an attempted job's provider
    is in its events only, so its row has none until the daemon's start fills the open
    jobs' rows (`fill_mailboxes`): meanwhile the round counts its channel's scope, as
    the earlier release did."""
    clock = FakeClock(START)
    policies = channels("p0")
    with Ledger(store_url, clock=clock) as ledger:
        for key in ("sent", "waits"):
            content = receipt("c0", key)
            ledger.submit(content, policies["c0"].sender_for(content.sender))
        deadline = clock() + timedelta(seconds=30)
        ledger.update("sent", lambda j: j.claim(provider="p0", deadline=deadline, at=clock()))
        assert ledger.row("sent").attempt_provider == "p0"  # type: ignore[union-attr]
        assert ledger.row("waits").attempt_provider == ""  # type: ignore[union-attr]
    drop = f"ALTER TABLE {INDEX_TABLE} DROP COLUMN attempt_provider"
    if store_url.startswith("sqlite:///"):
        with sqlite3.connect(store_url.removeprefix("sqlite:///")) as conn:
            conn.execute(drop)
    else:
        schema = store_url.split("schema=")[1]
        with psycopg.connect(store_url.split("?")[0]) as conn:
            conn.execute(f'SET search_path TO "{schema}"')
            conn.execute(drop)
    with Ledger(store_url, clock=clock) as ledger:
        before = clock() + timedelta(seconds=60)
        assert set(ledger.scopes_due(before)) == {("c0", MAILBOX, ""), ("c0", MAILBOX, None)}
        assert ledger.row("sent").attempt_provider is None  # type: ignore[union-attr]
        assert ledger.fill_mailboxes() == 1
        assert sorted(ledger.scopes_due(before)) == [("c0", MAILBOX, ""), ("c0", MAILBOX, "p0")]
        assert ledger.rebuild_index() == 2
        assert ledger.row("sent").attempt_provider == "p0"  # type: ignore[union-attr]
