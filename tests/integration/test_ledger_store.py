"""The Ledger against each store backend (memory, SQLite file, PostgreSQL schema).

Covers idempotent intake, the job index staying in step with the events, the index
queries, optimistic concurrency (invariant 1) and rebuilding the index from the events.
Every test taking `store_url` runs on all three backends: the memory backend is held to
the same contract as the SQL ones.
"""

from __future__ import annotations

import contextlib
import math
import sqlite3
import subprocess
import sys
import textwrap
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from daemon.doubles.fake_time import FakeClock
from ledger.application import (
    ConcurrentUpdate,
    KeyConflict,
    Ledger,
    Sender,
    UnknownJob,
)
from ledger.content import JobContent
from ledger.decision_types import Confirm, ResendAt, RetryAt, Review, SearchAgainAt, SearchAt
from ledger.job import JobState, SendJob, TransitionError
from ledger.message_id import message_id_for
from ledger.stores.index import IndexRow, WatchedMailbox, WatchHold, index_row
from ledger.stores.memory import discard_memory_store
from ledger.stores.postgres import PostgresJobIndexRecorder
from ledger.stores.url import MemoryStore, PostgresStore, SqliteStore
from ledger.vocabulary import EscalationReason, PolicyRef, Resolution

DOMAIN = "mail.example.com"
POLICY = PolicyRef("receipts", "0123456789abcdef")
SENDER = Sender(
    from_addr="Support <support@example.com>",
    message_id_domain=DOMAIN,
    policy=POLICY,
)
SRC = Path(__file__).resolve().parents[2] / "src"


def content(
    key: str, *, subject: str = "Your receipt", body: str = "Thanks", channel: str = "receipts"
) -> JobContent:
    return JobContent(
        channel=channel,
        key=key,
        to=("Alice <alice@example.com>",),
        subject=subject,
        body=body,
    )


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """One store per test on each backend; two Ledgers on the URL share the store."""
    if request.param == "memory":
        name = f"test-{uuid.uuid4().hex[:12]}"
        yield f"memory://{name}"
        discard_memory_store(name)
    elif request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    else:
        yield str(request.getfixturevalue("pg_url"))


@pytest.fixture
def ledger(store_url: str, clock: FakeClock) -> Iterator[Ledger]:
    with Ledger(store_url, clock=clock) as app:
        yield app


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
    ) as pg:
        schema = spec.schema.replace('"', '""')
        return [tuple(r) for r in pg.execute(sql_pg.replace("{schema}", f'"{schema}"'))]


def stored_topics(app: Ledger) -> list[str]:
    if isinstance(app.store, MemoryStore):
        # No connection of its own to a memory store: eventsourcing's POPO recorder.
        return [n.topic for n in app.recorder.select_notifications(start=1, limit=10**6)]
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
    row = app.row(key)
    assert row is not None
    assert row == index_row(job)
    assert app.row_by_message_id(job.message_id) == row
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
    assert job.content.to == ("Alice <alice@example.com>",)
    assert job.content == content("order-1")
    assert job.content_hash == content("order-1").content_hash
    assert event_types(ledger, "order-1") == ["Requested"]
    # The channel's policy that accepted the job is recorded with it.
    [requested] = ledger.history("order-1")
    assert (requested.policy, requested.fingerprint) == (POLICY.name, POLICY.fingerprint)

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
    assert job.content.body == "Thanks"
    after_events = [(type(e).__name__, e.originator_version) for e in ledger.history("order-1")]
    assert after_events == before_events
    assert ledger.row("order-1") == before_row
    assert len(stored_topics(ledger)) == 1


def test_conflict_after_progress_leaves_the_job_as_it_was(ledger: Ledger, clock: FakeClock) -> None:
    ledger.submit(content("order-1"), SENDER)
    ledger.update("order-1", lambda j: j.claim(**attempt_args(clock)))
    before = assert_index_in_step(ledger, "order-1")
    with pytest.raises(KeyConflict):
        ledger.submit(content("order-1", subject="Changed"), SENDER)
    assert ledger.get_job("order-1").version == 2
    assert event_types(ledger, "order-1") == ["Requested", "Attempted"]
    assert ledger.row("order-1") == before
    # The same content is still a no-op, and reports the job's current state.
    result = ledger.submit(content("order-1"), SENDER)
    assert (result.created, result.state) == (False, "attempted")


def test_unknown_job(ledger: Ledger) -> None:
    with pytest.raises(UnknownJob):
        ledger.get_job("nope")
    with pytest.raises(UnknownJob):
        ledger.history("nope")
    assert ledger.find_job("nope") is None
    assert ledger.row("nope") is None
    assert ledger.row_by_message_id(message_id_for("nope", DOMAIN)) is None


