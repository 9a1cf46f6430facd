"""What a purge costs per job (docs/configuration.md "Retention", cost).

Builds a SQLite store of `--jobs` confirmed jobs (submitted, claimed and confirmed through
the ledger, as the daemon records them), moves the injected clock past `purge_after`, and
times `Ledger.purge_settled`: each job rewritten in its own transaction, then the WAL
checkpointed and truncated (the scrub). Prints jobs, seconds and ms per job.

With `--scrub`, times only what the scrub costs the CPU per job (`redact_events`: the
job's pattern compiled, then its events' texts looked into), for `--jobs` jobs whose
three provider texts quote nothing: plain texts, and texts with the marks of the forms
a reader decodes (an HTML page's references, a URL's escapes, JSON escapes), which cost
the scrub a decoded look each.

    .venv/bin/python bench/purge.py [--jobs 1000] [--json] [--scrub]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from ledger.application import Ledger, Sender
from ledger.content import JobContent
from ledger.decision_types import Confirm
from ledger.job import SendJob
from ledger.redaction import redact_events
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


@dataclass(frozen=True)
class Texts:
    """An event with two texts outside the trail (a reason and a note)."""

    reason: str
    note: str


_POLICY = "550 5.7.1 message refused by policy, please contact the postmaster of mx.example "
PLAIN = [Texts(_POLICY * 3, "an operator's note quoting nothing"), Texts(_POLICY, _POLICY * 2)]
MARKED = [
    Texts(_POLICY * 3, "an operator's note quoting nothing"),
    Texts(
        "<html><body><p>Error 400 &mdash; the request was refused &amp; logged</p></body></html>",
        "see https://mx.example/err?code=550&lang=en&q=abc%20def+ghi",
    ),
    Texts('{"error": {"code": 400, "message": "bad request \\u2014 try later"}}', _POLICY),
]


def scrub_cost(jobs: int) -> dict[str, float]:
    """CPU microseconds per job of `redact_events`, each job its own content (so its own
    pattern, compiled: the `re` cache holds 512)."""
    contents = [
        JobContent(
            channel="receipts",
            key=f"scrub-{i}",
            to=(f"Zoë Quartz {i} <zoe.quartz{i}@example.net>",),
            cc=("carl.cc@example.net",),
            subject=f"Your invoice {i} for the order of Zoë Quartz",
            body="x",
        )
        for i in range(2 * jobs)
    ]
    figures: dict[str, float] = {}
    for label, events, batch in (
        ("plain", PLAIN, contents[:jobs]),
        ("marked", MARKED, contents[jobs:]),
    ):
        started = time.process_time()
        for content in batch:
            redact_events(events, content)
        figures[f"{label}_us_per_job"] = round((time.process_time() - started) * 1e6 / jobs)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--scrub", action="store_true")
    args = parser.parse_args()
    if args.scrub:
        cost = scrub_cost(args.jobs)
        print(json.dumps(cost) if args.json else ", ".join(f"{k}: {v}" for k, v in cost.items()))
        return
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
