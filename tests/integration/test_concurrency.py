"""Several processes submitting the same keys into one store at once.

Eight worker processes each submit the same 200 keys (each in its own order) into one
SQLite file, and separately into one PostgreSQL schema (forked from one interpreter that
imported the ledger once, before any of them opens the store); eight threads do the same
into one memory store. Intake is idempotent on the key, so exactly 200 jobs must exist, exactly 200
submissions across all workers must report created=True, and no worker may see an
exception ("database is locked" least of all).
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from ledger.application import Ledger, Sender
from ledger.content import JobContent
from ledger.stores.memory import discard_memory_store
from ledger.stores.url import PostgresStore, SqliteStore
from ledger.vocabulary import PolicyRef

WORKERS = 8
KEYS = 200

WORKER = textwrap.dedent(
    """
    import json, os, random, sys, time
    from ledger.application import Ledger, Sender
    from ledger.content import JobContent
    from ledger.vocabulary import PolicyRef
    import ledger.stores.postgres, ledger.stores.sqlite  # what Ledger(url) imports on open

    url, barrier = sys.argv[1], sys.argv[2]
    workers, key_count, open_tries = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    policy = PolicyRef("receipts", "f" * 16)
    sender = Sender("Support <support@example.com>", "mail.example.com", policy)


    def wait_for_go(seed):
        # A barrier: say "ready", start when every worker is ready, so they really race.
        open(os.path.join(barrier, f"ready-{seed}"), "w").close()
        while not os.path.exists(os.path.join(barrier, "go")):
            time.sleep(0.005)


    def work(seed):
        keys = [f"key-{i:04d}" for i in range(key_count)]
        random.Random(seed).shuffle(keys)
        created, errors, open_errors = [], [], []
        if not keys:
            wait_for_go(seed)  # open-only run: race the opens themselves
        ledger = None
        for _ in range(open_tries):
            try:
                ledger = Ledger(url)
                break
            except Exception as exc:
                open_errors.append(f"open: {type(exc).__name__}: {exc}".splitlines()[0])
                time.sleep(random.uniform(0.05, 0.3))
        if ledger is None:
            print(json.dumps({"created": [], "errors": open_errors, "open_errors": open_errors}))
            return
        if keys:
            wait_for_go(seed)
        for key in keys:
            content = JobContent(
                channel="receipts", key=key, to=("a@example.com",), subject="s", body=key
            )
            try:
                if ledger.submit(content, sender).created:
                    created.append(key)
            except Exception as exc:
                errors.append(f"{key}: {type(exc).__name__}: {exc}".splitlines()[0])
        ledger.close()
        print(json.dumps({"created": created, "errors": errors, "open_errors": open_errors}))


    # The imports above are paid once; each worker is a process of its own, forked before
    # it opens anything, with its stdout and stderr in files of its own.
    pids = {}
    for seed in range(workers):
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                for fd, name in ((1, "out"), (2, "err")):
                    path = os.path.join(barrier, f"{name}-{seed}")
                    os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), fd)
                work(seed)
                code = 0
            except BaseException:
                import traceback
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        pids[pid] = seed
    codes = {}
    while pids:
        pid, status = os.wait()
        codes[pids.pop(pid)] = os.waitstatus_to_exitcode(status)
    print(json.dumps(codes))
    """
)


def run_workers(
    url: str, tmp_path: Path, *, keys: int = KEYS, open_tries: int = 1
) -> list[dict[str, Any]]:
    script = tmp_path / "worker.py"
    script.write_text(WORKER, encoding="utf-8")
    src = Path(__file__).resolve().parents[2] / "src"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")]),
    }
    barrier = tmp_path / f"barrier-{time.monotonic_ns()}"
    barrier.mkdir()
    parent = subprocess.Popen(
        [sys.executable, str(script), url, str(barrier), str(WORKERS), str(keys), str(open_tries)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    deadline = time.monotonic() + 90
    while len(list(barrier.glob("ready-*"))) < WORKERS and time.monotonic() < deadline:
        if parent.poll() is not None:
            break  # a worker ended early; its output says why
        time.sleep(0.01)
    (barrier / "go").touch()
    out, err = parent.communicate(timeout=120)
    assert parent.returncode == 0, err
    codes = json.loads(out.strip().splitlines()[-1])
    results = []
    for seed in range(WORKERS):
        worker_err = (barrier / f"err-{seed}").read_text(encoding="utf-8")
        assert "database is locked" not in worker_err.lower(), worker_err
        assert codes[str(seed)] == 0, worker_err
        worker_out = (barrier / f"out-{seed}").read_text(encoding="utf-8")
        results.append(json.loads(worker_out.strip().splitlines()[-1]))
    return results


def check(results: list[dict[str, Any]], app: Ledger, distinct_events: int, requested: int) -> None:
    errors = [e for r in results for e in r["errors"]]
    assert errors == [], errors[:5]
    assert not any("locked" in e.lower() for e in errors)
    created = [key for r in results for key in r["created"]]
    assert len(created) == KEYS
    assert sorted(created) == sorted(f"key-{i:04d}" for i in range(KEYS))

    assert app.counts() == {"requested": KEYS}
    rows = list(app.jobs())
    assert len(rows) == KEYS
    assert len({r.job_id for r in rows}) == KEYS
    assert all(r.version == 1 for r in rows)
    assert distinct_events == KEYS
    assert requested == KEYS
    for row in rows[:: KEYS // 10]:
        job = app.get_job(row.key)
        assert job.version == 1
        assert job.content.body == row.key


def test_eight_processes_one_sqlite_file(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'shared.sqlite'}"
    Ledger(url).close()  # the schema exists before any worker starts
    results = run_workers(url, tmp_path)

    app = Ledger(url)
    try:
        assert isinstance(app.store, SqliteStore)
        conn = sqlite3.connect(app.store.path)
        try:
            distinct = conn.execute(
                "SELECT COUNT(DISTINCT originator_id) FROM stored_events"
            ).fetchone()[0]
            requested = conn.execute(
                "SELECT COUNT(*) FROM stored_events WHERE topic = 'sendledger:SendJob.Requested'"
            ).fetchone()[0]
            total = conn.execute("SELECT COUNT(*) FROM stored_events").fetchone()[0]
        finally:
            conn.close()
        assert total == KEYS
        check(results, app, distinct, requested)
    finally:
        app.close()


@pytest.mark.postgres
def test_eight_processes_one_postgres_schema(pg_url: str, tmp_path: Path) -> None:
    import psycopg

    Ledger(pg_url).close()
    results = run_workers(pg_url, tmp_path)

    app = Ledger(pg_url)
    try:
        spec = app.store
        assert isinstance(spec, PostgresStore)
        table = f'"{spec.schema}".sendledger_events'
        with psycopg.connect(
            dbname=spec.dbname,
            host=spec.host,
            port=spec.port,
            user=spec.user,
            password=spec.password,
        ) as conn:
            distinct, requested, total = conn.execute(
                f"SELECT COUNT(DISTINCT originator_id), "
                f"COUNT(*) FILTER (WHERE topic = 'sendledger:SendJob.Requested'), COUNT(*) "
                f"FROM {table}"
            ).fetchone()  # type: ignore[misc]
        assert total == KEYS
        check(results, app, distinct, requested)
    finally:
        app.close()


@pytest.mark.postgres
def test_concurrent_opens_on_postgres(pg_url: str, tmp_path: Path) -> None:
    # Regression: concurrent opens of an existing schema raised InternalError "tuple
    # concurrently updated" (CREATE OR REPLACE FUNCTION racing in create_table).
    Ledger(pg_url).close()  # the schema already exists: opening must be a no-op
    open_errors: list[str] = []
    for _ in range(2):  # the race was hit in most rounds of eight opens
        results = run_workers(pg_url, tmp_path, keys=0, open_tries=1)
        open_errors += [e for r in results for e in r["open_errors"]]
        if open_errors:
            break
    assert open_errors == []


def test_concurrent_opens_on_sqlite(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'shared.sqlite'}"
    results = run_workers(url, tmp_path, keys=0, open_tries=1)
    assert [e for r in results for e in r["open_errors"]] == []


def test_eight_threads_one_memory_store() -> None:
    """The memory backend's lock plays the part of the database's: one winner per key."""
    import random

    name = f"threads-{uuid.uuid4().hex[:8]}"
    url = f"memory://{name}"
    sender = Sender(
        "Support <support@example.com>", "mail.example.com", PolicyRef("receipts", "f" * 16)
    )
    barrier = threading.Barrier(WORKERS)
    results: list[dict[str, Any]] = [{} for _ in range(WORKERS)]

    def worker(seed: int) -> None:
        keys = [f"key-{i:04d}" for i in range(KEYS)]
        random.Random(seed).shuffle(keys)
        created: list[str] = []
        errors: list[str] = []
        with Ledger(url) as ledger:  # a Ledger of its own, as each process has
            barrier.wait(timeout=30)
            for key in keys:
                job = JobContent(
                    channel="receipts", key=key, to=("a@example.com",), subject="s", body=key
                )
                try:
                    if ledger.submit(job, sender).created:
                        created.append(key)
                except Exception as exc:
                    errors.append(f"{key}: {type(exc).__name__}: {exc}")
        results[seed] = {"created": created, "errors": errors}

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(WORKERS)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        with Ledger(url) as app:
            notifications = app.recorder.select_notifications(start=1, limit=10 * KEYS)
            distinct = len({n.originator_id for n in notifications})
            requested = sum(n.topic == "sendledger:SendJob.Requested" for n in notifications)
            assert len(notifications) == KEYS
            check(results, app, distinct, requested)
    finally:
        discard_memory_store(name)
