"""Webhook positions and deliveries on the real stores (SQLite and PostgreSQL; docs/http-api.md
"Webhooks"): a position survives a reopened store, reading the status creates nothing,
and on PostgreSQL two delivery workers deliver each event at least once and never skip
one, however the writers' notification ids interleave."""

from __future__ import annotations

import json
import random
import threading
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from tests.unit.engine_rig import policy, receipt

from daemon.cli import main
from daemon.doubles.fake_provider import FakeProvider
from daemon.engine import Engine, PolicyHolder
from daemon.webhooks.delivery import Outcome
from daemon.webhooks.events import WEBHOOK_TYPES
from daemon.webhooks.signing import new_secret
from daemon.webhooks.status import webhook_status
from daemon.webhooks.worker import Deliverer, Hook
from ledger.application import Ledger
from ledger.job import job_id_for
from ledger.stores.cipher import new_key
from ledger.stores.positions import POSITIONS_TABLE
from policies.loader import PolicySet

SECRET = new_secret()
HOOK = Hook("ops", "https://hooks.example.com/x", SECRET, frozenset(WEBHOOK_TYPES), timeout=5.0)
POLICY = policy("receipts")


class Receiver:
    """Thread-safe: every delivery, in arrival order."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.got: list[dict[str, Any]] = []

    def __call__(
        self, url: str, body: bytes, headers: Mapping[str, str], timeout: float
    ) -> Outcome:
        import json

        with self.lock:
            self.got.append(json.loads(body))
        return Outcome(True, 200)

    def ids(self) -> list[str]:
        with self.lock:
            return [p["event_id"] for p in self.got]


def engine_on(ledger: Ledger) -> Engine:
    provider = FakeProvider("fake", clock=lambda: datetime.now(UTC))
    return Engine(
        ledger,
        PolicyHolder(lambda: PolicySet({"receipts": POLICY})),
        {"fake": provider},
        provider_timeouts={"fake": 5.0},
        concurrency=2,
        rng=random.Random(1),
    )


def confirm(ledger: Ledger, engine: Engine, keys: list[str]) -> None:
    for key in keys:
        ledger.submit(receipt("receipts", key), POLICY.sender)
    engine.tick()


def confirmed_ids(ledger: Ledger) -> list[str]:
    """The event ids of every Confirmed event, in log order."""
    return [
        f"evt_{e.originator_id.hex}_{e.originator_version}"
        for e in ledger.job_events(types=["Confirmed"])
    ]


@pytest.fixture
def ledger(store_url: str) -> Iterator[Ledger]:
    with Ledger(store_url) as opened:
        yield opened


def test_a_position_survives_reopening_the_store(store_url: str) -> None:
    receiver = Receiver()
    with Ledger(store_url) as ledger:
        engine = engine_on(ledger)
        confirm(ledger, engine, ["s-1", "s-2"])
        Deliverer(ledger, HOOK, owner="a", poster=receiver).pass_once()
        engine.close()
    assert len(receiver.got) == 2
    with Ledger(store_url) as ledger:
        engine = engine_on(ledger)
        confirm(ledger, engine, ["s-3"])
        row = ledger.positions().read_all()[0]
        assert row.position > 0 and row.delivered == 2 and row.owner == "a"
        Deliverer(ledger, HOOK, owner="a", poster=receiver).pass_once()
        assert receiver.ids() == confirmed_ids(ledger)
        status = webhook_status(ledger, {"ops": list(WEBHOOK_TYPES)}, time.time())
        assert status[0]["behind"] == 0 and status[0]["delivered"] == 3
        engine.close()


def test_a_delivery_after_failures_clears_the_last_error(store_url: str) -> None:
    # `webhooks status` showed a stale LAST_ERROR with nothing behind on 127b519.
    with Ledger(store_url) as ledger:
        positions = ledger.positions()
        positions.ensure()
        now = time.time()
        assert positions.claim("ops", "a", now, 30.0) is not None
        assert positions.fail("ops", "a", 0, "HTTP 503: busy", now + 2, now, 30.0)
        [row] = positions.read_all()
        assert (row.failures, row.last_error) == (1, "HTTP 503: busy")
        assert row.last_error_at is not None
        assert positions.advance("ops", "a", 0, 5, 1, now + 3, 30.0)
        [row] = positions.read_all()
        assert (row.position, row.failures, row.failed, row.delivered) == (5, 0, 1, 1)
        assert row.last_error is None and row.last_error_at is None


def test_a_purges_scrub_of_the_last_error_changes_only_the_error_it_read(
    store_url: str,
) -> None:
    with Ledger(store_url) as ledger:
        positions = ledger.positions()
        positions.ensure()
        now = time.time()
        assert positions.claim("ops", "a", now, 30.0) is not None
        assert positions.fail("ops", "a", 0, "HTTP 400: zoe@example.net", now + 2, now, 30.0)
        assert not positions.scrub_error("ops", "HTTP 400: other", "HTTP 400: x")
        assert positions.scrub_error("ops", "HTTP 400: zoe@example.net", "HTTP 400: [purged]")
        [row] = positions.read_all()
        assert (row.last_error, row.failures, row.owner) == ("HTTP 400: [purged]", 1, "a")


def test_an_operators_skip_never_moves_a_position_back(store_url: str) -> None:
    """`webhooks skip` works its target out from the position it read; a daemon that
    delivered meanwhile moved it on, and setting the skip's target then would move it back
    and deliver those events again."""
    with Ledger(store_url) as ledger:
        positions = ledger.positions()
        positions.ensure()
        now = time.time()
        assert positions.claim("ops", "a", now, 30.0) is not None
        assert positions.advance("ops", "a", 0, 5, 5, now, 30.0)  # delivered meanwhile
        assert not positions.force("ops", 3, now, expected=0)  # the skip read 0
        assert [row.position for row in positions.read_all()] == [5]
        assert positions.force("ops", 7, now, expected=5)
        assert positions.force("new", 2, now, expected=0)  # a webhook no daemon took yet
        assert [(row.name, row.position) for row in positions.read_all()] == [
            ("new", 2),
            ("ops", 7),
        ]


def test_an_operators_skip_clears_the_error_of_the_event_it_skipped(store_url: str) -> None:
    """After `webhooks skip`, nothing is failing: `webhooks status` showed FAILURES 0 beside
    the skipped event's LAST_ERROR, and kept the receiver's words about it (which may
    quote the payload: an address a purge has since erased) until the next failure."""
    with Ledger(store_url) as ledger:
        positions = ledger.positions()
        positions.ensure()
        now = time.time()
        assert positions.claim("ops", "a", now, 30.0) is not None
        error = 'HTTP 422: {"input":{"detail":"550 customer@example.net unknown"}}'
        assert positions.fail("ops", "a", 0, error, now + 2, now, 30.0)
        assert positions.force("ops", 4, now + 1, expected=0)
        [row] = positions.read_all()
        assert (row.position, row.failures, row.next_at) == (4, 0, None)
        assert row.last_error is None and row.last_error_at is None
        assert row.failed == 1  # the total stays


def test_status_on_a_store_without_webhooks_creates_nothing(store_url: str) -> None:
    with Ledger(store_url) as ledger:
        engine = engine_on(ledger)
        confirm(ledger, engine, ["n-1"])
        engine.close()
        status = webhook_status(ledger, {"ops": ["confirmed"]}, time.time())
        assert status[0]["position"] == 0 and status[0]["behind"] == 1
        assert ledger.positions().read_all() == []
        assert not _table_exists(ledger)


def _table_exists(ledger: Ledger) -> bool:
    recorder: Any = ledger.recorder
    with recorder.datastore.transaction(commit=False) as cursor:
        if store_is_postgres(ledger):
            cursor.execute(
                "SELECT to_regclass(%s) IS NOT NULL AS found",
                [f'"{recorder.datastore.schema}".{POSITIONS_TABLE}'],
            )
            return bool(next(iter(cursor.fetchall()[0].values())))
        cursor.execute("SELECT 1 FROM sqlite_master WHERE name = ?", [POSITIONS_TABLE])
        return bool(cursor.fetchall())


def store_is_postgres(ledger: Ledger) -> bool:
    return type(ledger.store).__name__ == "PostgresStore"


# -- PostgreSQL: gaps and two workers ------------------------------------------------------


@contextmanager
def insert_in_flight(ledger: Ledger, pg_url: str) -> Iterator[Any]:
    """A session that inserted an event, which took its notification id, and has not
    committed: a gap below every id taken after it, until its rollback or commit."""
    import psycopg

    recorder: Any = ledger.recorder
    table = f'"{recorder.datastore.schema}"."{recorder.events_table_name}"'
    with psycopg.connect(pg_url.split("?")[0]) as slow:
        slow.execute(
            f"INSERT INTO {table} (originator_id, originator_version, topic, state) "
            "VALUES (%s, 1, 'test:Other', '\\x7b7d')",
            [job_id_for("gap-holder")],
        )
        yield slow


@pytest.mark.postgres
def test_horizon_waits_for_an_insert_that_has_not_committed(pg_url: str) -> None:

    with Ledger(pg_url) as ledger:
        engine = engine_on(ledger)
        confirm(ledger, engine, ["g-1"])
        positions = ledger.positions()
        before = positions.horizon(0)
        recorder: Any = ledger.recorder
        # An insert that took its notification id and has not committed ...
        with insert_in_flight(ledger, pg_url) as slow:
            # ... while a later one commits.
            confirm(ledger, engine, ["g-2"])
            assert recorder.max_notification_id() > before + 1
            started = time.monotonic()
            assert positions.horizon(before) == before  # the gap is not passed over
            assert time.monotonic() - started < 5
            receiver = Receiver()
            Deliverer(ledger, HOOK, owner="a", poster=receiver).pass_once()
            assert [p["key"] for p in receiver.got] == ["g-1"]
            slow.rollback()  # the id is never used: a gap for good
        assert positions.horizon(before) == recorder.max_notification_id()
        Deliverer(ledger, HOOK, owner="a", poster=receiver).pass_once()
        assert [p["key"] for p in receiver.got] == ["g-1", "g-2"]
        engine.close()


@pytest.mark.postgres
def test_status_counts_behind_only_what_delivery_reads_before_a_gap_in_flight(
    pg_url: str,
) -> None:
    """An insert holds a notification id and has not committed while a later event
    commits: delivery stops below the gap, and `behind` counts what it will send next,
    not the event past the gap (it counted up to the newest visible id: 2 here, with
    the webhook caught up to the gap)."""
    with Ledger(pg_url) as ledger:
        engine = engine_on(ledger)
        confirm(ledger, engine, ["s-1"])
        recorder: Any = ledger.recorder
        with insert_in_flight(ledger, pg_url) as slow:
            confirm(ledger, engine, ["s-2"])
            [before] = webhook_status(ledger, {"ops": ["confirmed"]}, time.time())
            receiver = Receiver()
            Deliverer(ledger, HOOK, owner="a", poster=receiver).pass_once()
            [after] = webhook_status(ledger, {"ops": ["confirmed"]}, time.time())
            slow.rollback()
        assert [p["key"] for p in receiver.got] == ["s-1"]
        assert (before["behind"], before["next_event_id"]) == (1, confirmed_ids(ledger)[0])
        assert after["behind"] == 0 and after["next_event_id"] is None
        assert after["log_end"] == recorder.max_notification_id()
        [settled] = webhook_status(ledger, {"ops": ["confirmed"]}, time.time())
        assert (settled["behind"], settled["next_event_id"]) == (1, confirmed_ids(ledger)[1])
        engine.close()


@pytest.mark.postgres
def test_two_workers_on_one_postgres_store_deliver_each_event_and_skip_none(
    pg_url: str,
) -> None:
    """Writers in threads (each key submitted twice at once, so that ids are taken and
    rolled back), two delivery workers on their own Ledgers; half-way the worker holding
    the lease dies without giving it up and the other takes over once it runs out (its
    clock is moved on past the lease)."""
    receiver = Receiver()
    stop = threading.Event()
    skew = {"a": 0.0, "b": 0.0}
    dead: set[str] = set()

    def work(owner: str) -> None:
        with Ledger(pg_url) as mine:
            deliverer = Deliverer(
                mine, HOOK, owner=owner, poster=receiver, clock=lambda: time.time() + skew[owner]
            )
            while not stop.is_set():
                if owner in dead:
                    return  # killed: no release
                if not deliverer.pass_once():
                    time.sleep(0.01)

    with Ledger(pg_url) as writer:
        engine = engine_on(writer)
        Deliverer(writer, HOOK, owner="setup", poster=receiver).positions.ensure()
        with ThreadPoolExecutor(2) as workers:
            futures = [workers.submit(work, "a"), workers.submit(work, "b")]
            with ThreadPoolExecutor(4) as submitters:
                for batch in range(8):
                    keys = [f"p-{batch}-{n}" for n in range(10)]
                    # Each key twice at once: the loser's insert takes ids and rolls back.
                    list(
                        submitters.map(
                            lambda key: writer.submit(receipt("receipts", key), POLICY.sender),
                            keys + keys,
                        )
                    )
                    engine.tick()
                    if batch == 3:
                        time.sleep(0.5)
                        holder = writer.positions().read_all()[0].owner
                        dead.add(holder)
                        other = "b" if holder == "a" else "a"
                        skew[other] = 61.0  # the dead worker's lease has run out
            expected = confirmed_ids(writer)
            deadline = time.monotonic() + 30
            while set(receiver.ids()) != set(expected) and time.monotonic() < deadline:
                time.sleep(0.1)
            stop.set()
            for future in futures:
                future.result()
        engine.close()
    got = receiver.ids()
    assert len(expected) == 80
    assert set(got) == set(expected)  # every event at least once
    # Never out of log order: only a redelivery goes back, never a skip ahead.
    first_seen = list(dict.fromkeys(got))
    assert first_seen == expected
    repeats = sum(count - 1 for count in Counter(got).values())
    assert repeats <= 1  # at most the one in flight when the holder died


def test_an_event_the_store_can_no_longer_read_is_shown_and_can_be_skipped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The worker fails on an event it cannot read (a key left the key file while events
    written with it remain: docs/configuration.md "Key rotation") and says an operator
    can skip it; `webhooks status` and `webhooks skip` read the same events and raised on
    it, so the webhook stayed stuck on it for good."""
    url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    old, new = new_key(), new_key()
    with Ledger(url, encryption_keys=[old]) as ledger:
        engine = engine_on(ledger)
        confirm(ledger, engine, ["old-1"])
        engine.close()
    with Ledger(url, encryption_keys=[new, old]) as ledger:
        engine = engine_on(ledger)
        confirm(ledger, engine, ["new-1"])
        engine.close()
    (tmp_path / "keys").write_text(new + "\n")  # the old key gone: old-1 cannot be read
    (tmp_path / "secret").write_text(SECRET + "\n")
    for name in ("keys", "secret"):
        (tmp_path / name).chmod(0o600)
    config = tmp_path / "sendledger.toml"
    config.write_text(
        f'[store]\nurl = "{url}"\nencryption_key_file = "keys"\n\n'
        '[webhooks.ops]\nurl = "https://hooks.example.com/x"\nsecret_file = "secret"\n'
    )
    receiver = Receiver()
    with Ledger(url, encryption_keys=[new]) as ledger:
        assert not Deliverer(ledger, HOOK, owner="a", poster=receiver).pass_once()
        [row] = ledger.positions().read_all()
        assert row.failures == 1 and "cannot deliver" in (row.last_error or "")

    assert main(["--config", str(config), "webhooks", "status", "--json"]) == 0
    [status] = json.loads(capsys.readouterr().out)
    assert status["behind"] == 2 and status["failures"] == 1
    assert status["next_event_id"].startswith(f"evt_{job_id_for('old-1').hex}_")
    assert main(["--config", str(config), "webhooks", "skip", "ops", "--json"]) == 0
    skipped = json.loads(capsys.readouterr().out)
    assert skipped["skipped"] == 1 and skipped["event_ids"] == [status["next_event_id"]]
    with Ledger(url, encryption_keys=[new]) as ledger:
        Deliverer(ledger, HOOK, owner="a", poster=receiver).pass_once()
    assert [p["key"] for p in receiver.got] == ["new-1"]


