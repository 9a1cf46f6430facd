"""Readers of the event log by position on PostgreSQL, where the store's own saves leave
gaps: a save takes its notification id, then waits (for a job's index row another
session holds), while a later save commits a higher id (docs/architecture.md
"Webhooks", docs/http-api.md "Metrics"). The store's insert takes no table lock, as
eventsourcing's own insert does, so the gap is real; the webhooks and the recorded
metrics must neither pass it nor count an event twice, and `admin copy-store` must not
finish without the event that fills it."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from tests.integration.test_webhooks_stores import HOOK, Receiver
from tests.unit.engine_rig import policy, receipt
from tests.unit.test_copy_store import a_save_just_before_the_mark

from daemon.api.recorded_metrics import RecordedByPeople
from daemon.cli import main
from daemon.service_layer.copy_store import CopyMismatch, copy_store
from daemon.webhooks.signing import new_secret
from daemon.webhooks.worker import Deliverer
from ledger.application import Ledger
from ledger.decision_types import Review
from ledger.stores import positions
from ledger.stores.index import INDEX_TABLE
from ledger.stores.keycheck import SqlKeyChecks, UnfinishedCopy
from ledger.stores.memory import discard_memory_store
from ledger.stores.url import MemoryStore, PostgresStore, SqliteStore, parse_store_url
from ledger.vocabulary import EscalationReason, PolicyRef, Resolution

pytestmark = pytest.mark.postgres

REVIEW = Review(PolicyRef("receipts", "f"), EscalationReason.UNKNOWN_OUTCOME)


def in_review(ledger: Ledger, *keys: str) -> None:
    for key in keys:
        ledger.submit(receipt("receipts", key), policy("receipts").sender)
        ledger.update(key, lambda j: j.escalate(REVIEW, detail="t", at=ledger.clock()))


def abandon(ledger: Ledger, key: str) -> None:
    ledger.update(
        key, lambda j: j.resolve(Resolution.ABANDON, note="n", by="ops", at=ledger.clock())
    )


@contextmanager
def save_held(ledger: Ledger, pg_url: str, key: str) -> Iterator[Callable[[], None]]:
    """`key` abandoned in a thread whose save has taken its notification id and waits
    for the job's index row, which an open session (an operator's psql) holds; the
    session ends when the block does, or when the callable given is called, and the
    save then commits (the call returns once it has)."""
    recorder: Any = ledger.recorder
    rows = f'"{recorder.datastore.schema}".{INDEX_TABLE}'
    with (
        psycopg.connect(pg_url.split("?")[0]) as holder,
        ThreadPoolExecutor(1) as saver,
    ):
        holder.execute(f"SELECT key FROM {rows} WHERE key = %s FOR UPDATE", [key])
        before = int(recorder.max_notification_id() or 0)
        saved = saver.submit(abandon, ledger, key)
        deadline = time.monotonic() + 10
        while not _waiting_for_a_row(holder):
            assert time.monotonic() < deadline, "the save never reached the held row"
            assert not saved.done(), saved.exception()
            time.sleep(0.02)
        assert int(recorder.max_notification_id() or 0) == before  # not committed

        def release() -> None:
            holder.rollback()
            saved.result(timeout=30)

        try:
            yield release
        finally:
            release()


def _waiting_for_a_row(holder: psycopg.Connection[Any]) -> bool:
    with psycopg.connect(str(holder.info.dsn), autocommit=True) as look:
        found = look.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND %s = ANY(pg_blocking_pids(pid))",
            [holder.info.backend_pid],
        ).fetchone()
    return bool(found and found[0])


def abandoned(collector: RecordedByPeople) -> float:
    families = {f.name: f for f in collector.collect()}
    samples = families["sendledger_resolutions_recorded"].samples
    return next(s.value for s in samples if s.labels["decision"] == "abandon")


def test_a_save_waiting_with_its_id_is_neither_passed_nor_counted_twice(pg_url: str) -> None:
    """The later save commits while the earlier one holds a lower id (with a table lock
    on insert, as eventsourcing's own, it would wait for it: no gap). The webhook
    delivers neither until the earlier commits, then both, in log order; the metrics of
    a process that started before both count both, once each."""
    with Ledger(pg_url) as ledger:
        in_review(ledger, "held", "later")
        collector = RecordedByPeople(ledger)
        receiver = Receiver()
        deliverer = Deliverer(ledger, HOOK, owner="a", poster=receiver)
        deliverer.pass_once()
        delivered = len(receiver.got)
        with save_held(ledger, pg_url, "held"):
            abandon(ledger, "later")  # commits past the held id
            deliverer.pass_once()
            assert len(receiver.got) == delivered  # the gap is not passed
            assert abandoned(collector) == 0
        deliverer.pass_once()
        assert abandoned(collector) == 2
        assert abandoned(collector) == 2  # a later scrape adds nothing
    got = [(p["type"], p["key"]) for p in receiver.got[delivered:]]
    assert got == [("abandoned", "held"), ("abandoned", "later")]


def test_a_save_in_flight_when_the_metrics_start_is_counted_once_it_commits(
    pg_url: str,
) -> None:
    """The process's counts are of the events recorded (committed) after it started:
    the save that held a lower id then and commits later is one of them, the one that
    committed before the start is not. Before, the start was the highest id visible,
    and the held one, below it, was never read."""
    with Ledger(pg_url) as ledger:
        in_review(ledger, "held", "before")
        with save_held(ledger, pg_url, "held"):
            abandon(ledger, "before")  # committed before the start
            collector = RecordedByPeople(ledger)
            assert abandoned(collector) == 0
        assert abandoned(collector) == 1
        in_review(ledger, "after")
        abandon(ledger, "after")
        assert abandoned(collector) == 2


def test_a_save_committed_below_the_copied_events_leaves_the_copy_unfinished(
    pg_url: str,
) -> None:
    """`admin copy-store` walks the log past a save in flight (its id below later
    events), and the save commits after the walk and before the copy is marked
    finished. The source's last event is the last one copied all the same: before, the
    copy was marked finished without the event (the source's alone, a fork)."""
    with Ledger(pg_url) as source:
        in_review(source, "held", "later")
        walked: list[bool] = []

        def progress(copied: int, total: int) -> None:
            walked.append(True)

        with save_held(source, pg_url, "held") as release:
            abandon(source, "later")

            # A webhook's row: its move on the destination is the first look at the
            # clock after the walk, before the checks that precede the mark.
            source.positions().ensure()
            source.positions().force("ops", 0, time.time(), expected=0)

            def clock() -> float:
                if walked and not committed:
                    committed.append(True)
                    release()
                return time.time()

            committed: list[bool] = []
            name = f"gap-copy-{time.monotonic_ns()}"
            with pytest.raises(CopyMismatch, match="a save committed after the walk passed it"):
                copy_store(source, MemoryStore(name), progress=progress, clock=clock)
            assert committed
            discard_memory_store(name)


def test_a_save_still_in_flight_at_the_end_of_the_copy_leaves_it_unfinished(
    pg_url: str,
) -> None:
    """A save holds an id below the last event copied through the whole copy (an
    operator's psql holds the job's row) and commits only after it. The count before the
    mark waits for the saves in flight ([store] lock_timeout, 1 s here), and this one
    outlasts it: the copy stays unfinished. Before, the count did not wait: it matched
    the copied events, the copy was marked finished, and the save then committed to the
    source alone (a fork)."""
    spec = parse_store_url(pg_url)
    assert isinstance(spec, PostgresStore)
    source_spec = dataclasses.replace(spec, lock_timeout=1)
    with Ledger(pg_url) as saver, Ledger(source_spec) as source:
        in_review(saver, "held", "later")
        with save_held(saver, pg_url, "held"):
            abandon(saver, "later")
            name = f"gap-copy-{time.monotonic_ns()}"
            with pytest.raises(CopyMismatch, match="still in flight after"):
                copy_store(source, MemoryStore(name))
            discard_memory_store(name)


def test_a_save_committed_just_before_the_mark_leaves_the_copy_unfinished(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A command's save commits after every check, as the finished mark is written (into
    a SQLite destination): the last event read again after the mark has moved past the
    last copied, and the mark is taken back. Before, the copy stayed marked finished
    without the save (the source's alone, a fork)."""
    destination = SqliteStore(tmp_path / "copy.sqlite")
    with Ledger(pg_url) as source:
        in_review(source, "before")
        saved = a_save_just_before_the_mark(monkeypatch, source, SqlKeyChecks)
        with pytest.raises(CopyMismatch, match="the source changed while it was copied"):
            copy_store(source, destination)
        assert saved
    monkeypatch.undo()
    with pytest.raises(UnfinishedCopy):
        Ledger(destination)


def test_a_scrape_reads_past_more_ids_than_one_gap_scan(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On PostgreSQL the horizon looks GAP_SCAN ids ahead at a time; a scrape asks it
    again until the log ends. Before, a scrape read GAP_SCAN ids at most, so a store
    writing more than that between two scrapes left the counts further behind at each."""
    monkeypatch.setattr(positions, "GAP_SCAN", 3)
    keys = [f"k{i}" for i in range(5)]
    with Ledger(pg_url) as ledger:
        in_review(ledger, *keys)
        collector = RecordedByPeople(ledger)
        for key in keys:
            abandon(ledger, key)
        assert abandoned(collector) == len(keys)


def test_skip_to_the_end_goes_past_more_ids_than_one_gap_scan(
    pg_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`webhooks skip NAME --to end` (a new webhook that is not to be sent the history)
    moves to the final end of the log. Before, to the end of one look ahead: GAP_SCAN
    ids, 1,000 on a store with no gap among them (one `admin copy-store` numbered), and
    the webhook was then sent the rest of the history."""
    monkeypatch.setattr(positions, "GAP_SCAN", 3)
    (tmp_path / "secret").write_text(new_secret() + "\n")
    (tmp_path / "secret").chmod(0o600)
    config = tmp_path / "sendledger.toml"
    config.write_text(
        f'[store]\nurl = "{pg_url}"\n\n'
        '[webhooks.ops]\nurl = "https://hooks.example.com/x"\nsecret_file = "secret"\n'
    )
    keys = [f"k{i}" for i in range(4)]
    with Ledger(pg_url) as ledger:
        in_review(ledger, *keys)
        for key in keys:
            abandon(ledger, key)
        end = int(ledger.recorder.max_notification_id() or 0)
    assert main(["--config", str(config), "webhooks", "skip", "ops", "--to", "end", "--json"]) == 0
    skipped = json.loads(capsys.readouterr().out)
    assert skipped["position"] == end
    assert skipped["skipped"] == 2 * len(keys)  # each job's review and abandon


def test_events_past_a_rolled_back_id_at_the_start_are_not_counted(pg_url: str) -> None:
    """An id taken and rolled back (a save that lost a race) is a gap for good: the start
    is below it, so the events after it, committed before the start, are passed over as
    read, not counted, and the next one is."""
    with Ledger(pg_url) as ledger:
        in_review(ledger, "one", "two", "three")
        recorder: Any = ledger.recorder
        table = f'"{recorder.datastore.schema}"."{recorder.events_table_name}"'
        with psycopg.connect(pg_url.split("?")[0]) as lost:
            lost.execute(
                f"INSERT INTO {table} (originator_id, originator_version, topic, state) "
                "VALUES (gen_random_uuid(), 1, 'test:Other', '\\x7b7d')"
            )
            lost.rollback()
        abandon(ledger, "one")
        abandon(ledger, "two")
        collector = RecordedByPeople(ledger)
        assert abandoned(collector) == 0
        abandon(ledger, "three")
        assert abandoned(collector) == 1


def test_the_final_end_is_not_chased_while_saves_keep_arriving(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store that saves more than one look ahead (GAP_SCAN ids) between two asks of
    the horizon: `final_end` (a scrape, `webhooks skip --to end`) stops at the end that
    was visible when it began. Before, it asked again as long as the saves went on (each
    ask on a gap a SHARE lock that holds the saves up): here 55 asks for 6 events,
    ended only because the test's saves stop after 40."""
    monkeypatch.setattr(positions, "GAP_SCAN", 3)
    with Ledger(pg_url) as ledger:
        in_review(ledger, "a", "b", "c")
        store = ledger.positions()
        visible = int(ledger.recorder.max_notification_id() or 0)  # 6
        asks: list[int] = []
        horizon = store.horizon

        def busy_horizon(after: int) -> int:
            asks.append(after)
            if len(asks) < 40:
                in_review(ledger, f"more{len(asks)}", f"more{len(asks)}b")  # 4 ids
            return horizon(after)

        monkeypatch.setattr(store, "horizon", busy_horizon)
        end = positions.final_end(store, 0)
        assert visible <= end and len(asks) <= 3, (end, asks)
