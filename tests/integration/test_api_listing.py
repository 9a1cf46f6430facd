"""`GET /v1/jobs` through the real server: pages in (updated, key) order, a cursor stable
under inserts and changes, filters, every bad parameter named in one 422; and the index
query behind it bounded by an index on SQLite and PostgreSQL (docs/http-api.md "HTTP API")."""

from __future__ import annotations

import base64
import json
import sqlite3
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.conftest import require_postgres
from tests.integration.api_kit import TOKEN, Api, job, running_api, write_config
from tests.integration.test_index_plans import captured_sql

from daemon.service_layer.listing import decode_cursor, encode_cursor
from ledger.application import Ledger
from ledger.stores.index import INDEX_TABLE
from ledger.vocabulary import JobState

SUBMITTER = "submitter-token-0123456789ab"


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    settings = write_config(tmp_path, f"sqlite:///{tmp_path / 'ledger.sqlite'}")
    with (tmp_path / "api-tokens").open("a") as tokens:
        tokens.write(f"shop:{SUBMITTER}:submit\n")
    with running_api(settings) as running:
        yield running


def submit(api: Api, *keys: str) -> None:
    answer = api.client.post("/v1/jobs", json=[job(k) for k in keys], headers=api.auth())
    assert answer.status_code == 201, answer.text


def every_page(api: Api, **params: Any) -> Iterator[list[dict[str, Any]]]:
    cursor = None
    while True:
        query = {**params, **({"cursor": cursor} if cursor else {})}
        answer = api.client.get("/v1/jobs", params=query, headers=api.auth())
        assert answer.status_code == 200, answer.text
        body = answer.json()
        yield body["jobs"]
        cursor = body["next_cursor"]
        if cursor is None:
            return


def test_pages_cover_every_job_once_in_change_order(api: Api) -> None:
    submit(api, *(f"k{i:02}" for i in range(7)))
    pages = list(every_page(api, limit=3))
    assert [len(p) for p in pages] == [3, 3, 1]  # no empty page at the end
    rows = [row for page in pages for row in page]
    assert sorted(r["key"] for r in rows) == [f"k{i:02}" for i in range(7)]
    positions = [(r["updated"], r["key"]) for r in rows]
    assert positions == sorted(positions)
    first = rows[0]
    assert set(first) == {"key", "channel", "state", "reason", "message_id", "attempts",
                          "due_at", "created", "updated", "version", "purged"}  # fmt: skip
    assert (first["channel"], first["state"], first["purged"]) == ("receipts", "requested", False)


def test_the_cursor_is_stable_under_inserts_and_changes(api: Api) -> None:
    submit(api, "b", "d", "f", "h")
    pages = every_page(api, limit=2)
    seen = [row["key"] for row in next(pages)]
    # Inserted meanwhile with keys before and after the cursor, and one read job changed:
    # each sorts after everything already read, none already read is skipped.
    submit(api, "a", "z")
    api.client.post(f"/v1/jobs/{seen[0]}/cancel", json={}, headers=api.auth())
    seen += [row["key"] for page in pages for row in page]
    assert seen[:4] == ["b", "d", "f", "h"]
    assert sorted(seen[4:]) == sorted(["a", "z", "b"])
    assert len(seen) == 7


def test_filters_state_channel_since(api: Api) -> None:
    submit(api, "x1", "x2", "x3")
    api.client.post("/v1/jobs/x2/cancel", json={}, headers=api.auth())

    def keys(**params: Any) -> list[str]:
        return sorted(row["key"] for page in every_page(api, **params) for row in page)

    assert keys(state="cancelled") == ["x2"]
    assert keys(state="requested", channel="receipts") == ["x1", "x3"]
    assert keys(channel="other") == []
    assert keys(since="1h") == ["x1", "x2", "x3"]
    future = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    assert keys(since=future) == []
    assert keys(since="20991231") == []  # a date in ISO 8601's basic form, not seconds ago


