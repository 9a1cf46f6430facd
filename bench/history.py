"""Flat in history: a store of 1,000 settled jobs next to one of 1,000,000, in one run.

Each store holds its settled jobs (confirmed by response; every 50th abandoned after
review), 20 jobs waiting in review and 100 due jobs (requested). Side by side, small and
big, each measured in a separate process (its peak RSS read by a small launcher's
`os.wait4`):

  tick      one engine tick over the 100 due jobs (`Engine.tick`, the in-process fake
            provider `daemon/doubles/fake_provider.py`: the store's cost, not a network's)
  start-up  `sendledger run` from process start to READY=1 on $NOTIFY_SOCKET (identity,
            recovery of its own claims, the scheduler), Gmail provider on the emulator
  status    `sendledger status KEY --json` of a settled job
  history   `sendledger history KEY --json`
  review    `sendledger audit --state review --format json`
  recent    `sendledger audit --state confirmed --since 1h --format json`

and prints big/small for each (goal <= 1.5, peak RSS <= 1.2), the median of `--rounds`
runs. A command's process time is mostly the interpreter's start-up, so each command's
own work (`main(argv)` timed in-process after its imports) is shown and held to the goal
too. The tick and start-up move the due jobs on; they are put back (their later events
and index rows) between runs. Last, what the (state, updated_at) index of the job index
costs a save, with it and without it on a fresh store.

The big store is built straight through the recorder: the events the domain records for
each job (`SendJob` commands, encoded by the ledger's own mapper) and the index rows
(`index_row`), 20,000 jobs per transaction (2,000 on PostgreSQL). It is cached under
the cache folder keyed by `SCHEMA`, the job count and the backend, so reruns skip the
build (bump `SCHEMA` whenever what a store holds changes). PostgreSQL runs when
reachable at SENDLEDGER_TEST_PG_URL, else it is skipped with the reason.

    .venv/bin/python bench/history.py [--jobs 1000000] [--no-postgres] [--rounds 5]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import UUID

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from intake import PG_URL, pg_reachable
from intake import pg_store as scratch_pg
from intake import sqlite_store as scratch_sqlite

from ledger.application import Ledger
from ledger.content import JobContent
from ledger.decision_types import Confirm, Review
from ledger.job import SendJob
from ledger.message_id import message_id_for
from ledger.stores.index import INDEX_ROWS_KWARG, UPSERT, index_row
from ledger.vocabulary import EscalationReason, PolicyRef, Resolution

#: Bump when what a built store holds changes: cached stores of other versions are ignored.
SCHEMA = 1
SMALL = 1_000
DUE = 100
REVIEW = 20
#: Jobs per transaction. PostgreSQL's smaller: psycopg pipelines an executemany, and
#: 60,000 inserts in one pipeline stall with both sides waiting on full buffers.
BATCH = {"sqlite": 20_000, "postgresql": 2_000}
#: Settled jobs are spaced this far apart, the last at the build, whatever the store's
#: size: the hour before the last one then holds the same jobs in both stores.
SPACING = timedelta(seconds=7.776)  # 1,000,000 jobs over 90 days
TICK_GOAL = 1.5
RSS_GOAL = 1.2
CHANNEL = "receipts"
FROM = "Support <support@example.com>"
DOMAIN = "mail.example.com"
POLICY_REF = PolicyRef(CHANNEL, "0123456789abcdef")
POLICY_TOML = f"""channel = "{CHANNEL}"
provider = "gmail"
from = "{FROM}"
message_id_domain = "{DOMAIN}"
search_after = "30s"
"""


# -- building a store ---------------------------------------------------------------------


def content(key: str) -> JobContent:
    return JobContent(
        channel=CHANNEL,
        key=key,
        to=("Alice <alice@example.com>",),
        subject=f"Your receipt {key}",
        body=f"Thanks for order {key}.\n",
    )


def request(key: str, at: datetime) -> SendJob:
    return SendJob.request(
        content(key),
        from_addr=FROM,
        message_id=message_id_for(key, DOMAIN),
        policy=POLICY_REF,
        at=at,
    )


def settled_job(i: int, at: datetime) -> SendJob:
    """What the engine would have recorded: sent and confirmed by response, or (every
    50th) sent to review and abandoned by an operator."""
    job = request(f"old-{i:08d}", at)
    if i % 50 == 49:
        job.escalate(
            Review(POLICY_REF, EscalationReason.REJECTED), detail="550 mailbox unknown", at=at
        )
        job.resolve(Resolution.ABANDON, note="bounced", by="ops", at=at + timedelta(minutes=5))
        return job
    job.claim(provider="gmail", deadline=at + timedelta(seconds=45), at=at, daemon="bench")
    job.record_response(provider_message_id=f"18c{i:013x}", decision=Confirm(POLICY_REF), at=at)
    return job


def write_jobs(ledger: Ledger, jobs: list[SendJob]) -> None:
    """One transaction: the jobs' events as the ledger's mapper encodes them, and their
    index rows, through the recorder's insert (the path `Ledger.save_job` takes)."""
    stored = [ledger.mapper.to_stored_event(e) for job in jobs for e in job.collect_events()]
    ledger.recorder.insert_events(stored, **{INDEX_ROWS_KWARG: [index_row(j) for j in jobs]})


