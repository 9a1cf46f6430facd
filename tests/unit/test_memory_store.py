"""The memory backend: eventsourcing's POPO recorder with the job index kept in a dict,
updated under the recorder's lock in the same insert as the events.

Nothing here may open a file or a socket (an autouse fixture makes both fail). The same
contract on a real Ledger, beside SQLite and PostgreSQL, is in
tests/integration/test_ledger_store.py.
"""

from __future__ import annotations

import builtins
import os
import socket
import sqlite3
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from eventsourcing.persistence import IntegrityError, StoredEvent

from ledger.application import ConcurrentUpdate, KeyConflict, Ledger, Sender
from ledger.content import JobContent
from ledger.decision_types import Review
from ledger.stores import backend_for
from ledger.stores.index import INDEX_ROWS_KWARG, IndexRow, JobFilter
from ledger.stores.memory import (
    MemoryBackend,
    MemoryFactory,
    MemoryJobIndexRecorder,
    discard_memory_store,
    shared_recorder,
)
from ledger.stores.url import MemoryStore, parse_store_url
from ledger.vocabulary import EscalationReason, PolicyRef

SENDER = Sender(
    "Support <support@example.com>", "mail.example.com", PolicyRef("receipts", "f" * 16)
)


@pytest.fixture(autouse=True)
def no_files_no_sockets(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"the memory backend touched a file or a socket: {args!r}")

    monkeypatch.setattr(socket, "socket", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(sqlite3, "connect", refuse)
    monkeypatch.setattr(builtins, "open", refuse)
    monkeypatch.setattr(os, "open", refuse)
    monkeypatch.setattr(os, "mkdir", refuse)


@pytest.fixture
def name() -> Iterator[str]:
    store = f"unit-{uuid.uuid4().hex[:8]}"
    yield store
    discard_memory_store(store)


def row(key: str, **fields: Any) -> IndexRow:
    values: dict[str, Any] = {
        "key": key,
        "job_id": uuid.uuid5(uuid.NAMESPACE_URL, key).hex,
        "channel": "receipts",
        "state": "requested",
        "message_id": f"<{key}@mail.example.com>",
        "due_at": None,
        "created_at": 0.0,
        "updated_at": 0.0,
        "version": 1,
        "attempts": 0,
        "reason": None,
    }
    values.update(fields)
    return IndexRow(**values)


def event(key: str, version: int = 1, topic: str = "sendledger:SendJob.Requested") -> StoredEvent:
    return StoredEvent(
        originator_id=uuid.UUID(row(key).job_id),
        originator_version=version,
        topic=topic,
        state=b"{}",
    )


def insert(recorder: MemoryJobIndexRecorder, *rows: IndexRow) -> None:
    events = [event(r.key, r.version) for r in rows]
    recorder.insert_events(events, **{INDEX_ROWS_KWARG: list(rows)})


def content(key: str, body: str = "Thanks") -> JobContent:
    return JobContent(channel="receipts", key=key, to=("a@example.com",), subject="s", body=body)


# -- the backend ---------------------------------------------------------------------------


def test_memory_urls_pick_the_memory_backend() -> None:
    backend = backend_for(parse_store_url("memory://x"))
    assert isinstance(backend, MemoryBackend)
    assert backend.spec == MemoryStore("x")
    assert backend.env["PERSISTENCE_MODULE"] == "ledger.stores.memory:MemoryFactory"
    assert backend.prepare() is False  # nothing stored under "x" yet
    assert backend.is_retryable(RuntimeError("database is locked")) is False
    assert backend.is_setup_race(RuntimeError("already exists")) is False


def test_the_factory_gives_the_named_store_or_a_new_one(name: str) -> None:
    shared = MemoryFactory({"MEMORY_STORE_NAME": name}).application_recorder()
    assert shared is shared_recorder(name)
    assert MemoryFactory({"MEMORY_STORE_NAME": name}).application_recorder() is shared
    own = MemoryFactory({"MEMORY_STORE_NAME": ""}).application_recorder()
    assert isinstance(own, MemoryJobIndexRecorder) and own is not shared
    assert MemoryBackend(MemoryStore(name)).prepare() is True  # it exists now
    discard_memory_store(name)
    assert shared_recorder(name) is not shared


# -- writes: events and index together -----------------------------------------------------


def test_the_index_row_is_written_with_the_events() -> None:
    recorder = MemoryJobIndexRecorder()
    insert(recorder, row("a"))
    assert recorder.job_by_key("a") == row("a")
    assert [n.originator_version for n in recorder.select_notifications(1, 10)] == [1]


def test_a_version_conflict_leaves_events_and_index_unchanged() -> None:
    recorder = MemoryJobIndexRecorder()
    insert(recorder, row("a"))
    with pytest.raises(IntegrityError):
        insert(recorder, row("a", state="attempted", attempts=1))  # version 1 again
    assert recorder.job_by_key("a") == row("a")
    assert len(recorder.select_notifications(1, 10)) == 1
    # Two events of one save: none is stored if one conflicts.
    with pytest.raises(IntegrityError):
        recorder.insert_events(
            [event("b"), event("a")], **{INDEX_ROWS_KWARG: [row("b"), row("a", version=9)]}
        )
    assert recorder.job_by_key("b") is None
    assert recorder.job_by_key("a") == row("a")
    assert len(recorder.select_notifications(1, 10)) == 1


def test_only_a_newer_version_replaces_a_row() -> None:
    recorder = MemoryJobIndexRecorder()
    recorder.replace_all([row("a", version=3, state="unknown")])
    insert(recorder, row("a", version=2, state="attempted"))  # a stale row: events only
    assert recorder.job_by_key("a") == row("a", version=3, state="unknown")
    insert(recorder, row("a", version=4, state="review"))
    assert recorder.job_by_key("a") == row("a", version=4, state="review")


def test_replace_all_clears_then_writes() -> None:
    recorder = MemoryJobIndexRecorder()
    insert(recorder, row("a"), row("b"))
    recorder.replace_all([row("c"), row("c", version=2, state="attempted")])
    assert recorder.find() == [row("c", version=2, state="attempted")]
    recorder.replace_all([])
    assert recorder.find() == []
    assert len(recorder.select_notifications(1, 10)) == 2  # the events are untouched


def test_concurrent_writers_of_one_version_one_wins() -> None:
    recorder = MemoryJobIndexRecorder()
    insert(recorder, row("a"))
    barrier = threading.Barrier(8)
    wins: list[int] = []
    losses: list[int] = []

    def write(n: int) -> None:
        barrier.wait(timeout=10)
        try:
            insert(recorder, row("a", version=2, attempts=n))
            wins.append(n)
        except IntegrityError:
            losses.append(n)

    threads = [threading.Thread(target=write, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert len(wins) == 1 and len(losses) == 7
    stored = recorder.job_by_key("a")
    assert stored is not None and (stored.version, stored.attempts) == (2, wins[0])


# -- queries ---------------------------------------------------------------------------------


@pytest.fixture
def filled() -> MemoryJobIndexRecorder:
    recorder = MemoryJobIndexRecorder()
    recorder.replace_all(
        [
            row("c", due_at=30.0, updated_at=30.0),
            row("a", due_at=10.0, updated_at=10.0, channel="payouts"),
            row("b", due_at=20.0, updated_at=20.0),
            row("e", due_at=10.0, updated_at=5.0),
            row("d", state="attempted", due_at=140.0, updated_at=41.0, attempts=1),
            row("f", state="review", reason="duplicate", updated_at=50.0),
            row("g", state="confirmed", updated_at=60.0),
        ]
    )
    return recorder


def keys(rows: list[IndexRow]) -> list[str]:
    return [r.key for r in rows]


def test_due_jobs_soonest_first(filled: MemoryJobIndexRecorder) -> None:
    assert keys(filled.jobs_due("requested", 25.0, 100)) == ["a", "e", "b"]  # ties by key
    assert keys(filled.jobs_due("requested", 1000.0, 2)) == ["a", "e"]
    assert keys(filled.jobs_due("requested", 9.9, 100)) == []
    assert keys(filled.jobs_due("attempted", 140.0, 100)) == ["d"]  # due_at <= now
    assert filled.jobs_due("review", 1e12, 100) == []  # no due time: never due
    assert filled.jobs_due("requested", 1000.0, 0) == []


def test_find_by_state_channel_and_window_in_key_order(filled: MemoryJobIndexRecorder) -> None:
    assert keys(filled.find()) == list("abcdefg")
    assert keys(filled.find(JobFilter(state="requested"))) == ["a", "b", "c", "e"]
    assert keys(filled.find(JobFilter(channel="payouts"))) == ["a"]
    assert keys(filled.find(JobFilter(updated_from=20.0))) == ["b", "c", "d", "f", "g"]
    assert keys(filled.find(JobFilter(updated_to=20.0))) == ["a", "e"]
    assert keys(filled.find(JobFilter(state="requested", updated_from=10.0, updated_to=30.0))) == [
        "a",
        "b",
    ]
    assert keys(filled.find(after_key="c", limit=2)) == ["d", "e"]
    assert keys(filled.find(after_key="g")) == []


def test_counts_next_due_and_lookups(filled: MemoryJobIndexRecorder) -> None:
    assert filled.count_by_state() == {"requested": 4, "attempted": 1, "review": 1, "confirmed": 1}
    assert filled.count_in_states(["review", "unknown"]) == {"review": 1, "unknown": 0}
    assert filled.count_in_states([]) == {}
    assert filled.next_due(["requested", "attempted"]) == 10.0
    assert filled.next_due(["attempted"]) == 140.0
    assert filled.next_due(["review"]) is None
    assert filled.next_due([]) is None
    assert filled.job_by_key("f") == row("f", state="review", reason="duplicate", updated_at=50.0)
    assert filled.job_by_key("zz") is None
    found = filled.job_by_message_id("<d@mail.example.com>")
    assert found is not None and found.key == "d"
    assert filled.job_by_message_id("<nope@mail.example.com>") is None


# -- through the Ledger ------------------------------------------------------------------


def test_ledgers_on_one_name_share_a_store(name: str) -> None:
    with Ledger(f"memory://{name}") as first, Ledger(f"memory://{name}") as second:
        first.mark_handle("support", lambda h: None)
        assert second.handle("support") is not None
    with Ledger(f"memory://{name}") as later:
        assert later.handle("support") is not None  # a named store outlives its ledgers
    with Ledger("memory://") as own, Ledger("memory://") as other:
        own.mark_handle("support", lambda h: None)
        assert other.handle("support") is None  # no name: a store of its own


def test_submit_and_a_stale_writer_on_the_memory_backend(name: str) -> None:
    with Ledger(f"memory://{name}") as first, Ledger(f"memory://{name}") as second:
        assert first.submit(content("k"), SENDER).created is True
        assert second.submit(content("k"), SENDER).created is False
        with pytest.raises(KeyConflict):
            second.submit(content("k", body="other"), SENDER)
        job_a, job_b = first.get_job("k"), second.get_job("k")
        before = first.row("k")
        assert before is not None and before.version == 1
        # Two writers append version 2: the second one is refused, as with SQL.
        review = Review(PolicyRef("p", "f"), EscalationReason.REJECTED)
        job_a.escalate(review, detail="a", at=first.clock())
        job_b.escalate(review, detail="b", at=first.clock())
        first.save_job(job_a)
        with pytest.raises(ConcurrentUpdate):
            second.save_job(job_b)
        after = second.row("k")
        assert after is not None and (after.version, after.state) == (2, "review")
        assert [type(e).__name__ for e in second.history("k")] == ["Requested", "Escalated"]
        assert second.history("k")[-1].detail == "a"  # the first writer's event
        assert list(second.jobs(state="review")) == [after]
        assert second.rebuild_index() == 1
        assert second.row("k") == after
