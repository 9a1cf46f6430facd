"""Many mailboxes from one process: Gmail with `user = "{from}"` at Gmail's per-user quota.

One run, SQLite store, emulator with zero latency in its own process:

  ceiling    the daemon's own rate with one mailbox and the quota lifted, as in
             bench/pipeline.py (a) (N jobs, engine ticking back to back);
  mailboxes  200 mailboxes (`from` = m000..m199@example.com, allowed by the policy's
             `allowed_from`), each at Gmail's real per-user quota: 250 units/s, a send costs
             100, enforced per user by the emulator (429 when over); enough jobs for about
             20 s: total sends/s against 0.9 x min(200 x 2.5/s, ceiling);
  batch      with --per-mailbox K: K jobs in every mailbox, all due at once (issue 17's
             cases: 20 x 8 and 200 x 50), the whole batch's rate against the same bound.

The emulator reports what each mailbox spent: the most units in any one second of its clock
and how many requests it refused (429). Every job must end with exactly one copy, in its
own mailbox.

Then what the mailboxes cost (issue 30: "cost flat in the number of mailboxes"), at 10,
1,000 and --mailboxes mailboxes (those not above it), each a `sendledger run` process of its
own (the daemon as deployed, its HTTP API on: the emulator in a third process):

  cost       one job per mailbox submitted while the daemon runs, then idle: the daemon's
             CPU per job (from the first submission to the last confirmation), its idle
             CPU (ms per second over --idle-seconds, after the jobs), its RSS per mailbox
             (after the idle window, less before the jobs), the CPU of one /metrics scrape
             and one /healthz, and the tokens the emulator granted per subject; CPU per job
             and idle CPU at the largest count against 1.3x those at 10.

    .venv/bin/python bench/mailboxes.py [--mailboxes 200] [--seconds 20] [--n-ceiling 2000]
                                        [--per-mailbox K] [--only quota,cost]
                                        [--idle-seconds 20]

Exit code 0 unless a job did not end with one copy in its own mailbox, or a subject was
granted more than one token.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import pipeline
from intake import sqlite_store
from pipeline import daemon_run, emulator_process

from daemon.bootstrap import bootstrap
from daemon.config.settings import settings_from_dict
from ledger.application import Ledger
from ledger.content import JobContent, parse_job
from ledger.vocabulary import Sender
from policies.loader import PolicySet
from policies.model import ChannelPolicy
from testkit import write_service_account

GOAL = 0.9
#: CPU per job and idle CPU at the most mailboxes, at most this times those at 10.
COST_GOAL = 1.3
COST_BASE = 10  # the mailboxes the largest count is compared with
COST_MIDDLE = 1000
USER_QUOTA = 250.0  # Gmail's units per user per second
SEND_UNITS = 100.0
IDLE_LIMIT = 10.0  # seconds without progress before the run gives up
# bench/pipeline.py's policy, letting each job name its own mailbox.
POLICY = ChannelPolicy.model_validate(
    {
        **pipeline.POLICY.model_dump(by_alias=True),
        "allowed_from": ["m*@example.com"],
        # A 429 (none expected) is retried within the run rather than after 30 s.
        "retry_backoff": "1s",
    }
)


def mailbox_job(key: str, i: int, mailbox: str) -> tuple[JobContent, Sender]:
    """Job `i` of the bench, from `mailbox`, and the policy's sender for it."""
    content = parse_job(
        {
            "channel": "receipts",
            "key": key,
            "to": "Alice <alice@example.com>",
            "subject": f"Your receipt {i}",
            "body": f"Thanks for order {i}.\n",
            "from": f"Shop <{mailbox}>",
        }
    )
    return content, POLICY.sender_for(content.sender)