def build(url: str, settled: int, now: datetime) -> float:
    """Fill an empty store; seconds taken."""
    started = time.perf_counter()
    first = now - SPACING * settled
    with Ledger(url) as ledger:
        batch = BATCH["sqlite" if url.startswith("sqlite") else "postgresql"]
        for start in range(0, settled, batch):
            jobs = [
                settled_job(i, first + SPACING * i)
                for i in range(start, min(settled, start + batch))
            ]
            write_jobs(ledger, jobs)
            if settled > SMALL and (start + len(jobs)) % 20_000 == 0:
                print(f"  ... {start + len(jobs):,} jobs", file=sys.stderr, flush=True)
        review = []
        for i in range(REVIEW):
            job = request(f"review-{i:04d}", now - timedelta(minutes=30))
            job.escalate(
                Review(POLICY_REF, EscalationReason.UNKNOWN_OUTCOME),
                detail="timeout",
                at=now - timedelta(minutes=29),
            )
            review.append(job)
        write_jobs(ledger, review)
        write_jobs(ledger, [request(due_key(i), now - timedelta(minutes=1)) for i in range(DUE)])
    return time.perf_counter() - started


def due_key(i: int) -> str:
    return f"due-{i:04d}"


# -- stores: where they live, cached between runs -------------------------------------------


@dataclass(frozen=True)
class Store:
    name: str  # "small" / "big"
    backend: str  # "sqlite" / "postgresql"
    url: str
    settled: int


def cache_dir(given: str | None) -> Path:
    base = Path(given or os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    folder = (base if given else base / "sendledger-bench") / f"history-v{SCHEMA}"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def sqlite_store(
    folder: Path, name: str, settled: int, *, fresh: bool
) -> tuple[Store, float | None]:
    """The cached store, or a new one (then its build time). A store is complete only
    once its marker file is written: an interrupted build is started again."""
    path = folder / f"{settled}.sqlite"
    marker = folder / f"{settled}.complete"
    store = Store(name, "sqlite", f"sqlite:///{path}", settled)
    if marker.exists() and not fresh:
        return store, None
    marker.unlink(missing_ok=True)
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    seconds = build(store.url, settled, datetime.now(UTC))
    marker.write_text(json.dumps({"built_seconds": seconds}))
    return store, seconds


def pg_store(name: str, settled: int, *, fresh: bool) -> tuple[Store, float | None]:
    import psycopg

    schema = f"bench_history_v{SCHEMA}_{settled}"
    store = Store(name, "postgresql", f"{PG_URL}?schema={schema}", settled)
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        done = conn.execute(
            "SELECT 1 FROM information_schema.tables WHERE table_schema = %s "
            "AND table_name = 'bench_complete'",
            (schema,),
        ).fetchone()
        if done and not fresh:
            return store, None
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        conn.execute(f'CREATE SCHEMA "{schema}"')
    seconds = build(store.url, settled, datetime.now(UTC))
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'CREATE TABLE "{schema}".bench_complete (built_seconds float)')
    return store, seconds


