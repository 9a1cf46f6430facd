"""Two processes under one daemon name on real PostgreSQL (tests/unit/test_same_name_scopes.py
on the memory store): the name's lock there can end under a live daemon, so a new process
of the name calls for the scopes the name held only once the old one's calls there are past
their deadline; after a stop, at once. Real time, short durations: the scope leases hold
each daemon's clock to the server's."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
import tests.conftest as conftest
from tests.unit.test_scope_owners import POLICIES, Mailboxes, scope, submit

from daemon.doubles.fake_provider import FakeProvider
from daemon.engine import Engine, PolicyHolder
from ledger.application import Ledger
from ledger.stores import IdentityLock, IdentityTaken
from ledger.stores.postgres import AdvisoryIdentityLock
from ledger.stores.scopes import DAEMONS_TABLE, Heartbeat

pytestmark = pytest.mark.postgres

TIMEOUT = 0.5
GRACE = 1.0
LEASE = 2.0
CALLS = TIMEOUT + GRACE


def _engine(ledger: Ledger, provider: Mailboxes) -> Engine:
    return Engine(ledger, PolicyHolder(lambda: POLICIES), {"fake": provider},
                  provider_timeouts={"fake": TIMEOUT}, deadline_grace=GRACE,
                  rng=random.Random(1), daemon_name="a", scope_lease=LEASE)  # fmt: skip


def _first_call_after_restart(pg_url: str, *, stopped: bool, run: str = "") -> float:
    """Seconds from the new process's start to its first call for the mailbox the old
    process of its name was sending."""
    with Ledger(pg_url) as ledger:
        inner = FakeProvider("fake", clock=ledger.clock)
        old_calls, new_calls = Mailboxes(inner), Mailboxes(inner)
        old = _engine(ledger, old_calls)
        try:
            submit(ledger, f"k0{run}", 0)
            old.tick()
            assert len(old_calls.calls) == 1
            if stopped:
                old.close()  # SIGTERM: its calls ended, its scopes released
            # A database restart ended the old one's session: the name is free.
            identity = ledger.hold_identity("a")
            try:
                assert not identity.ends_only_with_holder
                new = _engine(ledger, new_calls)
                try:
                    new.wait_for_predecessor(0.0)  # as start_up does here (ticks called by hand)
                    started = time.monotonic()
                    submit(ledger, f"k1{run}", 0)
                    while not new_calls.calls:
                        new.tick()
                        assert time.monotonic() - started < CALLS + 5.0
                        time.sleep(0.05)
                    return time.monotonic() - started
                finally:
                    new.close()
            finally:
                identity.release()
        finally:
            old.name_lost()
            old.close()


def test_on_postgresql_a_new_process_of_a_live_name_waits_for_its_calls(pg_url: str) -> None:
    assert _first_call_after_restart(pg_url, stopped=False) >= CALLS


def test_on_postgresql_a_restart_after_a_stop_sends_at_once(pg_url: str) -> None:
    assert _first_call_after_restart(pg_url, stopped=True) < CALLS


def _taken_after_a_restart(ledger: Ledger, name: IdentityLock) -> IdentityLock:
    """The session holding `name` ended by the server, as a database restart ends it (the
    process holding it none the wiser), and the name taken by a new process."""
    assert isinstance(name, AdvisoryIdentityLock) and name._conn is not None
    pid = name._conn.info.backend_pid
    recorder: Any = ledger.recorder  # PostgreSQL's: a pool of its own
    with recorder.datastore.transaction(commit=True) as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
    deadline = time.monotonic() + 5.0
    while True:
        try:
            return ledger.hold_identity("a")
        except IdentityTaken:  # its lock goes a moment after
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def test_on_postgresql_the_old_process_renews_the_name_s_scopes_no_more_once_it_is_taken(
    pg_url: str,
) -> None:
    """A restart ended the old process's lock and a new one took the name, while the old
    one's tick was held up: its renewer kept renewing the name's scope leases (the same
    owner name) and its workers kept calling, past the new process's wait for its calls.
    Now each renewal asks the name's lock first: taken, it renews nothing and calls for no
    scope (the tick, when it comes, stops the daemon as before)."""
    with Ledger(pg_url) as ledger, _sending_then_taken(ledger, sessions=False) as (old, _):
        assert old.owners is not None
        due = datetime.now(UTC) + timedelta(seconds=LEASE / 2)  # a renewal due
        old.owners.renew_due(due)
        assert old.owners.owned() == []
        assert not old.owners.may_call(scope(0), due)


@contextmanager
def _sending_then_taken(ledger: Ledger, *, sessions: bool) -> Iterator[tuple[Engine, IdentityLock]]:
    """An old process of name "a" sending for mailbox 0 (`sessions`: its writes under the
    name asked of its session), then a restart ending its session and a new process
    taking the name, no check of the old one's told: the old engine and the new name."""
    old_name = ledger.hold_identity("a")
    old = _engine(ledger, Mailboxes(FakeProvider("fake", clock=ledger.clock)))
    old.check_name_by(old_name.check, old_name.session if sessions else None)
    try:
        submit(ledger, "k0", 0)
        old.tick()
        assert old.owners is not None and old.owners.owned() == [scope(0)]
        new_name = _taken_after_a_restart(ledger, old_name)
        try:
            yield old, new_name
        finally:
            new_name.release()
    finally:
        old.name_lost()
        old.close()
        old_name.release()