def mailbox_run(
    creds: Path, store_url: str, mailboxes: int, n: int, concurrency: int
) -> dict[str, Any]:
    with emulator_process(user_quota=USER_QUOTA) as emulator:
        url = emulator.url
        settings = settings_from_dict(
            {
                "store": {"url": store_url},
                "daemon": {"concurrency": concurrency, "batch_size": 200},
                "providers": {
                    "gmail": {
                        "credentials_file": str(creds),
                        "user": "{from}",
                        "api_endpoint": url,
                        "token_uri": url + "/token",
                    }
                },
            }
        )
        policies = PolicySet({"receipts": POLICY})
        ledger = Ledger(store_url)
        expected: dict[str, str] = {}
        for i in range(n):
            mailbox = f"m{i % mailboxes:03d}@example.com"
            result = ledger.submit(*mailbox_job(f"mb-{i:07d}", i, mailbox))
            expected[result.message_id] = mailbox
        service = bootstrap(
            settings,
            ledger=ledger,
            policy_loader=lambda: policies,
            policies=policies,
        )
        confirmed = ticks = rejected = skipped = 0
        try:
            wall, cpu = time.perf_counter(), time.process_time()
            progress = wall
            while confirmed < n and time.perf_counter() - progress < IDLE_LIMIT:
                report = service.engine.tick()
                ticks += 1
                confirmed += report.confirmed
                rejected += report.rejected
                skipped += report.skipped
                if report.busy():
                    progress = time.perf_counter()
                else:
                    time.sleep(0.01)  # only a backoff is left: wait for it, not spin
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        finally:
            service.close()
            ledger.close()
        places, usage, refusals = emulator.call("mailboxes", list(expected))
    right = all(places.get(mid) == [mailbox] for mid, mailbox in expected.items())
    return {
        "rate": confirmed / wall,
        "confirmed": confirmed,
        "ok": confirmed == n and right,
        "max_units": max((peak for peak, _ in usage.values()), default=0.0),
        "max_mean": max((mean for _, mean in usage.values()), default=0.0),
        "refusals": refusals,
        "rejected": rejected,
        "ticks": ticks,
        "skipped": skipped,
        "cpu_ms": cpu * 1000 / max(confirmed, 1),
    }


def one_round(args: argparse.Namespace, creds: Path) -> tuple[float, bool]:
    """The ceiling, then the mailboxes at min(quota, ceiling) for about args.seconds:
    (ratio, every job one copy in its own mailbox)."""
    with emulator_process(0.0) as emulator, sqlite_store() as url:
        ceiling_run = daemon_run(
            emulator, creds, url, args.n_ceiling, concurrency=args.concurrency, batch_size=200
        )
    ceiling = ceiling_run.rate
    quota_rate = args.mailboxes * USER_QUOTA / SEND_UNITS
    target = min(quota_rate, ceiling)
    n = args.mailboxes * args.per_mailbox if args.per_mailbox else int(target * args.seconds)
    with sqlite_store() as url:
        run = mailbox_run(creds, url, args.mailboxes, n, args.concurrency)
    ratio = run["rate"] / target
    print(
        f"  ceiling (one mailbox, quota lifted) {ceiling:4.0f} jobs/s; {args.mailboxes} "
        f"mailboxes: {run['confirmed']} jobs, {run['rate']:4.0f} sends/s "
        f"({run['cpu_ms']:.2f} cpu-ms/job) of "
        f"min({quota_rate:.0f}, {ceiling:.0f}): ratio {ratio:4.2f}; busiest mailbox "
        f"{run['max_mean']:.0f} units/s over 5 s ({run['max_units']:.0f} in one second), "
        f"429s {run['refusals']}, one copy each in its own mailbox: {run['ok']}",
        flush=True,
    )
    return ratio, run["ok"] and ceiling_run.copies_ok


# -- what the mailboxes cost a running daemon ---------------------------------------------

POLICY_TOML = """channel = "receipts"
provider = "gmail"
from = "Shop <m0@example.com>"
allowed_from = ["m*@example.com"]
message_id_domain = "mail.example.com"
search_after = "1s"
"""


@dataclass
class Cost:
    mailboxes: int
    cpu_per_job_ms: float
    idle_ms_per_s: float
    rss_per_mailbox_kb: float
    scrape_ms: float  # the daemon's CPU for one /metrics scrape
    health_ms: float  # and for one /healthz
    tokens_max: int  # tokens granted to the subject that got the most
    subjects: int  # subjects granted a token
    ok: bool