def test_events_are_stored_with_explicit_topics(ledger: Ledger, clock: FakeClock) -> None:
    ledger.submit(content("order-1"), SENDER)
    ledger.update("order-1", lambda j: j.claim(**attempt_args(clock)))
    ledger.update(
        "order-1",
        lambda j: j.record_response(provider_message_id="p1", decision=Confirm(POLICY), at=clock()),
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
    ledger.update("order-1", lambda j: j.claim(**attempt_args(clock)))
    clock.advance(1)
    # The policy's review decision: Unknown and Escalated, recorded in one step.
    ledger.update(
        "order-1",
        lambda j: j.record_unknown(
            reason="timeout",
            decision=Review(POLICY, EscalationReason.UNKNOWN_OUTCOME),
            at=clock(),
        ),
    )
    events = ledger.history("order-1")
    assert [type(e).__name__ for e in events] == ["Requested", "Attempted", "Unknown", "Escalated"]
    assert [e.originator_version for e in events] == [1, 2, 3, 4]
    stamps = [e.timestamp for e in events]
    assert stamps == sorted(stamps)


def test_a_jobs_life_keeps_the_index_row_in_step(ledger: Ledger, clock: FakeClock) -> None:
    """Every command, saved, leaves the index row equal to the job's projection. A
    decision that implies several events records them in one step: one save, all of them
    (same time, consecutive versions), never the job half-way through a transition."""
    key = "order-life"
    ledger.submit(content(key), SENDER)
    steps: list[tuple[Callable[[SendJob], Any], list[str], dict[str, Any]]] = []

    def step(command: Callable[[SendJob], Any], events: list[str], **expected: Any) -> None:
        steps.append((command, events, expected))

    t0 = clock()

    def at(seconds: float) -> datetime:
        return t0 + timedelta(seconds=seconds)

    step(
        lambda j: j.claim(provider="support", deadline=at(30), at=at(0)),
        ["Attempted"],
        state="attempted",
        due_at=at(30),
        attempts=1,
        reason=None,
    )
    step(
        lambda j: j.record_unknown(reason="timeout", decision=SearchAt(POLICY, at(300)), at=at(31)),
        ["Unknown"],
        state="unknown",
        due_at=at(300),
        attempts=1,
        reason="timeout",
    )
    step(
        lambda j: j.record_search(
            query="q", copies=[], decision=SearchAgainAt(POLICY, at(600)), at=at(300)
        ),
        ["SearchedMiss"],
        state="unknown",
        due_at=at(600),
        reason="timeout",
    )
    # The second miss is believed and the policy resends: the miss and the requeue are
    # one decision (ResendAt), so they are recorded together.
    step(
        lambda j: j.record_search(
            query="q", copies=[], decision=ResendAt(POLICY, at(600), misses_required=2), at=at(600)
        ),
        ["SearchedMiss", "Requeued"],
        state="requested",
        due_at=at(600),
        reason="no copy found in 2 searches: sending again (same Message-ID)",
        attempts=1,
    )
    step(
        lambda j: j.claim(provider="support", deadline=at(630), at=at(601)),
        ["Attempted"],
        state="attempted",
        due_at=at(630),
        attempts=2,
        reason=None,
    )
    step(
        lambda j: j.record_rejection(
            transient=True,
            reason="rate-limited",
            status=429,
            decision=RetryAt(POLICY, at(700)),
            at=at(602),
        ),
        ["Rejected"],
        state="requested",
        due_at=at(700),
        reason="rate-limited",
        attempts=2,
    )
    step(
        lambda j: j.claim(provider="support", deadline=at(730), at=at(700)),
        ["Attempted"],
        state="attempted",
        due_at=at(730),
        attempts=3,
    )
    # The policy sends an unknown outcome to review: Unknown and Escalated together.
    step(
        lambda j: j.record_unknown(
            reason="5xx", decision=Review(POLICY, EscalationReason.UNKNOWN_OUTCOME), at=at(701)
        ),
        ["Unknown", "Escalated"],
        state="review",
        due_at=None,
        reason="unknown-outcome",
        attempts=3,
    )
    # A human's "sent": Resolved and Confirmed together.
    step(
        lambda j: j.resolve(Resolution.SENT, note="found it", by="ops", at=at(800)),
        ["Resolved", "Confirmed"],
        state="confirmed",
        due_at=None,
        reason="resolved: sent",
    )

    version = 1
    for command, events, expected in steps:
        ledger.update(key, command)
        row = assert_index_in_step(ledger, key)
        history = ledger.history(key)
        new = history[version:]
        assert [type(e).__name__ for e in new] == events
        assert [e.originator_version for e in new] == list(
            range(version + 1, version + len(events) + 1)
        )
        assert len({e.timestamp for e in new}) == 1, new  # one step, one time
        version += len(events)
        assert row.version == ledger.get_job(key).version == version
        for field, value in expected.items():
            if field == "due_at":
                value = None if value is None else value.timestamp()
            assert getattr(row, field) == value, (field, row)
    assert event_types(ledger, key)[-2:] == ["Resolved", "Confirmed"]
    assert ledger.counts() == {"confirmed": 1}


def drop_column(app: Ledger, column: str) -> None:
    """Make the store's index as an earlier release left it: without `column`."""
    spec = app.store
    if isinstance(spec, SqliteStore):
        with contextlib.closing(sqlite3.connect(spec.path)) as conn:
            conn.execute(f"ALTER TABLE sendledger_jobs DROP COLUMN {column}")
            conn.commit()
        return
    assert isinstance(spec, PostgresStore)
    import psycopg

    with psycopg.connect(
        dbname=spec.dbname, host=spec.host, port=spec.port, user=spec.user,
        password=spec.password, autocommit=True,
    ) as conn:  # fmt: skip
        schema = spec.schema.replace('"', '""')
        conn.execute(f'ALTER TABLE "{schema}".sendledger_jobs DROP COLUMN {column}')


def test_the_index_keeps_when_a_job_went_to_review_through_later_writes(
    store_url: str, clock: FakeClock
) -> None:
    """`review_since` is the time of the job's latest Escalated while it is in review:
    a check written after it leaves it as it was (the review queue's age), leaving
    review empties it. A store of an earlier release gains the column when opened; its
    rows read `updated_at` until the job is written again or the index is rebuilt."""
    key = "waits"
    with Ledger(store_url, clock=clock) as app:
        app.submit(content(key), SENDER)
        app.update(key, lambda j: j.claim(**attempt_args(clock)))
        clock.advance(5)
        went = clock()
        review = Review(POLICY, EscalationReason.UNKNOWN_OUTCOME)
        app.update(key, lambda j: j.record_unknown(reason="5xx", decision=review, at=clock()))
        clock.advance(3 * 86400)
        check: dict[str, Any] = {"by": "ops", "purpose": "check", "query": "q", "copies": []}
        app.update(key, lambda j: j.record_check(**check, at=clock()))
        row = assert_index_in_step(app, key)
        assert row.updated_at == clock().timestamp()
        assert row.review_since == row.in_review_since == went.timestamp()
        if not isinstance(app.store, MemoryStore):
            stored = raw_query(
                app,
                "SELECT review_since FROM sendledger_jobs",
                "SELECT review_since FROM {schema}.sendledger_jobs",
            )
            assert stored == [(went.timestamp(),)]  # in the table, not computed on read
        if isinstance(app.store, MemoryStore):
            return  # no table to take a column from
        drop_column(app, "review_since")
    with Ledger(store_url, clock=clock) as app:
        # Opening added the column back, empty: the row's last change stands in for it.
        reopened = app.row(key)
        assert reopened is not None and reopened.review_since is None
        assert reopened.in_review_since == reopened.updated_at
        assert app.rebuild_index() == 1
        row = assert_index_in_step(app, key)
        assert row.review_since == went.timestamp()
        app.update(key, lambda j: j.resolve(Resolution.ABANDON, note="n", by="ops", at=clock()))
        row = assert_index_in_step(app, key)
        assert row.review_since is None and app.get_job(key).escalated_at == went


def test_a_watched_row_says_what_else_is_due_and_an_earlier_release_s_is_filled_in(
    store_url: str, clock: FakeClock
) -> None:
    """A watched job's row says when anything else of it is due (`other_due_at`: its
    verification; infinity when nothing), which its `due_at` hides once the watch's end
    has passed. A store of an earlier release gains the column when opened, empty, and
    `fill_other_dues` (the daemon's start-up) fills it from the events, a page at a time,
    once."""
    verify_at = {"plain": None, "resent": clock() + timedelta(minutes=10)}
    with Ledger(store_url, clock=clock) as app:
        for key, verify in verify_at.items():
            app.submit(content(key), SENDER)
            app.update(key, lambda j: j.claim(**attempt_args(clock)))
            watch = Confirm(POLICY, verify_at=verify, watch_until=clock() + timedelta(hours=1))
            app.update(
                key,
                lambda j, k=key, d=watch: j.record_response(  # type: ignore[misc]
                    provider_message_id=f"id-{k}", decision=d, at=clock()
                ),
            )
            assert_index_in_step(app, key)
        want = {
            "plain": math.inf,
            "resent": verify_at["resent"].timestamp(),  # type: ignore[union-attr]
        }
        assert {key: row.other_due_at for key, row in rows_of(app, want).items()} == want
        if isinstance(app.store, MemoryStore):
            return  # no table to take a column from
        drop_column(app, "other_due_at")
    with Ledger(store_url, clock=clock) as app:
        # Opening added the column back, empty.
        assert {row.other_due_at for row in rows_of(app, want).values()} == {None}
        assert app.fill_other_dues(batch=1) == 2
        assert {key: row.other_due_at for key, row in rows_of(app, want).items()} == want
        assert app.fill_other_dues() == 0
        for key in want:
            assert_index_in_step(app, key)


def rows_of(app: Ledger, keys: Iterable[str]) -> dict[str, IndexRow]:
    rows = {key: app.row(key) for key in keys}
    return {key: row for key, row in rows.items() if row is not None}


def test_refused_command_stores_nothing(ledger: Ledger, clock: FakeClock) -> None:
    ledger.submit(content("order-1"), SENDER)
    before = assert_index_in_step(ledger, "order-1")
    # Not attempted: no outcome to record, neither of the decision's two events is stored.
    with pytest.raises(TransitionError):
        ledger.update(
            "order-1",
            lambda j: j.record_unknown(
                reason="timeout",
                decision=Review(POLICY, EscalationReason.UNKNOWN_OUTCOME),
                at=clock(),
            ),
        )
    assert event_types(ledger, "order-1") == ["Requested"]
    assert ledger.row("order-1") == before


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
    ledger.update("d", lambda j: j.claim(**attempt_args(clock, timeout=100)))

    now = t0 + timedelta(seconds=25)
    due = ledger.due(JobState.REQUESTED, now, 100)
    assert [r.key for r in due] == ["a", "b"]
    # A plain state name and epoch seconds ask the same.
    assert ledger.due("requested", now.timestamp(), 100) == due

    later = t0 + timedelta(seconds=1000)
    assert [r.key for r in ledger.due("requested", later, 100)] == ["a", "b", "c"]
    assert [r.key for r in ledger.due("requested", later, 2)] == ["a", "b"]
    assert [r.key for r in ledger.due("attempted", now, 100)] == []
    assert [r.key for r in ledger.due("attempted", later, 100)] == ["d"]
    assert ledger.due(JobState.UNKNOWN, later, 100) == []

    assert ledger.next_due(["requested"]) == t0 + timedelta(seconds=10)
    assert ledger.next_due([JobState.ATTEMPTED, "review"]) == t0 + timedelta(seconds=141)
    assert ledger.next_due(["review"]) is None
    assert ledger.next_due([]) is None


def row(key: str, due: float, **fields: Any) -> IndexRow:
    """A confirmed job's row, due at `due`: by default the end of its watch in mailbox m
    of channel c."""
    base: dict[str, Any] = {"channel": "c", "watch_mailbox": "m", "watch_until": due}
    base.update(fields)
    return IndexRow(
        key=key, job_id=uuid.uuid5(uuid.NAMESPACE_URL, key).hex, state="confirmed",
        message_id=f"<{key}@x>", due_at=due, created_at=0.0, updated_at=0.0, version=2,
        attempts=1, reason=None, **base,
    )  # fmt: skip


def test_watched_names_each_watched_mailbox_with_its_count_a_job_and_its_soonest_end(
    ledger: Ledger,
) -> None:
    """What the bounce watch reads (`Ledger.watched`), on every backend alike: on
    PostgreSQL its rows come as dicts by column name, so two unnamed MIN()s were one."""
    ledger._index.replace_all(
        [
            row("b", 100.0),
            row("a", 50.0),
            row("c", 100.0, watch_mailbox="n"),
            row("d", 70.0, channel="d"),
            row("e", 120.0, watch_mailbox=None, watch_until=None),
        ]
    )
    assert ledger.watched() == [
        WatchedMailbox("c", "m", 2, "a", 50.0),
        WatchedMailbox("c", "n", 1, "c", 100.0),
        WatchedMailbox("d", "m", 1, "d", 70.0),
    ]


def test_due_leaves_out_the_watches_a_hold_says_wait_for_a_read(ledger: Ledger) -> None:
    """`WatchHold`: a watch of its channel and mailboxes, past its end (its due time),
    ending after the hold's cut, with nothing else due by now (`other_due_at`, infinity
    when nothing) is left out of the due rows, on every backend alike; a row that cannot
    say (no `other_due_at`: an earlier release's) never is."""

    ledger._index.replace_all(
        [
            row("waits", 100.0, other_due_at=math.inf),
            row("verify-due", 90.0, other_due_at=150.0),
            row("verify-later", 100.0, other_due_at=250.0),
            row("ended-earlier", 50.0, other_due_at=math.inf),
            row("earlier-release", 100.0),
            row("other-mailbox", 100.0, watch_mailbox="n", other_due_at=math.inf),
            row("other-channel", 100.0, channel="d", other_due_at=math.inf),
            row("verify-first", 110.0, watch_until=300.0, other_due_at=110.0),
            row("not-watched", 120.0, watch_mailbox=None, watch_until=None),
        ]
    )
    everything = {r.key for r in ledger.due("confirmed", 200.0, 100)}
    assert len(everything) == 9
    for hold, left_out in (
        (WatchHold("c", ("m",)), {"waits", "verify-later", "ended-earlier"}),
        (WatchHold("c", ("m", "n"), after=75.0), {"waits", "verify-later", "other-mailbox"}),
    ):
        due = ledger.due("confirmed", 200.0, 100, held=[hold])
        assert {r.key for r in due} == everything - left_out, hold
        assert [r.due_at for r in due] == sorted(r.due_at or 0.0 for r in due)
    # The page's limit counts only what is left in: the held rows before it take none.
    first = ledger.due("confirmed", 200.0, 1, held=[WatchHold("c", ("m",))])
    assert [r.key for r in first] == ["verify-due"]


def test_due_refuses_a_naive_datetime(ledger: Ledger) -> None:
    with pytest.raises(ValueError, match="naive"):
        ledger.due("requested", datetime(2026, 1, 1, 12, 0), 10)


def test_jobs_in_a_state_page_by_page_and_counts(ledger: Ledger, clock: FakeClock) -> None:
    keys = [f"job-{i:02d}" for i in range(7)]
    for key in reversed(keys):
        ledger.submit(content(key), SENDER)
    for key in keys[:2]:
        ledger.update(key, lambda j: j.claim(**attempt_args(clock)))

    for page_size in (2, 5, 1000):  # full last page, short last page, one page
        ledger.page_size = page_size
        assert [r.key for r in ledger.jobs(state="requested")] == keys[2:]
        assert [r.key for r in ledger.jobs()] == keys
    assert [r.key for r in ledger.jobs(state=JobState.ATTEMPTED)] == keys[:2]
    assert list(ledger.jobs(state="review")) == []
    assert ledger.counts() == {"requested": 5, "attempted": 2}
    assert ledger.counts(["requested", JobState.REVIEW]) == {"requested": 5, "review": 0}
    assert ledger.open_counts() == {"requested": 5, "attempted": 2, "unknown": 0, "review": 0}
    assert list(ledger.open_counts()) == ["requested", "attempted", "unknown", "review"]


def test_jobs_filter_by_channel_and_time_window(ledger: Ledger, clock: FakeClock) -> None:
    """`since` is inclusive and `until` exclusive, on the row's last change (updated_at),
    as `sendledger audit` has them."""
    t0 = clock()
    for offset, key, channel in [(0, "a", "receipts"), (10, "b", "payouts"), (20, "c", "receipts")]:
        clock.now = t0 + timedelta(seconds=offset)
        ledger.submit(content(key, channel=channel), SENDER)
    clock.now = t0 + timedelta(seconds=30)
    ledger.update("a", lambda j: j.claim(**attempt_args(clock)))  # a changes at t0+30

    def keys(**filters: Any) -> list[str]:
        return [r.key for r in ledger.jobs(**filters)]

    assert keys(channel="receipts") == ["a", "c"]
    assert keys(channel="payouts", state="requested") == ["b"]
    assert keys(channel="other") == []
    assert keys(since=t0 + timedelta(seconds=10)) == ["a", "b", "c"]
    assert keys(since=t0 + timedelta(seconds=11)) == ["a", "c"]
    assert keys(until=t0 + timedelta(seconds=20)) == ["b"]
    assert keys(since=t0 + timedelta(seconds=10), until=t0 + timedelta(seconds=30)) == ["b", "c"]
    assert keys(state="requested", since=t0 + timedelta(seconds=20)) == ["c"]
    assert keys(until=t0) == []


def test_job_events_by_type_and_time(ledger: Ledger, clock: FakeClock) -> None:
    t0 = clock()
    ledger.submit(content("a"), SENDER)
    clock.advance(10)
    ledger.submit(content("b"), SENDER)
    clock.advance(10)
    ledger.update("a", lambda j: j.claim(**attempt_args(clock)))
    # A provider handle's events are in the same log, but are not job events.
    ledger.mark_handle("support", lambda h: None)

    def seen(**filters: Any) -> list[tuple[str, str]]:
        return [(type(e).__name__, str(e.originator_id)) for e in ledger.job_events(**filters)]

    a, b = str(ledger.get_job("a").id), str(ledger.get_job("b").id)
    assert seen() == [("Requested", a), ("Requested", b), ("Attempted", a)]
    assert seen(types=["Attempted"]) == [("Attempted", a)]
    assert seen(types=["Requested", "Attempted"], since=t0 + timedelta(seconds=10)) == [
        ("Requested", b),
        ("Attempted", a),
    ]
    assert seen(until=t0 + timedelta(seconds=10)) == [("Requested", a)]
    assert seen(types=["Escalated"]) == []
    ledger.page_size = 1
    assert seen(types=["Requested"]) == [("Requested", a), ("Requested", b)]
    with pytest.raises(ValueError, match="not a SendJob event type"):
        list(ledger.job_events(types=["NoSuchEvent"]))


def test_job_ids_name_each_job_once(ledger: Ledger, clock: FakeClock) -> None:
    for key in ("x", "y"):
        ledger.submit(content(key), SENDER)
        ledger.update(key, lambda j: j.claim(**attempt_args(clock)))
    ledger.mark_handle("support", lambda h: None)  # not a job
    ledger.page_size = 1
    assert list(ledger.job_ids()) == [ledger.get_job("x").id, ledger.get_job("y").id]


# -- optimistic concurrency (invariant 1) ----------------------------------------------


def test_two_writers_racing_for_one_attempt_only_one_wins(store_url: str, clock: FakeClock) -> None:
    first, second = Ledger(store_url, clock=clock), Ledger(store_url, clock=clock)
    try:
        first.submit(content("order-1"), SENDER)
        job_a = first.get_job("order-1")
        job_b = second.get_job("order-1")
        assert job_a.claim(**attempt_args(clock, timeout=30)) == 1
        assert job_b.claim(**attempt_args(clock, timeout=99)) == 1

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
        first.update("order-1", lambda j: j.claim(**attempt_args(clock)))
        stale.escalate(Review(POLICY, EscalationReason.REJECTED), detail="x", at=clock())
        with pytest.raises(ConcurrentUpdate):
            second.save_job(stale)
        assert event_types(first, "order-1") == ["Requested", "Attempted"]
        assert first.row("order-1") == index_row(first.get_job("order-1"))
    finally:
        first.close()
        second.close()


# -- rebuilding the index --------------------------------------------------------------


def delete_index_rows(app: Ledger) -> None:
    app._index.replace_all([])


def make_mixed_jobs(app: Ledger, clock: FakeClock, count: int = 50) -> None:
    for i in range(count):
        key = f"mix-{i:03d}"
        clock.advance(1)
        app.submit(content(key, body=f"body {i}"), SENDER)
        kind = i % 6
        if kind == 0:
            continue  # requested
        app.update(key, lambda j: j.claim(**attempt_args(clock)))
        if kind == 1:
            continue  # attempted
        if kind == 2:
            app.update(
                key,
                lambda j: j.record_response(
                    provider_message_id=f"p-{j.key}", decision=Confirm(POLICY), at=clock()
                ),
            )
            continue
        app.update(
            key,
            lambda j: j.record_unknown(
                reason="timeout",
                decision=SearchAt(POLICY, clock() + timedelta(minutes=5)),
                at=clock(),
            ),
        )
        if kind == 3:
            continue  # unknown
        app.update(
            key,
            lambda j: j.escalate(
                Review(POLICY, EscalationReason.UNKNOWN_OUTCOME), detail="", at=clock()
            ),
        )
        if kind == 4:
            continue  # review
        app.update(key, lambda j: j.resolve(Resolution.ABANDON, note="n", by="ops", at=clock()))


def test_rebuild_index_equals_the_live_index(ledger: Ledger, clock: FakeClock) -> None:
    make_mixed_jobs(ledger, clock)
    live = list(ledger.jobs())
    assert len(live) == 50
    assert ledger.counts() == {
        "requested": 9,
        "attempted": 9,
        "confirmed": 8,
        "unknown": 8,
        "review": 8,
        "abandoned": 8,
    }
    assert ledger.rebuild_index() == 50
    assert list(ledger.jobs()) == live


def test_rebuild_index_after_the_rows_were_deleted(ledger: Ledger, clock: FakeClock) -> None:
    make_mixed_jobs(ledger, clock, count=12)
    live = list(ledger.jobs())
    delete_index_rows(ledger)
    assert list(ledger.jobs()) == []
    assert ledger.row("mix-000") is None
    assert ledger.rebuild_index() == 12
    assert list(ledger.jobs()) == live
    # And the rebuilt rows are used by later writes as usual.
    ledger.update("mix-000", lambda j: j.claim(**attempt_args(clock)))
    assert_index_in_step(ledger, "mix-000")


class _RowsHeldBack(list[IndexRow]):
    """A rebuild's projected rows whose batch from `at` on is handed over only once `go`
    is set: the rebuild's transaction is open and goes no further meanwhile."""

    def __init__(self, rows: list[IndexRow], at: int = 0) -> None:
        super().__init__(rows)
        self.at = at
        self.reached = threading.Event()
        self.go = threading.Event()

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice) and (index.start or 0) >= self.at:
            self.reached.set()
            self.go.wait(30)
        return super().__getitem__(index)


