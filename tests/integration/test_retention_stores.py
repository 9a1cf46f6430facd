"""Retention on the real stores (docs/configuration.md "Retention"): after a purge, the raw SQLite
file and its WAL, and every row of the PostgreSQL tables, hold none of the purged jobs' addresses,
subjects, bodies, attachments or headers, with and without `store.encryption_key_file`; the jobs
still open keep theirs; the trail still answers; a store written by the first release is purged just
as well.
"""

from __future__ import annotations

import base64
import json
import shutil
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from tests.integration.test_ledger_store import SENDER, attempt_args, content

from daemon.doubles.fake_time import FakeClock
from ledger.application import Ledger
from ledger.content import JobContent, parse_job
from ledger.decision_types import Confirm, Review
from ledger.job import TransitionError
from ledger.stores.cipher import new_key
from ledger.stores.url import PostgresStore
from ledger.vocabulary import EscalationReason, JobState, Resolution

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "store-v1"
DAY = 86400.0


def secrets_of(i: int) -> list[str]:
    return [
        f"ret{i}.hidden@private-example.org",
        f"bcc{i}.hidden@private-example.org",
        f"Retention subject {i} QX",
        f"Retention body {i} ZZ",
        f"attachment-{i}-PDFDATA",
        f"unsub-{i}-customer",
    ]


def job_of(i: int) -> JobContent:
    to, bcc, subject, body, attachment, header = secrets_of(i)
    return parse_job(
        {
            "channel": "receipts",
            "key": f"ret-{i}",
            "to": f"Hidden {i} <{to}>",
            "bcc": [bcc],
            "subject": subject,
            "body": body,
            "headers": {"List-Unsubscribe": f"<mailto:{header}@example.org>"},
            "attachments": [
                {
                    "filename": "invoice.pdf",
                    "content_type": "application/pdf",
                    # Stored as given (base64): grep for that form.
                    "content_base64": base64.b64encode(attachment.encode()).decode(),
                }
            ],
        }
    )


def stored_forms(i: int) -> list[bytes]:
    *texts, attachment, header = secrets_of(i)
    return [
        *(t.encode() for t in texts),
        base64.b64encode(attachment.encode()),
        header.encode(),
    ]


def raw_store(ledger: Ledger, tmp_path: Path) -> bytes:
    """Everything the store holds, as bytes: the SQLite files (main, WAL, shm), or every
    row of every table in the PostgreSQL schema, as text."""
    spec = ledger.store
    schema = getattr(spec, "schema", None)
    if schema is None:
        return b"".join(p.read_bytes() for p in tmp_path.rglob("ledger.sqlite*") if p.is_file())
    assert isinstance(spec, PostgresStore)
    import psycopg

    with psycopg.connect(
        dbname=spec.dbname,
        host=spec.host,
        port=spec.port,
        user=spec.user,
        password=spec.password or None,
    ) as conn:
        chunks = []
        for (table,) in conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (schema,)
        ).fetchall():
            for row in conn.execute(f'SELECT * FROM "{schema}"."{table}"').fetchall():
                for value in row:
                    chunks.append(
                        bytes(value)
                        if isinstance(value, bytes | memoryview)
                        else str(value).encode()
                    )
        return b"\n".join(chunks)


def settle(ledger: Ledger, clock: FakeClock, key: str) -> None:
    ledger.update(key, lambda j: j.claim(**attempt_args(clock)))
    ledger.update(
        key,
        lambda j: j.record_response(
            provider_message_id=f"gm-{key}", decision=Confirm(SENDER.policy), at=clock()
        ),
    )


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    else:
        yield str(request.getfixturevalue("pg_url"))


@pytest.mark.parametrize("encrypted", [False, True], ids=["plain", "encrypted"])
def test_a_purge_leaves_no_content_in_the_store_and_keeps_the_trail(
    url: str, encrypted: bool, tmp_path: Path, clock: FakeClock
) -> None:
    keys = [new_key()] if encrypted else []
    with Ledger(url, clock=clock, encryption_keys=keys) as ledger:
        for i in range(6):
            ledger.submit(job_of(i), SENDER)
        for i in range(4):  # 0-3 confirmed; 4 stays open; 5 goes to review
            settle(ledger, clock, f"ret-{i}")
        ledger.update("ret-5", lambda j: j.claim(**attempt_args(clock)))
        ledger.update(
            "ret-5",
            lambda j: j.record_unknown(
                reason=f"timeout sending to {secrets_of(5)[0]}",
                decision=Review(SENDER.policy, EscalationReason.UNKNOWN_OUTCOME),
                at=clock(),
            ),
        )
        before = {key: ledger.get_job(key) for key in ("ret-0", "ret-1")}
        raw = raw_store(ledger, tmp_path)
        present = [s for i in range(6) for s in stored_forms(i) if s in raw]
        assert len(present) == (0 if encrypted else 36)

        clock.advance(40 * DAY)
        result = ledger.purge_settled(clock() - timedelta(days=30), by="ops", rule="test")
        assert (result.purged, result.skipped, result.scrubbed) == (4, 0, True)

        raw = raw_store(ledger, tmp_path)
        for i in range(4):
            assert [s for s in stored_forms(i) if s in raw] == [], i
        if not encrypted:  # the open jobs keep their content
            assert all(s in raw for i in (4, 5) for s in stored_forms(i))

        # The trail answers: status, history, the index, audits.
        for key, old in before.items():
            job = ledger.get_job(key)
            assert (job.state, job.message_id, job.content_hash) == (
                JobState.CONFIRMED,
                old.message_id,
                old.content_hash,
            )
            assert job.purged_by == "ops" and job.content.to == ()
            assert [type(e).__name__ for e in ledger.history(key)][-1] == "Purged"
            assert ledger.row(key) == ledger.index_row(job)
        assert {r.key for r in ledger.jobs(state=JobState.CONFIRMED)} == {
            f"ret-{i}" for i in range(4)
        }
        assert len(list(ledger.job_events(["Purged"]))) == 4
        assert ledger.get_job("ret-4").content.subject == secrets_of(4)[2]
        # Resending is refused: a purged job has nothing left to send.
        with pytest.raises(TransitionError, match="purged"):
            ledger.update(
                "ret-0",
                lambda j: j.resolve(Resolution.RESEND, note="", by="op", at=clock()),
            )
        assert list(ledger.purgeable(clock())) == []
    # Reopened (the SQLite WAL checkpointed on close too): still nothing, still the trail.
    with Ledger(url, clock=clock, encryption_keys=keys) as ledger:
        raw = raw_store(ledger, tmp_path)
        assert [s for i in range(4) for s in stored_forms(i) if s in raw] == []
        assert ledger.rebuild_index() == 6
        assert ledger.row("ret-2") == ledger.index_row(ledger.get_job("ret-2"))


