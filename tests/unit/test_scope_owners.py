"""Quota scopes shared by daemons (daemon/engine/owners.py, docs/performance.md "Several
daemons"): each scope is owned by one daemon at a time through a lease in the store; the
daemons share the scopes fairly, a dead daemon's scopes go to the others once its leases
end, and no two daemons may call for one scope at the same moment, whatever their clocks
(within the grace), pauses or store failures."""

from __future__ import annotations

import contextlib
import itertools
import math
import random
import threading
from collections import Counter
from collections.abc import Callable, Collection, Iterator
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any, TypeVar

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
)
from tests.unit.engine_rig import BASE_POLICY, receipt
from tests.unit.meanwhile import Meanwhile

from daemon.doubles.fake_drafts import FakeDraftsProvider, FakeGraphProvider
from daemon.doubles.fake_provider import FakeProvider, Scripted
from daemon.doubles.fake_time import FakeClock
from daemon.engine import Engine, PolicyHolder
from daemon.engine.circuit import CircuitSettings
from daemon.engine.owners import OurScopes, ScopeOwners
from daemon.engine.process_mark import ProcessMark
from daemon.providers.base import (
    Provider,
    ProviderBase,
    ReportRead,
    ScopeLost,
    SearchResult,
    SendKind,
    SendOutcome,
    next_call,
)
from daemon.providers.draft_handle import BeforeDeleting, Draft
from ledger.addresses import mailbox_key
from ledger.application import Ledger
from ledger.content import parse_job
from ledger.stores.scopes import MemoryScopeLeases, ScopeLease
from ledger.vocabulary import JobState
from policies.loader import PolicySet
from policies.model import ChannelPolicy
from testkit.dsn import rfc3464_report

LEASE = 9.0
GRACE = 3.0
TIMEOUT = 2.0
START = datetime(2026, 11, 1, 9, 0, tzinfo=UTC)
POLICY = ChannelPolicy.model_validate(
    {**BASE_POLICY, "channel": "receipts", "allowed_from": ["*@shop.example"]}
)
POLICIES = PolicySet({"receipts": POLICY})
BOUNCE_INTERVAL = 5.0


class Mailboxes(ProviderBase):
    """The fake provider acting per From mailbox, as Gmail with user = "{from}" does:
    one scope per mailbox. Every call is recorded with the daemon whose worker made it
    (the worker threads are named after their daemon) and the scope it spent."""

    def __init__(self, inner: FakeProvider) -> None:
        self.inner = inner
        self.name = inner.name
        self.response_ids_readable = True
        self.calls: list[tuple[str, str, datetime]] = []  # (daemon, scope, at)
        self.out_of_quota = False  # every mailbox's reservation refused
        #: Called in each report read, between its calls; then whether the read may go on
        #: is recorded (`go_on_after`: scope, `may_go_on()`).
        self.during_read: Callable[[str], None] | None = None
        self.go_on_after: list[tuple[str, bool | None]] = []
        self._lock = threading.Lock()

    def scope_of(self, mailbox: str) -> str:
        return f"{self.name}/{mailbox}"

    def for_job(self, from_addr: str, thread_id: str | None) -> Provider:
        return MailboxView(self, self.scope_of(mailbox_key(from_addr)))

    def record(self, scope: str) -> None:
        # "send-0@a" or "check@a_0": the daemon "a".
        daemon = threading.current_thread().name.rpartition("@")[2].partition("_")[0]
        with self._lock:
            self.calls.append((daemon, scope, self.inner.clock()))

    def send_raw(self, raw: bytes) -> SendOutcome:
        raise AssertionError("every job's send goes through its mailbox")

    def search(self, message_id: str) -> SearchResult:
        raise AssertionError("every job's search goes through its mailbox")

    def read_message_id(self, provider_message_id: str) -> str | None:
        return self.inner.read_message_id(provider_message_id)

    def close(self) -> None:
        pass


class MailboxView(ProviderBase):
    def __init__(self, owner: Mailboxes, scope: str) -> None:
        self.owner, self._scope = owner, scope
        self.name = owner.name
        self.response_ids_readable = True

    def scope(self) -> str:
        return self._scope

    def reserve_send(self) -> float:
        return 0.5 if self.owner.out_of_quota else 0.0

    def send_raw(self, raw: bytes) -> SendOutcome:
        self.owner.record(self._scope)
        return self.owner.inner.send_raw(raw)

    def search(self, message_id: str) -> SearchResult:
        self.owner.record(self._scope)
        return self.owner.inner.search(message_id)

    def read_message_id(self, provider_message_id: str) -> str | None:
        return self.owner.inner.read_message_id(provider_message_id)

    reads_reports = True

    def read_reports(
        self,
        since: datetime,
        *,
        known: Collection[str],
        max_bytes: int,
        limit: int,
        may_go_on: Callable[[], bool] | None = None,
    ) -> ReportRead:
        self.owner.record(self._scope)
        hook = self.owner.during_read
        if hook is not None:
            hook(self._scope)
            go_on = None if may_go_on is None else may_go_on()
            self.owner.go_on_after.append((self._scope, go_on))
        return self.owner.inner.read_reports(since, known=known, max_bytes=max_bytes, limit=limit)

    def close(self) -> None:
        pass


def due_pairs(count: int) -> list[tuple[str, str | None, str | None]]:
    return [("receipts", f"m{n}@shop.example", "") for n in range(count)]


def scope(n: int) -> str:
    return f"fake/m{n}@shop.example"


class Daemon:
    """One daemon's scope owners on the shared store, on a clock of its own."""

    def __init__(
        self, store: Any, name: str, clock: FakeClock, process: ProcessMark | None = None
    ) -> None:
        """`process`: the process its heartbeat names (this one's by default)."""
        self.name = name
        self.clock = clock
        provider = Mailboxes(FakeProvider("fake", clock=clock))
        self.owners = ScopeOwners(
            store,
            PolicyHolder(lambda: POLICIES),
            {"fake": provider},
            daemon=name,
            lease=LEASE,
            grace=GRACE,
            horizon=LEASE + TIMEOUT,
            clock=clock,
            process=process,
        )

    def round(self, scopes: int) -> None:
        self.owners.balance(due_pairs(scopes), self.clock())

    def may_call(self, n: int) -> bool:
        return self.owners.may_call(scope(n), self.clock())


class World:
    """Daemons on one memory store; real time moves every daemon's clock alike."""

    def __init__(self) -> None:
        self.store = MemoryScopeLeases(SimpleNamespace())
        self.clocks: dict[str, FakeClock] = {}
        self.daemons: dict[str, Daemon] = {}

    def start(self, name: str, skew: float = 0.0) -> Daemon:
        base = next(iter(self.clocks.values())).now if self.clocks else START
        if name not in self.clocks:
            self.clocks[name] = FakeClock(base + timedelta(seconds=skew))
        daemon = self.daemons[name] = Daemon(self.store, name, self.clocks[name])
        return daemon

    def advance(self, seconds: float) -> None:
        for clock in self.clocks.values():
            clock.advance(seconds)

    def rounds(self, scopes: int, times: int = 1, step: float = 1.0) -> None:
        for _ in range(times):
            for daemon in self.daemons.values():
                daemon.round(scopes)
            self.advance(step)

    def owners_of(self, n: int) -> list[str]:
        return [name for name, d in self.daemons.items() if d.may_call(n)]


def test_one_daemon_takes_every_scope_with_work_at_its_first_round() -> None:
    world = World()
    alone = world.start("a")
    alone.round(5)
    assert alone.owners.owned() == [scope(n) for n in range(5)]
    assert all(alone.may_call(n) for n in range(5))
    rows = {row.scope: row for row in world.store.leases()}
    assert {row.owner for row in rows.values()} == {"a"}


@pytest.mark.parametrize("count", [2, 3])
def test_daemons_share_the_scopes_and_none_owns_more_than_its_share(count: int) -> None:
    world = World()
    names = [f"d{n}" for n in range(count)]
    world.start(names[0]).round(50)  # the first takes everything while it is alone
    for name in names[1:]:
        world.start(name)
    world.rounds(50, times=int(3 * LEASE))
    held = Counter(owner for n in range(50) for owner in world.owners_of(n))
    assert sorted(held) == names, held
    assert max(held.values()) <= math.ceil(50 / count), held
    assert sum(held.values()) == 50  # every scope has its one owner