#: The old process: a daemon of name "a" that sends for mailbox 0, then hangs in nothing
#: until it is killed.
_KILLED = textwrap.dedent(
    """
    import random, sys, time
    from tests.unit.test_scope_owners import POLICIES, Mailboxes, submit
    from daemon.doubles.fake_provider import FakeProvider
    from daemon.engine import Engine, PolicyHolder
    from ledger.application import Ledger

    ledger = Ledger(sys.argv[1])
    name = ledger.hold_identity("a")
    calls = Mailboxes(FakeProvider("fake", clock=ledger.clock))
    engine = Engine(ledger, PolicyHolder(lambda: POLICIES), {"fake": calls},
                    provider_timeouts={"fake": float(sys.argv[2])},
                    deadline_grace=float(sys.argv[3]), rng=random.Random(1),
                    daemon_name="a", scope_lease=float(sys.argv[4]))
    engine.wait_for_predecessor(0.0)
    submit(ledger, "k0", 0)
    engine.tick()
    assert len(calls.calls) == 1
    print("sending", flush=True)
    time.sleep(600)
    """
)


def first_call_after_kill_9(
    pg_url: str, *, timeout: float, grace: float, lease: float, tick: float = 0.0
) -> float:
    """Seconds from a new process's start, once the old one was killed with kill -9, to its
    first call for the mailbox the old one was sending (its name's lock ended with it).
    `tick`: `daemon.tick`, which the wait counts (the ticks here are called by hand)."""
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    old = subprocess.Popen(
        [sys.executable, "-c", _KILLED, pg_url, str(timeout), str(grace), str(lease)],
        stdout=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        assert old.stdout is not None and old.stdout.readline().strip() == "sending"
    finally:
        old.send_signal(signal.SIGKILL)
        old.wait()  # reaped, as systemd reaps it
    with Ledger(pg_url) as ledger:
        deadline = time.monotonic() + 5.0
        while True:
            try:
                identity = ledger.hold_identity("a")
                break
            except IdentityTaken:  # the server ends its session a moment after
                assert time.monotonic() < deadline
                time.sleep(0.02)
        calls = Mailboxes(FakeProvider("fake", clock=ledger.clock))
        new = Engine(ledger, PolicyHolder(lambda: POLICIES), {"fake": calls},
                     provider_timeouts={"fake": timeout}, deadline_grace=grace,
                     rng=random.Random(1), daemon_name="a", scope_lease=lease)  # fmt: skip
        try:
            new.wait_for_predecessor(tick)  # start_up's
            started = time.monotonic()
            submit(ledger, "k1", 0)
            while not calls.calls:
                new.tick()
                assert time.monotonic() - started < timeout + grace + tick + 5.0
                time.sleep(0.05)
            return time.monotonic() - started
        finally:
            new.close()
            identity.release()


def test_on_postgresql_a_restart_after_kill_9_on_this_host_sends_at_once(pg_url: str) -> None:
    """systemd restarting a daemon killed with kill -9: the name's heartbeat is live (no
    stop removed it), so the new process waited for the old one's calls, the longest
    timeout plus the grace (61 s with the defaults, 1.5 s here), though the kernel says
    the old process is gone. The heartbeat names its process now: the wait is skipped."""
    took = first_call_after_kill_9(pg_url, timeout=TIMEOUT, grace=GRACE, lease=LEASE)
    print(f"first call {took:.2f}s after the restart (the wait: {CALLS}s)")
    assert took < CALLS


def test_on_postgresql_a_heartbeat_an_earlier_release_wrote_over_names_no_process(
    pg_url: str,
) -> None:
    """A daemon of an earlier release writes `seen_until` alone (its upsert, below) over
    a row a killed process of this release wrote: that process is no longer the writer,
    and the one that is may be alive. The row names no process, and the wait is kept; a
    table the earlier release created gains the column at the first start."""
    with Ledger(pg_url) as ledger:
        recorder: Any = ledger.recorder
        table = f'"{recorder.datastore.schema}".{DAEMONS_TABLE}'
        with recorder.datastore.transaction(commit=True) as cursor:
            # The earlier release's table, then this release's ensure.
            cursor.execute(f"CREATE TABLE {table} (name TEXT PRIMARY KEY, "
                           "seen_until DOUBLE PRECISION NOT NULL)")  # fmt: skip
        rows = ledger.scope_leases()
        rows.ensure()
        now = time.time()
        rows.beat("a", now + LEASE, '{"pid": 1}')
        beat = rows.heartbeat("a")
        assert beat is not None and beat.process == '{"pid": 1}'
        with recorder.datastore.transaction(commit=True) as cursor:
            cursor.execute(
                f"INSERT INTO {table} (name, seen_until) VALUES (%s, %s) "
                "ON CONFLICT (name) DO UPDATE SET seen_until = excluded.seen_until",
                ["a", now + 2 * LEASE],
            )
        assert rows.heartbeat("a") == Heartbeat(now + 2 * LEASE, None)


@contextmanager
def _taken_at_a_check(
    ledger: Ledger, then: Callable[[], None] = lambda: None
) -> Iterator[tuple[Engine, list[IdentityLock], list[bool]]]:
    """An old process of name "a", sending for mailbox 0, whose name check passes and,
    once `armed[0]` is set, loses the name to a new process right after (`then`: what the
    new process does at once): a restart and a take between the check and the write."""
    old_name = ledger.hold_identity("a")
    taken: list[IdentityLock] = []
    armed = [False]

    def check_then_taken() -> None:
        old_name.check()  # held: the check passes
        if armed[0] and not taken:
            taken.append(_taken_after_a_restart(ledger, old_name))  # and meanwhile
            then()

    old = _engine(ledger, Mailboxes(FakeProvider("fake", clock=ledger.clock)))
    old.check_name_by(check_then_taken, old_name.session)
    try:
        submit(ledger, "k0", 0)
        old.tick()
        yield old, taken, armed
    finally:
        for name in taken:
            name.release()
        old.name_lost()
        old.close()
        old_name.release()


def test_on_postgresql_a_name_taken_between_the_check_and_the_renewal_renews_nothing(
    pg_url: str,
) -> None:
    """The renewal asks the name, then writes: a restart that ended the old process's
    session and a new process that took the name in between got the name's scope leases
    renewed by the old one all the same, which kept calling for them until its next
    check. The write now asks the server that the session that held the name at the
    check still holds it (`pg_locks`, in the statement): it renews nothing."""
    with Ledger(pg_url) as ledger, _taken_at_a_check(ledger) as (old, taken, armed):
        assert old.owners is not None and old.owners.owned() == [scope(0)]
        armed[0] = True
        due = datetime.now(UTC) + timedelta(seconds=LEASE / 2)  # a renewal due
        old.owners.renew_due(due)
        assert taken  # the name went to the new process between check and write
        assert old.owners.owned() == []
        assert not old.owners.may_call(scope(0), due)
        (row,) = ledger.scope_leases().leases()
        assert row.lease_until < due.timestamp() + LEASE / 2  # not renewed


def test_on_postgresql_a_heartbeat_table_held_at_the_upgrade_costs_one_wait_not_the_join(
    pg_url: str,
) -> None:
    """The first start of this release adds the heartbeat table's `process` column, an
    ALTER TABLE that waits for every transaction on the table (a pg_dump's, an open psql)
    and that every other daemon's beat queues behind. Refused after `[store] lock_timeout`,
    it was tried again at each renewal, every few seconds: this daemon renewed nothing and
    sent nothing while the transaction lasted, and the daemons of the earlier release
    waited behind each try. It is now tried once: the heartbeat is then written without
    the process (the waits kept, as an earlier release's row) until the next start."""
    with Ledger(pg_url) as ledger:
        recorder: Any = ledger.recorder
        recorder.datastore.lock_timeout = 1
        table = f'"{recorder.datastore.schema}".{DAEMONS_TABLE}'
        with recorder.datastore.transaction(commit=True) as cursor:
            cursor.execute(f"CREATE TABLE {table} (name TEXT PRIMARY KEY, "
                           "seen_until DOUBLE PRECISION NOT NULL)")  # fmt: skip
        with psycopg.connect(conftest.PG_URL) as dump:  # a transaction reading the table, held
            dump.execute(f"SELECT count(*) FROM {table}").fetchone()
            rows = ledger.scope_leases()
            rows.ensure()  # one wait of lock_timeout, then on without the column
            now = time.time()
            for _ in range(3):  # the renewals that follow: no ALTER, no wait
                started = time.monotonic()
                rows.ensure()
                rows.beat("a", now + LEASE, '{"pid": 1}')
                assert rows.heartbeat("a") == Heartbeat(now + LEASE, None)
                assert time.monotonic() - started < 0.5
            dump.rollback()


def test_on_postgresql_a_name_taken_between_the_check_and_the_beat_keeps_the_new_row(
    pg_url: str,
) -> None:
    """The renewal's heartbeat was written unconditioned: a process that lost the name
    between its check and its write wrote its own mark over the row of the process that
    took the name (which, waiting for it, names none). The row then vouched for the old
    process alone: once that one stopped, the next start of the name took it for gone
    and called at once beside the holder it had not waited for. The beat is now made
    only while the session that held the name at the check still holds it."""
    with Ledger(pg_url) as ledger:
        rows = ledger.scope_leases()

        def first_beat() -> None:  # the new process's, naming no process while it waits
            rows.beat("a", time.time() + LEASE, None)

        with _taken_at_a_check(ledger, first_beat) as (old, taken, armed):
            assert old.owners is not None
            before = rows.heartbeat("a")
            assert before is not None and before.process is not None  # the old one's mark
            armed[0] = True
            old.owners.renew_due(datetime.now(UTC) + timedelta(seconds=LEASE / 2))
            assert taken
            after = rows.heartbeat("a")
            assert after is not None and after.process is None  # the new process's row


def test_on_postgresql_the_renewal_s_condition_is_the_session_not_its_pid(pg_url: str) -> None:
    """The renewal's condition named the name's session by its server pid alone: a server
    restarted in a fresh container gives its pids out again in the same order, so the
    session of the process that took the name could have the pid of the one the old
    process held, and the old one's writes went on. The session's start is asked too: a
    session of that pid begun at another time renews nothing."""
    with Ledger(pg_url) as ledger:
        name = ledger.hold_identity("a")
        try:
            rows = ledger.scope_leases()
            rows.ensure()
            now = time.time()
            assert rows.take("a", [scope(0)], now, now + LEASE)
            held = name.session()
            assert held is not None and held.pid
            later = replace(held, started=held.started + timedelta(seconds=1))
            assert rows.renew("a", [scope(0)], now + 2 * LEASE, later) == []
            assert len(rows.renew("a", [scope(0)], now + 2 * LEASE, held)) == 1
        finally:
            name.release()


def test_on_postgresql_a_stop_after_the_name_was_taken_leaves_the_new_process_s_rows(
    pg_url: str,
) -> None:
    """A daemon stopping while a restart ends its session and a new process takes the
    name (and renews the name's scope leases and heartbeat as its own), before any check
    of the stopping one told it: its stop released the name's leases (ending them a grace
    later, while the new process calls for them by its own renewal: another daemon takes
    the mailbox and both send from it) and removed the new process's heartbeat. The stop's
    writes now ask the server, as the renewal's do, that its session still holds the
    name: they write nothing."""
    with Ledger(pg_url) as ledger, _sending_then_taken(ledger, sessions=True) as (old, new):
        assert old.owners is not None
        rows = ledger.scope_leases()
        until = time.time() + LEASE  # the new process's renewal, by its session
        rows.beat("a", until, '{"pid": 2}', new.session())
        assert rows.renew("a", [scope(0)], until, new.session())
        old.owners.close()  # the old one's stop, no check of its name since
        (row,) = rows.leases()
        assert row.lease_until == pytest.approx(until, abs=0.001)  # not released
        assert rows.heartbeat("a") == Heartbeat(until, '{"pid": 2}')