def reset_due(store: Store) -> None:
    """Put the due jobs back as built (requested, version 1): a tick or a start-up moved
    them on. Bench plumbing, in the recorder's own SQL helpers: nothing else is touched."""
    now = datetime.now(UTC)
    with Ledger(store.url) as ledger:
        recorder: Any = ledger.recorder
        # eventsourcing keeps SQLite's originator ids as hex, PostgreSQL's as uuid.
        param: Callable[[UUID], object] = (
            (lambda u: u.hex) if store.backend == "sqlite" else (lambda u: u)
        )
        jobs = [request(due_key(i), now - timedelta(minutes=1)) for i in range(DUE)]
        with recorder._transaction(commit=True) as cursor:
            for job in jobs:
                cursor.execute(
                    recorder._sql(
                        f"DELETE FROM {_qualified(ledger, recorder.events_table_name)} "
                        "WHERE originator_id = {p} AND originator_version > 1"
                    ),
                    [param(job.id)],
                )
                cursor.execute(recorder._sql("DELETE FROM {t} WHERE key = {p}"), [job.key])
        recorder._execute(recorder._sql(UPSERT), [index_row(job).as_tuple() for job in jobs])


# -- the measured child processes ----------------------------------------------------------


@dataclass
class Measured:
    seconds: float
    rss_mb: float
    #: A command's own work, run in-process after its imports: what grows with the store
    #: shows here first, before the interpreter's start-up hides it.
    work: float | None = None


# A launcher with a small footprint runs each measured process and reports its peak RSS:
# Linux carries the parent's high-water mark into a forked child's ru_maxrss, so the
# bench (big after a build) cannot read a child's own peak from its own wait4.
LAUNCHER = """
import os, signal, subprocess, sys
child = subprocess.Popen(sys.argv[2:])
signal.signal(signal.SIGTERM, lambda *_: child.terminate())
while True:
    try:
        _pid, status, usage = os.wait4(child.pid, 0)
        break
    except InterruptedError:
        continue
with open(sys.argv[1], "w") as out:
    out.write(str(usage.ru_maxrss))
sys.exit(os.waitstatus_to_exitcode(status))
"""


@contextlib.contextmanager
def launched(
    argv: list[str], *, env: dict[str, str] | None = None, stdout: Any = None
) -> Iterator[tuple[subprocess.Popen[bytes], list[float]]]:
    """Start `argv` under the launcher; on the way out, wait for it and put the peak RSS
    (MB) of the process into the yielded list. A non-zero exit raises."""
    with tempfile.TemporaryDirectory(prefix="sendledger-rss-") as folder:
        rss_file = Path(folder) / "rss"
        process = subprocess.Popen(
            [sys.executable, "-c", LAUNCHER, str(rss_file), *argv],
            env=env,
            stdout=stdout,
            stderr=subprocess.PIPE,
        )
        peak: list[float] = []
        yield process, peak
        _out, errors = process.communicate()
        if process.returncode != 0:
            raise RuntimeError(f"{' '.join(argv[:4])} ...: exit {process.returncode}: {errors!r}")
        peak.append(int(rss_file.read_text()) / 1024)


def run_child(argv: list[str]) -> tuple[float, float, str]:
    """Wall seconds from start to exit (launcher included), peak RSS (MB), stdout."""
    with tempfile.TemporaryFile() as out:
        started = time.perf_counter()
        with launched(argv, stdout=out) as (_process, peak):
            pass
        seconds = time.perf_counter() - started
        out.seek(0)
        return seconds, peak[0], out.read().decode()