def test_a_dead_daemons_scopes_go_to_the_others_once_its_lease_ends() -> None:
    world = World()
    world.start("a").round(6)
    world.start("b")
    world.rounds(6, times=int(3 * LEASE))
    theirs = [n for n in range(6) if world.owners_of(n) == ["a"]]
    assert theirs
    del world.daemons["a"]  # kill -9: no release, no renewal
    waited = 0.0
    while not all(world.owners_of(n) == ["b"] for n in theirs):
        world.rounds(6, step=0.5)
        waited += 0.5
        assert waited <= LEASE + 1.0, "one lease and two rounds at most"


def test_a_paused_daemon_calls_for_no_scope_it_lost_when_it_resumes() -> None:
    world = World()
    a = world.start("a")
    a.round(3)
    paused = world.daemons.pop("a")  # SIGSTOP: no round, no renewal
    world.start("b")
    world.rounds(3, times=int(2 * LEASE))
    assert all(world.owners_of(n) == ["b"] for n in range(3))
    # SIGCONT: a worker of `a` asks before its next round or renewal.
    assert not any(paused.may_call(n) for n in range(3))
    world.daemons["a"] = paused
    world.rounds(3)
    assert paused.owners.lost == 3 and paused.owners.owned() == []
    for _ in range(int(2 * LEASE)):  # then they share: never two at once for a scope
        world.rounds(3, step=0.5)
        assert all(len(world.owners_of(n)) <= 1 for n in range(3))
    assert sorted(len(d.owners.owned()) for d in world.daemons.values()) == [1, 2]


def test_renewals_that_fail_stop_the_owner_before_anyone_else_may_start() -> None:
    world = World()
    a = world.start("a")
    a.round(1)
    taken_at = a.clock()
    failing = FailingStore(world.store)
    a.owners._store = failing  # the database goes away
    failing.failing = True
    while True:
        world.advance(0.25)
        with pytest.raises(RuntimeError):
            a.round(1)
        if not a.may_call(0):
            break
    stopped = (a.clock() - taken_at).total_seconds()
    assert stopped <= LEASE - GRACE + 0.25  # it stopped by itself, a grace early
    b = world.start("b")
    b.round(1)
    assert not b.may_call(0)  # the lease has not ended yet
    world.advance(GRACE)
    b.round(1)
    assert b.may_call(0) and not a.may_call(0)


@pytest.mark.parametrize("skew", [GRACE * 0.9, -GRACE * 0.9])
def test_clocks_apart_by_less_than_the_grace_never_let_two_daemons_act(skew: float) -> None:
    """The owner stops a grace before its lease ends by its clock; another takes the scope
    once it has ended by its own: whichever clock is ahead, never both at once."""
    world = World()
    a = world.start("a")
    a.round(1)
    paused = world.daemons.pop("a")  # it renews no more
    b = world.start("b", skew=skew)
    acted: list[tuple[bool, bool]] = []
    for _ in range(int(4 * LEASE / 0.1)):
        world.advance(0.1)
        b.round(1)
        acted.append((paused.may_call(0), b.may_call(0)))
    assert (True, True) not in acted
    assert acted[0] == (True, False) and acted[-1] == (False, True)


class TimedStore:
    """The shared rows, with the clock of a store that daemons on other hosts share
    (PostgreSQL's `clock_timestamp()`)."""

    def __init__(self, inner: Any, clock: FakeClock, behind: float = 0.0) -> None:
        self.inner = inner
        self.clock = clock
        self.behind = behind

    def store_time(self) -> float:
        return self.clock().timestamp() - self.behind

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@pytest.mark.parametrize("jump", [GRACE, -GRACE, -3 * LEASE])
def test_a_daemon_whose_clock_leaves_the_store_s_stands_aside_until_it_is_back(
    jump: float,
) -> None:
    """Two daemons share 4 scopes; `a`'s clock jumps (an NTP step, a VM resumed) by more
    than half the grace. Set back, its leases would look longer than they are and it would
    act on after `b` may take them; set ahead, `b`'s would look ended. At its next look it
    stands aside: no scope, no heartbeat, no job; `b` takes its scopes once their leases
    have ended; never two at once. Its clock back, `a` shares them again."""
    world = World()
    store_clock = world.clocks["store"] = FakeClock(START)
    a, b = world.start("a"), world.start("b")
    for daemon in (a, b):
        daemon.owners._store = TimedStore(world.store, store_clock)
    world.rounds(4, times=int(3 * LEASE), step=0.5)
    assert sorted(len(d.owners.owned()) for d in (a, b)) == [2, 2]

    def both_never_act(times: int) -> None:
        for _ in range(times):
            world.rounds(4, step=0.25)
            assert all(len(world.owners_of(n)) <= 1 for n in range(4))

    a.clock.advance(jump)
    world.rounds(4, step=0.0)
    assert a.owners.aside == pytest.approx(jump) and a.owners.owned() == []
    assert not any(a.may_call(n) for n in range(4))
    assert "a" not in world.store.members(store_clock().timestamp())
    both_never_act(int(2 * LEASE / 0.25))
    assert all(world.owners_of(n) == ["b"] for n in range(4))  # b took them when they ended
    a.clock.advance(-jump)  # NTP puts it right
    both_never_act(int(3 * LEASE / 0.25))
    assert a.owners.aside is None
    assert sorted(len(d.owners.owned()) for d in (a, b)) == [2, 2]


class RenewerLooksDuringTheRound:
    """The shared rows; while the round reads the heartbeats (after it asked whether its
    daemon stands aside, before it takes), `look` runs: the lease renewer's thread
    looking at the clock, as it may at any moment in a running daemon."""

    def __init__(self, inner: Any, look: Callable[[], None]) -> None:
        self.inner = inner
        self.look = Meanwhile(look)

    def members(self, now: float) -> list[str]:
        members: list[str] = self.inner.members(now)
        self.look()
        return members

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_a_round_during_which_the_renewer_stands_aside_takes_no_scope() -> None:
    """`a`'s clock is set back (an NTP step) while its round reads the store; its lease
    renewer's thread sees it first and stands aside, dropping every scope. The round then
    took the free scopes all the same and held them: `a` acted on them for as long as
    its clock was back (three leases), and `b`, whose round found them taken, took them
    when their leases ended by the store: two daemons calling for one mailbox at once.
    Standing aside, a daemon takes nothing: `b` takes them at its first round."""
    world = World()
    store_clock = world.clocks["store"] = FakeClock(START)
    a = world.start("a")

    def renewer_looks() -> None:
        a.clock.advance(-3 * LEASE)
        renewer = threading.Thread(target=a.owners.renew_due, name="scope-renewer")
        renewer.start()
        renewer.join(timeout=10)
        assert not renewer.is_alive()

    a.owners._store = RenewerLooksDuringTheRound(
        TimedStore(world.store, store_clock), renewer_looks
    )
    a.round(4)
    assert a.owners.aside == pytest.approx(-3 * LEASE)
    assert a.owners.owned() == [] and not any(a.may_call(n) for n in range(4))
    assert [row.scope for row in world.store.leases() if row.owner == "a"] == []
    b = world.start("b")
    b.owners._store = TimedStore(world.store, store_clock)
    for _ in range(int(4 * LEASE / 0.25)):
        world.rounds(4, step=0.25)
        assert all(len(world.owners_of(n)) <= 1 for n in range(4))
    assert all(world.owners_of(n) == ["b"] for n in range(4))


