"""Moving a store and backing one up, on real files and a real PostgreSQL
(daemon/service_layer/copy_store.py, ledger/stores/sqlite_backup.py; docs/operations.md
"Moving to PostgreSQL" and "Backups"): an encrypted SQLite store copied into PostgreSQL
reads there as it did; a PostgreSQL log with gaps keeps its webhooks in place; a daemon
name held on the source refuses the copy; a backup taken while a writer writes is one
consistent store; and a store restored from a backup older than its last sends searches
the jobs it holds in flight instead of sending them again."""

from __future__ import annotations

import dataclasses
import shutil
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from tests.integration.test_ledger_store import SENDER, content
from tests.unit.engine_rig import DAEMON, EngineRig, claimed_by, policy

from daemon.service_layer.copy_store import CopyRefused, copy_store
from ledger.application import KeyConflict, Ledger
from ledger.decision_types import Confirm, Review
from ledger.job import SendJob
from ledger.stores.cipher import new_key
from ledger.stores.identity import FileIdentityLock
from ledger.stores.index import IndexRow
from ledger.stores.sqlite_backup import backup
from ledger.stores.url import StoreUrlError, parse_store_url
from ledger.vocabulary import EscalationReason, JobState, PolicyRef

AT = datetime(2026, 11, 1, 9, 0, tzinfo=UTC)
POLICY = PolicyRef("receipts", "sha256:00")


def at() -> datetime:
    return AT


def fill(ledger: Ledger, count: int) -> None:
    """`count` jobs: requested, attempted, confirmed and in review in turn; a handle."""
    for i in range(count):
        ledger.submit(content(f"job-{i}", body=f"Body {i}"), SENDER)
        if i % 4 == 0:
            continue

        def step(job: SendJob, i: int = i) -> None:
            if i % 4 == 3:
                job.escalate(Review(POLICY, EscalationReason.UNKNOWN_OUTCOME), detail="t", at=AT)
                return
            job.claim(provider="gmail", deadline=AT + timedelta(minutes=1), at=AT, daemon="d1")
            if i % 4 == 2:
                job.record_response(provider_message_id=f"gm-{i}", decision=Confirm(POLICY), at=AT)

        ledger.update(f"job-{i}", step)
    ledger.mark_handle("gmail", lambda handle: None)


def log(ledger: Ledger) -> list[tuple[Any, ...]]:
    return [
        (str(n.originator_id), n.originator_version, n.topic, bytes(n.state))
        for n in ledger.log_after(0, 1 << 62, 1 << 20, ())
    ]


def index(ledger: Ledger) -> list[IndexRow]:
    return [dataclasses.replace(row, written_at=0.0) for row in ledger.jobs()]


@pytest.mark.postgres
def test_an_encrypted_sqlite_store_reads_the_same_in_postgresql(
    tmp_path: Path, pg_url: str
) -> None:
    key = new_key()
    with Ledger(f"sqlite:///{tmp_path}/a.sqlite", clock=at, encryption_keys=[key]) as source:
        fill(source, 40)
        source.positions().force("crm", 30, time.time(), expected=0)
        result = copy_store(source, parse_store_url(pg_url), encryption_keys=[key], page=7)
        assert result.finished and result.events == len(log(source)) == result.total
        with Ledger(pg_url, encryption_keys=[key]) as target:
            assert log(target) == log(source)  # the same bytes: encrypted as they were
            assert index(target) == index(source)
            assert target.get_job("job-2").state is JobState.CONFIRMED
            assert [(p.name, p.position) for p in target.positions().read_all()] == [("crm", 30)]
        with pytest.raises(CopyRefused, match="holds events"):
            copy_store(source, parse_store_url(pg_url), encryption_keys=[key])


@pytest.mark.postgres
def test_webhooks_keep_their_place_past_the_gaps_of_a_postgresql_log(
    tmp_path: Path, pg_url: str
) -> None:
    with Ledger(pg_url, clock=at) as source:
        fill(source, 3)
        for _ in range(3):  # a refused insert takes an id from the sequence: a gap
            with pytest.raises(KeyConflict):
                source.submit(content("job-0", body="other"), SENDER)
        source.submit(content("after-gap"), SENDER)
        ids = [n.id for n in source.log_after(0, 1 << 62, 1000, ())]
        assert ids[-1] > len(ids)  # the gaps are there
        source.positions().force("crm", ids[-1] - 1, time.time(), expected=0)
        target_url = f"sqlite:///{tmp_path}/b.sqlite"
        copy_store(source, parse_store_url(target_url))
        with Ledger(target_url) as target:
            # Every event but the last handled, as in the source: numbered 1.. without gaps.
            assert target.positions().read_all()[0].position == len(ids) - 1
            assert log(target) == log(source)


def test_a_daemon_name_held_on_the_source_refuses_the_copy(tmp_path: Path) -> None:
    store = tmp_path / "a.sqlite"
    with Ledger(f"sqlite:///{store}", clock=at) as source:
        fill(source, 2)
        lock = FileIdentityLock(store, "host-a")  # what a running daemon holds
        try:
            with pytest.raises(CopyRefused, match=r"holding its daemon.name .* fork"):
                copy_store(source, parse_store_url(f"sqlite:///{tmp_path}/b.sqlite"))
        finally:
            lock.release()
        assert not (tmp_path / "b.sqlite").exists()  # nothing written
        copy_store(source, parse_store_url(f"sqlite:///{tmp_path}/b.sqlite"))


