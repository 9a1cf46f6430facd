"""The Ledger against a real store (SQLite file, PostgreSQL schema).

Covers idempotent intake, the job index staying in step with the events, the index
queries, optimistic concurrency (invariant 1) and rebuilding the index from the events.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from tests.conftest import FakeClock

from ledger.application import (
    ConcurrentUpdate,
    KeyConflict,
    Ledger,
    Sender,
    UnknownJob,
)
from ledger.content import JobContent
from ledger.index import IndexRow, index_row
from ledger.job import SendJob, TransitionError
from ledger.message_id import message_id_for
from ledger.store_url import PostgresStore, SqliteStore

DOMAIN = "mail.example.com"
SENDER = Sender(
    from_addr="Support <support@example.com>",
    message_id_domain=DOMAIN,
    policy="receipts",
    fingerprint="0123456789abcdef",
)
POLICY = {"policy": "receipts", "fingerprint": "0123456789abcdef"}


def content(key: str, *, subject: str = "Your receipt", body: str = "Thanks") -> JobContent:
    return JobContent(
        channel="receipts",
        key=key,
        to=("Alice <alice@example.com>",),
        subject=subject,
        body=body,
    )


@pytest.fixture
def ledger(store_url: str, clock: FakeClock) -> Iterator[Ledger]:
    app = Ledger(store_url, clock=clock)
    try:
        yield app
    finally:
        app.close()


def raw_query(app: Ledger, sql_sqlite: str, sql_pg: str) -> list[tuple[Any, ...]]:
    """Read the store with a connection of its own, not through the code under test."""
    spec = app.store
    if isinstance(spec, SqliteStore):
        conn = sqlite3.connect(spec.path)
        try:
            return [tuple(r) for r in conn.execute(sql_sqlite).fetchall()]
        finally:
            conn.close()
    assert isinstance(spec, PostgresStore)
    import psycopg

    with psycopg.connect(
        dbname=spec.dbname,
        host=spec.host,
        port=spec.port,
        user=spec.user,
        password=spec.password,
    ) as conn:
        schema = spec.schema.replace('"', '""')
        return [tuple(r) for r in conn.execute(sql_pg.replace("{schema}", f'"{schema}"'))]


def stored_topics(app: Ledger) -> list[str]:
    rows = raw_query(
        app,
        "SELECT topic FROM stored_events ORDER BY rowid",
        "SELECT topic FROM {schema}.sendledger_events ORDER BY notification_id",
    )
    return [str(r[0]) for r in rows]


def event_types(app: Ledger, key: str) -> list[str]:
    return [type(e).__name__ for e in app.history(key)]


def assert_index_in_step(app: Ledger, key: str) -> IndexRow:
    job = app.get_job(key)
    row = app.index.job_by_key(key)
    assert row is not None
    assert row == index_row(job)
    assert app.index.job_by_message_id(job.message_id) == row
    return row


# -- intake ----------------------------------------------------------------------------


def test_submit_creates_a_job(ledger: Ledger, clock: FakeClock) -> None:
    result = ledger.submit(content("order-1"), SENDER)
    assert result.created is True
    assert result.key == "order-1"
    assert result.state == "requested"
    assert result.message_id == message_id_for("order-1", DOMAIN)

    job = ledger.get_job("order-1")
    assert job.state.value == "requested"
    assert job.version == 1
    assert job.to == ["Alice <alice@example.com>"]
    assert job.content_hash == content("order-1").content_hash
    assert event_types(ledger, "order-1") == ["Requested"]

    row = assert_index_in_step(ledger, "order-1")
    assert row.state == "requested"
    assert row.version == 1
    assert row.attempts == 0
    assert row.reason is None
    assert row.channel == "receipts"
    assert row.due_at == clock.now.timestamp()


def test_same_key_same_content_is_a_noop(ledger: Ledger, clock: FakeClock) -> None:
    first = ledger.submit(content("order-1"), SENDER)
    clock.advance(60)
    again = ledger.submit(content("order-1"), SENDER)
    assert again.created is False
    assert (again.key, again.message_id, again.state) == (
        first.key,
        first.message_id,
        first.state,
    )
    assert event_types(ledger, "order-1") == ["Requested"]
    assert ledger.get_job("order-1").version == 1
    assert stored_topics(ledger) == ["sendledger:SendJob.Requested"]


def test_same_key_other_content_conflicts_and_leaves_the_job(
    ledger: Ledger, clock: FakeClock
) -> None:
    ledger.submit(content("order-1"), SENDER)
    before_row = assert_index_in_step(ledger, "order-1")
    before_events = [(type(e).__name__, e.originator_version) for e in ledger.history("order-1")]
    clock.advance(60)

    with pytest.raises(KeyConflict) as info:
        ledger.submit(content("order-1", body="other body"), SENDER)
    assert info.value.key == "order-1"

    job = ledger.get_job("order-1")
    assert job.version == 1
    assert job.body == "Thanks"
    after_events = [(type(e).__name__, e.originator_version) for e in ledger.history("order-1")]
    assert after_events == before_events
    assert ledger.index.job_by_key("order-1") == before_row
    assert len(stored_topics(ledger)) == 1


def test_conflict_after_progress_leaves_the_job_as_it_was(ledger: Ledger, clock: FakeClock) -> None:
    ledger.submit(content("order-1"), SENDER)
    ledger.update("order-1", lambda j: j.attempt(**attempt_args(clock)))
    before = assert_index_in_step(ledger, "order-1")
    with pytest.raises(KeyConflict):
        ledger.submit(content("order-1", subject="Changed"), SENDER)
    assert ledger.get_job("order-1").version == 2
    assert event_types(ledger, "order-1") == ["Requested", "Attempted"]
    assert ledger.index.job_by_key("order-1") == before
    # The same content is still a no-op, and reports the job's current state.
    result = ledger.submit(content("order-1"), SENDER)
    assert (result.created, result.state) == (False, "attempted")


def test_unknown_job(ledger: Ledger) -> None:
    with pytest.raises(UnknownJob):
        ledger.get_job("nope")
    with pytest.raises(UnknownJob):
        ledger.history("nope")
    assert ledger.find_job("nope") is None
    assert ledger.index.job_by_key("nope") is None
    assert ledger.index.job_by_message_id(message_id_for("nope", DOMAIN)) is None


def test_events_are_stored_with_explicit_topics(ledger: Ledger, clock: FakeClock) -> None:
    ledger.submit(content("order-1"), SENDER)
    ledger.update("order-1", lambda j: j.attempt(**attempt_args(clock)))
    ledger.update(
        "order-1",
        lambda j: j.confirm(via="response", provider_message_ids=["p1"], at=clock(), **POLICY),
    )
    assert stored_topics(ledger) == [
        "sendledger:SendJob.Requested",
        "sendledger:SendJob.Attempted",
        "sendledger:SendJob.Confirmed",
    ]
    # And they replay into the aggregate from those topics.
    assert ledger.get_job("order-1").state.value == "confirmed"


# -- commands keep the index in step ---------------------------------------------------


def attempt_args(clock: FakeClock, timeout: float = 30) -> dict[str, Any]:
    return {
        "provider": "support",
        "deadline": clock() + timedelta(seconds=timeout),
        "at": clock(),
    }


def test_history_is_oldest_first(ledger: Ledger, clock: FakeClock) -> None:
    ledger.submit(content("order-1"), SENDER)
    clock.advance(1)
    ledger.update("order-1", lambda j: j.attempt(**attempt_args(clock)))
    clock.advance(1)
    ledger.update(
        "order-1",
        lambda j: j.record_unknown(reason="timeout", search_due_at=None, at=clock(), **POLICY),
    )
    events = ledger.history("order-1")
    assert [type(e).__name__ for e in events] == ["Requested", "Attempted", "Unknown"]
    assert [e.originator_version for e in events] == [1, 2, 3]
    stamps = [e.timestamp for e in events]
    assert stamps == sorted(stamps)


def test_a_jobs_life_keeps_the_index_row_in_step(ledger: Ledger, clock: FakeClock) -> None:
    key = "order-life"
    ledger.submit(content(key), SENDER)
    steps: list[tuple[Callable[[SendJob], Any], dict[str, Any]]] = []

    def step(command: Callable[[SendJob], Any], **expected: Any) -> None:
        steps.append((command, expected))

    t0 = clock()

    def at(seconds: float) -> datetime:
        return t0 + timedelta(seconds=seconds)

    step(
        lambda j: j.attempt(provider="support", deadline=at(30), at=at(0)),
        state="attempted",
        due_at=at(30),
        attempts=1,
        reason=None,
    )
    step(
        lambda j: j.record_unknown(reason="timeout", search_due_at=at(300), at=at(31), **POLICY),
        state="unknown",
        due_at=at(300),
        attempts=1,
        reason="timeout",
    )
    step(
        lambda j: j.record_miss(query="q", next_search_at=at(600), at=at(300), **POLICY),
        state="unknown",
        due_at=at(600),
        reason="timeout",
    )
    step(
        lambda j: j.record_miss(query="q", next_search_at=None, at=at(600), **POLICY),
        state="unknown",
        due_at=None,
    )
    step(
        lambda j: j.requeue(
            reason="misses", due_at=at(600), misses_required=2, at=at(600), **POLICY
        ),
        state="requested",
        due_at=at(600),
        reason="misses",
        attempts=1,
    )
    step(
        lambda j: j.attempt(provider="support", deadline=at(630), at=at(601)),
        state="attempted",
        due_at=at(630),
        attempts=2,
        reason=None,
    )
    step(
        lambda j: j.reject(
            transient=True,
            reason="rate-limited",
            status=429,
            retry_at=at(700),
            at=at(602),
            **POLICY,
        ),
        state="requested",
        due_at=at(700),
        reason="rate-limited",
        attempts=2,
    )
    step(
        lambda j: j.attempt(provider="support", deadline=at(730), at=at(700)),
        state="attempted",
        due_at=at(730),
        attempts=3,
    )
    step(
        lambda j: j.record_unknown(reason="5xx", search_due_at=None, at=at(701), **POLICY),
        state="unknown",
        due_at=None,
        reason="5xx",
    )
    step(
        lambda j: j.escalate(
            reason="unknown-outcome", detail="review policy", at=at(702), **POLICY
        ),
        state="review",
        due_at=None,
        reason="unknown-outcome",
        attempts=3,
    )
    step(
        lambda j: j.resolve(decision="sent", note="found it", by="ops", at=at(800)),
        state="confirmed",
        due_at=None,
        reason="resolved: sent",
    )

    for version, (command, expected) in enumerate(steps, start=2):
        ledger.update(key, command)
        row = assert_index_in_step(ledger, key)
        # `resolve(sent)` appends two events (Resolved, Confirmed).
        assert row.version == ledger.get_job(key).version >= version
        for field, value in expected.items():
            if field == "due_at":
                value = None if value is None else value.timestamp()
            assert getattr(row, field) == value, (field, row)
    assert event_types(ledger, key)[-2:] == ["Resolved", "Confirmed"]
    assert ledger.index.count_by_state() == {"confirmed": 1}


def test_refused_command_stores_nothing(ledger: Ledger, clock: FakeClock) -> None:
    ledger.submit(content("order-1"), SENDER)
    before = assert_index_in_step(ledger, "order-1")
    with pytest.raises(TransitionError):
        ledger.update(
            "order-1",
            lambda j: j.record_unknown(reason="timeout", search_due_at=None, at=clock(), **POLICY),
        )
    assert event_types(ledger, "order-1") == ["Requested"]
    assert ledger.index.job_by_key("order-1") == before


# -- index queries ---------------------------------------------------------------------


def test_jobs_due_returns_only_due_jobs_in_the_state_ordered(
    ledger: Ledger, clock: FakeClock
) -> None:
    t0 = clock()
    # Requested jobs are due at their submission time; submit out of order of key.
    for offset, key in [(30, "c"), (10, "a"), (20, "b"), (40, "d")]:
        clock.now = t0 + timedelta(seconds=offset)
        ledger.submit(content(key), SENDER)
    # Move "d" into attempted with a deadline: it leaves the requested set.
    clock.now = t0 + timedelta(seconds=41)
    ledger.update("d", lambda j: j.attempt(**attempt_args(clock, timeout=100)))

    now = (t0 + timedelta(seconds=25)).timestamp()
    due = ledger.index.jobs_due("requested", now, 100)
    assert [r.key for r in due] == ["a", "b"]

    later = (t0 + timedelta(seconds=1000)).timestamp()
    assert [r.key for r in ledger.index.jobs_due("requested", later, 100)] == ["a", "b", "c"]
    assert [r.key for r in ledger.index.jobs_due("requested", later, 2)] == ["a", "b"]
    assert [r.key for r in ledger.index.jobs_due("attempted", now, 100)] == []
    assert [r.key for r in ledger.index.jobs_due("attempted", later, 100)] == ["d"]
    assert ledger.index.jobs_due("unknown", later, 100) == []

    assert ledger.index.next_due(["requested"]) == (t0 + timedelta(seconds=10)).timestamp()
    assert ledger.index.next_due(["attempted"]) == (t0 + timedelta(seconds=141)).timestamp()
    assert ledger.index.next_due(["review"]) is None


def test_jobs_in_state_pages_and_count_by_state(ledger: Ledger, clock: FakeClock) -> None:
    keys = [f"job-{i:02d}" for i in range(7)]
    for key in reversed(keys):
        ledger.submit(content(key), SENDER)
    for key in keys[:2]:
        ledger.update(key, lambda j: j.attempt(**attempt_args(clock)))

    pages: list[list[str]] = []
    after: str | None = None
    while True:
        page = ledger.index.jobs_in_state("requested", limit=2, after_key=after)
        if not page:
            break
        pages.append([r.key for r in page])
        after = page[-1].key
    assert pages == [keys[2:4], keys[4:6], keys[6:7]]
    assert [r.key for r in ledger.index.jobs_in_state("attempted")] == keys[:2]
    assert ledger.index.jobs_in_state("review") == []
    assert ledger.index.count_by_state() == {"requested": 5, "attempted": 2}


# -- optimistic concurrency (invariant 1) ----------------------------------------------


def test_two_writers_racing_for_one_attempt_only_one_wins(store_url: str, clock: FakeClock) -> None:
    first, second = Ledger(store_url, clock=clock), Ledger(store_url, clock=clock)
    try:
        first.submit(content("order-1"), SENDER)
        job_a = first.get_job("order-1")
        job_b = second.get_job("order-1")
        assert job_a.attempt(**attempt_args(clock, timeout=30)) == 1
        assert job_b.attempt(**attempt_args(clock, timeout=99)) == 1

        first.save_job(job_a)
        with pytest.raises(ConcurrentUpdate):
            second.save_job(job_b)

        for app in (first, second):
            assert event_types(app, "order-1") == ["Requested", "Attempted"]
            job = app.get_job("order-1")
            assert job.version == 2
            # The winner's deadline, not the loser's.
            assert job.due_at == job_a.due_at
            row = assert_index_in_step(app, "order-1")
            assert (row.version, row.attempts, row.state) == (2, 1, "attempted")
        topics = stored_topics(first)
        assert topics.count("sendledger:SendJob.Attempted") == 1
    finally:
        first.close()
        second.close()


def test_update_with_a_stale_job_raises_concurrent_update(store_url: str, clock: FakeClock) -> None:
    first, second = Ledger(store_url, clock=clock), Ledger(store_url, clock=clock)
    try:
        first.submit(content("order-1"), SENDER)
        stale = second.get_job("order-1")
        first.update("order-1", lambda j: j.attempt(**attempt_args(clock)))
        stale.escalate(reason="rejected", detail="x", at=clock(), **POLICY)
        with pytest.raises(ConcurrentUpdate):
            second.save_job(stale)
        assert event_types(first, "order-1") == ["Requested", "Attempted"]
        assert first.index.job_by_key("order-1") == index_row(first.get_job("order-1"))
    finally:
        first.close()
        second.close()


# -- rebuilding the index --------------------------------------------------------------


def delete_index_rows(app: Ledger) -> None:
    app.index._execute(app.index._sql("DELETE FROM {t}"), [[]])


def make_mixed_jobs(app: Ledger, clock: FakeClock, count: int = 50) -> None:
    for i in range(count):
        key = f"mix-{i:03d}"
        clock.advance(1)
        app.submit(content(key, body=f"body {i}"), SENDER)
        kind = i % 6
        if kind == 0:
            continue  # requested
        app.update(key, lambda j: j.attempt(**attempt_args(clock)))
        if kind == 1:
            continue  # attempted
        if kind == 2:
            app.update(
                key,
                lambda j: j.confirm(
                    via="response", provider_message_ids=[f"p-{j.key}"], at=clock(), **POLICY
                ),
            )
            continue
        app.update(
            key,
            lambda j: j.record_unknown(
                reason="timeout", search_due_at=clock() + timedelta(minutes=5), at=clock(), **POLICY
            ),
        )
        if kind == 3:
            continue  # unknown
        if kind == 4:
            app.update(
                key,
                lambda j: j.escalate(reason="unknown-outcome", detail="", at=clock(), **POLICY),
            )
            continue
        app.update(
            key, lambda j: j.escalate(reason="unknown-outcome", detail="", at=clock(), **POLICY)
        )
        app.update(key, lambda j: j.resolve(decision="abandon", note="n", by="ops", at=clock()))


def test_rebuild_index_equals_the_live_index(ledger: Ledger, clock: FakeClock) -> None:
    make_mixed_jobs(ledger, clock)
    live = ledger.index_rows()
    assert len(live) == 50
    assert ledger.index.count_by_state() == {
        "requested": 9,
        "attempted": 9,
        "confirmed": 8,
        "unknown": 8,
        "review": 8,
        "abandoned": 8,
    }
    assert ledger.rebuild_index() == 50
    assert ledger.index_rows() == live


def test_rebuild_index_after_the_rows_were_deleted(ledger: Ledger, clock: FakeClock) -> None:
    make_mixed_jobs(ledger, clock, count=12)
    live = ledger.index_rows()
    delete_index_rows(ledger)
    assert ledger.index_rows() == []
    assert ledger.index.job_by_key("mix-000") is None
    assert ledger.rebuild_index() == 12
    assert ledger.index_rows() == live
    # And the rebuilt rows are used by later writes as usual.
    ledger.update("mix-000", lambda j: j.attempt(**attempt_args(clock)))
    assert_index_in_step(ledger, "mix-000")


def test_rebuild_index_of_an_empty_store(ledger: Ledger) -> None:
    assert ledger.rebuild_index() == 0
    assert ledger.index_rows() == []


def test_index_rows_pages_past_a_thousand(ledger: Ledger, clock: FakeClock) -> None:
    # index_rows pages by 1000; make sure the page boundary loses nothing.
    rows = [
        IndexRow(
            key=f"k{i:05d}",
            job_id=f"{i:032x}",
            channel="receipts",
            state="requested",
            message_id=f"<m{i}@x>",
            due_at=None,
            created_at=0.0,
            updated_at=0.0,
            version=1,
            attempts=0,
            reason=None,
        )
        for i in range(1001)
    ]
    ledger.index.replace_all(rows)
    assert ledger.index_rows() == rows
    # The index is only a projection: a rebuild from the (empty) event store clears it.
    assert ledger.rebuild_index() == 0
    assert ledger.index_rows() == []


def test_a_missing_postgres_schema_is_created() -> None:
    import uuid as _uuid

    import psycopg
    from tests.conftest import PG_URL, require_postgres

    require_postgres()
    schema = f"new_{_uuid.uuid4().hex[:10]}"
    try:
        ledger = Ledger(f"{PG_URL}?schema={schema}")
        try:
            assert ledger.index.count_by_state() == {}
        finally:
            ledger.close()
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def test_count_in_states_reports_zero_for_empty_states(store_url: str) -> None:
    ledger = Ledger(store_url)
    try:
        assert ledger.index.count_in_states(["requested", "review"]) == {
            "requested": 0,
            "review": 0,
        }
    finally:
        ledger.close()