def test_a_round_during_which_the_renewer_stands_aside_extends_no_lease() -> None:
    """`a` holds 4 scopes and `b` joins: `a` gives up two. While its round orders them,
    its clock jumps ahead three leases and the renewer's thread stands aside. The release
    was still written, by the clock found off: those leases ran three leases past their
    end and nobody took the two mailboxes meanwhile. Standing aside writes nothing: every
    lease ends as last written, and `b` takes them all when they end."""
    world = World()
    store_clock = world.clocks["store"] = FakeClock(START)
    a = world.start("a")
    a.owners._store = TimedStore(world.store, store_clock)
    a.round(4)
    b = world.start("b")
    b.owners._store = TimedStore(world.store, store_clock)
    b.round(4)  # nothing free: it only beats
    last_written = max(row.lease_until for row in world.store.leases())
    order = a.owners._preference

    def renewer_looks(scope: str) -> bytes:
        if a.owners.aside is None:
            a.clock.advance(3 * LEASE)
            renewer = threading.Thread(target=a.owners.renew_due, name="scope-renewer")
            renewer.start()
            renewer.join(timeout=10)
            assert not renewer.is_alive()
        return order(scope)

    a.owners._preference = renewer_looks  # type: ignore[method-assign]
    a.round(4)
    assert a.owners.aside == pytest.approx(3 * LEASE) and a.owners.owned() == []
    assert max(row.lease_until for row in world.store.leases()) == last_written
    del world.daemons["a"]  # its rounds, aside, do nothing more
    waited = 0.0
    while not all(world.owners_of(n) == ["b"] for n in range(4)):
        world.rounds(4, step=0.5)
        waited += 0.5
        assert waited <= LEASE + 1.0, "one lease and two rounds at most"


def test_a_clock_within_half_the_grace_of_the_store_s_is_not_off() -> None:
    world = World()
    store_clock = world.clocks["store"] = FakeClock(START)
    a = world.start("a", skew=GRACE * 0.45)
    a.owners._store = TimedStore(world.store, store_clock)
    a.round(2)
    assert a.owners.aside is None and a.owners.clock_off() is None
    assert a.owners.owned() == [scope(0), scope(1)]


def test_a_scope_with_nothing_due_for_a_lease_is_released_and_taken_back_at_once() -> None:
    world = World()
    a = world.start("a")
    a.round(2)
    world.advance(1)
    for _ in range(int(LEASE) + 2):
        a.round(1)  # only m0 has work now
        world.advance(1)
    assert a.owners.owned() == [scope(0)]
    row = next(r for r in world.store.leases() if r.scope == scope(1))
    assert row.owner == "a" and row.lease_until <= a.clock().timestamp() + GRACE
    a.round(2)  # work again: its own released lease, taken back without waiting
    assert a.may_call(1)


class SlowReads:
    """The shared rows, whose reads of the leases take `seconds` (a loaded store)."""

    def __init__(self, inner: Any, clock: FakeClock, seconds: float) -> None:
        self.inner = inner
        self.clock = clock
        self.seconds = seconds

    def leases(self) -> list[ScopeLease]:
        self.clock.advance(self.seconds)
        return list(self.inner.leases())

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_a_scope_released_by_a_slow_round_keeps_the_grace_from_when_it_was_given_up() -> None:
    """A release ends the lease a grace later, for the call that asked `may_call` just
    before the scope was dropped. A round whose store reads took a while gave it up
    counting that grace from the round's start: a call started at the drop had less than
    the grace before another daemon could take the scope."""
    world = World()
    a = world.start("a")
    a.round(2)
    b = world.start("b")
    b.round(2)  # `b` joins: nothing free, its share is one
    a.owners._store = SlowReads(world.store, a.clock, GRACE * 0.8)
    a.round(2)  # over its share, `a` gives one up; its reads took most of a grace
    assert len(a.owners.owned()) == 1
    dropped_at = a.clock().timestamp()
    released = [r for r in world.store.leases() if r.scope not in a.owners.owned()]
    assert [r.owner for r in released] == ["a"]
    assert released[0].lease_until >= dropped_at + GRACE


def test_a_daemon_that_stops_releases_its_scopes_and_its_name_takes_them_back_at_once() -> None:
    world = World()
    a = world.start("a")
    a.round(2)
    a.owners.close()
    assert not a.may_call(0)
    b = world.start("b")
    b.round(2)
    assert b.owners.owned() == []  # what `a` may still have in flight has the grace
    again = world.start("a")  # restarted under its name: the leases are its own
    again.round(2)
    assert len(again.owners.owned()) == 1  # its share, at once
    world.advance(GRACE)
    b.round(2)
    assert len(b.owners.owned()) == 1  # the other, once the grace has passed


def test_a_daemon_that_lost_its_name_leaves_the_leases_under_it_alone() -> None:
    """A PostgreSQL restart dropped the lock on `a`'s name and a second process named `a`
    took it, and with it the scopes as its own. The first stops (IdentityTaken): were it
    to release the scopes under the name, their leases would end a grace later while the
    second still acts on them by its own last write, and `b` would take them: two
    daemons acting on one mailbox at once."""
    world = World()
    first = world.start("a")
    first.round(1)
    second = world.daemons["a"] = Daemon(world.store, "a", world.clocks["a"])
    second.round(1)  # its own rows: taken back at once
    assert second.may_call(0)
    first.owners.disown()  # its name check failed with IdentityTaken
    assert not first.may_call(0)
    first.owners.close()  # it stops
    world.advance(GRACE + 0.1)
    b = world.start("b")
    b.round(1)
    assert second.may_call(0) and not b.may_call(0)
    for _ in range(int(3 * LEASE)):
        world.rounds(1, step=0.5)
        assert len([d for d in (first, second, b) if d.may_call(0)]) <= 1


class FailingStore:
    """The store, or none at all when `failing`."""

    def __init__(self, inner: MemoryScopeLeases) -> None:
        self.inner = inner
        self.failing = False

    def __getattr__(self, name: str) -> Any:
        if self.failing:

            def fail(*args: Any, **kwargs: Any) -> Any:
                raise RuntimeError("connection lost")

            return fail
        return getattr(self.inner, name)


NAMES = ("a", "b", "c")
SCOPES = 3


class OwnersMachine(RuleBasedStateMachine):
    """Three daemons with skewed clocks (within the grace) join, round, renew, pause,
    lose the store, die and restart in any order; at every moment each scope has at most
    one daemon that may call for it, a paused one included (it would call as soon as it
    resumes)."""

    @initialize(
        skews=st.lists(
            st.floats(-GRACE * 0.9, GRACE * 0.9), min_size=len(NAMES), max_size=len(NAMES)
        )
    )
    def setup(self, skews: list[float]) -> None:
        self.world = World()
        self.skews = dict(zip(NAMES, skews, strict=True))
        self.paused: dict[str, Daemon] = {}
        self.failing: dict[str, FailingStore] = {}
        self.scopes = SCOPES
        for name in NAMES:
            self.start(name)

    @rule()
    def tick_all(self) -> None:
        for name in list(self.world.daemons):
            self.round(name)

    def _live(self, name: str) -> Daemon | None:
        return self.world.daemons.get(name)

    @rule(name=st.sampled_from(NAMES))
    def start(self, name: str) -> None:
        """A daemon (re)starts under `name`, when no live process holds the name."""
        if name in self.world.daemons or name in self.paused:
            return  # one live process per name (the identity lock)
        daemon = self.world.start(name, self.skews[name])
        failing = self.failing[name] = FailingStore(self.world.store)
        daemon.owners._store = failing

    @rule(name=st.sampled_from(NAMES))
    def round(self, name: str) -> None:
        daemon = self._live(name)
        if daemon is not None:
            # The store may be gone: the tick fails, the leases end as written.
            with contextlib.suppress(RuntimeError):
                daemon.round(self.scopes)

    @rule(name=st.sampled_from(NAMES))
    def renew(self, name: str) -> None:
        daemon = self._live(name)
        if daemon is not None:
            with contextlib.suppress(RuntimeError):
                daemon.owners.renew_due()

    @rule(seconds=st.floats(0.01, LEASE))
    def advance(self, seconds: float) -> None:
        self.world.advance(seconds)

    @rule(name=st.sampled_from(NAMES), offset=st.floats(-GRACE * 1.5, GRACE * 1.5))
    def near_a_lease_end(self, name: str, offset: float) -> None:
        """Time moves to around the end of a lease `name` holds, by its clock: where a
        daemon stops and another may start."""
        daemon = {**self.world.daemons, **self.paused}.get(name)
        ends = [] if daemon is None else list(daemon.owners._held.values())
        if ends:
            ahead = min(ends) + offset - daemon.clock().timestamp()  # type: ignore[union-attr]
            if ahead > 0:
                self.world.advance(ahead)

    @rule(name=st.sampled_from(NAMES))
    def pause(self, name: str) -> None:
        daemon = self.world.daemons.pop(name, None)
        if daemon is not None:
            self.paused[name] = daemon

    @rule(name=st.sampled_from(NAMES))
    def resume(self, name: str) -> None:
        daemon = self.paused.pop(name, None)
        if daemon is not None:
            self.world.daemons[name] = daemon

    @rule(name=st.sampled_from(NAMES), failing=st.booleans())
    def store(self, name: str, failing: bool) -> None:
        if name in self.failing:
            self.failing[name].failing = failing

    @rule(name=st.sampled_from(NAMES))
    def kill(self, name: str) -> None:
        self.world.daemons.pop(name, None)
        self.paused.pop(name, None)

    @rule(name=st.sampled_from(NAMES))
    def stop(self, name: str) -> None:
        daemon = self.world.daemons.pop(name, None)
        if daemon is not None:
            daemon.owners.close()

    @rule(scopes=st.integers(1, SCOPES))
    def work(self, scopes: int) -> None:
        self.scopes = scopes

    @invariant()
    def one_owner_at_a_time(self) -> None:
        everyone = {**self.world.daemons, **self.paused}
        for n in range(SCOPES):
            acting = [name for name, daemon in everyone.items() if daemon.may_call(n)]
            assert len(acting) <= 1, (scope(n), acting)

    @invariant()
    def the_store_names_who_acts(self) -> None:
        rows: dict[str, ScopeLease] = {r.scope: r for r in self.world.store.leases()}
        everyone = {**self.world.daemons, **self.paused}
        for n in range(SCOPES):
            for name, daemon in everyone.items():
                if daemon.may_call(n):
                    assert rows[scope(n)].owner == name


