"""The scope leases (ledger/stores/scopes.py) and the job index's mailbox column on every
backend (docs/performance.md "Several daemons"): every write is conditional, so the store
never names two owners for one scope, and the due reads of several daemons split the
jobs by the scopes each owns."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from eventsourcing.postgres import PostgresApplicationRecorder
from eventsourcing.sqlite import SQLiteApplicationRecorder

from daemon.doubles.fake_time import FakeClock
from ledger.application import Ledger
from ledger.content import parse_job
from ledger.job import SendJob
from ledger.stores.cipher import new_key
from ledger.stores.index import INDEX_TABLE, ScopeFilter, ScopeGroup
from ledger.stores.scopes import ScopeLeaseStore
from ledger.vocabulary import JobState, PolicyRef, Sender

NOW = 1_800_000_000.0
SENDER = Sender("Shop <shop@shop.example>", "mail.shop.example", PolicyRef("receipts", "f" * 16))


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def ledger(request: pytest.FixtureRequest, tmp_path: object) -> Iterator[Ledger]:
    if request.param == "memory":
        url = "memory://"
    elif request.param == "sqlite":
        url = str(request.getfixturevalue("sqlite_url"))
    else:
        url = str(request.getfixturevalue("pg_url"))
    clock = FakeClock(datetime(2026, 11, 1, 9, 0, tzinfo=UTC))
    with Ledger(url, clock=clock) as opened:
        yield opened


@pytest.fixture
def leases(ledger: Ledger) -> ScopeLeaseStore:
    store = ledger.scope_leases()
    store.ensure()
    return store


def test_a_take_is_conditional_on_the_lease_having_ended_by_the_takers_clock(
    leases: ScopeLeaseStore,
) -> None:
    [first] = leases.take("d1", ["gmail/a@x"], NOW, NOW + 10)
    assert (first.owner, first.lease_until, first.version) == ("d1", NOW + 10, 1)
    assert leases.take("d2", ["gmail/a@x"], NOW + 9.9, NOW + 20) == []  # still d1's
    [again] = leases.take("d1", ["gmail/a@x"], NOW + 1, NOW + 11)  # its own: at any time
    assert (again.lease_until, again.version) == (NOW + 11, 2)
    assert leases.take("d2", ["gmail/a@x"], NOW + 10.9, NOW + 21) == []
    taken = leases.take("d2", ["gmail/a@x", "gmail/b@x"], NOW + 11, NOW + 21)  # ended
    assert sorted((r.scope, r.owner, r.lease_until, r.version) for r in taken) == [
        ("gmail/a@x", "d2", NOW + 21, 3),
        ("gmail/b@x", "d2", NOW + 21, 1),
    ]
    assert [(r.scope, r.owner) for r in leases.leases()] == [
        ("gmail/a@x", "d2"),
        ("gmail/b@x", "d2"),
    ]


def test_renew_touches_only_the_owners_rows_and_release_lets_others_in_after_it(
    leases: ScopeLeaseStore,
) -> None:
    assert len(leases.take("d1", ["s1", "s2"], NOW, NOW + 10)) == 2
    assert len(leases.take("d2", ["s3"], NOW, NOW + 10)) == 1
    renewed = leases.renew("d1", ["s1", "s2", "s3", "gone"], NOW + 30)
    assert sorted(r.scope for r in renewed) == ["s1", "s2"]
    assert {r.scope: r.lease_until for r in leases.leases()} == {
        "s1": NOW + 30,
        "s2": NOW + 30,
        "s3": NOW + 10,
    }
    leases.release("d1", ["s1", "s3"], NOW + 3)  # s3 is not d1's: untouched
    rows = {r.scope: r for r in leases.leases()}
    assert (rows["s1"].owner, rows["s1"].lease_until) == ("d1", NOW + 3)
    assert rows["s3"].lease_until == NOW + 10
    assert leases.take("d2", ["s1"], NOW + 2, NOW + 12) == []
    assert len(leases.take("d2", ["s1"], NOW + 3, NOW + 13)) == 1
    leases.forget(NOW + 12)  # s3's lease ended before: a missing row is a free one
    assert sorted(r.scope for r in leases.leases()) == ["s1", "s2"]


def test_heartbeats_name_the_daemons_that_share(leases: ScopeLeaseStore) -> None:
    leases.beat("d1", NOW + 10)
    leases.beat("d2", NOW + 5)
    leases.beat("d2", NOW + 20)  # written again
    assert leases.members(NOW) == ["d1", "d2"]
    assert leases.members(NOW + 15) == ["d2"]
    leases.leave("d2")
    assert leases.members(NOW) == ["d1"]


def test_many_takers_of_one_ended_lease_make_one_owner(leases: ScopeLeaseStore) -> None:
    assert leases.take("old", ["s"], NOW, NOW + 1)
    for round_ in range(5):
        at = NOW + 10 * (round_ + 1)
        won: list[str] = []
        start = threading.Barrier(4)

        def take(
            name: str,
            at: float = at,
            start: threading.Barrier = start,
            won: list[str] = won,
        ) -> None:
            start.wait()
            if leases.take(name, ["s"], at, at + 5):
                won.append(name)

        threads = [threading.Thread(target=take, args=(f"d{n}",)) for n in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(won) == 1, won
        (row,) = leases.leases()
        assert row.owner == won[0]


def submit(ledger: Ledger, key: str, sender: str, channel: str = "receipts") -> None:
    content = parse_job(
        {"channel": channel, "key": key, "from": sender, "to": "c@example.net", "subject": "s"}
        | {"body": "b\n"}
    )
    ledger.submit(content, Sender(sender, "mail.shop.example", SENDER.policy))


def test_the_due_reads_split_the_jobs_by_scope(ledger: Ledger) -> None:
    submit(ledger, "a1", "Ann <Ann@Shop.example>")
    submit(ledger, "a2", "ann@shop.example")
    submit(ledger, "b1", "bob@shop.example")
    submit(ledger, "n1", "bob@shop.example", channel="nopolicy")
    submit(ledger, "o1", "ann@shop.example", channel="other")
    now = ledger.clock() + timedelta(seconds=1)
    assert ledger.row("a1") is not None and ledger.row("a1").mailbox == "ann@shop.example"  # type: ignore[union-attr]
    assert sorted(ledger.scopes_due(now)) == [
        ("nopolicy", "bob@shop.example", ""),
        ("other", "ann@shop.example", ""),
        ("receipts", "ann@shop.example", ""),
        ("receipts", "bob@shop.example", ""),
    ]

    def keys(scopes: ScopeFilter) -> list[str]:
        return sorted(row.key for row in ledger.due(JobState.REQUESTED, now, 100, scopes))

    known = ("other", "receipts")
    ann = ScopeFilter((ScopeGroup(("receipts",), ("ann@shop.example",)),), known)
    bob = ScopeFilter((ScopeGroup(("receipts",), ("bob@shop.example",)),), known)
    whole = ScopeFilter((ScopeGroup(("other",)),), known)
    assert keys(ann) == ["a1", "a2", "n1"]  # a channel without a policy: everyone's
    assert keys(bob) == ["b1", "n1"]
    assert keys(whole) == ["n1", "o1"]
    assert keys(ScopeFilter((), known)) == ["n1"]
    assert len(ledger.due(JobState.REQUESTED, now, 100)) == 5


def as_an_earlier_release_left_them(ledger: Ledger, version_off: int = 0) -> None:
    """Every index row without its mailbox and attempt provider, as a daemon of an earlier
    release writes them; `version_off`: and its version that far from its job's."""
    recorder = ledger.recorder
    if hasattr(recorder, "_rows"):  # memory
        rows = recorder._rows
        for key, row in rows.items():
            blank = {
                "mailbox": None,
                "attempt_provider": None,
                "version": row.version + version_off,
            }
            rows[key] = row.__class__(**{**row.as_dict(), **blank})
    else:
        assert isinstance(recorder, SQLiteApplicationRecorder | PostgresApplicationRecorder)
        table = INDEX_TABLE
        if hasattr(recorder.datastore, "schema"):
            table = f'"{recorder.datastore.schema}".{INDEX_TABLE}'
        with recorder.datastore.transaction(commit=True) as cursor:
            cursor.execute(
                f"UPDATE {table} SET mailbox = NULL, attempt_provider = NULL, "
                f"version = version + {int(version_off)}"
            )