def _cpu_seconds(pid: int) -> float:
    """The CPU time of the process's live threads, in seconds: the scheduler's own count in
    nanoseconds (/proc/PID/stat counts 10 ms ticks, coarser than one scrape). A thread
    that ends takes its count with it; none of the daemon's ends while it is measured
    (workers, ticks and the API's threads live on)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            continue  # ended meanwhile
    return total / 1e9


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def running_daemon(config: Path) -> Iterator[subprocess.Popen[bytes]]:
    """`sendledger run` until READY=1 on $NOTIFY_SOCKET; SIGTERM at the end. The socket is
    closed once READY came: a datagram socket nobody reads fills up, and the daemon's
    next status line would then block its main thread."""
    with tempfile.TemporaryDirectory(prefix="sendledger-notify-") as folder:
        address = str(Path(folder) / "notify")
        command = [str(Path(sys.executable).parent / "sendledger"), "--config", str(config)]
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.bind(address)
            sock.settimeout(120)
            process = subprocess.Popen(
                [*command, "run"],
                env={**os.environ, "NOTIFY_SOCKET": address, "PYTHONFAULTHANDLER": "1"},
                stdout=subprocess.DEVNULL,
                stderr=open(os.environ.get("COST_LOG", os.devnull), "ab"),  # noqa: SIM115
            )
            try:
                while b"READY=1" not in sock.recv(4096):
                    pass
            except BaseException:
                process.kill()
                raise
        try:
            yield process
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                # Its threads' stacks to the log (PYTHONFAULTHANDLER), then gone.
                process.send_signal(signal.SIGABRT)
                process.wait(timeout=60)
                print("  (the daemon did not exit within 60 s of SIGTERM)", flush=True)


def _scrape_cpu(pid: int, url: str, times: int) -> float:
    """The daemon's CPU per request of `url`, in ms (the median of `times`)."""
    spent = []
    for _ in range(times):
        before = _cpu_seconds(pid)
        with urllib.request.urlopen(url, timeout=30) as answer:
            answer.read()
        time.sleep(0.05)  # the answer's last bytes written: its CPU counted
        spent.append((_cpu_seconds(pid) - before) * 1000)
    return statistics.median(spent)


def cost_run(mailboxes: int, idle_seconds: float) -> Cost:
    """One daemon process, one job per mailbox, then idle (see the module docstring)."""
    with (
        emulator_process(user_quota=USER_QUOTA) as emulator,
        tempfile.TemporaryDirectory(prefix="sendledger-cost-") as name,
    ):
        folder = Path(name)
        (folder / "policies").mkdir()
        (folder / "policies" / "receipts.toml").write_text(POLICY_TOML)
        creds = write_service_account(folder / "sa.json", token_uri=emulator.url + "/token")
        store_url = f"sqlite:///{folder / 'cost.sqlite'}"
        port = _free_port()
        tokens = folder / "api-tokens"
        tokens.write_text("bench:bench-token-0123456789abcdef\n")
        tokens.chmod(0o600)
        config = folder / "sendledger.toml"
        config.write_text(
            f"""[store]
url = "{store_url}"

[daemon]
policies_dir = "{folder / "policies"}"
name = "bench-mailboxes"

[api]
listen = "127.0.0.1:{port}"
token_file = "{tokens}"

[providers.gmail]
kind = "gmail"
credentials_file = "{creds}"
user = "{{from}}"
api_endpoint = "{emulator.url}"
token_uri = "{emulator.url}/token"
"""
        )
        ledger = Ledger(store_url)
        base = f"http://127.0.0.1:{port}"
        try:
            with running_daemon(config) as daemon:
                pid = daemon.pid
                time.sleep(2.0)  # the first ticks after start-up
                rss_before = _rss_kb(pid)
                cpu_before = _cpu_seconds(pid)
                expected: dict[str, str] = {}
                batch: list[Any] = []
                for i in range(mailboxes):
                    batch.append(mailbox_job(f"cost-{i:07d}", i, f"m{i}@example.com"))
                    if len(batch) == 500 or i == mailboxes - 1:
                        for result in ledger.submit_many(batch):
                            expected[result.message_id] = mailbox_of(result.key)
                        batch = []
                progress, confirmed = time.monotonic(), 0
                while confirmed < mailboxes and time.monotonic() - progress < IDLE_LIMIT * 3:
                    now_confirmed = ledger.counts(["confirmed"])["confirmed"]
                    if now_confirmed > confirmed:
                        confirmed, progress = now_confirmed, time.monotonic()
                    time.sleep(0.05)
                cpu_jobs = _cpu_seconds(pid) - cpu_before
                time.sleep(3.0)  # the last outcomes' commits, the next ticks
                idle_from = _cpu_seconds(pid)
                time.sleep(idle_seconds)
                idle = (_cpu_seconds(pid) - idle_from) / idle_seconds
                rss_after = _rss_kb(pid)
                scrape = _scrape_cpu(pid, base + "/metrics", 10)
                health = _scrape_cpu(pid, base + "/healthz", 10)
        finally:
            ledger.close()
        places, _usage, refusals = emulator.call("mailboxes", list(expected))
        tokens = emulator.call("tokens")
    right = all(places.get(mid) == [mailbox] for mid, mailbox in expected.items())
    delegated = {sub: n for sub, n in tokens.items() if sub}
    return Cost(
        mailboxes,
        cpu_per_job_ms=cpu_jobs * 1000 / max(confirmed, 1),
        idle_ms_per_s=idle * 1000,
        rss_per_mailbox_kb=(rss_after - rss_before) / mailboxes,
        scrape_ms=scrape,
        health_ms=health,
        tokens_max=max(delegated.values(), default=0),
        subjects=len(delegated),
        ok=confirmed == mailboxes and right and refusals == 0,
    )