TestOwnersMachine = OwnersMachine.TestCase
TestOwnersMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


# -- the engine: two daemons' engines on one store ------------------------------------


@pytest.fixture
def engines() -> Iterator[tuple[FakeClock, Ledger, Mailboxes, list[Engine]]]:
    yield from two_engines(POLICIES)


def daemons(
    ledger: Ledger,
    policies: PolicySet,
    providers: dict[str, Provider],
    clock: FakeClock,
    timeout: float,
    **options: Any,
) -> list[Engine]:
    """Daemons `a` and `b` on one store, each provider's calls timing out after `timeout`."""
    timeouts = {name: timeout for name in providers}
    engines = []
    for name in ("a", "b"):
        engines.append(Engine(ledger, PolicyHolder(lambda: policies), providers,
                              provider_timeouts=timeouts, clock=clock, deadline_grace=GRACE,
                              elapsed=clock.elapsed,
                              rng=random.Random(1), daemon_name=name, scope_lease=LEASE,
                              **options))  # fmt: skip
    return engines


def two_engines(policies: PolicySet) -> Iterator[tuple[FakeClock, Ledger, Mailboxes, list[Engine]]]:
    clock = FakeClock(START)
    ledger = Ledger("memory://", clock=clock)
    provider = Mailboxes(FakeProvider("fake", clock=clock))
    built = daemons(ledger, policies, {"fake": provider}, clock, TIMEOUT, concurrency=2,
                    bounce_interval=BOUNCE_INTERVAL)  # fmt: skip
    yield clock, ledger, provider, built
    for engine in built:
        engine.close()
    ledger.close()


def submit(ledger: Ledger, key: str, mailbox: int) -> None:
    content = parse_job(
        {
            "channel": "receipts",
            "key": key,
            "from": f"Shop <m{mailbox}@shop.example>",
            "to": "customer@example.net",
            "subject": key,
            "body": "b\n",
        }
    )
    ledger.submit(content, POLICY.sender_for(content.sender))


def test_two_engines_send_each_mailbox_from_one_daemon_only(
    engines: tuple[FakeClock, Ledger, Mailboxes, list[Engine]],
) -> None:
    clock, ledger, provider, (a, b) = engines
    a.tick()  # `a` alone: it joins; b joins at its first tick
    for n in range(40):
        submit(ledger, f"k{n:02d}", n % 4)
    for second in range(int(3 * LEASE)):
        for engine in (a, b):
            engine.tick()
        clock.advance(1)
        if second < 2 * LEASE:  # more work while the daemons rebalance
            for n in range(4):
                submit(ledger, f"late-{second}-{n}", n)
    senders: dict[str, set[str]] = {}
    for daemon, scope_name, _at in provider.calls:
        senders.setdefault(scope_name, set()).add(daemon)
    # Each mailbox changed hands at most once (the rebalance when `b` joined), and its
    # calls never interleave: the owner's calls end before the next owner's start.
    for scope_name in senders:
        order = [d for d, s, _ in provider.calls if s == scope_name]
        changes = sum(1 for x, y in itertools.pairwise(order) if x != y)
        assert changes <= 1, (scope_name, order)
    assert {d for s in senders.values() for d in s} == {"a", "b"}
    rows = list(ledger.jobs())
    assert rows and all(row.state == JobState.CONFIRMED for row in rows)
    assert all(provider.inner.copies_of(ledger.get_job(r.key).message_id) == 1 for r in rows)


def test_an_engine_whose_clock_is_off_runs_no_step_and_the_other_does_its_work(
    engines: tuple[FakeClock, Ledger, Mailboxes, list[Engine]],
) -> None:
    clock, ledger, provider, (a, b) = engines
    assert a.owners is not None
    # `a`'s clock runs two graces ahead of the store's.
    a.owners._store = TimedStore(a.owners._store, clock, behind=2 * GRACE)
    for n in range(8):
        submit(ledger, f"k{n}", n % 4)
    a.tick()
    assert a.owners.aside == pytest.approx(2 * GRACE) and provider.calls == []
    for _ in range(int(2 * LEASE)):
        for engine in (a, b):
            engine.tick()
        clock.advance(1)
    assert {daemon for daemon, _scope, _at in provider.calls} == {"b"}
    assert all(row.state == JobState.CONFIRMED for row in ledger.jobs())


def test_a_daemon_that_loses_a_scope_sends_none_of_the_jobs_it_had_queued(
    engines: tuple[FakeClock, Ledger, Mailboxes, list[Engine]],
) -> None:
    """The jobs wait in `a`'s send queue (their mailbox out of quota) when its lease ends
    and `b` takes the mailbox: when the quota comes back, `a` drops them, `b` sends them."""
    clock, ledger, provider, (a, b) = engines
    provider.out_of_quota = True
    for n in range(6):
        submit(ledger, f"k{n}", 0)
    a.tick()  # `a` alone: it takes the mailbox, loads the jobs, and they wait
    assert a.owners is not None and a.owners.owned() == [scope(0)]
    clock.advance(LEASE + 1)  # `a` renews no more (stopped): its lease ends
    b.tick()
    assert b.owners is not None and b.owners.owned() == [scope(0)]
    provider.out_of_quota = False
    assert a.settle(timeout=10)  # its workers look at their queue again
    assert provider.calls == []
    b.tick()
    assert [daemon for daemon, _scope, _at in provider.calls] == ["b"] * 6