def test_open_jobs_of_an_earlier_release_get_their_mailbox(ledger: Ledger) -> None:
    submit(ledger, "k1", "Ann <ann@shop.example>")
    submit(ledger, "k2", "bob@shop.example")
    as_an_earlier_release_left_them(ledger)
    now = ledger.clock() + timedelta(seconds=1)
    assert ledger.scopes_due(now) == [("receipts", None, None)]
    assert ledger.fill_mailboxes(batch=1) == 2
    assert sorted(ledger.scopes_due(now)) == [
        ("receipts", "ann@shop.example", ""),
        ("receipts", "bob@shop.example", ""),
    ]
    assert ledger.fill_mailboxes() == 0


def test_a_row_filled_from_an_older_version_is_filled_again_from_the_newer(
    ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A daemon's start-up fills the rows an earlier release wrote (`fill_mailboxes`)
    while a daemon of that release, still running in a rolling upgrade, writes the job
    again: it claims it on provider `p0` and writes the row without the columns. The fill,
    from the job as it read it (not attempted: its next call is its channel's, ""), wrote
    that over the newer row: an attempted job whose calls are made on `p0` said they are
    made on its channel's provider, whichever that is since a reload, and the scope that
    owns its search never counted it. A fill holds only for the version it read."""
    submit(ledger, "k1", "ann@shop.example")
    as_an_earlier_release_left_them(ledger)
    read = ledger.get_jobs
    writes = [True]

    def read_then_the_earlier_release_writes(keys: list[str]) -> dict[str, SendJob]:
        jobs = read(keys)
        if writes.pop() if writes else False:
            job = ledger.get_job("k1")
            now = ledger.clock()
            job.claim(provider="p0", deadline=now + timedelta(seconds=60), at=now, daemon="d0")
            ledger.save_job(job)
            as_an_earlier_release_left_them(ledger)
        return jobs

    monkeypatch.setattr(ledger, "get_jobs", read_then_the_earlier_release_writes)
    ledger.fill_mailboxes()
    row = ledger.row("k1")
    assert row is not None and row.version == 2 and row.state == "attempted"
    assert (row.mailbox, row.attempt_provider) == ("ann@shop.example", "p0")
    assert ledger.fill_mailboxes() == 0


def test_a_row_behind_its_events_ends_the_fill_unfilled(ledger: Ledger) -> None:
    """A row whose version is not its job's (an index damaged by hand) is never filled from
    the job, and the fill ends all the same; `admin rebuild-index` rewrites it."""
    submit(ledger, "k1", "ann@shop.example")
    as_an_earlier_release_left_them(ledger, version_off=-1)
    ledger.fill_mailboxes()
    row = ledger.row("k1")
    assert row is not None and (row.mailbox, row.attempt_provider) == (None, None)
    ledger.rebuild_index()
    row = ledger.row("k1")
    assert row is not None and (row.mailbox, row.attempt_provider) == ("ann@shop.example", "")


def test_an_encrypted_store_keeps_a_keyed_digest_of_the_mailbox_the_same_across_a_rotation(
    sqlite_url: str,
) -> None:
    """docs/configuration.md "Encryption at rest": no address in the clear, and every
    daemon, before and after a key rotation, names a mailbox alike (or two could own it)."""
    old, new = new_key(), new_key()
    with Ledger(sqlite_url, encryption_keys=[old]) as ledger:
        submit(ledger, "k1", "Ann <ann@shop.example>")
        row = ledger.row("k1")
        assert row is not None and row.mailbox is not None
        assert "ann" not in row.mailbox and row.mailbox.startswith("~")
        before = ledger.mailbox_of("ann@shop.example")
        assert row.mailbox == before != ledger.mailbox_of("bob@shop.example")
    for ring in ([old, new], [new, old]):  # steps (1) and (2) of a rotation
        with Ledger(sqlite_url, encryption_keys=ring) as ledger:
            assert ledger.mailbox_of("ANN@shop.example") == before
    with Ledger(sqlite_url.replace("ledger.sqlite", "other.sqlite"), encryption_keys=[old]) as x:
        assert x.mailbox_of("ann@shop.example") == before  # the key's, not the file's
    with Ledger(sqlite_url.replace("ledger.sqlite", "plain.sqlite")) as plain:
        assert plain.mailbox_of("Ann <ANN@shop.example>") == "ann@shop.example"


def test_a_store_that_daemons_on_other_hosts_share_tells_its_time(
    ledger: Ledger, leases: ScopeLeaseStore
) -> None:
    # PostgreSQL's own clock, read now (not the transaction's start), for each daemon to
    # hold its clock to (daemon/engine/owners.py: clock_off); memory and SQLite run on
    # their daemon's host and clock: none.
    before = time.time()
    told = leases.store_time()
    after = time.time()
    if type(leases).__name__ != "PostgresScopeLeases":
        assert told is None
    else:
        assert told is not None and before - 1.0 <= told <= after + 1.0  # one host here


@pytest.mark.postgres
def test_a_renewal_behind_a_row_lock_gives_up_at_lock_timeout_and_the_sends_stop_in_time(
    pg_url: str,
) -> None:
    """Another session holds the scope's row (a long transaction, an open psql): the
    renewal waited on it without limit, holding the renewer (and a stop joining it, and a
    round wanting to release). It gives up at `[store] lock_timeout`, and the daemon stops
    calling for the scope a grace before its lease ends as last written."""
    import dataclasses

    import psycopg
    from tests.conftest import PG_URL
    from tests.unit.engine_rig import policy

    from daemon.doubles.fake_provider import FakeProvider
    from daemon.engine import PolicyHolder
    from daemon.engine.owners import ScopeOwners
    from ledger.stores.scopes import SCOPES_TABLE
    from ledger.stores.url import PostgresStore, parse_store_url
    from policies.loader import PolicySet

    spec = parse_store_url(pg_url)
    assert isinstance(spec, PostgresStore)
    spec = dataclasses.replace(spec, lock_timeout=1)
    clock = FakeClock(datetime.now(UTC))
    with Ledger(spec, clock=clock) as ledger:
        store = ledger.scope_leases()
        store.store_time = lambda: clock().timestamp()  # type: ignore[method-assign]
        owners = ScopeOwners(
            store,
            PolicyHolder(lambda: PolicySet({"receipts": policy("receipts")})),
            {"fake": FakeProvider("fake", clock=clock)},
            daemon="d1",
            lease=30.0,
            grace=5.0,
            horizon=40.0,
            clock=clock,
        )
        owners.balance([("receipts", "support@example.com", "")], clock())
        assert owners.owned() == ["fake"] and owners.may_call("fake", clock())
        clock.advance(11)  # a renewal is due
        outcome: list[BaseException | None] = []

        def renew() -> None:
            try:
                owners.renew_due()
                outcome.append(None)
            except Exception as exc:
                outcome.append(exc)

        with psycopg.connect(PG_URL) as holder:
            holder.execute(f'SELECT 1 FROM "{spec.schema}".{SCOPES_TABLE} FOR UPDATE')
            renewer = threading.Thread(target=renew, daemon=True)
            started = time.monotonic()
            renewer.start()
            renewer.join(timeout=10)
            waited = time.monotonic() - started
            holder.rollback()
        renewer.join(timeout=10)
        assert waited < 5.0, "the renewal still waited behind the row lock"
        assert len(outcome) == 1 and outcome[0] is not None, outcome
        # Not renewed: the lease ends at 30 s as written, the calls stop at 25 s.
        clock.advance(13.9)
        assert owners.may_call("fake", clock())
        clock.advance(0.2)
        assert not owners.may_call("fake", clock())
        owners.renew_due()  # the row is free again: renewed, the calls go on
        assert owners.may_call("fake", clock())
        owners.close()
