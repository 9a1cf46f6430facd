"""The index queries behind ticks, status and audits read what matches, not the history.

Each read the daemon or a command makes through `Ledger` is captured as the SQL the
recorder actually runs, and the database's plan for it is checked: a search of an index
bounded by the query's filters, never a scan of the job index. This is what keeps them
flat as settled jobs pile up (docs/performance.md "Performance and scaling", bench/history.py).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from tests.conftest import require_postgres

from ledger.application import Ledger
from ledger.stores.index import INDEX_TABLE, ScopeFilter, ScopeGroup, WatchHold
from ledger.vocabulary import OPEN_STATES, JobState

NOW = datetime(2026, 11, 1, 9, 0, tzinfo=UTC)

#: What a tick, start-up, `status`, `review list` and the audits ask of the index.
READS: dict[str, Callable[[Ledger], Any]] = {
    "due (a tick)": lambda ledger: ledger.due(JobState.CONFIRMED, NOW, 200),
    "due of the scopes owned (a tick, several daemons)": lambda ledger: ledger.due(
        JobState.REQUESTED,
        NOW,
        200,
        ScopeFilter(
            (ScopeGroup(("receipts",), ("a@example.com",)), ScopeGroup(("other",))),
            ("other", "receipts"),
        ),
    ),
    "due with waiting watches held (a tick's confirmed jobs)": lambda ledger: ledger.due(
        JobState.CONFIRMED, NOW, 200, held=[WatchHold("receipts", ("m1", "m2"), after=1.0)]
    ),
    "watched rows without other_due_at (start-up)": lambda ledger: ledger.fill_other_dues(),
    "scopes_due (the scope owners' round)": lambda ledger: ledger.scopes_due(NOW),
    "next_due": lambda ledger: ledger.next_due([JobState.REQUESTED, JobState.UNKNOWN]),
    "open_counts (status line)": lambda ledger: ledger.open_counts(),
    "row (status KEY)": lambda ledger: ledger.row("k-1"),
    "row_by_message_id": lambda ledger: ledger.row_by_message_id("<x@example.com>"),
    "watched (the bounce reads' mailboxes)": lambda ledger: ledger.watched(),
    "jobs in a state (audit --state review)": lambda ledger: list(
        ledger.jobs(state=JobState.REVIEW)
    ),
    "jobs in a state since (audit --state confirmed --since)": lambda ledger: list(
        ledger.jobs(state=JobState.CONFIRMED, since=NOW - timedelta(hours=1))
    ),
    "jobs since (audit --since)": lambda ledger: list(ledger.jobs(since=NOW - timedelta(hours=1))),
    "jobs of a channel since (audit --channel --since)": lambda ledger: list(
        ledger.jobs(channel="receipts", since=NOW - timedelta(hours=1))
    ),
}
SINCE_READS = [name for name in READS if "since" in name]


def captured_sql(ledger: Ledger, read: Callable[[Ledger], Any]) -> list[tuple[str, list[Any]]]:
    recorder: Any = ledger.recorder
    seen: list[tuple[str, list[Any]]] = []
    fetch = recorder._fetch

    def spy(sql: str, params: Any) -> Any:
        seen.append((sql, list(params)))
        return fetch(sql, params)

    recorder._fetch = spy
    try:
        read(ledger)
    finally:
        del recorder._fetch
    assert seen, "the read ran no index query"
    return seen


@pytest.fixture
def sqlite_ledger(tmp_path: Path) -> Iterator[tuple[Ledger, Path]]:
    path = tmp_path / "plans.sqlite"
    with Ledger(f"sqlite:///{path}") as ledger:
        yield ledger, path


@pytest.mark.parametrize("name", list(READS))
def test_sqlite_reads_search_an_index(sqlite_ledger: tuple[Ledger, Path], name: str) -> None:
    ledger, path = sqlite_ledger
    with sqlite3.connect(path) as conn:
        for sql, params in captured_sql(ledger, READS[name]):
            plan = [row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + sql, params)]
            scans = [step for step in plan if step.startswith("SCAN") and INDEX_TABLE in step]
            assert not scans, f"{name}: {sql!r} scans the job index: {plan}"


@pytest.mark.parametrize("name", SINCE_READS)
def test_sqlite_since_bounds_the_search(sqlite_ledger: tuple[Ledger, Path], name: str) -> None:
    """Without the (state, updated_at) index, "in state S since T" is a search of every
    job ever in S, filtered one by one, and "since T" a scan of every job."""
    ledger, path = sqlite_ledger
    with sqlite3.connect(path) as conn:
        for sql, params in captured_sql(ledger, READS[name]):
            plan = " ".join(row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + sql, params))
            assert f"{INDEX_TABLE}_state_updated (state=? AND updated_at>?)" in plan, plan


def test_an_older_sqlite_store_gains_the_index_when_opened(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    Ledger(f"sqlite:///{path}").close()
    with sqlite3.connect(path) as conn:
        conn.execute(f"DROP INDEX {INDEX_TABLE}_state_updated")
    Ledger(f"sqlite:///{path}").close()
    with sqlite3.connect(path) as conn:
        names = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
    assert f"{INDEX_TABLE}_state_updated" in names


@pytest.mark.postgres
@pytest.mark.parametrize("name", SINCE_READS)
def test_postgres_since_uses_the_index(pg_url: str, name: str) -> None:
    require_postgres()
    with Ledger(pg_url) as ledger:
        schema = ledger.store.schema  # type: ignore[union-attr]
        statements = captured_sql(ledger, READS[name])
    with psycopg.connect(pg_url.split("?")[0]) as conn:
        conn.execute(f'SET search_path TO "{schema}"')
        # An empty table is cheapest to read whole: ask whether the index can serve it.
        conn.execute("SET enable_seqscan = off")
        for sql, params in statements:
            plan = " ".join(row[0] for row in conn.execute("EXPLAIN " + sql, params).fetchall())
            assert f"{INDEX_TABLE}_state_updated" in plan, plan


@pytest.mark.postgres
@pytest.mark.parametrize("name", [name for name in READS if "scope" in name])
def test_postgres_scope_reads_use_the_due_index(pg_url: str, name: str) -> None:
    """The reads of several daemons sharing scopes: what is due, however many settled
    jobs the store keeps (the filter of the scopes owned is one array per list)."""
    require_postgres()
    with Ledger(pg_url) as ledger:
        schema = ledger.store.schema  # type: ignore[union-attr]
        statements = captured_sql(ledger, READS[name])
    with psycopg.connect(pg_url.split("?")[0]) as conn:
        conn.execute(f'SET search_path TO "{schema}"')
        conn.execute("SET enable_seqscan = off")
        for sql, params in statements:
            plan = " ".join(row[0] for row in conn.execute("EXPLAIN " + sql, params).fetchall())
            assert f"{INDEX_TABLE}_state_due" in plan, plan


def test_every_open_state_is_read(sqlite_ledger: tuple[Ledger, Path]) -> None:
    """The status line counts open states only (a range of the index each)."""
    ledger, _path = sqlite_ledger
    assert list(ledger.open_counts()) == [str(s) for s in OPEN_STATES]
