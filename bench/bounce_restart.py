"""A restart over bounce watches that wait for a read of their mailbox, in one run.

N confirmed jobs of one mailbox have their bounce watch past its end (10 minutes ago),
their mailbox not read through since (its reads held: a send of it always queued), so
each watch waits for a read (docs/architecture.md "Bounces on the job"). Beside them,
one job of the same mailbox whose verification is due 5 seconds after the start, its own
watch still running, so its row is due after every waiting one. An engine starts over the
store (4 check workers, `daemon.batch_size` 200, the in-process fake provider
`daemon/doubles/fake_provider.py`: the store's cost, not a network's) and ticks, one
simulated second a tick (`daemon.tick`'s default), until

  known     every waiting watch is passed over by the tick without a load of its job
            (`BounceWatch.waits_for_read` holds for each of their rows)
  verified  the verification has run (its job written again)

and prints, per store and per way, the ticks (seconds of a daemon) to each, the jobs
loaded and the CPU the ticks took. The ways, measured on the same store in the same run:

  known     the rows say when anything else of the job is due (`other_due_at`): nothing
            to load
  unknown   the rows as a store of an earlier release left them (`other_due_at` NULL, not
            filled in): each waiting watch is loaded once to learn it (the way before)

and (`fill`) what filling in an earlier release's rows costs at start-up
(`Ledger.fill_other_dues`, pages of 500 in one query each) beside what loading every
waiting job by pages of 200 (`Ledger.get_jobs`, the other way a restart could learn the
times) costs. A run that passes `--max-ticks` says so. PostgreSQL runs when reachable (or a
private cluster when its binaries are installed), else it is skipped with the reason.

    .venv/bin/python bench/bounce_restart.py [--jobs 1000 10000] [--no-postgres]
        [--ways known unknown fill] [--stores sqlite postgresql] [--max-ticks 4000]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from intake import pg_store as scratch_pg
from intake import postgres_server
from intake import sqlite_store as scratch_sqlite

from daemon.doubles.fake_provider import FakeProvider
from daemon.doubles.fake_time import FakeClock
from daemon.engine import Engine, PolicyHolder
from ledger.application import Ledger
from ledger.decision_types import Confirm
from ledger.job import SendJob
from ledger.message_id import message_id_for
from ledger.stores.index import INDEX_ROWS_KWARG, IndexRow, index_row
from policies.loader import PolicySet
from policies.model import ChannelPolicy

CHANNEL = "receipts"
POLICY = ChannelPolicy.model_validate(
    {
        "channel": CHANNEL,
        "provider": "fake",
        "from": "Support <support@example.com>",
        "message_id_domain": "mail.example.com",
        "watch_bounces": "1h",
        "verify_after": "10m",
    }
)
WORKERS = 4
BATCH = 200
VERIFY_KEY = "verify-me"
WAYS = ("known", "unknown", "fill")
JOBS = (1_000, 10_000)
STORES = ("sqlite", "postgresql")
#: Jobs written per transaction while building.
WRITE_BATCH = 2_000


def content(key: str) -> Any:
    from ledger.content import parse_job

    return parse_job(
        {
            "channel": CHANNEL,
            "key": key,
            "to": "customer@example.net",
            "subject": f"Receipt {key}",
            "body": f"Thank you ({key}).\n",
        }
    )


def confirmed(key: str, at: datetime, *, verify_at: datetime | None = None) -> SendJob:
    """Sent and confirmed by response `at`, watched for an hour: what the engine records."""
    sender = POLICY.sender
    job = SendJob.request(
        content(key),
        from_addr=sender.from_addr,
        message_id=message_id_for(key, sender.message_id_domain),
        policy=sender.policy,
        at=at,
    )
    job.claim(provider="fake", deadline=at + timedelta(seconds=40), at=at, daemon="bench")
    decision = Confirm(sender.policy, verify_at=verify_at, watch_until=at + timedelta(hours=1))
    job.record_response(provider_message_id=f"id-{key}", decision=decision, at=at)
    return job


def build(ledger: Ledger, n: int, start: datetime) -> list[str]:
    """The waiting watches (ended 10 minutes before `start`) and the job to verify."""
    keys = [f"wait-{i:06d}" for i in range(n)]
    ended = start - timedelta(hours=1, minutes=10)
    for first in range(0, n, WRITE_BATCH):
        jobs = [confirmed(k, ended) for k in keys[first : first + WRITE_BATCH]]
        write_jobs(ledger, jobs)
    verify = confirmed(VERIFY_KEY, start - timedelta(minutes=10), verify_at=start + timedelta(0, 5))
    write_jobs(ledger, [verify])
    return keys


def write_jobs(ledger: Ledger, jobs: list[SendJob]) -> None:
    stored = [ledger.mapper.to_stored_event(e) for job in jobs for e in job.collect_events()]
    ledger.recorder.insert_events(stored, **{INDEX_ROWS_KWARG: [index_row(j) for j in jobs]})


def forget_other_dues(ledger: Ledger) -> None:
    """The rows as a store of an earlier release has them: `other_due_at` NULL."""
    recorder: Any = ledger.recorder
    if hasattr(recorder, "_execute") and "other_due_at" in index_columns():
        recorder._execute(recorder._sql("UPDATE {t} SET other_due_at = NULL"), [[]])


def index_columns() -> tuple[str, ...]:
    from ledger.stores import index

    return index.COLUMNS


@dataclass
class Run:
    known: int | None = None  # ticks until every waiting watch is passed over unloaded
    verified: int | None = None  # ticks until the verification ran
    ticks: int = 0
    loads: int = 0
    cpu: float = 0.0
    wall: float = 0.0


def restart(url: str, keys: list[str], start: datetime, max_ticks: int) -> Run:
    """A daemon's engine started over the store at `start`, ticking a simulated second a
    tick; the CPU and wall time of its ticks only."""
    clock = FakeClock(start)
    ledger = Ledger(url, clock=clock)
    provider = FakeProvider("fake", clock=clock)
    policies = PolicyHolder(lambda: PolicySet({CHANNEL: POLICY}), PolicySet({CHANNEL: POLICY}))
    engine = Engine(
        ledger,
        policies,
        {"fake": provider},
        provider_timeouts={"fake": 10.0},
        clock=clock,
        concurrency=WORKERS,
        batch_size=BATCH,
        deadline_grace=5.0,
        daemon_name="bench",
    )
    engine.bounces._sends_waiting = lambda scope: 1  # a send of the mailbox always queued
    loads = [0]
    loaded: set[str] = set()
    get_job = ledger.get_job

    def counted(key: str) -> SendJob:
        loads[0] += 1
        loaded.add(key)
        return get_job(key)

    ledger.get_job = counted  # type: ignore[method-assign]
    waiting = set(keys)
    first_version = (ledger.row(VERIFY_KEY) or _missing()).version
    run = Run()
    try:
        while run.ticks < max_ticks and (run.known is None or run.verified is None):
            clock.advance(1.0)
            cpu, wall = time.process_time(), time.perf_counter()
            engine.tick()
            run.cpu += time.process_time() - cpu
            run.wall += time.perf_counter() - wall
            run.ticks += 1
            if run.verified is None and (ledger.row(VERIFY_KEY) or _missing()).version > (
                first_version
            ):
                run.verified = run.ticks
            # Asked at the first tick, then once every waiting job was loaded (the
            # index rows are read whole: asked every tick, it would outweigh the ticks).
            asked = run.ticks == 1 or waiting <= loaded
            if run.known is None and asked and all_passed_over(ledger, engine, waiting):
                run.known = run.ticks
    finally:
        run.loads = loads[0]
        engine.close()
        ledger.close()
    return run


def all_passed_over(ledger: Ledger, engine: Engine, waiting: set[str]) -> bool:
    rows = [r for r in ledger.jobs(state="confirmed") if r.key in waiting]
    return len(rows) == len(waiting) and all(engine.bounces.waits_for_read(r) for r in rows)


def _missing() -> IndexRow:
    raise SystemExit(f"{VERIFY_KEY}: no index row")


def timed(action: Callable[[], object]) -> tuple[float, float]:
    cpu, wall = time.process_time(), time.perf_counter()
    action()
    return time.process_time() - cpu, time.perf_counter() - wall


def page_loads(url: str, keys: list[str]) -> tuple[float, float]:
    """Every waiting job loaded by pages of `BATCH`, one query each (`Ledger.get_jobs`)."""
    with Ledger(url) as ledger:
        return timed(
            lambda: [ledger.get_jobs(keys[i : i + BATCH]) for i in range(0, len(keys), BATCH)]
        )


def fill(url: str) -> tuple[float, float, int]:
    with Ledger(url) as ledger:
        filled = [0]

        def go() -> None:
            if hasattr(ledger, "fill_other_dues"):  # absent before the column
                filled[0] = ledger.fill_other_dues()

        cpu, wall = timed(go)
        return cpu, wall, filled[0]


def show(store: str, n: int, way: str, run: Run, max_ticks: int) -> None:
    def ticks(value: int | None) -> str:
        return f">{max_ticks}" if value is None else str(value)

    print(
        f"{store:10} {n:>6} {way:8} known {ticks(run.known):>6} s  verified "
        f"{ticks(run.verified):>6} s  loads {run.loads:>6}  ticks' CPU {run.cpu:7.2f} s"
        f"  wall {run.wall:7.2f} s"
    )


def measure(
    store: str,
    scratch: Callable[[], AbstractContextManager[str]],
    n: int,
    max_ticks: int,
    ways: list[str],
) -> None:
    """Each way on a store of its own, built alike."""
    start = datetime(2026, 11, 1, 9, 0, tzinfo=UTC)
    for way in ways:
        with scratch() as url:
            with Ledger(url) as ledger:
                keys = build(ledger, n, start)
                if way != "known":
                    forget_other_dues(ledger)
            if way != "fill":
                show(store, n, way, restart(url, keys, start, max_ticks), max_ticks)
                continue
            cpu, wall, filled = fill(url)
            print(
                f"{store:10} {n:>6} fill     {filled} rows filled in at start-up:"
                f" CPU {cpu:.2f} s, wall {wall:.2f} s"
            )
            cpu, wall = page_loads(url, keys)
            print(
                f"{store:10} {n:>6} get_jobs every waiting job, pages of {BATCH}:"
                f" CPU {cpu:.2f} s, wall {wall:.2f} s"
            )


def stores(
    names: list[str], no_postgres: bool
) -> Iterator[tuple[str, Callable[[], AbstractContextManager[str]]]]:
    if "sqlite" in names:
        yield "sqlite", scratch_sqlite
    if no_postgres or "postgresql" not in names:
        return
    with postgres_server() as pg_url:
        if pg_url is not None:
            yield "postgresql", lambda: scratch_pg(pg_url)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, nargs="+", default=list(JOBS))
    parser.add_argument("--max-ticks", type=int, default=4_000)
    parser.add_argument("--no-postgres", action="store_true")
    parser.add_argument("--stores", nargs="+", choices=STORES, default=list(STORES))
    parser.add_argument("--ways", nargs="+", choices=WAYS, default=list(WAYS))
    args = parser.parse_args(argv)
    for name, scratch in stores(args.stores, args.no_postgres):
        for n in args.jobs:
            measure(name, scratch, n, args.max_ticks, args.ways)
    return 0


if __name__ == "__main__":
    sys.exit(main())
