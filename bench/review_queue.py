"""The review queue with many jobs in review (docs/review.md "Review page"): a SQLite store
holding `--jobs` jobs in review (2,000 by default), each with its own recipient, and the
time of what a human asks of it through the service layer every door uses
(`daemon/service_layer/services.py`):

  queue page     one page of the page's queue (`Services.review_queue`: the index, then
                 the content of its 50 jobs in one query)
  review list    every job in review (`Services.review_list`, what `review list --json`
                 and `GET /v1/review` answer: content loaded 50 jobs a query)
  one by one     the same rows with each job loaded in a query of its own (`Ledger.get_job`),
                 the way lists were read before, for comparison
  search         a recipient search that matches nothing, so every recent job is read
                 (`Services.find_jobs`, the page's search box)

Median of `--rounds` runs each, in milliseconds. Under a minute in all.

    .venv/bin/python bench/review_queue.py [--jobs 2000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from daemon.service_layer.read_models import review_index, review_row
from daemon.service_layer.services import ChannelPolicies, Services
from ledger.application import Ledger
from ledger.content import parse_job
from ledger.decision_types import Review
from ledger.job import SendJob
from ledger.message_id import message_id_for
from ledger.vocabulary import EscalationReason, PolicyRef
from policies.loader import PolicySet

POLICY = PolicyRef("receipts", "f" * 16)
BATCH = 500


def fill(ledger: Ledger, count: int) -> None:
    """`count` jobs in review (an unknown outcome), written `BATCH` a transaction."""
    review = Review(POLICY, EscalationReason.UNKNOWN_OUTCOME)
    for start in range(0, count, BATCH):
        jobs = []
        for n in range(start, min(start + BATCH, count)):
            content = parse_job(
                {
                    "channel": "receipts",
                    "key": f"order-{n:06d}",
                    "to": f"customer-{n}@example.net",
                    "subject": f"Receipt {n}",
                    "body": "Thank you.\n" * 20,
                }
            )
            at = ledger.clock()
            job = SendJob.request(
                content,
                from_addr="Support <support@example.com>",
                message_id=message_id_for(content.key, "mail.example.com"),
                policy=POLICY,
                at=at,
            )
            job.escalate(review, detail="bench", at=at)
            jobs.append(job)
        ledger.save_jobs(jobs)


def median_ms(call: Callable[[], Any], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="sendledger-bench-") as folder,
        Ledger(f"sqlite:///{Path(folder) / 'bench.sqlite'}") as ledger,
    ):
        fill(ledger, args.jobs)
        services = Services(ledger, lambda: ChannelPolicies(PolicySet()))
        assert len(services.review_list()) == args.jobs
        runs: dict[str, Callable[[], Any]] = {
            "queue page": lambda: services.review_queue(page=1),
            "review list": services.review_list,
            "one by one": lambda: [
                review_row(row, ledger.get_job(row.key)) for row in review_index(ledger)
            ],
            "search": lambda: services.find_jobs("nobody@example.org"),
        }
        print(f"{args.jobs} jobs in review, SQLite, median of {args.rounds}")
        for name, call in runs.items():
            print(f"{name:<12} {median_ms(call, args.rounds):8.1f} ms")


if __name__ == "__main__":
    main()