def child_tick(url: str) -> None:
    """In the child: one engine tick over the due jobs, fake provider; prints seconds."""
    from daemon.doubles.fake_provider import FakeProvider
    from daemon.engine import Engine, PolicyHolder
    from ledger.application import utcnow
    from policies.loader import PolicySet
    from policies.model import ChannelPolicy

    policy = ChannelPolicy.model_validate(
        {"channel": CHANNEL, "provider": "gmail", "from": FROM, "message_id_domain": DOMAIN}
    )
    with Ledger(url) as ledger:
        engine = Engine(
            ledger,
            PolicyHolder(lambda: PolicySet({CHANNEL: policy})),
            {"gmail": FakeProvider("gmail", clock=utcnow)},
            provider_timeouts={"gmail": 30.0},
        )
        started = time.perf_counter()
        report = engine.tick()
        seconds = time.perf_counter() - started
        engine.close()
    print(json.dumps({"seconds": seconds, "dispatched": report.confirmed}))


def measure_tick(store: Store) -> Measured:
    _wall, rss, out = run_child([sys.executable, __file__, "--child-tick", store.url])
    result = json.loads(out)
    if result["dispatched"] != DUE:
        raise RuntimeError(f"the tick confirmed {result['dispatched']} of {DUE} due jobs")
    reset_due(store)
    return Measured(result["seconds"], rss)


@dataclass
class Setup:
    """The config, policy folder and Gmail emulator the CLI and daemon run against."""

    folder: Path
    emulator: Any

    def config(self, store: Store) -> Path:
        path = self.folder / f"{store.backend}-{store.name}.toml"
        if not path.exists():
            path.write_text(
                f"""[store]
url = "{store.url}"

[daemon]
tick = "1h"
policies_dir = "{self.folder / "policies"}"
name = "bench-history"

[providers.gmail]
kind = "gmail"
credentials_file = "{self.folder / "sa.json"}"
user = "support@example.com"
api_endpoint = "{self.emulator.url}"
token_uri = "{self.emulator.url}/token"
"""
            )
        return path


@contextlib.contextmanager
def setup() -> Iterator[Setup]:
    from testkit import GmailEmulator, write_service_account

    with tempfile.TemporaryDirectory(prefix="sendledger-history-") as name:
        folder = Path(name)
        (folder / "policies").mkdir()
        (folder / "policies" / f"{CHANNEL}.toml").write_text(POLICY_TOML)
        emulator = GmailEmulator().start()
        write_service_account(folder / "sa.json", token_uri=emulator.url + "/token")
        try:
            yield Setup(folder, emulator)
        finally:
            emulator.stop()


def sendledger(config: Path, *args: str) -> list[str]:
    return [str(Path(sys.executable).parent / "sendledger"), "--config", str(config), *args]


def measure_command(config: Path, *args: str) -> Measured:
    seconds, rss, out = run_child(sendledger(config, *args))
    if not out.strip():
        raise RuntimeError(f"sendledger {' '.join(args)}: no output")
    _wall, _rss, work = run_child(
        [sys.executable, __file__, "--child-cli", "--config", str(config), *args]
    )
    return Measured(seconds, rss, json.loads(work)["seconds"])


def child_cli(argv: list[str]) -> None:
    """In the child: the CLI's `main(argv)` after its imports, output captured; prints
    the seconds it took."""
    import io

    from daemon.cli import build_parser
    from daemon.cli import main as cli_main

    build_parser()  # imports the command modules, which it loads lazily
    captured = io.StringIO()
    with contextlib.redirect_stdout(captured):
        started = time.perf_counter()
        code = cli_main(argv)
        seconds = time.perf_counter() - started
    if code != 0 or not captured.getvalue().strip():
        raise SystemExit(f"sendledger {' '.join(argv)}: exit {code}, no output")
    print(json.dumps({"seconds": seconds}))


def measure_start_up(store: Store, config: Path) -> Measured:
    """`sendledger run` from process start to READY=1 on $NOTIFY_SOCKET; then SIGTERM."""
    with tempfile.TemporaryDirectory(prefix="sendledger-notify-") as folder:
        address = str(Path(folder) / "notify")
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.bind(address)
            sock.settimeout(120)
            env = {**os.environ, "NOTIFY_SOCKET": address}
            started = time.perf_counter()
            with launched(sendledger(config, "run"), env=env) as (process, peak):
                try:
                    while b"READY=1" not in sock.recv(4096):
                        pass
                    seconds = time.perf_counter() - started
                finally:
                    process.terminate()
    reset_due(store)
    return Measured(seconds, peak[0])


