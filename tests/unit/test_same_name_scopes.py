"""Two processes under one daemon name (docs/performance.md "Several daemons"): a
PostgreSQL restart ends the name's lock while its daemon lives, and a new process takes
the name, and with it the name's quota scopes. The old one may still be finishing calls
there until its next tick finds the name lost; the new one calls for those scopes only once
those calls are past their deadline (the longest provider timeout plus the grace), so one
mailbox is never called by both. A lock that ends only with its holder (SQLite, memory),
and a predecessor that stopped, leave nothing in flight: the scopes are taken back at once."""

from __future__ import annotations

import random
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest
from tests.unit.test_scope_owners import (
    GRACE,
    LEASE,
    POLICIES,
    START,
    TIMEOUT,
    Daemon,
    Mailboxes,
    World,
    scope,
    submit,
)

from daemon.bootstrap import Service, bootstrap
from daemon.config.settings import settings_from_dict
from daemon.doubles.fake_provider import FakeProvider, Scripted
from daemon.doubles.fake_time import FakeClock
from daemon.engine import Engine, PolicyHolder
from daemon.engine.owners import ScopeOwners
from daemon.engine.process_mark import ProcessMark, read_mark, this_process
from daemon.engine.recover import OWN_REASON
from daemon.runtime import start_up
from ledger.application import Ledger
from ledger.vocabulary import JobState

#: An earlier process's calls are past their deadline this long after the take.
CALLS = TIMEOUT + GRACE


def _successor(world: World, name: str, process: ProcessMark | None = None) -> Daemon:
    """A second process of `name` on the store, sharing the first one's clock, on a store
    whose name lock can end under a live holder."""
    second = Daemon(world.store, name, world.clocks[name], process)
    second.owners.wait_for_predecessor(CALLS)
    return second


def exited_process() -> ProcessMark:
    """The mark of a process of this host that ran and is gone (reaped): a daemon killed
    by kill -9 and restarted by systemd leaves such a one in the name's heartbeat."""
    code = "from daemon.engine.process_mark import this_process; print(this_process().text())"
    printed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             check=True).stdout  # fmt: skip
    mark = read_mark(printed)
    assert mark is not None
    return mark


def _beat_from(world: World, name: str, process: str | None) -> None:
    """The name's heartbeat as `process` last wrote it, live for a lease."""
    world.store.beat(name, world.clocks[name]().timestamp() + LEASE, process)


def test_a_new_process_of_a_name_calls_only_once_the_old_one_s_calls_are_past_deadline() -> None:
    world = World()
    old = world.start("a")
    old.round(1)
    assert old.may_call(0)
    new = _successor(world, "a")
    new.round(1)  # the name's lease: its own, taken at once ...
    assert new.owners.owned() == [scope(0)]
    assert not new.may_call(0)  # ... but the old one may still be calling
    taken_at = world.clocks["a"]().timestamp()
    old.owners.disown()  # its next tick finds the name taken: it starts no call
    while not new.may_call(0):
        world.advance(0.25)
        new.round(1)
        assert world.clocks["a"]().timestamp() - taken_at <= CALLS + 0.5
    # A call the old one began at the take ends within its timeout: none overlaps.
    assert world.clocks["a"]().timestamp() - taken_at >= CALLS
    assert new.owners.owned() == [scope(0)]


def test_the_scope_is_not_read_for_work_before_the_old_process_s_calls_end() -> None:
    """The due reads leave the scope out meanwhile: its jobs are not offered to workers
    that would refuse them each tick."""
    world = World()
    world.start("a").round(2)
    new = _successor(world, "a")
    waiting = new.owners.balance([("receipts", "m0@shop.example", "")], world.clocks["a"]())
    assert waiting.groups == ()
    world.advance(CALLS)
    ready = new.owners.balance([("receipts", "m0@shop.example", "")], world.clocks["a"]())
    assert ready.groups != ()