@pytest.mark.parametrize(
    ("params", "fields"),
    [
        ({"state": "lost"}, ["state"]),
        ({"limit": "0"}, ["limit"]),
        ({"limit": "1001"}, ["limit"]),
        ({"limit": "ten"}, ["limit"]),
        ({"limit": "9" * 5000}, ["limit"]),
        ({"since": "yesterday"}, ["since"]),
        ({"since": "3600"}, ["since"]),  # seconds, or hours? its unit is asked for
        ({"cursor": "not-a-cursor"}, ["cursor"]),
        ({"channel": " "}, ["channel"]),
        ({"state": "x", "limit": "-1", "cursor": "%%"}, ["state", "limit", "cursor"]),
    ],
)
def test_bad_parameters_are_422_naming_each(
    api: Api, params: dict[str, str], fields: list[str]
) -> None:
    answer = api.client.get("/v1/jobs", params=params, headers=api.auth())
    assert answer.status_code == 422, answer.text
    body = answer.json()
    assert [e["field"] for e in body["errors"]] == fields
    assert body["error"].startswith(f"{fields[0]}: ")


def test_listing_needs_a_token(api: Api) -> None:
    assert api.client.get("/v1/jobs").status_code == 401


params = st.dictionaries(
    st.sampled_from(["state", "channel", "since", "limit", "cursor", "other"]),
    st.one_of(
        st.text(max_size=12),
        st.sampled_from(["review", "requested", "1", "1000", "24h", "2026-11-01", "-1"]),
        st.builds(encode_cursor, st.floats(allow_nan=True, allow_infinity=True), st.text()),
    ),
)


@settings(
    deadline=None, max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(query=params, token=st.sampled_from([None, TOKEN, SUBMITTER, "wrong-token-0123456789"]))
def test_listing_answers_only_documented_statuses(
    api: Api, query: dict[str, str], token: str | None
) -> None:
    doc = api.client.get("/v1/openapi.json").json()
    documented = {int(status) for status in doc["paths"]["/v1/jobs"]["get"]["responses"]}
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    answer = api.client.get("/v1/jobs", params=query, headers=headers)
    assert answer.status_code in documented and answer.status_code < 500, answer.text
    expected = {None: 401, SUBMITTER: 403, "wrong-token-0123456789": 401}.get(token)
    if any("\x00" in value for value in query.values()):
        # A NUL in the query is refused by the transport guard, before any route or token
        # (docs/http-api.md "Errors and statuses"): it names no job either.
        expected = 422
    if expected is not None:
        assert answer.status_code == expected  # before any parameter is looked at
    assert "error" in answer.json() or "jobs" in answer.json()


@settings(deadline=None, max_examples=200)
@given(st.text(max_size=60))
def test_any_text_is_a_position_or_none_never_an_error(text: str) -> None:
    found = decode_cursor(text)
    if found is not None:
        at, key = found
        assert isinstance(at, float) and isinstance(key, str)


@pytest.mark.parametrize("key", ["\ud800", "k\x00", "\udfff-k"])
def test_a_cursor_naming_a_key_no_store_can_hold_is_422(api: Api, key: str) -> None:
    # Checked as text, the cursor is plain base64; decoded, its key would reach the store
    # with a lone surrogate (no UTF-8 encoding: a crash on SQLite and PostgreSQL) or a NUL
    # (PostgreSQL refuses it). No job has such a key, so no cursor this API gave does.
    cursor = base64.urlsafe_b64encode(json.dumps([1.0, key]).encode()).decode().rstrip("=")
    assert decode_cursor(cursor) is None
    answer = api.client.get("/v1/jobs", params={"cursor": cursor}, headers=api.auth())
    assert answer.status_code == 422, answer.text
    assert [e["field"] for e in answer.json()["errors"]] == ["cursor"]


@settings(deadline=None)
@given(
    st.floats(min_value=0, max_value=4e9, allow_nan=False),
    # Any text a store holds as a key (no NUL, no lone surrogate: see the test above).
    st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"), max_size=50),
)
def test_a_cursor_round_trips_exactly(at: float, key: str) -> None:
    assert decode_cursor(encode_cursor(at, key)) == (at, key)


NOW = datetime(2026, 11, 1, 9, 0, tzinfo=UTC)
AFTER = (NOW.timestamp(), "k-1")
LISTINGS = {
    "first page": lambda ledger: ledger.changed_jobs(limit=101),
    "next page": lambda ledger: ledger.changed_jobs(after=AFTER, limit=101),
    "in a state": lambda ledger: ledger.changed_jobs(state=JobState.REVIEW, after=AFTER),
    "since": lambda ledger: ledger.changed_jobs(since=NOW - timedelta(hours=1), after=AFTER),
    "of a channel": lambda ledger: ledger.changed_jobs(channel="receipts", after=AFTER),
}


@pytest.mark.parametrize("name", list(LISTINGS))
def test_sqlite_listing_reads_an_index_in_order(tmp_path: Path, name: str) -> None:
    """A page is a range of an index read up to its size: never a scan of the table and
    never a sort of every matching job (a state's page sorts only equal times by key)."""
    path = tmp_path / "plans.sqlite"
    with Ledger(f"sqlite:///{path}") as ledger:
        statements = captured_sql(ledger, LISTINGS[name])
    with sqlite3.connect(path) as conn:
        for sql, params in statements:
            plan = [row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + sql, params)]
            assert any("USING INDEX" in step or "USING COVERING INDEX" in step for step in plan)
            assert not [s for s in plan if s.startswith("SCAN") and "INDEX" not in s], plan
            assert "USE TEMP B-TREE FOR ORDER BY" not in plan, plan