# -- the comparison -----------------------------------------------------------------------


def median(runs: list[Measured]) -> Measured:
    works = [r.work for r in runs if r.work is not None]
    return Measured(
        statistics.median(r.seconds for r in runs),
        statistics.median(r.rss_mb for r in runs),
        statistics.median(works) if works else None,
    )


def recent(store: Store) -> str:
    """An hour before the store's last settled job (the same jobs in either store)."""
    with Ledger(store.url) as ledger:
        row = ledger.row(f"old-{store.settled - 1:08d}")
    assert row is not None
    return datetime.fromtimestamp(row.updated_at - 3600, UTC).isoformat()


def compare(backend: str, small: Store, big: Store, rounds: int, env: Setup) -> bool:
    measurements: list[tuple[str, Any]] = [
        ("tick (100 due)", lambda s, c: measure_tick(s)),
        ("start-up to READY", lambda s, c: measure_start_up(s, c)),
        (
            "status KEY",
            lambda s, c: measure_command(c, "status", f"old-{s.settled - 1:08d}", "--json"),
        ),
        (
            "history KEY",
            lambda s, c: measure_command(c, "history", f"old-{s.settled - 1:08d}", "--json"),
        ),
        (
            "audit --state review",
            lambda s, c: measure_command(c, "audit", "--state", "review", "--format", "json"),
        ),
        (
            "audit confirmed --since 1h",
            lambda s, c: measure_command(
                c, "audit", "--state", "confirmed", "--since", recent(s), "--format", "json"
            ),
        ),
    ]
    print(f"\n{backend}: {small.settled:,} vs {big.settled:,} settled, {DUE} due, {REVIEW} review")
    print(
        f"  {'measurement':<28} {'small':>10} {'big':>10} {'ratio':>6}   "
        f"{'own work':>9} {'':>9} {'ratio':>6}   {'RSS small':>9} {'RSS big':>8} {'ratio':>6}"
    )
    ok = True
    for label, measure in measurements:
        runs: dict[str, list[Measured]] = {"small": [], "big": []}
        for _ in range(rounds):
            # Alternate, so that drift on a shared machine hits both alike.
            for store in (small, big):
                runs[store.name].append(measure(store, env.config(store)))
        s, b = median(runs["small"]), median(runs["big"])
        ratio, rss_ratio = b.seconds / s.seconds, b.rss_mb / s.rss_mb
        met = ratio <= TICK_GOAL and rss_ratio <= RSS_GOAL
        work = "" if s.work is None else f"{_ms(s.work):>9} {_ms(b.work or 0):>9} "
        if s.work is not None and b.work is not None:
            work += f"{b.work / s.work:>6.2f}"
            met &= b.work / s.work <= TICK_GOAL
        ok &= met
        print(
            f"  {label:<28} {_ms(s.seconds):>10} {_ms(b.seconds):>10} {ratio:>6.2f}   "
            f"{work:<26}   {s.rss_mb:>7.0f}MB {b.rss_mb:>6.0f}MB {rss_ratio:>6.2f}  "
            + ("" if met else "GOAL MISSED")
        )
    return ok


def write_cost(backend: str, url_for: Any, jobs: int, rounds: int) -> None:
    """What the (state, updated_at) index costs a save: a job's claim and confirmation
    saved one by one (as the engine saves them), with the index and without, alternating."""
    from ledger.stores.index import ADDED_INDEXES

    timings: dict[bool, list[float]] = {True: [], False: []}
    for round_ in range(rounds):
        for indexed in (True, False):
            with url_for() as url, Ledger(url) as ledger:
                if not indexed:
                    # On a connection of its own: opening a ledger would create it again.
                    drop = [f"DROP INDEX {_qualified(ledger, name)}" for name, _ in ADDED_INDEXES]
                    _run_ddl(backend, url, drop)
                now = datetime.now(UTC)
                requested = [request(f"w{round_}-{i:06d}", now) for i in range(jobs)]
                write_jobs(ledger, requested)
                loaded = [ledger.get_job(job.key) for job in requested]
                started = time.perf_counter()
                for job in loaded:
                    job.claim(provider="gmail", deadline=now + timedelta(seconds=45), at=now)
                    ledger.save_job(job)
                    job.record_response(
                        provider_message_id="x", decision=Confirm(POLICY_REF), at=now
                    )
                    ledger.save_job(job)
                timings[indexed].append((time.perf_counter() - started) / (2 * jobs))
    with_index, without = (statistics.median(timings[k]) * 1e6 for k in (True, False))
    print(
        f"  save with the (state, updated_at) index {with_index:,.0f} us, without "
        f"{without:,.0f} us ({with_index / without:.2f}x; {jobs:,} jobs, 2 saves each)"
    )