def test_a_predecessor_that_stopped_leaves_its_scopes_at_once() -> None:
    """A stop ends its calls, releases the scopes and removes the name's heartbeat: a
    genuine restart pays nothing."""
    world = World()
    old = world.start("a")
    old.round(2)
    old.owners.close()
    new = _successor(world, "a")
    new.round(2)
    assert new.owners.owned() == [scope(0), scope(1)]
    assert new.may_call(0) and new.may_call(1)


def test_a_predecessor_killed_on_this_host_leaves_its_scopes_at_once() -> None:
    """A kill -9 and a restart on the same host (systemd): the name's heartbeat is live
    (no stop removed it) but names a process this host's kernel no longer has. Before,
    the new process waited the longest timeout plus the grace plus a tick (61 s with the
    defaults) all the same; the dead process calls nothing: it now calls at once."""
    world = World()
    world.start("a").round(2)
    _beat_from(world, "a", exited_process().text())  # its last beat, then kill -9
    new = _successor(world, "a")
    new.round(2)
    assert new.owners.owned() == [scope(0), scope(1)]
    assert new.may_call(0) and new.may_call(1)


def _live_elsewhere() -> ProcessMark:
    me = this_process()
    assert me is not None
    return ProcessMark("other-host", "another-boot-id", me.pidns, me.pid + 1, 1)


@pytest.mark.parametrize(
    "writer",
    ["this process, alive", "another host", "an earlier release", "not a mark"],
)
def test_a_predecessor_not_provably_gone_is_still_waited_for(writer: str) -> None:
    """Only a process of this boot and pid namespace that the kernel no longer has is
    proof: one alive, one on another host (its pid means nothing here), a row written
    by an earlier release (no process; a stale one it did not write:
    tests/integration/test_same_name_pg.py) or a value that is no mark leave the wait as
    it was."""
    world = World()
    world.start("a").round(1)
    me = this_process()
    assert me is not None
    process = {
        "this process, alive": me.text(),
        "another host": _live_elsewhere().text(),
        "an earlier release": None,
        "not a mark": '{"pid": 0, "start": 0}',
    }[writer]
    _beat_from(world, "a", process)
    new = _successor(world, "a")
    new.round(1)
    assert new.owners.owned() == [scope(0)]
    assert not new.may_call(0)


@pytest.mark.parametrize("first", ["live", "lapsed"])
def test_a_process_that_waits_for_its_predecessor_names_itself_only_after_the_wait(
    first: str,
) -> None:
    """A process that took the name from a live one (a database restart) and was then
    killed: its heartbeat must not vouch for the live one, still calling. It writes its
    mark only once that one's calls are past: a third process waits meanwhile. So when
    the first one's heartbeat had lapsed (paused past a lease: its scopes are taken at
    once, as before, but it may resume in a call)."""
    world = World()
    world.start("a").round(1)  # alive: this process
    if first == "lapsed":
        world.advance(LEASE + 1)
    second = _successor(world, "a", exited_process())  # killed later
    second.round(1)
    row = world.store.heartbeat("a")
    assert row is not None and row.process is None
    third = _successor(world, "a")
    third.round(1)
    assert not third.may_call(0)  # the first may still be calling
    world.advance(CALLS)
    second.round(1)
    row = world.store.heartbeat("a")
    assert row is not None and row.process is not None


def test_scopes_this_process_held_itself_are_taken_back_at_once() -> None:
    world = World()
    world.start("a").round(1)
    new = _successor(world, "a")
    new.round(1)
    world.advance(CALLS)
    new.round(1)
    assert new.may_call(0)
    new.owners._release([scope(0)], world.clocks["a"]().timestamp())  # idle, say
    new.round(1)
    assert new.may_call(0)


# -- the engine: the old process sends, the new one takes the name -------------------


@pytest.fixture
def ledger() -> Iterator[Ledger]:
    with Ledger("memory://", clock=FakeClock(START)) as opened:
        yield opened