@pytest.mark.postgres
def test_a_position_write_behind_a_row_lock_gives_up_at_lock_timeout(pg_url: str) -> None:
    """Another session holds a webhook's row (an open psql that touched it): a write of
    the row (the pass's claim, advance or fail, the stop's release, `webhooks skip`)
    waited without limit; it gives up at `[store] lock_timeout`."""
    import dataclasses

    import psycopg
    from tests.conftest import PG_URL

    from ledger.stores.url import PostgresStore, parse_store_url

    spec = parse_store_url(pg_url)
    assert isinstance(spec, PostgresStore)
    spec = dataclasses.replace(spec, lock_timeout=1)
    with Ledger(spec) as ledger:
        positions = ledger.positions()
        assert positions.claim("ops", "a", time.time(), 60.0) is not None
        outcome: list[BaseException | None] = []

        def release() -> None:
            try:
                positions.release("ops", "a")
                outcome.append(None)
            except Exception as exc:
                outcome.append(exc)

        with psycopg.connect(PG_URL) as holder:
            holder.execute(f'SELECT 1 FROM "{spec.schema}".{POSITIONS_TABLE} FOR UPDATE')
            writer = threading.Thread(target=release, daemon=True)
            started = time.monotonic()
            writer.start()
            writer.join(timeout=10)
            waited = time.monotonic() - started
            holder.rollback()
        writer.join(timeout=10)
        assert waited < 5.0, "the write still waited behind the row lock"
        assert len(outcome) == 1 and outcome[0] is not None, outcome
        positions.release("ops", "a")  # the row is free again
        [row] = positions.read_all()
        assert row.lease_until == 0.0