def _qualified(ledger: Ledger, name: str) -> str:
    """`name` in the index table's schema (PostgreSQL's table name is `"schema".table`)."""
    table: str = ledger.recorder._table  # type: ignore[attr-defined]
    return f"{table.rsplit('.', 1)[0]}.{name}" if "." in table else name


def _run_ddl(backend: str, url: str, statements: list[str]) -> None:
    if backend == "sqlite":
        import sqlite3

        with contextlib.closing(sqlite3.connect(url.removeprefix("sqlite:///"))) as conn:
            for statement in statements:
                conn.execute(statement)
            conn.commit()
        return
    import psycopg

    with psycopg.connect(url.split("?")[0], autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:,.0f} ms"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1_000_000, help="settled jobs of the big store")
    parser.add_argument(
        "--rounds", type=int, default=5, help="runs per measurement and store (median)"
    )
    parser.add_argument("--no-postgres", action="store_true")
    parser.add_argument("--no-sqlite", action="store_true")
    parser.add_argument(
        "--cache", help="folder for the built stores (default ~/.cache/sendledger-bench)"
    )
    parser.add_argument("--rebuild", action="store_true", help="build the stores again")
    parser.add_argument(
        "--write-jobs", type=int, default=2000, help="jobs of the index write-cost run"
    )
    parser.add_argument(
        "--only-write-cost", action="store_true", help="measure only what the index costs a save"
    )
    parser.add_argument("--child-tick", metavar="URL", help=argparse.SUPPRESS)
    parser.add_argument("--child-cli", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_tick:
        child_tick(args.child_tick)
        return 0
    if args.child_cli:
        child_cli(args.child_cli)
        return 0
    backends = [] if args.no_sqlite else ["sqlite"]
    if not args.no_postgres:
        reason = pg_reachable()
        if reason is None:
            backends.append("postgresql")
        else:
            print(f"postgresql: skipped, not reachable at {PG_URL.split('@')[-1]}: {reason}")
    if args.only_write_cost:
        for backend in backends:
            print(f"{backend}:")
            scratch = scratch_sqlite if backend == "sqlite" else scratch_pg
            write_cost(backend, scratch, args.write_jobs, args.rounds)
        return 0
    folder = cache_dir(args.cache)
    ok = True
    with setup() as env:
        for backend in backends:
            stores = []
            for name, settled in (("small", SMALL), ("big", args.jobs)):
                if backend == "sqlite":
                    store, seconds = sqlite_store(folder, name, settled, fresh=args.rebuild)
                else:
                    store, seconds = pg_store(name, settled, fresh=args.rebuild)
                built = (
                    "cached"
                    if seconds is None
                    else f"built in {seconds:.1f} s ({settled / seconds:,.0f} jobs/s)"
                )
                print(f"{backend} {name}: {settled:,} settled jobs, {built}", flush=True)
                # Opened once before any measurement: a store from an earlier release
                # gains what it lacks (`ADDED_INDEXES`) here, not in a measured process.
                Ledger(store.url).close()
                stores.append(store)
            ok &= compare(backend, stores[0], stores[1], args.rounds, env)
            write_cost(
                backend,
                scratch_sqlite if backend == "sqlite" else scratch_pg,
                args.write_jobs,
                args.rounds,
            )
    print("\nall goals met" if ok else "\nsome goals missed (see above)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