@pytest.mark.postgres
def test_a_long_rebuild_does_not_hold_back_live_writers(pg_url: str, clock: FakeClock) -> None:
    """`admin rebuild-index` beside live daemons (a store of a million jobs takes minutes):
    the lock that orders the listing's stamps is held only for the rebuild's last step, so
    a daemon's write meanwhile (a claim before its send) is not held until the rebuild
    commits, nor refused as 'store locked' after Ledger.store_wait."""
    with Ledger(pg_url, clock=clock) as rebuilder, Ledger(pg_url, clock=clock) as daemon:
        rebuilder.submit(content("old-1"), SENDER)
        rows = _RowsHeldBack([r for r in rebuilder.jobs()])
        assert isinstance(rebuilder.recorder, PostgresJobIndexRecorder)
        rebuilding = threading.Thread(target=rebuilder.recorder.rebuild, args=(rows,))
        rebuilding.start()
        try:
            assert rows.reached.wait(10)
            written = threading.Thread(target=daemon.submit, args=(content("new-1"), SENDER))
            written.start()
            written.join(5)
            assert not written.is_alive(), "a live write waited for the rebuild to commit"
        finally:
            rows.go.set()
            rebuilding.join(30)
            written.join(30)
        assert {r.key for r in rebuilder.jobs()} == {"old-1", "new-1"}
        assert all(r.written_at is not None for r in rebuilder.jobs())


