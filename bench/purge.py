"""What a purge costs per job (docs/configuration.md "Retention", cost).

Builds a SQLite store of `--jobs` confirmed jobs (submitted, claimed and confirmed through
the ledger, as the daemon records them), moves the injected clock past `purge_after`, and
times `Ledger.purge_settled`: each job rewritten in its own transaction, then the WAL
checkpointed and truncated (the scrub). Prints jobs, seconds and ms per job.

    .venv/bin/python bench/purge.py [--jobs 1000] [--json]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from ledger.application import Ledger, Sender
from ledger.content import JobContent
from ledger.decision_types import Confirm
from ledger.job import SendJob
from ledger.vocabulary import PolicyRef

SENDER = Sender(
    from_addr="Support <support@example.com>",
    message_id_domain="mail.example.com",
    policy=PolicyRef("receipts", "0123456789abcdef"),
)


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


def build(ledger: Ledger, clock: Clock, jobs: int) -> None:
    for i in range(jobs):
        key = f"purge-{i}"
        ledger.submit(
            JobContent(
                channel="receipts",
                key=key,
                to=(f"Customer {i} <customer{i}@example.org>",),
                subject=f"Your receipt {i}",
                body=f"Thanks for order {i}",
            ),
            SENDER,
        )
        settle(ledger, clock, key)


def settle(ledger: Ledger, clock: Clock, key: str) -> None:
    """Claimed, then confirmed by the provider's response: settled for good."""
    deadline = clock() + timedelta(seconds=60)

    def claim(job: SendJob) -> None:
        job.claim(provider="support", deadline=deadline, at=clock())

    def confirm(job: SendJob) -> None:
        job.record_response(
            provider_message_id=f"gm-{key}", decision=Confirm(SENDER.policy), at=clock()
        )

    ledger.update(key, claim)
    ledger.update(key, confirm)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    clock = Clock()
    with tempfile.TemporaryDirectory() as folder:
        url = f"sqlite:///{Path(folder) / 'ledger.sqlite'}"
        with Ledger(url, clock=clock) as ledger:
            build(ledger, clock, args.jobs)
            clock.now += timedelta(days=91)
            started = time.perf_counter()
            result = ledger.purge_settled(
                clock.now - timedelta(days=90), by="bench", rule="bench purge_after = 90d"
            )
            seconds = time.perf_counter() - started
    assert result.purged == args.jobs, result
    figures = {
        "jobs": args.jobs,
        "seconds": round(seconds, 2),
        "ms_per_job": round(seconds * 1000 / args.jobs, 2),
        "scrubbed": result.scrubbed,
    }
    if args.json:
        print(json.dumps(figures))
    else:
        print(
            f"purged {figures['jobs']} jobs in {figures['seconds']} s: "
            f"{figures['ms_per_job']} ms per job (scrubbed: {figures['scrubbed']})"
        )


if __name__ == "__main__":
    main()
