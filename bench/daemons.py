"""Several daemons on one PostgreSQL database: throughput for 1, 2 and 3 daemon processes on
--jobs jobs with faults (the fault relay's modes, as bench/soak.py draws them), with
POSTGRES_ENABLE_DB_FUNCTIONS off (eventsourcing's default insert: LOCK TABLE, INSERT) and
on (sendledger's default: the library's insert function, no table lock).

Per run: a fresh schema, the jobs submitted from --senders mailboxes (Gmail with `user =
"{from}"`, the quota lifted: the daemons share the mailboxes, each sending for its own,
docs/performance.md "Several daemons"), then N `sendledger run` processes (each its own
daemon.name) started at once; jobs/s is the job count over the time from their start
until every job has settled, and over the first 90% (the tail is faulted jobs waiting out
search windows and backoffs). Modes alternate within each round; medians over --rounds.
Checked in every run, counting effects outside the daemons: every confirmed job has
exactly one copy at the emulator and no Message-ID is accepted twice; Attempted events
equal the send calls the relay saw plus the calls recorded as Rejected "not sent" (they
never reached it): no claim without a call. Ratios are against the first configuration of
the same invocation (the machine is shared and noisy). Exit code 1 only when a check
fails; throughput is a measurement, never a pass/fail.

    SENDLEDGER_TEST_PG_URL=postgresql://... .venv/bin/python bench/daemons.py [--jobs 1000]

With --quota, the quota scopes shared by daemons (docs/performance.md "Several daemons"):
--mailboxes mailboxes (Gmail with `user = "{from}"`, each job from one of them) at Gmail's
real per-user quota (250 units/s, a send 100), which the emulator enforces per mailbox
(429 over it), about --seconds of jobs; 1, 2 and 3 daemons on PostgreSQL, then with
--kill one of three daemons killed -9 a third of the way through. Counted at the emulator:
each mailbox's units in every whole second of its clock (the goal: never above the quota
plus the one saved-up send its bucket holds, 350), the requests it refused (429, goal 0),
the aggregate sends/s between the first and the last acceptance (goal: >= 0.9 of the sum
of the quotas), every job one copy; with --kill, for each mailbox the killed daemon owned,
the time from the kill to its next send (goal: within one scope lease plus two ticks).
Exit code 1 when a goal is missed or a check fails.

    .venv/bin/python bench/daemons.py --quota [--mailboxes 50] [--seconds 30] [--kill]
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
from soak import (
    FAULTS,
    PG_URL,
    POLICIES,
    SENDLEDGER,
    SETTLED,
    write_config,
    write_policies,
    write_setup,
)

from ledger.application import Ledger
from ledger.content import parse_job
from policies.loader import load_policy_dir
from testkit.credentials import write_service_account
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


def one_run(
    daemons: int, functions: bool, jobs: int, seed: int, limit: float, senders: int = 12
) -> Run:
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
    policies = {"receipts": {**POLICIES["receipts"], "allowed_from": ["m*@shop.example"]}}
    config = write_setup(folder, store, policies, emulator, relay, user="{from}")
    procs: list[subprocess.Popen[bytes]] = []
    problems: list[str] = []
    try:
        ledger = Ledger(store)
        policy = load_policy_dir(folder / "policies").get("receipts")
        assert policy is not None

        def submit(n: int) -> None:
            job = {"channel": "receipts", "key": f"d-{n:05d}", "to": f"c{n}@example.com"}
            job["from"] = f"Shop <m{n % senders:02d}@shop.example>"
            content = parse_job({**job, "subject": f"Job {n}", "body": "b\n"})
            ledger.submit(content, policy.sender_for(content.sender))

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
        relay.stop()
        clean_up(procs, emulator, schema, folder, problems)


def clean_up(
    procs: list[subprocess.Popen[bytes]],
    emulator: GmailEmulator,
    schema: str,
    folder: Path,
    problems: list[str],
) -> None:
    """After a run: no daemon left, the emulator stopped, the schema dropped, and the
    folder (the daemons' logs) kept only when something went wrong."""
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    emulator.stop()
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    if not problems:
        shutil.rmtree(folder, ignore_errors=True)


# -- --quota: the quota scopes shared by daemons ---------------------------------------

USER_QUOTA = 250.0  # Gmail's units per user per second
SEND_UNITS = 100.0
#: Within any whole second a mailbox may spend its quota plus the one send its bucket
#: saved up (docs/performance.md "Several daemons").
SECOND_LIMIT = USER_QUOTA + SEND_UNITS
RATE_GOAL = 0.9
QUOTA_POLICY = {
    "provider": "gmail",
    "from": "Shop <m00@shop.example>",
    "allowed_from": ["m*@shop.example"],
    "message_id_domain": "mail.shop.example",
    "on_unknown": "retry",
    "search_after": "1s",
    "search_interval": "500ms",
    "confirm_misses": 2,
    "max_attempts": 6,
    "retry_backoff": "200ms",
    "retry_backoff_max": "2s",
}


@dataclass
class QuotaRun:
    daemons: int
    jobs: int
    rate: float  # sends/s between the first and the last acceptance
    quota_rate: float  # the sum of the mailboxes' quotas, sends/s
    peak_second: float  # the most units any mailbox spent in one whole second
    peak_mean: float  # the highest 5 s mean of any mailbox
    refusals: int  # requests answered 429
    resumed: list[float]  # --kill: per mailbox of the killed daemon, kill to next send (s)
    resume_limit: float
    problems: list[str]


def _epoch(iso: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(iso).timestamp()


def quota_run(
    daemons: int, args: argparse.Namespace, *, kill: bool = False, lifted: bool = False
) -> QuotaRun:
    """`daemons` daemons over args.mailboxes mailboxes at Gmail's quota (see the module);
    `lifted`: no quota anywhere, as many jobs as the quota would send in args.seconds (the
    daemons' own ceiling on this machine now)."""
    folder = Path(tempfile.mkdtemp(prefix="sendledger-quota-"))
    schema = f"quota_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    store = f"{PG_URL}?schema={schema}"
    quota = 1_000_000.0 if lifted else USER_QUOTA
    emulator = GmailEmulator(lag=0.3, user_quota=None if lifted else USER_QUOTA).start()
    write_service_account(folder / "service-account.json", token_uri=emulator.token_uri)
    write_policies(folder, {"receipts": QUOTA_POLICY})
    config = write_config(
        folder,
        store,
        '[providers.gmail]\nkind = "gmail"\ncredentials_file = "service-account.json"\n'
        f'user = "{{from}}"\napi_endpoint = "{emulator.url}"\n'
        f'token_uri = "{emulator.token_uri}"\ntimeout = "5s"\n'
        f"quota_units_per_second = {quota:g}\n",
        grace=args.grace,
    )
    lease = f'scope_lease = "{args.lease}"\n' if args.binary == SENDLEDGER else ""
    text = (
        config.read_text()
        .replace("[daemon]\n", f"[daemon]\n{lease}")
        .replace('tick = "200ms"', f'tick = "{args.tick}"')
    )
    config.write_text(text)
    quota_rate = args.mailboxes * USER_QUOTA / SEND_UNITS
    jobs = int(quota_rate * args.seconds)
    resume_limit = parse_seconds(args.lease) + 2 * parse_seconds(args.tick)
    procs: list[subprocess.Popen[bytes]] = []
    problems: list[str] = []
    resumed: list[float] = []
    try:
        ledger = Ledger(store)
        policy = load_policy_dir(folder / "policies").get("receipts")
        assert policy is not None

        def submit(n: int) -> None:
            mailbox = f"m{n % args.mailboxes:02d}@shop.example"
            content = parse_job(
                {
                    "channel": "receipts",
                    "key": f"q-{n:06d}",
                    "from": f"Shop <{mailbox}>",
                    "to": f"c{n}@example.com",
                    "subject": f"Job {n}",
                    "body": "b\n",
                }
            )
            ledger.submit(content, policy.sender_for(content.sender))

        with ThreadPoolExecutor(4) as pool:
            list(pool.map(submit, range(jobs)))
        env = {k: v for k, v in os.environ.items() if not k.startswith("SENDLEDGER_")}
        for i in range(daemons):
            log = (folder / f"daemon-{i}.log").open("wb")
            procs.append(
                subprocess.Popen(
                    [args.binary, "--config", str(config), "run"],
                    cwd=folder,
                    env={**env, "SENDLEDGER_DAEMON__NAME": f"quota-{i}"},
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                )
            )
        started = time.monotonic()
        killed: tuple[float, list[str]] | None = None
        victim = -1
        while (settled := sum(ledger.counts(SETTLED).values())) < jobs:
            if kill and killed is None and settled >= jobs / 3:
                owners = collections.defaultdict(list)
                for row in ledger.scope_leases().leases():
                    owners[row.owner].append(row.scope.partition("/")[2])
                victim = max(range(daemons), key=lambda i: len(owners[f"quota-{i}"]))
                procs[victim].kill()
                killed = (time.time(), owners[f"quota-{victim}"])
            if time.monotonic() - started > args.seconds * 4 + 60:
                problems.append(f"not settled in time: {ledger.counts()}")
                break
            if any(p.poll() is not None for i, p in enumerate(procs) if i != victim):
                problems.append(f"a daemon exited early; logs in {folder}")
                break
            time.sleep(0.2)
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in procs:
            proc.wait(timeout=60)

        accepted = emulator.accepted()
        copies = collections.Counter(entry["message_id"] for entry in accepted)
        twice = [m for m, n in copies.items() if n > 1]
        if twice:
            problems.append(f"{len(twice)} Message-IDs accepted more than once")
        for job in ledger.jobs():
            if job.state != "confirmed" or copies.get(job.message_id, 0) != 1:
                problems.append(f"{job.key}: {job.state} with {copies.get(job.message_id, 0)}")
        times = sorted(_epoch(entry["at"]) for entry in accepted)
        rate = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else 0.0
        usage = emulator.usage()
        if killed is not None:
            at, mailboxes = killed
            for mailbox in mailboxes:
                sent = [_epoch(e["at"]) for e in accepted if e["user"] == mailbox]
                after = [moment for moment in sent if moment > at]
                resumed.append(min(after) - at if after else float("inf"))
        ledger.close()
        return QuotaRun(
            daemons,
            jobs,
            rate,
            quota_rate,
            max((u.max_units_per_second for u in usage.values()), default=0.0),
            max((u.max_mean_units_per_second for u in usage.values()), default=0.0),
            emulator.quota_refusals,
            resumed,
            resume_limit,
            problems,
        )
    finally:
        clean_up(procs, emulator, schema, folder, problems)


def parse_seconds(text: str) -> float:
    from policies.durations import parse_duration

    return parse_duration(text)


def quota_main(args: argparse.Namespace) -> int:
    print(
        f"quota scopes shared by daemons: {args.mailboxes} mailboxes at {USER_QUOTA:g} units/s "
        f"each (a send {SEND_UNITS:g}; the emulator answers 429 over it), about {args.seconds:g}"
        f" s of jobs, PostgreSQL, scope_lease {args.lease}, deadline_grace {args.grace}, tick "
        f"{args.tick}; {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    failed = False
    runs = [(int(n), False) for n in args.daemons.split(",")]
    if args.kill:
        runs.append((max(n for n, _ in runs), True))
    ceiling = quota_run(1, args, lifted=True).rate
    print(
        f"  ceiling: one daemon, the quota lifted: {ceiling:5.1f} sends/s (the machine now; "
        f"the goal is {RATE_GOAL} x {args.mailboxes * USER_QUOTA / SEND_UNITS:g})",
        flush=True,
    )
    for daemons, kill in runs:
        run = quota_run(daemons, args, kill=kill)
        ratio = run.rate / run.quota_rate
        bound = min(run.quota_rate, ceiling)
        goals = [
            run.peak_second <= SECOND_LIMIT,
            run.refusals == 0,
            kill or ratio >= RATE_GOAL,
            all(gap <= run.resume_limit for gap in run.resumed),
            not run.problems,
        ]
        failed |= not all(goals)
        line = (
            f"  {daemons} daemon(s){' (one killed -9)' if kill else ''}: {run.jobs} jobs, "
            f"{run.rate:5.1f} sends/s of {run.quota_rate:g} ({ratio:4.2f}, goal {RATE_GOAL}; "
            f"{run.rate / bound:4.2f} of min(quotas, ceiling)); "
            f"busiest mailbox {run.peak_second:g} units in one second (limit "
            f"{SECOND_LIMIT:g}), {run.peak_mean:.0f}/s over 5 s; 429s {run.refusals}"
        )
        if kill:
            line += (
                f"; the killed daemon's {len(run.resumed)} mailboxes resumed after "
                f"{min(run.resumed, default=0):.2f}-{max(run.resumed, default=0):.2f} s "
                f"(limit {run.resume_limit:g} s)"
            )
        print(line + ("" if all(goals) else "  MISSED"), flush=True)
        for problem in run.problems[:10]:
            print("  PROBLEM:", problem)
    return 1 if failed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quota", action="store_true", help="the quota scopes benchmark")
    parser.add_argument("--mailboxes", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=30.0, help="--quota: jobs for this long")
    parser.add_argument("--kill", action="store_true", help="--quota: and a kill -9 run")
    parser.add_argument("--lease", default="3s", help="--quota: daemon.scope_lease")
    parser.add_argument("--grace", default="1s", help="--quota: daemon.deadline_grace")
    parser.add_argument("--tick", default="200ms", help="--quota: daemon.tick")
    parser.add_argument(
        "--binary",
        default=SENDLEDGER,
        help="--quota: the sendledger to run (another build, e.g. main's, without scope_lease)",
    )
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--senders", type=int, default=12, help="the From mailboxes of the jobs")
    parser.add_argument("--limit", type=float, default=600.0, help="give up a run after (s)")
    parser.add_argument("--seed", type=int, default=20261130)
    parser.add_argument("--daemons", default="1,2,3", help="daemon counts to run, e.g. 1,3")
    parser.add_argument("--functions", default="off,on", help="db functions modes: off,on")
    parser.add_argument("--rounds", type=int, default=2, help="medians over this many rounds")
    args = parser.parse_args()
    if args.quota:
        return quota_main(args)
    counts = [int(n) for n in args.daemons.split(",")]
    modes = [mode == "on" for mode in args.functions.split(",")]
    runs: dict[tuple[int, bool], list[Run]] = collections.defaultdict(list)
    # Modes alternate inside each round, so that both see the same machine noise.
    for _ in range(args.rounds):
        for daemons in counts:
            for functions in modes:
                run = one_run(daemons, functions, args.jobs, args.seed, args.limit, args.senders)
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
