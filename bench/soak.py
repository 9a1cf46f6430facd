"""Soak: thousands of jobs, random faults, two daemons on PostgreSQL, one of them killed
with SIGKILL and restarted (same daemon.name) every --kill-every seconds, until every job
settles. Not part of `make test`: `make soak` runs it (10,000 jobs by default).

What it checks, counting effects in the Gmail emulator's acceptance log only:
- retry channel ("receipts", on_unknown = retry): every confirmed job has exactly one
  copy, no Message-ID is ever accepted twice;
- review channel ("payouts", on_unknown = review): no job is sent again after an unknown
  outcome (no Attempted after an Unknown), at most one copy each;
- the job index equals a rebuild from the events (`admin rebuild-index`).
Figures are printed at the end; the exit code is 0 only when every check holds.

    SENDLEDGER_TEST_PG_URL=postgresql://... .venv/bin/python bench/soak.py [--jobs 10000]
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import psycopg

from ledger.application import Ledger
from ledger.content import parse_job
from policies.loader import load_policy_dir
from testkit.credentials import write_service_account
from testkit.gmail_emulator import GmailEmulator
from testkit.relay import FaultPlan, FaultRelay, Mode

PG_URL = os.environ.get(
    "SENDLEDGER_TEST_PG_URL", "postgresql://sendledger:sendledger@127.0.0.1:5432/sendledger_test"
)
SENDLEDGER = str(Path(sys.executable).parent / "sendledger")
MAILBOX = "shop@shop.example"
SETTLED = ("confirmed", "review", "abandoned")
# 20% of sends meet a fault, spread over every kind the relay makes.
FAULTS: dict[Mode, float] = {
    "pass": 80,
    "drop-response": 4,
    "fail-before-forward": 3,
    "500-after-forward": 3,
    "503": 3,
    "429": 4,
    "hang": 3,
}
COMMON = {
    "provider": "gmail",
    "message_id_domain": "mail.shop.example",
    "search_after": "1s",  # longer than the emulator's 0.3 s index lag
    "search_interval": "500ms",
    "confirm_misses": 2,
    "max_attempts": 6,
    "retry_backoff": "200ms",
    "retry_backoff_max": "2s",
}
POLICIES = {
    "receipts": {**COMMON, "from": "Receipts <receipts@shop.example>", "on_unknown": "retry"},
    "payouts": {**COMMON, "from": "Payouts <payouts@shop.example>", "on_unknown": "review"},
}


def toml_value(value: Any) -> str:
    return f'"{value}"' if isinstance(value, str) else str(value).lower()


def write_setup(
    folder: Path,
    store: str,
    policies: dict[str, dict[str, Any]],
    emulator: GmailEmulator,
    relay: FaultRelay,
) -> Path:
    """The service account, one policy file per channel and a sendledger.toml sending
    through the relay, in `folder`; returns the config's path (bench/daemons.py too)."""
    write_service_account(folder / "service-account.json", token_uri=emulator.token_uri)
    (folder / "policies").mkdir()
    for channel, fields in policies.items():
        text = "".join(
            f"{k} = {toml_value(v)}\n" for k, v in {"channel": channel, **fields}.items()
        )
        (folder / "policies" / f"{channel}.toml").write_text(text)
    config = folder / "sendledger.toml"
    config.write_text(
        f'[store]\nurl = "{store}"\n\n'
        '[daemon]\ntick = "200ms"\npolicies_dir = "policies"\nconcurrency = 8\n'
        'batch_size = 400\ndeadline_grace = "5s"\n\n'
        '[providers.gmail]\nkind = "gmail"\ncredentials_file = "service-account.json"\n'
        f'user = "{MAILBOX}"\napi_endpoint = "{relay.url}"\n'
        f'token_uri = "{emulator.token_uri}"\ntimeout = "1s"\n'
        "quota_units_per_second = 1000000\n"
    )
    return config