@pytest.mark.postgres
def test_a_rebuild_holds_back_no_write_of_a_job_whose_row_was_right(
    pg_url: str, clock: FakeClock
) -> None:
    """The rebuild rewrites only the rows that differ from their job's events (lost or
    damaged): one that was right is not locked until the rebuild commits, so a live
    daemon's claim of that job (its first 500 rows written, the rebuild still running)
    is made meanwhile, not refused as 'store locked' after Ledger.store_wait."""
    with Ledger(pg_url, clock=clock) as rebuilder, Ledger(pg_url, clock=clock) as daemon:
        for i in range(501):
            rebuilder.submit(content(f"job-{i:03d}"), SENDER)
        rows = _RowsHeldBack(sorted(rebuilder.jobs(), key=lambda r: r.key), at=500)
        assert isinstance(rebuilder.recorder, PostgresJobIndexRecorder)
        rebuilding = threading.Thread(target=rebuilder.recorder.rebuild, args=(rows,))
        rebuilding.start()
        try:
            assert rows.reached.wait(10)
            claim = threading.Thread(
                target=daemon.update, args=("job-000", lambda j: j.claim(**attempt_args(clock)))
            )
            claim.start()
            claim.join(5)
            assert not claim.is_alive(), "a live claim waited for the rebuild to commit"
        finally:
            rows.go.set()
            rebuilding.join(30)
            claim.join(30)
        row = rebuilder.row("job-000")
        assert row is not None and row.state == "attempted" and row.written_at is not None


