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
own mailbox. Exit code 0 unless a job did not.

    .venv/bin/python bench/mailboxes.py [--mailboxes 200] [--seconds 20] [--n-ceiling 2000]
                                        [--per-mailbox K]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
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
from ledger.content import parse_job
from policies.loader import PolicySet
from policies.model import ChannelPolicy
from testkit import write_service_account

GOAL = 0.9
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
            document = {
                "channel": "receipts",
                "key": f"mb-{i:07d}",
                "to": "Alice <alice@example.com>",
                "subject": f"Your receipt {i}",
                "body": f"Thanks for order {i}.\n",
                "from": f"Shop <{mailbox}>",
            }
            content = parse_job(document)
            result = ledger.submit(content, POLICY.sender_for(content.sender))
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
    args = parser.parse_args(argv)
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
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
