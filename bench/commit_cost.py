"""What a claim's commit costs, alone and shared: the ceiling of fewer commits per job.

N jobs of about 2 KB (bench/smtp_senders.py's) are submitted to a fresh SQLite store
(fsync on, as the daemon runs it), claimed in memory (Attempted, as `Dispatch.claim`
records it), then saved through `Ledger.save_jobs` in transactions of 1, 2, 4, 8 and 16
jobs; CPU ms and wall ms per job, median of `--rounds`. One job per transaction is what a
worker that commits alone pays; 4 is every worker of the default concurrency in one
commit (what `GroupCommit` gathers at best); 8 and 16 what claiming a batch of a scope's
due jobs in one commit would reach (docs/performance.md "The SMTP path": why the daemon
does not claim ahead).

    .venv/bin/python bench/commit_cost.py [--n 800] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from intake import sqlite_store
from smtp_senders import documents, policy_table

from ledger.application import Ledger
from ledger.content import parse_job
from policies.model import ChannelPolicy

SIZES = (1, 2, 4, 8, 16)


def per_job(n: int, size: int) -> tuple[float, float]:
    """(CPU ms, wall ms) per job of saving n claims, `size` jobs per transaction."""
    policy = ChannelPolicy.model_validate(policy_table())
    with sqlite_store() as url:
        ledger = Ledger(url)
        try:
            docs = documents(n, f"c{size}-{time.monotonic_ns()}", 0)
            for doc in docs:
                ledger.submit(parse_job(doc), policy.sender)
            jobs = list(ledger.get_jobs([doc["key"] for doc in docs]).values())
            now = datetime.now(UTC)
            for job in jobs:
                job.claim(provider="mail", deadline=now + timedelta(seconds=60), at=now)
            wall, cpu = time.perf_counter(), time.process_time()
            for start in range(0, n, size):
                ledger.save_jobs(jobs[start : start + size])
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        finally:
            ledger.close()
    return cpu * 1000 / n, wall * 1000 / n


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=800)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    spent: dict[int, list[tuple[float, float]]] = {size: [] for size in SIZES}
    for _ in range(args.rounds):
        for size in SIZES:
            spent[size].append(per_job(args.n, size))
    load = os.getloadavg()
    print(
        f"{args.n} claims saved on SQLite (fsync on), {args.rounds} rounds (median; range), "
        f"load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}, {os.cpu_count()} CPUs"
    )
    print()
    print("| jobs per transaction | CPU-ms per job | wall-ms per job |")
    print("|---|---|---|")
    for size, runs in spent.items():
        cpus, walls = [c for c, _ in runs], [w for _, w in runs]
        print(
            f"| {size} | {statistics.median(cpus):.2f} ({min(cpus):.2f}-{max(cpus):.2f}) | "
            f"{statistics.median(walls):.2f} ({min(walls):.2f}-{max(walls):.2f}) |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