def test_rebuild_index_of_an_empty_store(ledger: Ledger) -> None:
    assert ledger.rebuild_index() == 0
    assert list(ledger.jobs()) == []


def test_jobs_pages_past_a_thousand(ledger: Ledger, clock: FakeClock) -> None:
    # jobs() pages by page_size (500); make sure the page boundaries lose nothing.
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
    ledger._index.replace_all(rows)
    assert list(ledger.jobs()) == rows
    # The index is only a projection: a rebuild from the (empty) event store clears it.
    assert ledger.rebuild_index() == 0
    assert list(ledger.jobs()) == []


def test_a_missing_postgres_schema_is_created() -> None:
    import psycopg
    from tests.conftest import PG_URL, require_postgres

    require_postgres()
    schema = f"new_{uuid.uuid4().hex[:10]}"
    try:
        with Ledger(f"{PG_URL}?schema={schema}") as ledger:
            assert ledger.counts() == {}
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def test_counts_report_zero_for_empty_states(store_url: str) -> None:
    with Ledger(store_url) as ledger:
        assert ledger.counts(["requested", "review"]) == {"requested": 0, "review": 0}
        assert ledger.open_counts() == dict.fromkeys(
            ["requested", "attempted", "unknown", "review"], 0
        )
        assert ledger.counts() == {}
        assert ledger.counts([]) == {}


