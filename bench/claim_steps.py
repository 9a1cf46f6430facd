"""What the steps before and around a claim cost, each next to what it replaced, in one run.

A job of about 2 KB (bench/smtp_senders.py's shape: a name and an address in To, a
22-line body) goes through the per-send steps that docs/performance.md "The SMTP path"
names, each timed in one thread (best of `--rounds`, CPU time):

  render          ledger/mime.py: render_message
  proof           ledger/wire_check.py: find_mismatch (the writer's output read back)
  envelope        ledger/message.py: Envelope (To, Cc, Bcc, Message-ID by
                  two regular expressions), next to the email package's header parser and
                  getaddresses on the same bytes (what it did before): the ratio
  address split   wire_check's split of an address header at its commas, next to the
                  character walk it takes for quoted text (what every header took before)
  saves           `--n` claims saved one job per transaction on a fresh SQLite store
                  (fsync on, as the daemon runs it), the store's pool (each connection
                  keeps its prepared statements) next to the library's (a cache of one
                  statement, so each transaction prepared its statements again)

Each line prints the step's microseconds and, where there is one, the ratio to what it
replaced measured in the same run (below 1: cheaper). A measurement: exit code 0.

    .venv/bin/python bench/claim_steps.py [--rounds 5] [--n 600] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from email.parser import BytesHeaderParser
from email.utils import getaddresses
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from eventsourcing.sqlite import SQLiteConnectionPool

from ledger.application import Ledger
from ledger.content import parse_job
from ledger.message import Envelope
from ledger.mime import MessageFields, render_message
from ledger.vocabulary import PolicyRef, Sender
from ledger.wire_check import _split_top_level, _walk_top_level, find_mismatch

FROM = "Shop <shop@example.test>"
SENDER = Sender(FROM, "mail.example.test", PolicyRef("receipts", "0123456789abcdef"))
BODY = "Thanks for your order 1: it ships within two working days from our store.\n" * 22
DOC = {
    "channel": "receipts",
    "key": "steps-1",
    "to": "Alice <alice@example.test>",
    "subject": "Your receipt",
}


def cpu_us(action: Callable[[], object], rounds: int, calls: int) -> float:
    """The best of `rounds` runs of `calls` calls, CPU microseconds a call."""
    best = float("inf")
    for _ in range(rounds):
        started = time.process_time()
        for _ in range(calls):
            action()
        best = min(best, time.process_time() - started)
    return best * 1e6 / calls


def package_envelope(raw: bytes) -> tuple[list[str], str]:
    """The envelope as the email package's parser gives it (the way before)."""
    headers = BytesHeaderParser().parsebytes(raw[: raw.find(b"\r\n\r\n") + 4])
    fields = [str(v) for name in ("to", "cc", "bcc") for v in headers.get_all(name) or ()]
    return [a for _, a in getaddresses(fields) if a], str(headers.get("Message-ID") or "").strip()


def saves_us(n: int, library_pool: bool) -> float:
    """CPU microseconds a job of saving `n` claims, one job per transaction."""
    with tempfile.TemporaryDirectory() as folder:
        ledger = Ledger(f"sqlite:///{Path(folder) / 'steps.sqlite'}")
        try:
            if library_pool:
                datastore = ledger.recorder.datastore  # type: ignore[attr-defined]
                kept = datastore.pool
                datastore.pool = SQLiteConnectionPool(
                    db_name=kept.db_name, lock_timeout=kept.lock_timeout
                )
                kept.close()
            keys = [f"save-{i:05d}" for i in range(n)]
            for key in keys:
                ledger.submit(parse_job({**DOC, "key": key, "body": BODY}), SENDER)
            jobs = list(ledger.get_jobs(keys).values())
            now = datetime.now(UTC)
            for job in jobs:
                job.claim(provider="mail", deadline=now + timedelta(seconds=60), at=now)
            started = time.process_time()
            for job in jobs:
                ledger.save_jobs([job])
            return (time.process_time() - started) * 1e6 / n
        finally:
            ledger.close()


def measure(rounds: int, n: int) -> list[dict[str, Any]]:
    content = parse_job({**DOC, "body": BODY})
    fields = MessageFields.of(
        content,
        from_addr=FROM,
        message_id="<job-steps@mail.example.test>",
        date=datetime(2026, 1, 1, tzinfo=UTC),
    )
    raw = render_message(fields)
    envelope = Envelope(raw)
    assert (envelope.recipients, envelope.message_id) == package_envelope(raw)
    to = "Alice Example <alice@example.test>"
    calls = 2000
    rows: list[dict[str, Any]] = [
        {"step": "render", "us": cpu_us(lambda: render_message(fields), rounds, calls)},
        {"step": "proof", "us": cpu_us(lambda: find_mismatch(raw, fields), rounds, calls)},
    ]
    for step, new, old in (
        ("envelope", lambda: Envelope(raw), lambda: package_envelope(raw)),
        ("address split", lambda: _split_top_level("to", to), lambda: _walk_top_level("to", to)),
    ):
        now, before = cpu_us(new, rounds, calls), cpu_us(old, rounds, calls)
        rows.append({"step": step, "us": now, "before_us": before, "ratio": now / before})
    kept = min(saves_us(n, library_pool=False) for _ in range(max(1, rounds // 2)))
    one = min(saves_us(n, library_pool=True) for _ in range(max(1, rounds // 2)))
    rows.append({"step": "save, one job a transaction", "us": kept, "before_us": one})
    rows[-1]["ratio"] = kept / one
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--n", type=int, default=600, help="claims saved per store")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    rows = measure(args.rounds, args.n)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    load = os.getloadavg()
    print(f"best of {args.rounds}, CPU us a call; load average {load[0]:.1f}, one thread\n")
    print("| step | us | before (same run) | ratio |")
    print("|---|---|---|---|")
    for row in rows:
        before = f"{row['before_us']:.1f}" if "before_us" in row else "-"
        ratio = f"{row['ratio']:.2f}" if "ratio" in row else "-"
        print(f"| {row['step']} | {row['us']:.1f} | {before} | {ratio} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