@pytest.mark.postgres
def test_the_source_under_another_host_name_is_refused(pg_url: str) -> None:
    """`localhost` for the configured `127.0.0.1`: the same PostgreSQL schema under a URL
    that `same_store` cannot tell. Refused as the store itself, nothing written (before,
    an empty store was copied into itself and marked `copy-started`)."""
    assert "@127.0.0.1:" in pg_url
    with Ledger(pg_url) as source:
        before = source.recorder.key_checks()  # type: ignore[attr-defined]
        alias = parse_store_url(pg_url.replace("@127.0.0.1:", "@localhost:"))
        with pytest.raises(StoreUrlError, match="names the configured store itself"):
            copy_store(source, alias)
        assert source.recorder.key_checks() == before  # type: ignore[attr-defined]


def test_a_backup_taken_while_a_writer_writes_is_one_consistent_store(tmp_path: Path) -> None:
    store = tmp_path / "live.sqlite"
    written = threading.Event()
    stop = threading.Event()
    with Ledger(f"sqlite:///{store}") as live:
        live.submit(content("first"), SENDER)

        def write() -> None:
            i = 0
            while not stop.is_set():
                live.submit(content(f"w-{i}"), SENDER)
                i += 1
                written.set()

        writer = threading.Thread(target=write)
        writer.start()
        try:
            written.wait(10)
            result = backup(parse_store_url(f"sqlite:///{store}"), tmp_path / "copy.sqlite")  # type: ignore[arg-type]
        finally:
            stop.set()
            writer.join()
        with Ledger(f"sqlite:///{tmp_path}/copy.sqlite") as copy:
            copied = log(copy)
            # A prefix of the live log, each job whole, and an index that is its events'.
            assert copied == log(live)[: len(copied)] and len(copied) > 1
            assert index(copy) == [
                dataclasses.replace(copy.index_row(copy.get_job(row.key)), written_at=0.0)
                for row in copy.jobs()
            ]
    assert result.bytes == (tmp_path / "copy.sqlite").stat().st_size
    assert (tmp_path / "copy.sqlite").stat().st_mode & 0o777 == 0o600
    with pytest.raises(StoreUrlError, match="never overwrites"):
        backup(parse_store_url(f"sqlite:///{store}"), tmp_path / "copy.sqlite")  # type: ignore[arg-type]


def test_a_backup_never_writes_into_a_file_made_after_its_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process creates FILE between the backup's look for it and its creation (as
    if `exists` had just answered no): the backup is refused and that file left whole.
    Before, the creation passed over the file silently, the backup overwrote it, and a
    failure would have removed it."""
    store = tmp_path / "live.sqlite"
    with Ledger(f"sqlite:///{store}") as live:
        live.submit(content("first"), SENDER)
    theirs = tmp_path / "theirs.sqlite"
    theirs.write_bytes(b"another process's file")
    theirs.chmod(0o644)
    monkeypatch.setattr(Path, "exists", lambda self, **kw: False)
    monkeypatch.setattr(Path, "is_symlink", lambda self: False)
    with pytest.raises(StoreUrlError, match="never overwrites"):
        backup(parse_store_url(f"sqlite:///{store}"), theirs)  # type: ignore[arg-type]
    monkeypatch.undo()
    assert theirs.read_bytes() == b"another process's file"
    assert theirs.stat().st_mode & 0o777 == 0o644


def test_a_restored_stores_jobs_in_flight_are_searched_not_sent_again(tmp_path: Path) -> None:
    """The claim is in the backup, its outcome was written after it: restored, the job is
    an Attempted without outcome, which the daemon takes as Unknown at its start (its own
    claim) and searches; the provider's one copy confirms it. No second send."""
    live = tmp_path / "ledger.sqlite"
    with EngineRig(policy("receipts"), store=f"sqlite:///{live}") as rig:
        rig.submit("receipts", "in-flight")
        job = claimed_by(rig.ledger, "in-flight", DAEMON)
        rig.ledger.save_job(job)
        rig.provider.store_copy(job.message_id)  # the provider took it; no answer yet
        backup(parse_store_url(f"sqlite:///{live}"), tmp_path / "backup.sqlite")  # type: ignore[arg-type]
        confirm = Confirm(policy("receipts").ref)
        rig.ledger.update(
            "in-flight",
            lambda j: j.record_response(
                provider_message_id="gm-1", decision=confirm, at=rig.clock()
            ),
        )
        # Restored as docs/operations.md "Backups" says: the daemon stopped, the file replaced.
        rig.engine.close()
        rig.ledger.close()
        for leftover in (live, Path(f"{live}-wal"), Path(f"{live}-shm")):
            leftover.unlink(missing_ok=True)
        shutil.copyfile(tmp_path / "backup.sqlite", live)
        rig.ledger = Ledger(f"sqlite:///{live}", clock=rig.clock)
        rig.restart()
        assert rig.job("in-flight").state is JobState.ATTEMPTED
        assert rig.engine.recover_own_claims().recovered == 1  # the daemon's start-up
        assert rig.job("in-flight").state is JobState.UNKNOWN
        for _ in range(5):
            rig.advance_and_tick(61)
        assert rig.job("in-flight").state is JobState.CONFIRMED
        assert rig.copies("in-flight") == 1
        assert rig.events("in-flight") == ["Requested", "Attempted", "Unknown", "Confirmed"]
        assert rig.ledger.history("in-flight")[-1].via == "search"