# -- the Ledger as a context manager; what each backend imports ---------------------------


def test_with_closes_the_ledger(store_url: str, clock: FakeClock) -> None:
    with Ledger(store_url, clock=clock) as ledger:
        assert isinstance(ledger, Ledger)
        ledger.submit(content("order-1"), SENDER)
        assert not ledger.closing.is_set()
    assert ledger.closing.is_set()
    if not isinstance(ledger.store, MemoryStore) or ledger.store.name:
        # What was written is there for the next ledger on the same store.
        with Ledger(store_url, clock=clock) as again:
            assert again.get_job("order-1").version == 1


def test_with_closes_the_ledger_when_the_block_raises(sqlite_url: str) -> None:
    with pytest.raises(UnknownJob), Ledger(sqlite_url) as ledger:
        ledger.get_job("nope")
    assert ledger.closing.is_set()


@pytest.mark.parametrize("url", ["sqlite:///{tmp}/ledger.sqlite", "memory://", "memory://x"])
def test_sqlite_and_memory_users_never_import_psycopg(url: str, tmp_path: Path) -> None:
    # A process of its own: this one has imported psycopg for the PostgreSQL tests.
    script = textwrap.dedent(
        f"""
        import sys
        from ledger.application import Ledger, Sender
        from ledger.content import JobContent
        from ledger.vocabulary import PolicyRef
        sender = Sender("s@example.com", "mail.example.com", PolicyRef("receipts", "f" * 16))
        with Ledger({url.format(tmp=tmp_path)!r}) as ledger:
            ledger.submit(JobContent(channel="receipts", key="k", to=("a@example.com",),
                                     subject="s", body="b"), sender)
            assert [r.key for r in ledger.jobs()] == ["k"]
            ledger.rebuild_index()
        loaded = sorted(m for m in sys.modules if m.split(".")[0] == "psycopg"
                        or m in ("eventsourcing.postgres", "ledger.stores.postgres"))
        print(loaded)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"},
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


# -- transient errors: decided by the backend, by error code ------------------------------


def locked_error(path: Path) -> sqlite3.OperationalError:
    """A real "database is locked": another connection holds a write transaction."""
    holder = sqlite3.connect(path, isolation_level=None)
    other = sqlite3.connect(path, timeout=0)
    try:
        holder.execute("CREATE TABLE IF NOT EXISTS t (x INTEGER)")
        holder.execute("BEGIN IMMEDIATE")
        holder.execute("INSERT INTO t VALUES (1)")
        with pytest.raises(sqlite3.OperationalError) as info:
            other.execute("INSERT INTO t VALUES (2)")
        return info.value
    finally:
        holder.execute("ROLLBACK")
        holder.close()
        other.close()


def test_sqlite_lock_errors_are_told_by_their_code(tmp_path: Path) -> None:
    from eventsourcing.persistence import IntegrityError, OperationalError

    from ledger.stores.sqlite import is_lock_error

    error = locked_error(tmp_path / "locked.sqlite")
    assert "locked" in str(error)
    assert error.sqlite_errorcode & 0xFF == sqlite3.SQLITE_BUSY
    assert is_lock_error(error)

    # As eventsourcing re-raises it (`raise OperationalError(e) from e`) ...
    try:
        raise OperationalError(error) from error
    except OperationalError as wrapped:
        assert is_lock_error(wrapped)
    # ... and when it is only the context of what was raised.
    try:
        try:
            raise error
        except sqlite3.OperationalError:
            raise RuntimeError("while reading") from None
    except RuntimeError as plain:
        assert plain.__cause__ is None and not is_lock_error(plain)  # `from None` hides it
    try:
        try:
            raise error
        except sqlite3.OperationalError:
            raise RuntimeError("while reading")  # noqa: B904
    except RuntimeError as chained:
        assert is_lock_error(chained)

    # Not a lock: other codes, and text that only looks like one.
    conn = sqlite3.connect(tmp_path / "other.sqlite")
    try:
        conn.execute("CREATE TABLE u (x INTEGER PRIMARY KEY)")
        conn.execute("INSERT INTO u VALUES (1)")
        with pytest.raises(sqlite3.IntegrityError) as constraint:
            conn.execute("INSERT INTO u VALUES (1)")
        with pytest.raises(sqlite3.OperationalError) as missing:
            conn.execute("SELECT * FROM locked_busy_table")
    finally:
        conn.close()
    assert not is_lock_error(constraint.value)
    assert not is_lock_error(IntegrityError(constraint.value))
    assert "locked_busy" in str(missing.value) and not is_lock_error(missing.value)
    assert not is_lock_error(sqlite3.OperationalError("database is locked"))  # no code
    assert not is_lock_error(OperationalError("database is busy"))


def test_the_ledger_tries_a_locked_read_again(tmp_path: Path) -> None:
    error = locked_error(tmp_path / "locked.sqlite")
    with Ledger(f"sqlite:///{tmp_path / 'ledger.sqlite'}") as ledger:
        failures = [error, error]

        def flaky() -> str:
            if failures:
                raise failures.pop()
            return "read"

        assert ledger._retry_locked(flaky) == "read"
        assert failures == []

        def refused() -> str:
            failures.append(sqlite3.OperationalError("no such table: x"))
            raise failures[-1]

        with pytest.raises(sqlite3.OperationalError, match="no such table"):
            ledger._retry_locked(refused)
        assert len(failures) == 1  # not tried again


def test_postgres_errors_are_told_by_their_sqlstate() -> None:
    import psycopg.errors as pg
    from eventsourcing.persistence import IntegrityError, InternalError, OperationalError

    from ledger.stores.postgres import PostgresBackend
    from ledger.stores.url import parse_store_url

    spec = parse_store_url("postgresql://u@h/db")
    assert isinstance(spec, PostgresStore)
    backend = PostgresBackend(spec)

    def wrapped(wrapper: type[Exception], error: Exception) -> Exception:
        try:
            raise wrapper(str(error)) from error
        except wrapper as exc:
            return exc

    deadlock = wrapped(OperationalError, pg.DeadlockDetected("deadlock detected"))
    assert backend.is_retryable(deadlock) and backend.is_setup_race(deadlock)
    assert backend.is_retryable(pg.LockNotAvailable("lock timeout"))
    conflict = wrapped(IntegrityError, pg.UniqueViolation("duplicate key"))
    assert not backend.is_retryable(conflict)  # a version conflict is not transient
    assert backend.is_setup_race(conflict)  # but in the catalog, at set-up, it is a race
    raced = wrapped(InternalError, pg.InternalError_("tuple concurrently updated"))
    assert backend.is_setup_race(raced) and not backend.is_retryable(raced)
    assert backend.is_setup_race(pg.DuplicateTable("exists"))
    assert not backend.is_setup_race(wrapped(OperationalError, pg.InvalidPassword("no")))
    assert not backend.is_retryable(OperationalError("database is locked"))  # text alone


def race_single_and_batch(first: Ledger, second: Ledger, key: str, other: str) -> dict[str, Any]:
    """`first` submits `key`; at the same moment `second` submits a batch giving `key`
    other content, and `other`. Each one's answer (its results, or its KeyConflict)."""
    import threading

    gate = threading.Barrier(2)
    answers: dict[str, Any] = {}

    def single() -> None:
        gate.wait()
        try:
            answers["single"] = first.submit(content(key), SENDER)
        except KeyConflict as exc:
            answers["single"] = exc

    def batch() -> None:
        gate.wait()
        try:
            answers["batch"] = second.submit_many(
                [(content(key, subject="other"), SENDER), (content(other), SENDER)]
            )
        except KeyConflict as exc:
            answers["batch"] = exc

    threads = [threading.Thread(target=single), threading.Thread(target=batch)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return answers


def test_a_batch_and_a_single_submit_racing_for_one_key_leave_one_whole_answer(
    store_url: str, clock: FakeClock
) -> None:
    # Two writers (two daemons' APIs, or the API and `submit`) at the same moment: the
    # single job and a batch that gives the same key other content. Exactly one wins the
    # key; the other is told KeyConflict; a losing batch leaves none of its jobs behind.
    first, second = Ledger(store_url, clock=clock), Ledger(store_url, clock=clock)
    try:
        for round_ in range(20):
            key, other = f"race-{round_}", f"race-{round_}-b"
            answers = race_single_and_batch(first, second, key, other)
            refused = [name for name, got in answers.items() if isinstance(got, KeyConflict)]
            assert len(answers) == 2 and len(refused) == 1, answers
            stored = first.get_job(key)
            assert event_types(first, key) == ["Requested"]
            if refused == ["batch"]:
                assert stored.content.subject == "Your receipt"
                assert first.find_job(other) is None and first.row(other) is None
            else:
                assert stored.content.subject == "other"
                assert first.get_job(other).version == 1
            assert_index_in_step(first, key)
    finally:
        first.close()
        second.close()