def test_a_store_of_the_first_release_is_purged_too(tmp_path: Path) -> None:
    """tests/fixtures/store-v1 was written by c19fa83: its events have the first
    release's shape. A purge rewrites them like any other."""
    shutil.copy(FIXTURE / "ledger.sqlite", tmp_path / "ledger.sqlite")
    clock = FakeClock()
    clock.advance(10 * 365 * 86400)
    with Ledger(f"sqlite:///{tmp_path / 'ledger.sqlite'}", clock=clock) as ledger:
        settled = {r.key for r in ledger.purgeable(clock())}
        others = {r.key for r in ledger.jobs()} - settled
        assert settled and others
        purged_texts = {t for key in settled for t in texts_of(ledger.get_job(key).content)}
        open_texts = {t for key in others for t in texts_of(ledger.get_job(key).content)}
        result = ledger.purge_settled(clock(), by="ops", rule="test")
        assert result.purged == len(settled)
        assert all(texts_of(ledger.get_job(key).content) for key in others)  # untouched
    raw = b"".join(p.read_bytes() for p in tmp_path.glob("ledger.sqlite*"))
    # What only the purged jobs said is gone; what an open job also says stays.
    gone = {t for t in purged_texts if not any(t in o for o in open_texts)}
    assert gone and [t for t in gone if any(f in raw for f in stored_as(t))] == []
    assert all(any(f in raw for f in stored_as(t)) for t in open_texts)


def stored_as(text: str) -> list[bytes]:
    # JSON in the events may escape what is not ASCII.
    return [text.encode(), json.dumps(text)[1:-1].encode()]


def texts_of(content: JobContent) -> set[str]:
    addresses = {a.rsplit("<", 1)[-1].rstrip(">") for a in (*content.to, *content.cc)}
    return {t for t in (*addresses, content.subject, content.body) if len(t) >= 4}


def test_a_rebuild_keeps_the_rows_of_jobs_written_after_its_projection(
    url: str, clock: FakeClock
) -> None:
    """The rows a projection did not see belong to jobs created meanwhile: they have
    events and stay (on SQLite the events table keys jobs by 32 hex digits)."""
    with Ledger(url, clock=clock) as ledger:
        ledger.submit(content("late-1"), SENDER)
        row = ledger.row("late-1")
        ledger._index.rebuild([])  # a projection read before late-1 was written
        assert ledger.row("late-1") == row


def test_a_store_without_the_purge_column_gains_it_when_opened(url: str, clock: FakeClock) -> None:
    """Stores of earlier releases have no `purged_at` in their index: opening one adds it
    (SQLite and PostgreSQL), and their rows read as never purged."""
    with Ledger(url, clock=clock) as ledger:
        ledger.submit(content("before-1"), SENDER)
        spec = ledger.store
    if url.startswith("sqlite"):
        import sqlite3

        with sqlite3.connect(spec.path) as conn:  # type: ignore[union-attr]
            conn.execute("ALTER TABLE sendledger_jobs DROP COLUMN purged_at")
    else:
        import psycopg

        with psycopg.connect(url.split("?")[0], autocommit=True) as conn:
            conn.execute(f'ALTER TABLE "{spec.schema}".sendledger_jobs DROP COLUMN purged_at')  # type: ignore[union-attr]
    with Ledger(url, clock=clock) as ledger:
        row = ledger.row("before-1")
        assert row is not None and row.purged_at is None
        settle(ledger, clock, "before-1")
        assert ledger.purge("before-1", by="ops", rule="r").purged
        assert ledger.row("before-1").purged_at == clock().timestamp()  # type: ignore[union-attr]


@pytest.mark.postgres
@pytest.mark.parametrize("functions", ["y", "n"])
def test_a_purge_rewrites_on_both_postgres_insert_paths(
    pg_url: str, functions: str, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POSTGRES_ENABLE_DB_FUNCTIONS", functions)
    with Ledger(pg_url, clock=clock) as ledger:
        ledger.submit(job_of(7), SENDER)
        settle(ledger, clock, "ret-7")
        ledger.purge("ret-7", by="ops", rule="r")
        requested = ledger.history("ret-7")[0]
        assert (requested.to, requested.subject, requested.body) == ([], "", "")
        raw = raw_store(ledger, Path("/nonexistent"))
        assert [s for s in stored_forms(7) if s in raw] == []