@pytest.mark.postgres
@pytest.mark.parametrize("name", list(LISTINGS))
def test_postgres_listing_uses_an_index(pg_url: str, name: str) -> None:
    require_postgres()
    with Ledger(pg_url) as ledger:
        schema = ledger.store.schema  # type: ignore[union-attr]
        statements = captured_sql(ledger, LISTINGS[name])
    with psycopg.connect(pg_url.split("?")[0]) as conn:
        conn.execute(f'SET search_path TO "{schema}"')
        conn.execute("SET enable_seqscan = off")
        for sql, params in statements:
            plan = " ".join(row[0] for row in conn.execute("EXPLAIN " + sql, params).fetchall())
            assert f"{INDEX_TABLE}_" in plan and "Seq Scan" not in plan, plan


@pytest.mark.parametrize(
    "backend", ["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def test_changed_pages_by_time_then_key_on_every_backend(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Jobs are listed in the order they were stored, whatever their own times say (one
    transaction's rows by key); the position after the last row read leaves out exactly
    the rows already read, in memory, SQLite and PostgreSQL."""
    from tests.unit.engine_rig import receipt

    from daemon.doubles.fake_time import FakeClock
    from ledger.vocabulary import PolicyRef, Sender

    url = {"memory": "memory://", "sqlite": f"sqlite:///{tmp_path / 'l.sqlite'}"}.get(backend)
    url = url or str(request.getfixturevalue("pg_url"))
    clock = FakeClock(NOW)
    sender = Sender("s@example.com", "mail.example.com", PolicyRef("receipts", "f" * 16))
    with Ledger(url, clock=clock) as ledger:
        for key in ("c", "a", "b"):
            ledger.submit(receipt("receipts", key), sender)  # three stores in one instant
        ledger.submit_many([(receipt("receipts", k), sender) for k in ("e", "d")])  # one
        clock.advance(1)
        ledger.submit(receipt("receipts", "0-later"), sender)
        walked: list[str] = []
        after = None
        while True:
            page = ledger.changed_jobs(after=after, limit=2)
            walked += [row.key for row in page]
            if len(page) < 2:
                break
            assert page[-1].written_at is not None
            after = (page[-1].written_at, page[-1].key)
        assert walked == ["c", "a", "b", "d", "e", "0-later"]
        since = ledger.changed_jobs(since=NOW + timedelta(seconds=1))
        assert [row.key for row in since] == ["0-later"]
        assert [
            r.key for r in ledger.changed_jobs(state="requested", after=(NOW.timestamp(), "c"))
        ] == ["a", "b", "d", "e", "0-later"]


@pytest.mark.parametrize(
    "backend", ["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def test_a_batch_stored_after_a_walk_passed_its_times_is_still_walked(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """A batch's jobs are created at the time its messages were proved, seconds before
    it is stored (10,000 of them to render): a walk that meanwhile read a job stored
    later, or a poll `since` its last one, still lists them (docs/http-api.md "Listing
    jobs")."""
    from tests.unit.engine_rig import receipt

    from daemon.doubles.fake_time import FakeClock
    from daemon.service_layer.doors import store_services
    from ledger.application import Proved
    from ledger.vocabulary import PolicyRef, Sender

    url = {"memory": "memory://", "sqlite": f"sqlite:///{tmp_path / 'l.sqlite'}"}.get(backend)
    url = url or str(request.getfixturevalue("pg_url"))
    clock = FakeClock(NOW)
    sender = Sender("s@example.com", "mail.example.com", PolicyRef("receipts", "f" * 16))
    with Ledger(url, clock=clock) as ledger:
        services = store_services(ledger)
        proved = Proved(clock(), "writer")  # the batch's intake starts rendering
        clock.advance(5)
        polled = clock().isoformat()  # a poller's last poll found nothing
        clock.advance(1)
        ledger.submit(receipt("receipts", "single-1"), sender)
        ledger.submit(receipt("receipts", "single-2"), sender)
        first = services.list_jobs(limit=1)  # a walk starts
        assert [job["key"] for job in first.jobs] == ["single-1"]
        clock.advance(4)
        batch = [(receipt("receipts", f"batch-{i}"), sender) for i in range(3)]
        ledger.submit_many(batch, proved=proved)  # stored now, created 10 s ago
        walked = [job["key"] for job in first.jobs]
        cursor = first.next_cursor
        while cursor is not None:
            page = services.list_jobs(limit=1, cursor=cursor)
            walked += [job["key"] for job in page.jobs]
            cursor = page.next_cursor
        assert walked == ["single-1", "single-2", "batch-0", "batch-1", "batch-2"]
        since = services.list_jobs(since=polled)
        assert {job["key"] for job in since.jobs} == {
            "single-1", "single-2", "batch-0", "batch-1", "batch-2"
        }  # fmt: skip


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def test_a_store_of_an_earlier_release_lists_every_job_once_opened(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Its rows have no `written_at`: opening the store adds the column and gives each row
    its last change, so the listing, which pages by it, still has every job."""
    from tests.unit.engine_rig import receipt

    from daemon.doubles.fake_time import FakeClock
    from ledger.vocabulary import PolicyRef, Sender

    path = tmp_path / "l.sqlite"
    url = f"sqlite:///{path}" if backend == "sqlite" else str(request.getfixturevalue("pg_url"))
    sender = Sender("s@example.com", "mail.example.com", PolicyRef("receipts", "f" * 16))
    with Ledger(url, clock=FakeClock(NOW)) as ledger:
        ledger.submit(receipt("receipts", "old-1"), sender)
        ledger.submit(receipt("receipts", "old-2"), sender)
    drop = [f"DROP INDEX {INDEX_TABLE}_{n}" for n in ("written_key", "state_written")]
    drop.append(f"ALTER TABLE {INDEX_TABLE} DROP COLUMN written_at")
    if backend == "sqlite":
        with sqlite3.connect(path) as conn:
            for sql in drop:
                conn.execute(sql)
    else:
        schema = url.split("schema=")[1]
        with psycopg.connect(url.split("?")[0]) as conn:
            conn.execute(f'SET search_path TO "{schema}"')
            for sql in drop:
                conn.execute(sql)
    with Ledger(url, clock=FakeClock(NOW + timedelta(seconds=5))) as ledger:
        rows = ledger.changed_jobs()
        assert [r.key for r in rows] == ["old-1", "old-2"]
        assert all(r.written_at == r.updated_at for r in rows)
        ledger.submit(receipt("receipts", "new"), sender)
        assert [r.key for r in ledger.changed_jobs(since=NOW + timedelta(seconds=1))] == ["new"]


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def test_a_job_an_earlier_releases_daemon_stored_meanwhile_is_listed(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """A rolling upgrade: a daemon of the earlier release, on the store the new one has
    opened, stores a row without `written_at` (its upsert names no such column). The next
    write of this release stamps it, so a walk or a since-poll lists it."""
    from tests.unit.engine_rig import receipt

    from daemon.doubles.fake_time import FakeClock
    from ledger.stores.index import COLUMNS
    from ledger.vocabulary import PolicyRef, Sender

    path = tmp_path / "l.sqlite"
    url = f"sqlite:///{path}" if backend == "sqlite" else str(request.getfixturevalue("pg_url"))
    sender = Sender("s@example.com", "mail.example.com", PolicyRef("receipts", "f" * 16))
    clock = FakeClock(NOW)
    with Ledger(url, clock=clock) as ledger:
        ledger.submit(receipt("receipts", "new-1"), sender)
        polled = clock() + timedelta(seconds=1)  # a poller's last poll found new-1
        clock.advance(2)
        ledger.submit(receipt("receipts", "old-1"), sender)
        row = ledger.row("old-1")
        assert row is not None
        old_columns = [c for c in COLUMNS if c != "written_at"]
        values = row.as_tuple()[: len(old_columns)]
        if backend == "sqlite":
            with sqlite3.connect(path) as conn:  # the earlier release's write of old-1
                conn.execute(f"DELETE FROM {INDEX_TABLE} WHERE key = 'old-1'")
                marks = ", ".join(["?"] * len(old_columns))
                sql = f"INSERT INTO {INDEX_TABLE} ({', '.join(old_columns)}) VALUES ({marks})"
                conn.execute(sql, values)
        else:
            schema = url.split("schema=")[1]
            with psycopg.connect(url.split("?")[0]) as conn:
                conn.execute(f'SET search_path TO "{schema}"')
                conn.execute(f"DELETE FROM {INDEX_TABLE} WHERE key = 'old-1'")
                marks = ", ".join(["%s"] * len(old_columns))
                sql = f"INSERT INTO {INDEX_TABLE} ({', '.join(old_columns)}) VALUES ({marks})"
                conn.execute(sql, values)
        clock.advance(2)
        ledger.submit(receipt("receipts", "new-2"), sender)  # this release's next write
        since = [r.key for r in ledger.changed_jobs(since=polled)]
        assert sorted(since) == ["new-2", "old-1"]
        walked = [r.key for r in ledger.changed_jobs()]
        assert sorted(walked) == ["new-1", "new-2", "old-1"]


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def test_a_write_where_every_row_has_its_stamp_updates_no_unstamped_row(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """A transaction's stamp read the last stamp, then ran an UPDATE of the rows with none
    (an earlier release's, above) at every write, which found none at almost every one: a
    statement, on PostgreSQL a round trip, in every commit. The read now says whether one
    is there, each half a search of the (written_at, key) index, and the UPDATE runs only
    then (the test above: such a row is still stamped by the next write)."""
    from tests.unit.engine_rig import receipt

    from daemon.doubles.fake_time import FakeClock
    from ledger.vocabulary import PolicyRef, Sender

    path = tmp_path / "l.sqlite"
    url = f"sqlite:///{path}" if backend == "sqlite" else str(request.getfixturevalue("pg_url"))
    sender = Sender("s@example.com", "mail.example.com", PolicyRef("receipts", "f" * 16))
    with Ledger(url, clock=FakeClock(NOW)) as ledger:
        ledger.submit(receipt("receipts", "s-1"), sender)
        recorder: Any = ledger.recorder
        to_sql = recorder._sql
        made: list[str] = []

        def spy(template: str) -> str:
            made.append(to_sql(template))
            return made[-1]

        recorder._sql = spy
        try:
            ledger.submit(receipt("receipts", "s-2"), sender)
        finally:
            del recorder._sql
        stamps = [sql for sql in made if "MAX(written_at)" in sql]
        assert len(stamps) == 1, made  # the spy saw the write's stamp
        assert not [sql for sql in made if sql.startswith("UPDATE")], made
        if backend == "sqlite":
            with sqlite3.connect(path) as conn:
                plan = [row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + stamps[0])]
            assert [step for step in plan if step.startswith("SEARCH")] == [
                f"SEARCH {INDEX_TABLE} USING COVERING INDEX {INDEX_TABLE}_written_key",
                f"SEARCH {INDEX_TABLE} USING COVERING INDEX {INDEX_TABLE}_written_key "
                "(written_at=?)",
            ], plan
            assert not [step for step in plan if step.startswith(f"SCAN {INDEX_TABLE}")], plan