def mailbox_of(key: str) -> str:
    return f"m{int(key.rsplit('-', 1)[1])}@example.com"


def cost_ladder(args: argparse.Namespace) -> bool:
    sizes = sorted({n for n in (COST_BASE, COST_MIDDLE) if n < args.mailboxes} | {args.mailboxes})
    print(
        f"\nwhat mailboxes cost: one job each, then {args.idle_seconds:.0f} s idle; "
        f"`sendledger run` (tick 1 s, concurrency 4, API on) per count"
    )
    costs = []
    for size in sizes:
        cost = cost_run(size, args.idle_seconds)
        costs.append(cost)
        print(
            f"  {size:6d} mailboxes: {cost.cpu_per_job_ms:5.2f} CPU-ms per job, idle "
            f"{cost.idle_ms_per_s:5.2f} CPU-ms/s, RSS {cost.rss_per_mailbox_kb:6.2f} KB per "
            f"mailbox, /metrics {cost.scrape_ms:5.1f} CPU-ms, /healthz {cost.health_ms:4.1f} "
            f"CPU-ms; tokens: {cost.subjects} subjects, at most {cost.tokens_max} each; "
            f"one copy each in its own mailbox: {cost.ok}",
            flush=True,
        )
    base, top = costs[0], costs[-1]
    ok = all(c.ok and c.tokens_max <= 1 for c in costs)
    if top is not base:
        for what, ratio in (
            ("CPU per job", top.cpu_per_job_ms / base.cpu_per_job_ms),
            ("idle CPU", top.idle_ms_per_s / max(base.idle_ms_per_s, 1e-9)),
        ):
            verdict = "MEETS" if ratio <= COST_GOAL else "MISSES"
            print(
                f"  {what} at {top.mailboxes} mailboxes: {ratio:4.2f}x that at "
                f"{base.mailboxes} {verdict} (<= {COST_GOAL}x)"
            )
    print(
        f"  tokens granted once per subject (until they expire): "
        f"{'MEETS' if ok else 'MISSES'}; RSS per mailbox at {top.mailboxes}: "
        f"{top.rss_per_mailbox_kb:.2f} KB (no goal)"
    )
    return ok