class Daemon:
    def __init__(self, folder: Path, config: Path, name: str, generation: int) -> None:
        self.name = name
        self.log = folder / f"{name}.{generation}.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("SENDLEDGER_")}
        env["SENDLEDGER_DAEMON__NAME"] = name
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [SENDLEDGER, "--config", str(config), "run"],
                cwd=folder,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
            )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--kill-every", type=float, default=20.0)
    parser.add_argument("--limit", type=float, default=3600.0, help="give up after (s)")
    parser.add_argument("--seed", type=int, default=20261130)
    args = parser.parse_args()

    folder = Path(tempfile.mkdtemp(prefix="sendledger-soak-"))
    schema = f"soak_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    store = f"{PG_URL}?schema={schema}"
    emulator = GmailEmulator(lag=0.3, acceptance_log=folder / "acceptance.jsonl").start()
    relay = FaultRelay(
        emulator.url,
        plan=FaultPlan.random(args.seed, FAULTS),
        hang_seconds=1.5,
        retry_after=0.3,
    ).start()
    config = write_setup(folder, store, POLICIES, emulator, relay)
    daemons: dict[str, Daemon] = {}
    ok = False
    try:
        ledger = Ledger(store)
        policies = load_policy_dir(folder / "policies")
        started = time.monotonic()

        def submit(n: int) -> None:
            channel = "payouts" if n % 5 == 0 else "receipts"
            job = {
                "channel": channel,
                "key": f"soak-{n:05d}",
                "to": f"customer{n}@example.com",
                "subject": f"Soak {n}",
                "body": f"job {n}\n",
            }
            policy = policies.get(channel)
            assert policy is not None
            ledger.submit(parse_job(job), policy.sender)

        with ThreadPoolExecutor(4) as pool:
            list(pool.map(submit, range(args.jobs)))
        submitted = time.monotonic() - started
        print(f"submitted {args.jobs} jobs in {submitted:.1f}s", flush=True)

        generation = collections.Counter[str]()
        for name in ("soak-a", "soak-b"):
            daemons[name] = Daemon(folder, config, name, generation[name])
        kills = 0
        start_settle = time.monotonic()
        next_kill = start_settle + args.kill_every
        while True:
            settled = sum(ledger.counts(SETTLED).values())
            if settled == args.jobs:
                break
            now = time.monotonic()
            if now - start_settle > args.limit:
                print(f"gave up after {args.limit:.0f}s: {ledger.counts()}")
                return 1
            for name, daemon in daemons.items():
                code = daemon.proc.poll()
                if code is not None and not (name == "soak-a" and code == -signal.SIGKILL):
                    print(f"{name} exited {code}; see {daemon.log}")
                    return 1
            if now >= next_kill:
                victim = daemons["soak-a"]
                victim.proc.send_signal(signal.SIGKILL)
                victim.proc.wait()
                kills += 1
                generation["soak-a"] += 1
                daemons["soak-a"] = Daemon(folder, config, "soak-a", generation["soak-a"])
                next_kill = now + args.kill_every
                print(
                    f"  {now - start_settle:6.0f}s: killed soak-a (#{kills}); {ledger.counts()}",
                    flush=True,
                )
            time.sleep(0.5)
        settle = time.monotonic() - start_settle
        for daemon in daemons.values():
            daemon.proc.send_signal(signal.SIGTERM)
        for daemon in daemons.values():
            daemon.proc.wait(timeout=60)

        # -- checks, effects counted at the emulator ---------------------------------------
        rows = {row.key: row for row in ledger.jobs()}
        by_id = {row.job_id: row for row in rows.values()}
        copies = collections.Counter(entry["message_id"] for entry in emulator.accepted())
        events: dict[str, list[Any]] = collections.defaultdict(list)
        for event in ledger.job_events():
            events[by_id[event.originator_id.hex].key].append(event)
        problems: list[str] = []
        duplicates = {m: n for m, n in copies.items() if n > 1}
        if duplicates:
            problems.append(f"{len(duplicates)} Message-IDs accepted more than once")
        resent_after_unknown = 0
        for key, row in rows.items():
            n = copies.get(row.message_id, 0)
            if row.state == "confirmed" and n != 1:
                problems.append(f"{key}: confirmed with {n} copies")
            if row.channel == "payouts":
                names = [type(e).__name__ for e in events[key]]
                if "Unknown" in names and "Attempted" in names[names.index("Unknown") :]:
                    resent_after_unknown += 1
                    problems.append(f"{key}: review channel sent again after Unknown")
        live = sorted(rows.values(), key=lambda r: r.key)
        rebuilt_count = ledger.rebuild_index()
        rebuilt = list(ledger.jobs())
        if rebuilt_count != args.jobs or rebuilt != live:
            problems.append("the index differs from a rebuild")
        states = collections.Counter((r.channel, r.state) for r in rows.values())
        attempts = sum(1 for evs in events.values() for e in evs if type(e).__name__ == "Attempted")
        modes = collections.Counter(entry["mode"] for entry in relay.log if entry["kind"] == "send")
        recovered = collections.Counter(
            str(e.reason)[:40]
            for evs in events.values()
            for e in evs
            if type(e).__name__ == "Unknown" and "no outcome recorded" in str(e.reason)
        )
        print(
            f"soak: {args.jobs} jobs, two daemons on PostgreSQL, soak-a killed -9 {kills} times; "
            f"settled in {settle:.0f}s ({args.jobs / settle:.0f} jobs/s)\n"
            f"  states: {dict(sorted(states.items()))}\n"
            f"  provider calls {attempts}; send modes at the relay {dict(modes)}\n"
            f"  crashed claims recovered: {dict(recovered)}\n"
            f"  copies accepted {sum(copies.values())}, duplicates {len(duplicates)}; "
            f"review channel resends after Unknown {resent_after_unknown}\n"
            f"  index equals a rebuild: {rebuilt == live}"
        )
        for problem in problems[:20]:
            print("PROBLEM:", problem)
        ok = not problems
        ledger.close()
        return 0 if ok else 1
    finally:
        for daemon in daemons.values():
            if daemon.proc.poll() is None:
                daemon.proc.kill()
                daemon.proc.wait()
        relay.stop()
        emulator.stop()
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        if ok:
            shutil.rmtree(folder, ignore_errors=True)
        else:
            print(f"logs in {folder}")


if __name__ == "__main__":
    raise SystemExit(main())
