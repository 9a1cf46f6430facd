"""PostgreSQL insert modes: eventsourcing's default (a LOCK TABLE, then INSERT, pipelined)
against POSTGRES_ENABLE_DB_FUNCTIONS=y (one call of its PL/pgSQL insert function), each
with our job index row written in the same transaction.

Per mode and round: a fresh schema, --n submits (one Requested + one index row per save)
then --n claims (one Attempted + the row), from --threads writer threads (as a daemon's
send pool does). Rounds alternate the modes so both see the same machine noise; the median
saves per second per mode is reported. A measurement: the exit code is always 0.

    SENDLEDGER_TEST_PG_URL=postgresql://... .venv/bin/python bench/pg_insert_modes.py [--n 1000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import psycopg

from ledger.application import Ledger, Sender
from ledger.content import JobContent
from ledger.vocabulary import PolicyRef

PG_URL = os.environ.get(
    "SENDLEDGER_TEST_PG_URL", "postgresql://sendledger:sendledger@127.0.0.1:5432/sendledger_test"
)
SENDER = Sender("Support <support@example.com>", "mail.example.com", PolicyRef("b", "0" * 16))


def one_round(functions: bool, n: int, threads: int) -> tuple[float, float]:
    os.environ["POSTGRES_ENABLE_DB_FUNCTIONS"] = "y" if functions else "n"
    schema = f"bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    try:
        with Ledger(f"{PG_URL}?schema={schema}") as ledger:
            now = datetime.now(UTC) + timedelta(hours=1)  # every job is due by then
            keys = [f"k{i}" for i in range(n)]

            def submit(key: str) -> None:
                ledger.submit(
                    JobContent(channel="b", key=key, to=("a@example.com",), subject="s", body="b"),
                    SENDER,
                )

            def claim(key: str) -> None:
                ledger.update(
                    key,
                    lambda j: j.claim(
                        provider="p", deadline=now + timedelta(hours=1), at=now, daemon="bench"
                    ),
                )

            rates = []
            for work in (submit, claim):
                started = time.perf_counter()
                with ThreadPoolExecutor(threads) as pool:
                    list(pool.map(work, keys))
                rates.append(n / (time.perf_counter() - started))
            assert sum(1 for _ in ledger.jobs(state="attempted")) == n, "index rows missing"
            return rates[0], rates[1]
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=4)
    args = parser.parse_args()
    results: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    for _ in range(args.rounds):
        for functions in (False, True):
            results[functions].append(one_round(functions, args.n, args.threads))
    for functions, rounds in results.items():
        label = "db functions (y)" if functions else "default (n)     "
        submit = statistics.median(r[0] for r in rounds)
        claim = statistics.median(r[1] for r in rounds)
        print(
            f"{label}: submit {submit:7.0f}/s  claim {claim:7.0f}/s  ({args.n} each, "
            f"{args.threads} threads, median of {args.rounds})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