def profile_run(mailboxes: int, ticks: int) -> None:
    """The same jobs in this process, the engine ticked by hand: what grew in memory
    between before the jobs and after a minute of idle ticks (tracemalloc, by line), the
    objects of ours and google's still alive, and the functions the idle ticks, a
    /metrics render and a /healthz check called most (cProfile over `ticks` of each)."""
    import cProfile
    import gc
    import pstats
    import tracemalloc

    from daemon.api.health import HealthSources, check_health
    from daemon.api.metrics import Metrics, Sources
    from daemon.providers.mailboxes import IDLE_AFTER

    with (
        emulator_process(user_quota=USER_QUOTA) as emulator,
        sqlite_store() as url,
        tempfile.TemporaryDirectory(prefix="sendledger-profile-") as folder,
    ):
        creds = write_service_account(Path(folder) / "sa.json", token_uri="http://unused")
        settings = settings_from_dict(
            {
                "store": {"url": url},
                "providers": {
                    "gmail": {
                        "credentials_file": str(creds),
                        "user": "{from}",
                        "api_endpoint": emulator.url,
                        "token_uri": emulator.url + "/token",
                    }
                },
            }
        )
        policies = PolicySet({"receipts": POLICY})
        ledger = Ledger(url)
        service = bootstrap(
            settings, ledger=ledger, policy_loader=lambda: policies, policies=policies
        )
        metrics = Metrics(Sources(ledger, service.providers))
        health = HealthSources(
            ledger,
            lambda: policies,
            lambda: None,
            list(service.providers),
            circuits=service.engine.open_circuits,
        )
        try:
            service.engine.tick()
            tracemalloc.start(2)
            before = tracemalloc.take_snapshot()
            batch = []
            for i in range(mailboxes):
                batch.append(mailbox_job(f"profile-{i:07d}", i, f"m{i}@example.com"))
            ledger.submit_many(batch)
            del batch
            confirmed = 0
            while confirmed < mailboxes:
                report = service.engine.tick()
                confirmed += report.confirmed
                if not report.busy():
                    break
            # A minute of idle ticks: whatever is dropped when idle goes.
            for _ in range(int(IDLE_AFTER) + 2):
                time.sleep(1.0)
                service.engine.tick()
            gc.collect()
            after = tracemalloc.take_snapshot()
            tracemalloc.stop()
            print(
                f"\nprofile, {mailboxes} mailboxes ({confirmed} confirmed): grown by line",
                flush=True,
            )
            for stat in after.compare_to(before, "traceback")[:12]:
                print(f"  {stat.size_diff / 1024:9.1f} KB {stat.count_diff:7d} objects")
                for line in stat.traceback.format()[-4:]:
                    print("      " + line.strip())
            alive: dict[str, int] = {}
            for obj in gc.get_objects():
                kind = type(obj)
                if kind.__module__.startswith("daemon.") or kind.__module__.startswith("google"):
                    name = f"{kind.__module__}.{kind.__qualname__}"
                    alive[name] = alive.get(name, 0) + 1
            print("  alive after the idle ticks (the most numerous of ours and google's):")
            for name, count in sorted(alive.items(), key=lambda kv: -kv[1])[:8]:
                print(f"    {count:7d} {name}")
            for what, action in (
                ("idle tick", service.engine.hand_out),
                ("/metrics render", metrics.render),
                ("/healthz check", lambda: check_health(health)),
            ):
                profiler = cProfile.Profile()
                profiler.enable()
                for _ in range(ticks):
                    action()
                profiler.disable()
                counted: dict[Any, Any] = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
                rows = sorted(
                    (
                        (v[1], f"{k[0].rsplit('/', 2)[-1]}:{k[1]} {k[2]}")
                        for k, v in counted.items()
                    ),
                    reverse=True,
                )
                total = sum(v[1] for v in counted.values())
                print(f"  {what}: {total / ticks:.0f} calls each; most called:")
                for calls, where in rows[:5]:
                    print(f"    {calls / ticks:9.1f} {where}", flush=True)
        finally:
            service.close()
            ledger.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mailboxes", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=20.0, help="aimed length of a run")
    parser.add_argument("--n-ceiling", type=int, default=2000, help="jobs of the ceiling run")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (median ratio)")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument(
        "--per-mailbox", type=int, default=0, help="a batch of K jobs per mailbox instead"
    )
    parser.add_argument(
        "--only", default="quota,cost", help="which parts: quota (the rate), cost, or both"
    )
    parser.add_argument(
        "--idle-seconds", type=float, default=20.0, help="the idle window of the cost part"
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="instead: the cost's jobs in this process, profiled (memory by line, calls)",
    )
    args = parser.parse_args(argv)
    if args.profile:
        profile_run(args.mailboxes, 20)
        return 0
    parts = set(args.only.split(","))
    ok = True
    if "quota" in parts:
        ok = quota_rounds(args)
    if "cost" in parts:
        ok = cost_ladder(args) and ok
    return 0 if ok else 1


def quota_rounds(args: argparse.Namespace) -> bool:
    print(
        f"mailboxes benchmark: {args.mailboxes} mailboxes at {USER_QUOTA:.0f} units/s each "
        f"(Gmail's quota, a moving average; the emulator answers 429 over it), concurrency "
        f"{args.concurrency}, {os.cpu_count()} CPUs; emulator in its own process"
    )
    with tempfile.TemporaryDirectory(prefix="sendledger-bench-") as folder:
        creds = write_service_account(Path(folder) / "sa.json", token_uri="http://unused/token")
        rounds = [one_round(args, creds) for _ in range(args.rounds)]
    ratio = statistics.median(r for r, _ in rounds)
    ok = all(good for _, good in rounds)
    print(
        f"\nmany mailboxes: median ratio {ratio:4.2f} of min(quota, ceiling) "
        f"{'MEETS' if ratio >= GOAL else 'MISSES'} (>= {GOAL}); every job one copy: {ok}"
    )
    return ok


if __name__ == "__main__":
    sys.exit(main())