def _engine(ledger: Ledger, provider: Mailboxes) -> Engine:
    clock = ledger.clock
    assert isinstance(clock, FakeClock)
    return Engine(ledger, PolicyHolder(lambda: POLICIES), {"fake": provider},
                  provider_timeouts={"fake": TIMEOUT}, clock=clock, elapsed=clock.elapsed,
                  deadline_grace=GRACE, rng=random.Random(1), daemon_name="a",
                  scope_lease=LEASE)  # fmt: skip


def test_the_new_process_sends_a_mailbox_the_old_one_was_sending_only_after_its_calls(
    ledger: Ledger,
) -> None:
    clock = ledger.clock
    assert isinstance(clock, FakeClock)
    inner = FakeProvider("fake", clock=clock)
    old_calls, new_calls = Mailboxes(inner), Mailboxes(inner)
    old = _engine(ledger, old_calls)
    new = _engine(ledger, new_calls)
    try:
        submit(ledger, "k0", 0)
        old.tick()
        assert len(old_calls.calls) == 1  # the old process is sending mailbox 0
        sent_at = old_calls.calls[0][2]
        submit(ledger, "k1", 0)
        new.wait_for_predecessor(0.0)  # start_up on PostgreSQL (ticks called by hand)
        new.tick()
        old.name_lost()  # its next tick
        while not new_calls.calls:
            clock.advance(0.5)
            new.tick()
            assert clock.now - sent_at <= timedelta(seconds=CALLS + LEASE)
        assert new_calls.calls[0][2] - sent_at >= timedelta(seconds=CALLS)
        assert all(row.state == JobState.CONFIRMED for row in ledger.jobs())
    finally:
        old.close()
        new.close()


class EndsUnderHolder:
    """A name lock as PostgreSQL's: it can end under a live holder."""

    ends_only_with_holder = False

    def check(self) -> None:
        pass

    def session(self) -> None:
        return None

    def release(self) -> None:
        pass


class EndsWithHolder(EndsUnderHolder):
    ends_only_with_holder = True  # SQLite's, memory's


@contextmanager
def _started_beside_a_live_name(
    ledger: Ledger, lock: type[EndsUnderHolder], tick: float = 1.0
) -> Iterator[tuple[Service, ScopeOwners]]:
    """A service of name n1 started (`start_up`) while the name's earlier process is
    alive, holding the scope "fake", on a name lock like `lock`; its first tick made."""
    settings = settings_from_dict(
        {"store": {"url": "memory://"}, "daemon": {"name": "n1", "scope_lease": f"{LEASE}s",
                                                   "deadline_grace": f"{GRACE}s",
                                                   "tick": f"{tick}s"}}
    )  # fmt: skip
    rows = ledger.scope_leases()
    now = ledger.clock().timestamp()
    rows.beat("n1", now + LEASE)  # the earlier process of the name, alive
    rows.take("n1", ["fake"], now, now + LEASE)
    ledger.hold_identity = lambda name: lock()  # type: ignore[method-assign]
    service = bootstrap(
        settings,
        ledger=ledger,
        policy_loader=lambda: POLICIES,
        providers={"fake": FakeProvider("fake", clock=ledger.clock)},
    )
    try:
        start_up(service)
        submit(ledger, "k0", 0)
        service.engine.tick()
        owners = service.engine.owners
        assert owners is not None and owners.owned() == ["fake"]
        yield service, owners
    finally:
        service.close()


@pytest.mark.parametrize("lock", [EndsUnderHolder, EndsWithHolder])
def test_start_up_waits_for_the_predecessor_only_where_the_lock_can_end_under_it(
    ledger: Ledger, lock: type[EndsUnderHolder]
) -> None:
    with _started_beside_a_live_name(ledger, lock) as (_service, owners):
        waits = lock is EndsUnderHolder
        assert owners.may_call("fake", ledger.clock()) is not waits