def test_each_watched_mailbox_is_read_for_bounces_by_its_owner_alone() -> None:
    """Two daemons watch four mailboxes' confirmed jobs: each mailbox is read once per
    interval, by the daemon that owns its scope, not once per daemon; every report is
    recorded once."""
    watched = PolicySet({"receipts": POLICY.model_copy(update={"watch_bounces": 3600.0})})
    built = two_engines(watched)
    clock, ledger, provider, (a, b) = next(built)
    try:
        for n in range(8):
            submit(ledger, f"k{n}", n % 4)
        for _ in range(3):
            for engine in (a, b):
                engine.tick()
            clock.advance(1)
        assert all(r.state == JobState.CONFIRMED for r in ledger.jobs())
        for n in range(8):
            job = ledger.get_job(f"k{n}")
            provider.inner.deliver(bounce(job.from_addr, job.message_id))
        del provider.calls[:]
        intervals = 6
        for _ in range(intervals * int(BOUNCE_INTERVAL)):
            for engine in (a, b):
                engine.tick()
            clock.advance(1)
        reads: dict[str, list[str]] = {}
        for daemon, scope_name, _at in provider.calls:
            reads.setdefault(scope_name, []).append(daemon)
        assert sorted(reads) == [scope(n) for n in range(4)]
        for scope_name, readers in reads.items():
            assert len(set(readers)) == 1, (scope_name, readers)  # its owner alone
            assert len(readers) <= intervals + 1, (scope_name, readers)
        assert {d for readers in reads.values() for d in readers} == {"a", "b"}
        for n in range(8):
            assert [type(e).__name__ for e in ledger.history(f"k{n}")].count("Bounced") == 1
    finally:
        next(built, None)


def test_a_bounce_read_asks_before_each_call_whether_its_scope_is_still_ours() -> None:
    """A read of a mailbox makes many calls (pages, then each report): when `b` joins
    during one and `a` gives that mailbox's scope up, the read is told to stop there
    (`may_go_on` False), so its later calls are not made for a scope `a` no longer owns."""
    watched = PolicySet({"receipts": POLICY.model_copy(update={"watch_bounces": 3600.0})})
    built = two_engines(watched)
    clock, ledger, provider, (a, b) = next(built)
    try:
        a.tick()  # `a` alone: it joins
        for n in range(2):
            submit(ledger, f"k{n}", n)
        for _ in range(2):
            a.tick()
            clock.advance(1)
        assert all(r.state == JobState.CONFIRMED for r in ledger.jobs())
        assert a.owners is not None and a.owners.owned() == [scope(0), scope(1)]
        moved = sorted([scope(0), scope(1)], key=a.owners._preference)[1]

        def reading(read_scope: str) -> None:  # on `a`'s check worker, the read started
            if read_scope != moved:
                return
            b._balance_scopes()  # `b` starts and joins
            a._balance_scopes()  # `a`'s next round: over its share, it gives one up
            assert a.owners is not None and moved not in a.owners.owned()

        provider.during_read = reading
        clock.advance(BOUNCE_INTERVAL)
        a.tick()
        assert (moved, False) in provider.go_on_after
        kept = next(s for s in (scope(0), scope(1)) if s != moved)
        assert (kept, True) in provider.go_on_after
    finally:
        next(built, None)


def bounce(mailbox: str, message_id: str) -> bytes:
    to = "customer@example.net"
    sent = f"From: {mailbox}\r\nTo: {to}\r\nMessage-ID: {message_id}\r\n\r\nhi\r\n".encode()
    return rfc3464_report(sent, mailbox=mailbox, recipient=to)


# -- a send prepared past the grace: the scope moved before its call left -------------


class SlowDrafts(FakeDraftsProvider):
    """Gmail's drafts mode as the engine sees it: before its claim a send lists the
    job's drafts by Message-ID, then creates one; each of these calls may take up to the
    provider's timeout (`slow_find`, `slow_create`: run once at the start of the next
    such call). At every drafts.send, which daemons may call for its scope is recorded
    (`draft_sends_by`: the sender, and who may act at that moment), and likewise at
    every drafts.create as it starts (`draft_creates_by`)."""

    def __init__(self, name: str, clock: FakeClock) -> None:
        super().__init__(name, clock=clock)
        self.slow_find: Callable[[], None] | None = None
        self.slow_create: Callable[[], None] | None = None
        self.who_may_call: Callable[[], list[str]] = list
        self.draft_sends_by: list[tuple[str, list[str]]] = []
        self.draft_creates_by: list[tuple[str, list[str]]] = []

    def find_drafts(self, message_id: str) -> list[Draft]:
        hook, self.slow_find = self.slow_find, None
        if hook is not None:
            hook()
        return super().find_drafts(message_id)

    def create_draft(self, raw: bytes) -> Draft:
        sender = threading.current_thread().name.rpartition("@")[2]
        self.draft_creates_by.append((sender, self.who_may_call()))
        hook, self.slow_create = self.slow_create, None
        if hook is not None:
            hook()
        return super().create_draft(raw)

    def send_draft(self, draft: Draft) -> SendOutcome:
        sender = threading.current_thread().name.rpartition("@")[2]
        self.draft_sends_by.append((sender, self.who_may_call()))
        return super().send_draft(draft)


@pytest.mark.parametrize("slow_create", [True, False], ids=["list-and-create", "list"])
def test_a_draft_step_that_outlasts_the_grace_calls_nothing_once_its_scope_moved(
    slow_create: bool,
) -> None:
    """`a` owns two scopes (Gmail in drafts mode, its timeout as long as the grace, as
    with the defaults: 30 s each). One of its workers takes a job and starts its draft
    step; meanwhile `b` joins and `a`'s round gives that scope up (a grace from now).
    The draft step's calls answer slowly, each within its timeout:
    - list-and-create: drafts.list and drafts.create, so that `b` has taken the scope and
      may send when the claim is saved: `a` must not send then (two daemons acting on
      one mailbox at once, over its quota);
    - list: drafts.list alone, so the drafts.create that would follow is a call for a
      scope `a` may no longer call for (and a draft left by a daemon that will not send
      it): it is not made, and the job stays due.
    Either way the job is sent later by `b`, once, from the one draft it made."""
    timeout = GRACE  # Gmail's default timeout equals the default grace (30 s)
    clock = FakeClock(START)
    ledger = Ledger("memory://", clock=clock)
    providers = {name: SlowDrafts(name, clock) for name in ("p0", "p1")}
    policies = PolicySet(
        {
            f"c{n}": ChannelPolicy.model_validate(
                {**BASE_POLICY, "channel": f"c{n}", "provider": f"p{n}"}
            )
            for n in range(2)
        }
    )
    a, b = daemons(ledger, policies, dict(providers), clock, timeout, concurrency=1)
    try:

        def submit_to(channel: str, key: str) -> None:
            content = receipt(channel, key)
            ledger.submit(content, policies[channel].sender_for(content.sender))

        submit_to("c0", "k0")
        submit_to("c1", "k1")
        a.tick()  # `a` alone: it takes both scopes
        assert a.owners is not None and a.owners.owned() == ["p0", "p1"]
        moved = sorted(["p0", "p1"], key=a.owners._preference)[1]  # what `a` gives up
        slow = providers[moved]
        channel = "c0" if moved == "p0" else "c1"
        engines = {"a": a, "b": b}
        slow.who_may_call = lambda: sorted(
            name
            for name, e in engines.items()
            if e.owners is not None and e.owners.may_call(moved, clock())
        )

        def listing_drafts() -> None:  # on `a`'s send worker, its job taken
            b._balance_scopes()  # `b` starts and joins
            a._balance_scopes()  # `a`'s next round: over its share, it gives one up
            assert a.owners is not None and moved not in a.owners.owned()
            clock.advance(timeout * 0.95)  # drafts.list answers, within its timeout

        def creating_draft() -> None:
            clock.advance(timeout * 0.95)  # drafts.create answers, within its timeout
            b._balance_scopes()  # `b`'s round: the lease `a` gave up has ended
            assert b.owners is not None and moved in b.owners.owned()

        slow.slow_find = listing_drafts
        slow.slow_create = creating_draft if slow_create else None
        del slow.draft_creates_by[:], slow.draft_sends_by[:]
        submit_to(channel, "k2")

        def made_only_by_who_may_call() -> None:
            for calls in (slow.draft_creates_by, slow.draft_sends_by):
                assert all([caller] == allowed for caller, allowed in calls), calls

        a.tick()
        made_only_by_who_may_call()
        for _ in range(int(LEASE)):
            for engine in (a, b):
                engine.tick()
            clock.advance(1)
        job = ledger.get_job("k2")
        assert job.state is JobState.CONFIRMED, [type(e).__name__ for e in ledger.history("k2")]
        assert slow.copies_of(job.message_id) == 1
        made_only_by_who_may_call()
        if not slow_create:
            assert len(slow.draft_creates_by) == 1
    finally:
        for engine in (a, b):
            engine.close()
        ledger.close()


