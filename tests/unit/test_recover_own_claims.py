"""A daemon's own claims at start-up (daemon/engine/recover.py, docs/configuration.md
"Daemon names"). Where the name's lock ends only with its holder (SQLite, memory) they are
Unknown at once: whoever claimed them is dead. A PostgreSQL lock can end under a live
daemon, which finishes its calls in flight while another process of the same name starts:
there a claim whose deadline is ahead waits for it, as another daemon's does. Taken at
once, its search `search_after` later (no bound keeps that above the provider's timeout
plus `deadline_grace`: here 2 s against 15 s) found no copy yet, a channel that resends
sent the job again, and the call then landed: two copies."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import timedelta

import pytest
from tests.unit.engine_rig import GRACE, TIMEOUT, EngineRig, policy

from daemon.bootstrap import Service
from daemon.doubles.fake_provider import FakeProvider, Scripted
from daemon.engine.recover import OWN_REASON, REASON
from daemon.providers.base import SendKind, SendOutcome
from daemon.runtime import start_up
from ledger.stores.identity import FileIdentityLock, IdentityLock, MemoryIdentityLock
from ledger.stores.postgres import AdvisoryIdentityLock
from ledger.vocabulary import JobState

LEASE = TIMEOUT + GRACE
#: Resends after one believed miss, which a search makes `search_after` after the Unknown.
RETRY = policy(
    "receipts", on_unknown="retry", search_after="2s", search_interval="1s", confirm_misses=1
)


class SessionLock:
    """The name held as on PostgreSQL: a lock that can end under a live holder."""

    ends_only_with_holder = False

    def check(self) -> None:
        """Held."""

    def session(self) -> None:
        """No session to condition writes on."""

    def release(self) -> None:
        """Nothing to release."""


@pytest.fixture
def rig() -> Iterator[EngineRig]:
    with EngineRig(RETRY, concurrency=2) as rig:
        yield rig


def held_call(rig: EngineRig, fate: Scripted) -> None:
    """Job k1 claimed by the rig's daemon, its call in a worker until `fate` ends it."""
    rig.submit("receipts", "k1")
    rig.provider.script(fate)
    rig.engine.hand_out()
    assert rig.engine.settle(busy=lambda: rig.provider.hanging, timeout=10)


def files_its_copy_when_it_lands(provider: FakeProvider, message_id: str) -> None:
    """The held call's copy is filed only once it is released (a slow upload), and its
    answer is lost on the way back: the provider's next send files this copy."""

    def land() -> None:
        provider.during_send = None
        provider.store_copy(message_id)

    provider.during_send = land


def restarted(rig: EngineRig, lock: Callable[[str], IdentityLock]) -> tuple[Service, IdentityLock]:
    """A second process of the same name starts on the store (`run`'s start-up)."""
    service = rig.new_service()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(rig.ledger, "hold_identity", lock)
        identity = start_up(service)
    assert identity is not None
    return service, identity


def test_a_claim_still_in_flight_under_a_taken_name_is_not_sent_twice(rig: EngineRig) -> None:
    release = threading.Event()
    timed_out = SendOutcome(SendKind.UNKNOWN, "timed out", timed_out=True)
    held_call(rig, Scripted(timed_out, stored=False, hangs_until=release))
    try:
        files_its_copy_when_it_lands(rig.provider, rig.job("k1").message_id)
        deadline = rig.job("k1").due_at
        assert deadline is not None
        rig.clock.advance(1)
        other, _ = restarted(rig, lambda name: SessionLock())
        for _ in range(4):  # past search_after, not past the deadline (14 s ahead)
            rig.clock.advance(3)
            other.engine.tick()
        assert rig.clock() < deadline
        release.set()  # the first process's call lands; its answer is lost
        assert rig.engine.settle(timeout=10)
        assert (rig.provider.sends, rig.copies("k1")) == (1, 1), rig.events("k1")
        assert rig.job("k1").state is JobState.UNKNOWN  # written by the first process
        rig.clock.advance(LEASE)
        other.engine.tick()
        assert rig.job("k1").state is JobState.CONFIRMED, rig.events("k1")
        assert rig.provider.sends == 1 and rig.copies("k1") == 1
    finally:
        release.set()  # a failed check leaves no worker held


def test_a_dead_holder_s_claim_is_recovered_at_its_deadline_and_found(rig: EngineRig) -> None:
    """A genuine restart on such a store: what waiting costs. The claim is recovered at
    its deadline (14 s after the restart here; at most one lease, timeout plus grace,
    60 s by default), not at once, and searched `search_after` later."""
    held_call(rig, Scripted.crash_during_call(stored=True))
    deadline = rig.job("k1").due_at
    assert deadline is not None
    rig.clock.advance(1)
    other, _ = restarted(rig, lambda name: SessionLock())
    while rig.job("k1").state is JobState.ATTEMPTED:
        rig.clock.advance(1)
        other.engine.tick()
    unknown_at = rig.job("k1").unknown_at
    assert unknown_at == deadline and rig.job("k1").reason == REASON
    while rig.job("k1").state is JobState.UNKNOWN:
        rig.clock.advance(1)
        other.engine.tick()
    assert rig.job("k1").state is JobState.CONFIRMED
    assert rig.clock() - unknown_at == timedelta(seconds=RETRY.search_after)
    assert rig.provider.sends == 1 and rig.copies("k1") == 1


def test_where_the_name_ends_only_with_its_holder_own_claims_are_unknown_at_once(
    rig: EngineRig,
) -> None:
    held_call(rig, Scripted.crash_during_call(stored=True))
    rig.clock.advance(1)
    _, identity = restarted(rig, lambda name: MemoryIdentityLock("memory://own", name))
    try:
        assert rig.job("k1").state is JobState.UNKNOWN
        assert rig.job("k1").reason == OWN_REASON
    finally:
        identity.release()


def test_only_the_postgresql_name_lock_can_end_under_a_live_holder() -> None:
    assert FileIdentityLock.ends_only_with_holder and MemoryIdentityLock.ends_only_with_holder
    assert not AdvisoryIdentityLock.ends_only_with_holder
