"""Several daemons on one PostgreSQL database: throughput for 1, 2 and 3 daemon processes on
--jobs jobs with faults (the fault relay's modes, as bench/soak.py draws them), with
POSTGRES_ENABLE_DB_FUNCTIONS off (eventsourcing's default insert: LOCK TABLE, INSERT) and
on (sendledger's default: the library's insert function, no table lock).

Per run: a fresh schema, the jobs submitted, then N `sendledger run` processes (each its
own daemon.name) started at once; jobs/s is the job count over the time from their start
until every job has settled, and over the first 90% (the tail is faulted jobs waiting out
search windows and backoffs). Modes alternate within each round; medians over --rounds.
Checked in every run, counting effects outside the daemons: every confirmed job has
exactly one copy at the emulator and no Message-ID is accepted twice; Attempted events
equal the send calls the relay saw plus the calls recorded as Rejected "not sent" (they
never reached it): no claim without a call. Ratios are against the first configuration of
the same invocation (the machine is shared and noisy). Exit code 1 only when a check
fails; throughput is a measurement, never a pass/fail.

    SENDLEDGER_TEST_PG_URL=postgresql://... .venv/bin/python bench/daemons.py [--jobs 1000]
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/soak.py's fault mix

import psycopg
from soak import FAULTS, PG_URL, POLICIES, SENDLEDGER, SETTLED, write_setup

from ledger.application import Ledger
from ledger.content import parse_job
from policies.loader import load_policy_dir
from testkit.gmail_emulator import GmailEmulator
from testkit.relay import FaultPlan, FaultRelay

DB_FUNCTIONS = "POSTGRES_ENABLE_DB_FUNCTIONS"


@dataclass
class Run:
    daemons: int
    functions: bool
    jobs_per_s: float
    # The first 90% settled: the rate without the tail of faulted jobs, which wait out
    # search windows and backoffs whatever the throughput.
    ninety_per_s: float
    states: dict[str, int]
    attempted: int
    not_sent: dict[str, int]
    calls: int
    problems: list[str]


def one_run(daemons: int, functions: bool, jobs: int, seed: int, limit: float) -> Run:
    folder = Path(tempfile.mkdtemp(prefix="sendledger-daemons-"))
    schema = f"daemons_{uuid.uuid4().hex[:10]}"
    os.environ[DB_FUNCTIONS] = "y" if functions else "n"  # this process's Ledger and the daemons
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    store = f"{PG_URL}?schema={schema}"
    emulator = GmailEmulator(lag=0.3).start()
    relay = FaultRelay(
        emulator.url, plan=FaultPlan.random(seed, FAULTS), hang_seconds=1.5, retry_after=0.3
    ).start()
    config = write_setup(folder, store, {"receipts": POLICIES["receipts"]}, emulator, relay)
    procs: list[subprocess.Popen[bytes]] = []
    problems: list[str] = []
    try:
        ledger = Ledger(store)
        policy = load_policy_dir(folder / "policies").get("receipts")
        assert policy is not None

        def submit(n: int) -> None:
            job = {"channel": "receipts", "key": f"d-{n:05d}", "to": f"c{n}@example.com"}
            ledger.submit(parse_job({**job, "subject": f"Job {n}", "body": "b\n"}), policy.sender)

        with ThreadPoolExecutor(4) as pool:
            list(pool.map(submit, range(jobs)))
        env = {k: v for k, v in os.environ.items() if not k.startswith("SENDLEDGER_")}
        started = time.monotonic()
        for i in range(daemons):
            log = (folder / f"daemon-{i}.log").open("wb")
            procs.append(
                subprocess.Popen(
                    [SENDLEDGER, "--config", str(config), "run"],
                    cwd=folder,
                    env={**env, "SENDLEDGER_DAEMON__NAME": f"bench-{i}"},
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                )
            )
        ninety: float | None = None
        while (settled := sum(ledger.counts(SETTLED).values())) < jobs:
            if ninety is None and settled >= 0.9 * jobs:
                ninety = time.monotonic() - started
            if time.monotonic() - started > limit:
                problems.append(f"not settled after {limit:.0f}s: {ledger.counts()}")
                break
            dead = [p.args for p in procs if p.poll() is not None]
            if dead:
                problems.append(f"a daemon exited early; logs in {folder}")
                break
            time.sleep(0.2)
        elapsed = time.monotonic() - started
        ninety = ninety or elapsed
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=60)

        rows = {row.job_id: row for row in ledger.jobs()}
        copies = collections.Counter(entry["message_id"] for entry in emulator.accepted())
        twice = [m for m, n in copies.items() if n > 1]
        if twice:
            problems.append(f"{len(twice)} Message-IDs accepted more than once")
        for row in rows.values():
            if row.state == "confirmed" and copies.get(row.message_id, 0) != 1:
                problems.append(f"{row.key}: confirmed with {copies.get(row.message_id, 0)}")
        events = [e for e in ledger.job_events() if type(e).__name__ in ("Attempted", "Rejected")]
        attempted = sum(1 for e in events if type(e).__name__ == "Attempted")
        # A call that never reached the relay (connect refused, token refresh failed) is
        # recorded as Rejected "not sent": a claim with a call, not a claim without one.
        not_sent = collections.Counter(
            str(e.reason)[:50]
            for e in events
            if type(e).__name__ == "Rejected" and "not sent" in str(e.reason)
        )
        calls = sum(1 for entry in relay.log if entry["kind"] == "send")
        if attempted - not_sent.total() != calls:
            problems.append(
                f"{attempted} Attempted events, {not_sent.total()} not sent, but {calls} "
                "send calls at the relay"
            )
        states = dict(collections.Counter(row.state for row in rows.values()))
        ledger.close()
        return Run(
            daemons,
            functions,
            jobs / elapsed,
            0.9 * jobs / ninety,
            states,
            attempted,
            dict(not_sent),
            calls,
            problems,
        )
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        relay.stop()
        emulator.stop()
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        if not problems:
            shutil.rmtree(folder, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--limit", type=float, default=600.0, help="give up a run after (s)")
    parser.add_argument("--seed", type=int, default=20261130)
    parser.add_argument("--daemons", default="1,2,3", help="daemon counts to run, e.g. 1,3")
    parser.add_argument("--functions", default="off,on", help="db functions modes: off,on")
    parser.add_argument("--rounds", type=int, default=2, help="medians over this many rounds")
    args = parser.parse_args()
    counts = [int(n) for n in args.daemons.split(",")]
    modes = [mode == "on" for mode in args.functions.split(",")]
    runs: dict[tuple[int, bool], list[Run]] = collections.defaultdict(list)
    # Modes alternate inside each round, so that both see the same machine noise.
    for _ in range(args.rounds):
        for daemons in counts:
            for functions in modes:
                run = one_run(daemons, functions, args.jobs, args.seed, args.limit)
                runs[daemons, functions].append(run)
                print(
                    f"  {daemons} daemon(s), db functions {'on ' if functions else 'off'}: "
                    f"{run.jobs_per_s:6.1f} jobs/s (first 90%: {run.ninety_per_s:6.1f}/s)  "
                    f"states {run.states}  "
                    f"Attempted {run.attempted} / relay send calls {run.calls} / not sent "
                    f"{run.not_sent}",
                    flush=True,
                )

    def medians(key: tuple[int, bool]) -> tuple[float, float]:
        return (
            statistics.median(r.jobs_per_s for r in runs[key]),
            statistics.median(r.ninety_per_s for r in runs[key]),
        )

    base, base90 = medians((counts[0], modes[0]))
    print(
        f"daemons on PostgreSQL, {args.jobs} jobs with faults, median of {args.rounds} rounds; "
        f"jobs/s all settled / first 90%, and their ratios to {counts[0]} daemon(s), db "
        f"functions {'on' if modes[0] else 'off'}:"
    )
    for daemons, functions in runs:
        rate, rate90 = medians((daemons, functions))
        mode = "db functions on " if functions else "db functions off"
        print(
            f"  {mode} {daemons} daemon(s): {rate:6.1f} / {rate90:6.1f} jobs/s   "
            f"ratio {rate / base:5.2f} / {rate90 / base90:5.2f}"
        )
    problems = [p for group in runs.values() for run in group for p in run.problems]
    for problem in problems[:20]:
        print("PROBLEM:", problem)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