# -- a sweep whose fence is slow: the scope moved before its search --------------------


class SlowFence(FakeGraphProvider):
    """Graph as the engine sees it, whose fence (the unsent drafts deleted before a
    sweep's search) answers slowly, within its timeout (`slow_fence`: run once at the
    start of the next deletion). Which daemons may call for the scope is recorded at each
    search (`searches_by`: the searcher, and who may act at that moment)."""

    def __init__(self, name: str, clock: FakeClock) -> None:
        super().__init__(name, clock=clock)
        self.slow_fence: Callable[[], None] | None = None
        self.who_may_call: Callable[[], list[str]] = list
        self.searches_by: list[tuple[str, list[str]]] = []

    def delete_drafts(
        self, message_id: str, before_deleting: BeforeDeleting | None = None
    ) -> list[str]:
        hook, self.slow_fence = self.slow_fence, None
        if hook is not None:
            hook()
        return super().delete_drafts(message_id, before_deleting)

    def search(self, message_id: str) -> SearchResult:
        searcher = threading.current_thread().name.rpartition("@")[2].partition("_")[0]
        self.searches_by.append((searcher, self.who_may_call()))
        return super().search(message_id)


def test_a_sweep_whose_fence_answers_after_its_scope_moved_searches_nothing() -> None:
    """`a` owns two Graph scopes, each with a job whose send's outcome is unknown. When
    one of the sweeps deletes its job's drafts (the fence), `b` joins and `a` gives that
    scope up; the deletion answers within its timeout.
    The search that would follow is a call for a scope `a` may no longer call for (`b`
    takes it once the grace has passed: the mailbox read from two daemons at once, over
    its quota): it is not made, nothing is recorded as its result, and `b` sweeps the
    job."""
    timeout = GRACE
    clock = FakeClock(START)
    ledger = Ledger("memory://", clock=clock)
    providers = {name: SlowFence(name, clock) for name in ("p0", "p1")}
    policies = PolicySet(
        {
            f"c{n}": ChannelPolicy.model_validate(
                {**BASE_POLICY, "channel": f"c{n}", "provider": f"p{n}"}
            )
            for n in range(2)
        }
    )
    a, b = daemons(ledger, policies, dict(providers), clock, timeout, concurrency=1)
    try:
        for n, provider in enumerate(providers.values()):
            provider.script(Scripted.dropped_response())
            content = receipt(f"c{n}", f"k{n}")
            ledger.submit(content, policies[f"c{n}"].sender_for(content.sender))
        a.tick()  # `a` alone: it takes both scopes and sends; both outcomes unknown
        assert a.owners is not None and a.owners.owned() == ["p0", "p1"]
        assert {r.state for r in ledger.jobs()} == {JobState.UNKNOWN}
        for _ in range(61):  # the index lag (search_after) passes; `a` keeps its scopes
            clock.advance(1)
            a._balance_scopes()
        moved = sorted(["p0", "p1"], key=a.owners._preference)[1]  # what `a` gives up
        slow = providers[moved]
        key = "k0" if moved == "p0" else "k1"
        engines = {"a": a, "b": b}
        slow.who_may_call = lambda: sorted(
            name
            for name, e in engines.items()
            if e.owners is not None and e.owners.may_call(moved, clock())
        )

        def fencing() -> None:  # on `a`'s check worker, the job loaded
            b._balance_scopes()  # `b` starts and joins
            a._balance_scopes()  # `a`'s next round: over its share, it gives one up
            assert a.owners is not None and moved not in a.owners.owned()
            clock.advance(timeout * 0.95)  # the deletion answers, within its timeout

        slow.slow_fence = fencing
        before = len(ledger.history(key))
        a.tick()
        assert all([searcher] == allowed for searcher, allowed in slow.searches_by), (
            slow.searches_by
        )
        assert ledger.get_job(key).state is JobState.UNKNOWN
        assert len(ledger.history(key)) == before  # nothing recorded for a search not made
        for _ in range(int(LEASE)):
            b.tick()
            clock.advance(1)
        assert ledger.get_job(key).state is JobState.CONFIRMED
        assert [s for s, _ in slow.searches_by] == ["b"]
    finally:
        for engine in (a, b):
            engine.close()
        ledger.close()


class ReadBacks(FakeProvider):
    """A provider whose confirmed sends are read back (`response_ids_readable`); which
    daemons may call for the scope is recorded at each read (`reads_by`)."""

    response_ids_readable = True

    def __init__(self, name: str, clock: FakeClock) -> None:
        super().__init__(name, clock=clock)
        self.who_may_call: Callable[[], list[str]] = list
        self.reads_by: list[tuple[str, list[str]]] = []

    def read_message_id(self, provider_message_id: str) -> str | None:
        reader = threading.current_thread().name.rpartition("@")[2].partition("_")[0]
        self.reads_by.append((reader, self.who_may_call()))
        return super().read_message_id(provider_message_id)


P = TypeVar("P", bound=FakeProvider)


@contextlib.contextmanager
def a_scope_moving_during_a_send(
    make: Callable[[str, FakeClock], P],
) -> Iterator[tuple[Ledger, P, Callable[[], None]]]:
    """`a` owns two scopes, each provider made by `make`, each sent one job; then the
    one `a` gives up when `b` joins moves during the next send's call on it. Yields the
    store, that scope's provider and `send`: job "k" submitted on it and `a`'s tick,
    during whose call (`during_send`) `b` joins and `a` gives the scope up."""
    clock = FakeClock(START)
    ledger = Ledger("memory://", clock=clock)
    providers = {name: make(name, clock) for name in ("p0", "p1")}
    policies = PolicySet(
        {
            f"c{n}": ChannelPolicy.model_validate(
                {**BASE_POLICY, "channel": f"c{n}", "provider": f"p{n}"}
            )
            for n in range(2)
        }
    )
    a, b = daemons(ledger, policies, dict(providers), clock, GRACE, concurrency=1)
    try:
        a.tick()  # `a` alone: it joins
        for n in range(2):
            content = receipt(f"c{n}", f"first{n}")
            ledger.submit(content, policies[f"c{n}"].sender_for(content.sender))
        a.tick()  # it takes both scopes and sends both
        assert a.owners is not None and a.owners.owned() == ["p0", "p1"]
        moved = sorted(["p0", "p1"], key=a.owners._preference)[1]  # what `a` gives up
        slow = providers[moved]

        def sending() -> None:  # on `a`'s send worker, the call made
            slow.during_send = None
            b._balance_scopes()  # `b` starts and joins
            a._balance_scopes()  # `a`'s next round: over its share, it gives one up
            assert a.owners is not None and moved not in a.owners.owned()
            clock.advance(GRACE * 0.95)  # the call answers, within its timeout

        def send() -> None:
            slow.during_send = sending
            content = receipt("c0" if moved == "p0" else "c1", "k")
            ledger.submit(content, policies[content.channel].sender_for(content.sender))
            a.tick()

        yield ledger, slow, send
    finally:
        for engine in (a, b):
            engine.close()
        ledger.close()


def test_a_send_that_answers_after_its_scope_moved_is_not_read_back() -> None:
    """`a` owns two scopes; while one send's call runs, `b` joins and `a` gives that
    scope up. The call answers (confirmed) within its timeout: its read-back, a call of
    its own, is not made by `a`, which may no longer call for the scope."""
    with a_scope_moving_during_a_send(ReadBacks) as (ledger, slow, send):
        del slow.reads_by[:]
        send()
        assert ledger.get_job("k").state is JobState.CONFIRMED
        assert slow.reads_by == []


