"""Intake throughput: `Ledger.submit` against the raw eventsourcing save rate.

For each backend (a SQLite file; PostgreSQL when reachable) this measures, in one run:

  raw     a plain eventsourcing Application saving a trivial aggregate, one event per save()
  intake  Ledger.submit of new jobs (one Requested event and its index row, one transaction)

Both run side by side on fresh stores, interleaved in chunks of --chunk operations (raw
chunk, intake chunk, raw chunk, ...), so that both see the same machine noise; each round
gives a ratio of the two rates and the median over --rounds is reported. The goal is
intake >= 0.7x raw.
It is a measurement: the exit code is always 0.

    .venv/bin/python bench/intake.py [--n 2000] [--rounds 3] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
# tests/pg_cluster.py: a private PostgreSQL when none answers (`postgres_server`).
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from eventsourcing.application import Application
from eventsourcing.domain import Aggregate

from ledger.application import Ledger, Sender
from ledger.content import JobContent
from ledger.stores import StoreSpec, backend_for, parse_store_url
from ledger.vocabulary import PolicyRef

GOAL = 0.7
PG_URL = os.environ.get(
    "SENDLEDGER_TEST_PG_URL", "postgresql://sendledger:sendledger@127.0.0.1:5432/sendledger_test"
)
SENDER = Sender(
    "Support <support@example.com>", "mail.example.com", PolicyRef("receipts", "f" * 16)
)


class Thing(Aggregate):
    """The trivial aggregate of the raw baseline: one Created event."""

    def __init__(self, n: int) -> None:
        self.n = n


class Raw(Application[Any]):
    name = "rawbench"
    env = {"AGGREGATE_CACHE_MAXSIZE": "", "IS_SNAPSHOTTING_ENABLED": "n"}


def raw_env(spec: StoreSpec) -> dict[str, str]:
    """The same store settings as the ledger, with eventsourcing's own recorder."""
    env = dict(backend_for(spec).env)
    env.pop("APPLICATION_RECORDER_TOPIC", None)
    return env


# -- stores ------------------------------------------------------------------------------


@contextmanager
def sqlite_store() -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="sendledger-bench-") as folder:
        yield f"sqlite:///{Path(folder) / 'bench.sqlite'}"