def test_the_wait_covers_a_tick_longer_than_the_grace(ledger: Ledger) -> None:
    """The old process starts calls until its next tick's name check, up to one
    `daemon.tick` after the take: with a tick longer than the grace, a call it began just
    before that check still runs a timeout past the grace. The wait counts the tick too.
    Before, it was the longest timeout plus the grace whatever the tick: with `tick =
    "60s"` and the default grace the two processes called one mailbox for up to 30 s."""
    tick = 4 * GRACE
    clock = ledger.clock
    assert isinstance(clock, FakeClock)
    with _started_beside_a_live_name(ledger, EndsUnderHolder, tick) as (service, owners):
        taken = clock()
        # No provider in the settings: the default timeout, 30 s.
        wait = timedelta(seconds=30.0 + GRACE + tick)
        while clock() - taken < wait + timedelta(seconds=2):
            clock.advance(0.5)
            service.engine.tick()  # renews the lease
            assert owners.may_call("fake", clock()) is (clock() - taken >= wait), clock() - taken


def _restarted_as_a(ledger: Ledger) -> Service:
    """A service of name "a" on `ledger`, its name held as on PostgreSQL (a lock that can
    end under a live holder), not yet started (`start_up`)."""
    settings = settings_from_dict(
        {"store": {"url": "memory://"},
         "daemon": {"name": "a", "scope_lease": f"{LEASE}s", "deadline_grace": f"{GRACE}s"}}
    )  # fmt: skip
    ledger.hold_identity = lambda name: EndsUnderHolder()  # type: ignore[method-assign]
    providers = {"fake": FakeProvider("fake", clock=ledger.clock)}
    return bootstrap(settings, ledger=ledger, policy_loader=lambda: POLICIES, providers=providers)


@pytest.mark.parametrize("killed", [True, False])
def test_a_claim_of_a_predecessor_killed_on_this_host_is_recovered_at_once(
    ledger: Ledger, killed: bool
) -> None:
    """The old process claimed k0 and died in its call (kill -9); systemd starts the
    name again on this host. Where the name's lock can end under a live holder, its
    claims waited for their deadline (timeout plus grace, 60 s by default) before being
    taken as Unknown, like its scopes. The heartbeat names the dead process: they are
    taken at once, as on SQLite. A live one's (here: this process) still wait."""
    inner = FakeProvider("fake", clock=ledger.clock)
    old = _engine(ledger, Mailboxes(inner))
    try:
        submit(ledger, "k0", 0)
        inner.script(Scripted.crash_during_call(stored=True))
        old.hand_out()
        assert old.settle(busy=lambda: inner.hanging, timeout=10)
        (row,) = ledger.jobs()
        assert row.state == JobState.ATTEMPTED
        me = this_process()
        assert me is not None
        process = exited_process() if killed else me
        now = ledger.clock().timestamp()
        ledger.scope_leases().beat("a", now + LEASE, process.text())  # its last beat
        service = _restarted_as_a(ledger)
        try:
            start_up(service)
            (row,) = ledger.jobs()
            assert (row.state == JobState.UNKNOWN) is killed, row.state
            assert row.reason == (OWN_REASON if killed else row.reason)
        finally:
            service.close()
    finally:
        old.name_lost()
        old.close()


class UnreadableHeartbeat:
    """The scope rows, whose heartbeat cannot be read (the new column's ALTER waiting past
    `lock_timeout` behind a long transaction, the store away for a moment)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def heartbeat(self, name: str) -> None:
        raise RuntimeError("canceling statement due to lock timeout")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_a_heartbeat_that_cannot_be_read_at_start_up_keeps_the_waits(ledger: Ledger) -> None:
    """Reading whether the name's earlier process is gone is a help, not a condition of
    the start: failing, the start goes on and waits for that process as before."""
    service = _restarted_as_a(ledger)
    try:
        owners = service.engine.owners
        assert owners is not None
        owners._store = UnreadableHeartbeat(owners._store)
        assert start_up(service) is not None
        assert owners._predecessor_live is None  # judged again at the join
    finally:
        service.close()