class PollsForItsCopy(FakeProvider):
    """A provider whose send is several calls, as Graph's (create, send, then reads of
    the copy): after the send it asks `next_call` before reading the copy back, as Graph
    does, and answers Unknown when the scope was lost. Records who asked and the answer."""

    def __init__(self, name: str, clock: FakeClock) -> None:
        super().__init__(name, clock=clock)
        self.asked: list[bool] = []

    def send_raw(self, raw: bytes) -> SendOutcome:
        outcome = super().send_raw(raw)
        try:
            next_call("read the copy back")
        except ScopeLost:
            self.asked.append(False)
            return SendOutcome(SendKind.UNKNOWN, "copy not read back: scope lost")
        self.asked.append(True)
        return outcome


def test_a_send_of_several_calls_stops_between_them_once_its_scope_moved() -> None:
    """`a` owns two scopes; during one send (after its first call) `b` joins and `a`
    gives that scope up. The send's next call (Graph's read of its copy) asks whether
    the scope is still `a`'s, which the dispatch tells it (`calls_while`): no, so it is
    not made and the outcome is Unknown, left to the search of the scope's owner."""
    with a_scope_moving_during_a_send(PollsForItsCopy) as (ledger, slow, send):
        assert slow.asked == [True]  # the first send asked once, and went on
        send()
        assert slow.asked == [True, False]
        assert ledger.get_job("k").state is JobState.UNKNOWN


class Pings(FakeProvider):
    """A provider whose pings record which daemons may call for the scope then."""

    def __init__(self, name: str, clock: FakeClock) -> None:
        super().__init__(name, clock=clock)
        self.who_may_call: Callable[[], list[str]] = list
        self.pings_by: list[tuple[str, list[str]]] = []

    def ping(self) -> None:
        pinger = threading.current_thread().name.rpartition("@")[2].partition("_")[0]
        self.pings_by.append((pinger, self.who_may_call()))
        super().ping()


def test_a_ping_whose_saves_before_it_outlast_the_scope_is_not_made() -> None:
    """A send hung: its scope's circuit is probed with a ping. The send worker saves the
    outcomes it left to the next commit first (a slow store), and meanwhile `b` joins and
    `a` gives that scope up: the ping, a call for a scope `a` may no longer call for, is
    not made (the probe is handed back)."""
    clock = FakeClock(START)
    ledger = Ledger("memory://", clock=clock)
    providers = {name: Pings(name, clock) for name in ("p0", "p1")}
    policies = PolicySet(
        {
            f"c{n}": ChannelPolicy.model_validate(
                {**BASE_POLICY, "channel": f"c{n}", "provider": f"p{n}"}
            )
            for n in range(2)
        }
    )
    a, b = daemons(
        ledger, policies, dict(providers), clock, GRACE, concurrency=1,
        circuit=CircuitSettings(failures=1, probe_after=1.0, probe_max=8.0),
    )  # fmt: skip
    try:
        a.tick()  # `a` alone: it joins
        for n in range(2):
            content = receipt(f"c{n}", f"first{n}")
            ledger.submit(content, policies[f"c{n}"].sender_for(content.sender))
        a.tick()  # it takes both scopes
        assert a.owners is not None and a.owners.owned() == ["p0", "p1"]
        moved = sorted(["p0", "p1"], key=a.owners._preference)[1]  # what `a` gives up
        channel = "c0" if moved == "p0" else "c1"
        slow = providers[moved]
        engines = {"a": a, "b": b}
        slow.who_may_call = lambda: sorted(
            name
            for name, e in engines.items()
            if e.owners is not None and e.owners.may_call(moved, clock())
        )
        slow.script(Scripted.timed_out())  # the send hangs: the circuit opens
        for key in ("hung", "next"):
            content = receipt(channel, key)
            ledger.submit(content, policies[channel].sender_for(content.sender))
        a.tick()
        assert a.circuits.open() != []
        flush = a._send_steps.flush

        def slow_flush() -> None:  # on `a`'s send worker, before its ping
            flush()
            b._balance_scopes()  # `b` starts and joins
            a._balance_scopes()  # `a`'s next round: over its share, it gives one up

        a._send_steps.flush = slow_flush  # type: ignore[method-assign]
        clock.advance(1.5)  # the probe is due
        a.tick()
        assert a.owners is not None and moved not in a.owners.owned()
        assert all([pinger] == allowed for pinger, allowed in slow.pings_by), slow.pings_by
    finally:
        for engine in (a, b):
            engine.close()
        ledger.close()


class RefusingLeases(MemoryScopeLeases):
    """Scope lease rows that can be read but, once `refuse` is set, not written."""

    refuse = False

    def beat(self, name: str, until: float, *args: Any) -> None:
        if self.refuse:
            raise RuntimeError("store memory: read-only: it can be read but not written here")
        super().beat(name, until, *args)


def health_of(ledger: Ledger, owners: ScopeOwners) -> Any:
    """What `/healthz` checks in a daemon whose scopes are `owners`'s (as the runtime
    wires them)."""
    from daemon.api.health import HealthSources

    return HealthSources(
        ledger=ledger,
        policies=lambda: POLICIES,
        policy_error=lambda: None,
        providers=["fake"],
        scope_failure=owners.renewal_failure,
        clock_failure=owners.clock_failure,
    )


def test_healthz_reports_scope_leases_not_renewed_while_the_calls_are_stopped() -> None:
    """A daemon whose scope leases cannot be written (a role that may only read them, a
    row held by a long transaction) stops its calls by itself and writes no event, so no
    event write fails either: `/healthz` said the store was fine while it sent nothing.
    It reports the leases unrenewed once the next chance was missed too, until one is."""
    from daemon.api.health import check_health

    clock = FakeClock(START)
    store = RefusingLeases(SimpleNamespace())
    daemon = Daemon(store, "a", clock)
    daemon.round(1)
    assert daemon.may_call(0)
    with Ledger("memory://") as ledger:
        sources = health_of(ledger, daemon.owners)
        assert check_health(sources)[0]
        store.refuse = True
        clock.advance(LEASE / 3)  # the renewal is due: refused
        with pytest.raises(RuntimeError):
            daemon.round(1)
        assert check_health(sources)[0]  # one failure: the next chance is still ahead
        clock.advance(LEASE / 3)  # the next chance refused too: the calls have stopped
        with pytest.raises(RuntimeError):
            daemon.round(1)
        assert not daemon.may_call(0)
        ok, reasons, checks = check_health(sources)
        assert not ok
        assert reasons == [
            "store: scope leases not renewed for 3s: RuntimeError: store memory: read-only: "
            "it can be read but not written here"
        ]
        assert checks["store"]["ok"] is False
        store.refuse = False
        daemon.round(1)  # written again
        assert daemon.may_call(0)
        assert check_health(sources)[0]


def test_healthz_reports_a_daemon_standing_aside_for_its_clock_until_it_is_back() -> None:
    """A daemon whose clock is off the store's stands aside: it acts on no scope and no
    job, and said so only in its log while `/healthz` answered 200. The store check fails
    with `clock_off` (seconds, + ahead) and `clock_error` while it stands aside, and
    clears once its clock is back."""
    from daemon.api.health import check_health

    world = World()
    store_clock = world.clocks["store"] = FakeClock(START)
    a = world.start("a")
    a.owners._store = TimedStore(world.store, store_clock)
    a.round(2)
    with Ledger("memory://") as ledger:
        sources = health_of(ledger, a.owners)
        assert check_health(sources)[0]
        a.clock.advance(20.3)  # an NTP step, a VM resumed
        a.round(2)
        assert a.owners.aside == pytest.approx(20.3)
        ok, reasons, checks = check_health(sources)
        assert not ok
        assert reasons == [
            "store: clock +20.3s off the store's, more than half of daemon.deadline_grace "
            "(1.5s): acting on no scope and no job until it is back (check NTP)"
        ]
        assert checks["store"]["ok"] is False
        assert checks["store"]["clock_off"] == pytest.approx(20.3)
        assert checks["store"]["clock_error"] == reasons[0].removeprefix("store: ")
        a.clock.advance(-20.3)  # NTP puts it right
        a.round(2)
        assert a.owners.aside is None
        ok, reasons, checks = check_health(sources)
        assert ok and "clock_off" not in checks["store"]