@contextmanager
def pg_store(url: str = PG_URL) -> Iterator[str]:
    """A fresh schema on the server at `url` (bench/smtp_senders.py passes a private one)."""
    import psycopg

    schema = f"bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    try:
        yield f"{url}?schema={schema}"
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def pg_reachable() -> str | None:
    try:
        import psycopg

        with psycopg.connect(PG_URL, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except Exception as exc:
        return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return None


@contextmanager
def postgres_server(no_postgres: bool = False) -> Iterator[str | None]:
    """A PostgreSQL URL: SENDLEDGER_TEST_PG_URL's when it answers, else a private cluster
    for this run (tests/pg_cluster.py); None (with the reason printed) when neither can be
    had. bench/smtp_senders.py and bench/soak.py use it."""
    if no_postgres:
        yield None
        return
    if pg_reachable() is None:
        yield PG_URL
        return
    from tests.pg_cluster import PrivateCluster, unavailable

    reason = unavailable()
    if reason is not None:
        print(f"postgresql: skipped ({reason})")
        yield None
        return
    with PrivateCluster(prefix="sendledger-bench-pg-") as cluster:
        yield cluster.url


def available_backends(*, no_postgres: bool) -> list[tuple[str, Callable[[], Any]]]:
    """SQLite always; PostgreSQL when asked for and reachable (else says why not)."""
    backends: list[tuple[str, Callable[[], Any]]] = [("sqlite", sqlite_store)]
    if not no_postgres:
        reason = pg_reachable()
        if reason is None:
            backends.append(("postgresql", pg_store))
        else:
            print(f"postgresql: skipped, not reachable at {PG_URL.split('@')[-1]}: {reason}")
    return backends


# -- the two measured loops --------------------------------------------------------------


def contents(n: int) -> list[JobContent]:
    return [
        JobContent(
            channel="receipts",
            key=f"order-{i:07d}",
            to=("Alice <alice@example.com>",),
            subject="Your receipt",
            body=f"Thanks for order {i}.",
        )
        for i in range(n)
    ]


def run_intake(url: str, n: int, profiler: cProfile.Profile | None = None) -> float:
    jobs = contents(n)  # validation is not what is measured here
    ledger = Ledger(url)
    try:
        if profiler is not None:
            profiler.enable()
        start = time.perf_counter()
        for content in jobs:
            ledger.submit(content, SENDER)
        elapsed = time.perf_counter() - start
        if profiler is not None:
            profiler.disable()
        return n / elapsed
    finally:
        ledger.close()


# -- driver ------------------------------------------------------------------------------


def measure_round(raw_url: str, intake_url: str, n: int, chunk: int) -> tuple[float, float]:
    """Rates (ops/s) of raw and intake, timed in alternating chunks."""
    app = Raw(env=raw_env(parse_store_url(raw_url)))
    ledger = Ledger(intake_url)
    jobs = contents(n)  # validation is not what is measured here
    raw_time = intake_time = 0.0
    try:
        for start in range(0, n, chunk):
            stop = min(start + chunk, n)
            begin = time.perf_counter()
            for i in range(start, stop):
                app.save(Thing(i))
            raw_time += time.perf_counter() - begin
            begin = time.perf_counter()
            for content in jobs[start:stop]:
                ledger.submit(content, SENDER)
            intake_time += time.perf_counter() - begin
    finally:
        app.close()
        ledger.close()
    return n / raw_time, n / intake_time


def measure(
    name: str, store: Callable[[], Any], n: int, rounds: int, chunk: int
) -> tuple[float, float, float]:
    """Median raw rate, median intake rate, median of the per-round ratios."""
    raw_rates: list[float] = []
    intake_rates: list[float] = []
    ratios: list[float] = []
    for round_no in range(1, rounds + 1):
        with store() as raw_url, store() as intake_url:
            raw, intake = measure_round(raw_url, intake_url, n, chunk)
        raw_rates.append(raw)
        intake_rates.append(intake)
        ratios.append(intake / raw)
        print(
            f"  {name} round {round_no}: raw {raw:8.0f} saves/s   "
            f"intake {intake:8.0f} jobs/s   ratio {intake / raw:5.2f}",
            flush=True,
        )
    return statistics.median(raw_rates), statistics.median(intake_rates), statistics.median(ratios)


def profile_intake(name: str, store: Callable[[], Any], n: int, top: int) -> None:
    profiler = cProfile.Profile()
    with store() as url:
        run_intake(url, n, profiler)
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("cumulative").print_stats(top)
    print(f"\n--- cProfile of intake on {name} (n={n}), top {top} by cumulative time ---")
    print("\n".join(line for line in out.getvalue().splitlines() if line.strip()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000, help="saves / jobs per run")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (median of ratios)")
    parser.add_argument("--chunk", type=int, default=50, help="operations per interleaved chunk")
    parser.add_argument(
        "--profile", action="store_true", help="cProfile intake where it misses the goal"
    )
    parser.add_argument("--top", type=int, default=30, help="profile lines to print")
    parser.add_argument("--no-postgres", action="store_true")
    args = parser.parse_args(argv)

    backends = available_backends(no_postgres=args.no_postgres)

    print(
        f"intake benchmark: n={args.n} per round, chunks of {args.chunk} interleaved, "
        f"{args.rounds} rounds, median ratio reported; goal intake >= {GOAL}x raw"
    )
    summary = []
    for name, store in backends:
        try:
            raw, intake, ratio = measure(name, store, args.n, args.rounds, args.chunk)
        except Exception as exc:
            print(f"{name}: failed: {type(exc).__name__}: {exc}")
            continue
        summary.append((name, raw, intake, ratio))

    print()
    print(f"{'backend':<11} {'raw saves/s':>12} {'intake jobs/s':>14} {'ratio':>7}  goal")
    for name, raw, intake, ratio in summary:
        verdict = "MEETS" if ratio >= GOAL else "MISSES"
        print(f"{name:<11} {raw:12.0f} {intake:14.0f} {ratio:7.2f}  {verdict} (>= {GOAL}x)")

    if args.profile:
        for name, _raw, _intake, ratio in summary:
            if ratio < GOAL:
                store = dict(backends)[name]
                profile_intake(name, store, min(args.n, 1000), args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