class OwnedSearches(FakeProvider):
    """A provider with one quota scope (its name), whose searches record who searched and
    which daemon owned the scope in the store at that moment (`searches_by`)."""

    def __init__(self, name: str, clock: FakeClock, store: Any) -> None:
        super().__init__(name, clock=clock)
        self.store = store
        self.searches_by: list[tuple[str, str | None]] = []

    def search(self, message_id: str) -> SearchResult:
        searcher = threading.current_thread().name.rpartition("@")[2].partition("_")[0]
        now = self.clock().timestamp()
        live = [
            r.owner for r in self.store.leases() if r.scope == self.name and r.lease_until > now
        ]
        self.searches_by.append((searcher, live[0] if live else None))
        return super().search(message_id)


def test_a_job_of_a_channel_moved_to_another_provider_is_searched_by_its_attempts_owner() -> None:
    """`c0` sends on `p0`; a job's outcome is unknown; a reload moves `c0` to `p1`, and `p0`
    is now `b`'s. The job's search is made where its attempt was, on `p0`
    (`runner.provider_for`): `a`, which owns `p1` (the scope of `c0`'s provider now), must
    not make it, or `a` and `b` both call for `p0`, over its quota. Once `b`'s lease on
    `p0` ends, `a` takes `p0` for that job (the index does not know the attempt's provider:
    the refused search tells the round) and searches."""
    clock = FakeClock(START)
    ledger = Ledger("memory://", clock=clock)
    store = ledger.scope_leases()
    providers = {name: OwnedSearches(name, clock, store) for name in ("p0", "p1")}

    def c0_on(provider: str) -> PolicySet:
        return PolicySet(
            {
                "c0": ChannelPolicy.model_validate(
                    {**BASE_POLICY, "channel": "c0", "provider": provider}
                )
            }
        )

    policies = [c0_on("p0")]
    a = Engine(ledger, PolicyHolder(lambda: policies[0]), dict(providers),
               provider_timeouts={"p0": TIMEOUT, "p1": TIMEOUT}, clock=clock,
               elapsed=clock.elapsed,
               deadline_grace=GRACE, rng=random.Random(1), daemon_name="a",
               scope_lease=LEASE)  # fmt: skip
    try:
        providers["p0"].script(Scripted.dropped_response())
        content = receipt("c0", "k0")
        ledger.submit(content, policies[0]["c0"].sender_for(content.sender))
        a.tick()  # `a` takes `p0` and sends; the outcome is unknown
        assert ledger.get_job("k0").state is JobState.UNKNOWN
        assert a.owners is not None and a.owners.owned() == ["p0"]
        policies[0] = c0_on("p1")
        assert a.policies.reload()
        a.owners._release(["p0"], clock().timestamp())  # `p0` goes to `b`
        clock.advance(GRACE)
        b_until = clock().timestamp() + 90
        assert store.take("b", ["p0"], clock().timestamp(), b_until)
        for _ in range(150):
            clock.advance(1)
            a.tick()
            if ledger.get_job("k0").state is JobState.CONFIRMED:
                break
        searches = providers["p0"].searches_by
        assert searches and all(owner == searcher for searcher, owner in searches), searches
        assert ledger.get_job("k0").state is JobState.CONFIRMED
        assert clock().timestamp() >= b_until  # searched once `b`'s lease ended
        assert providers["p1"].searches_by == []
    finally:
        a.close()
        ledger.close()


def test_the_scope_of_a_moved_channels_attempts_stays_held_while_its_jobs_ask_for_it() -> None:
    """`c0` moved from `p0` to `p1`; its jobs' attempts on `p0` still need `p0`'s scope,
    which a row of an earlier release does not name: the workers' asks keep it wanted.
    Asked and granted at every tick (a job searched again and again, misses), it must
    stay held: counted as
    work only from refusals, it went idle a horizon after it was taken and was released
    under the jobs still asking for it."""
    clock = FakeClock(START)
    store = MemoryScopeLeases(SimpleNamespace())
    providers: dict[str, Provider] = {n: FakeProvider(n, clock=clock) for n in ("p0", "p1")}
    c0 = ChannelPolicy.model_validate({**BASE_POLICY, "channel": "c0", "provider": "p1"})
    owners = ScopeOwners(store, PolicyHolder(lambda: PolicySet({"c0": c0})), providers,
                         daemon="a", lease=LEASE, grace=GRACE, horizon=LEASE + TIMEOUT,
                         clock=clock)  # fmt: skip
    scopes = OurScopes(owners, providers, mailbox_key)
    sender = "Shop <m0@shop.example>"
    due = [("c0", "m0@shop.example", None)]  # a row that does not say (`want`)
    owners.balance(due, clock())
    assert not scopes.may_call(c0, sender, clock(), "p0")  # not taken yet: the round learns
    granted = []
    for _ in range(int(4 * (LEASE + TIMEOUT))):
        owners.balance(due, clock())
        granted.append(scopes.may_call(c0, sender, clock(), "p0"))
        clock.advance(1)
    assert all(granted), granted.index(False)
    assert owners.owned() == ["p0", "p1"]


def test_every_daemons_round_counts_the_scope_of_a_moved_channels_attempts() -> None:
    """`c0` moved from `p0` to `p1` after a job's attempt on `p0` (its outcome unknown):
    the index names the attempt's provider, so the round of `b`, which never loaded the
    job nor asked for `p0` (`want`), counts `p0` as work, takes it, and its due reads
    take the job's row, while the rows of `c0`'s jobs still to be sent stay `p1`'s work."""
    clock = FakeClock(START)

    def c0_on(provider: str) -> PolicySet:
        policy = {**BASE_POLICY, "channel": "c0", "provider": provider, "search_after": "1s"}
        return PolicySet({"c0": ChannelPolicy.model_validate(policy)})

    policies = [c0_on("p0")]
    providers: dict[str, Provider] = {n: FakeProvider(n, clock=clock) for n in ("p0", "p1")}
    with Ledger("memory://", clock=clock) as ledger:
        a = Engine(ledger, PolicyHolder(lambda: policies[0]), dict(providers),
                   provider_timeouts={"p0": TIMEOUT, "p1": TIMEOUT}, clock=clock,
                   elapsed=clock.elapsed,
                   rng=random.Random(1))  # fmt: skip
        try:
            providers["p0"].script(Scripted.dropped_response())  # type: ignore[attr-defined]
            for key in ("k0", "k1"):
                content = receipt("c0", key)
                ledger.submit(content, policies[0]["c0"].sender_for(content.sender))
                if key == "k0":
                    a.tick()  # sent on `p0`; the outcome is unknown
        finally:
            a.close()
        assert ledger.get_job("k0").state is JobState.UNKNOWN
        policies[0] = c0_on("p1")  # the reload
        clock.advance(2)  # the search is due
        mailbox = "support@example.com"
        due = ledger.scopes_due(clock() + timedelta(seconds=LEASE + TIMEOUT))
        assert sorted(due) == [("c0", mailbox, ""), ("c0", mailbox, "p0")]
        store = MemoryScopeLeases(SimpleNamespace())
        holder = PolicyHolder(lambda: policies[0])
        owners = [
            ScopeOwners(store, holder, providers, daemon=n, lease=LEASE, grace=GRACE,
                        horizon=LEASE + TIMEOUT, clock=clock)
            for n in "ab"
        ]  # fmt: skip
        for joining in owners:
            joining.renew_due(clock())  # both heartbeats in: a share each
        filters = [o.balance(due, clock()) for o in owners]
        assert sorted(o.owned() for o in owners) == [["p0"], ["p1"]]
        for held, scopes in zip(owners, filters, strict=True):
            rows = [
                row.key
                for state in (JobState.UNKNOWN, JobState.REQUESTED)
                for row in ledger.due(state, clock(), 10, scopes)
            ]
            # `p1`'s owner reads the channel's rows (k0's searches it leaves to `p0`'s:
            # `may_call` with the attempt's provider); `p0`'s reads k0's.
            assert rows == (["k0"] if held.owned() == ["p0"] else ["k0", "k1"]), rows
