"""`sendledger demo`: the daemon on SQLite against the bundled Gmail emulator, with faults.

Everything runs on loopback in this process's threads: the emulator (with search index
lag), the fault relay in front of it, and the real daemon (APScheduler ticks, the real
google-api-python-client). The copies per job are counted in the emulator's acceptance
log, where the effects happen, not in the daemon.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any, TextIO

from daemon import output
from daemon.bootstrap import bootstrap
from daemon.errors import bad_input
from daemon.logs import setup_logging
from daemon.runtime import Daemon
from daemon.settings import load_settings
from ledger.application import Ledger
from ledger.content import parse_job
from ledger.job import JobState
from policies.loader import load_policy_dir
from testkit import FaultPlan, FaultRelay, GmailEmulator, Mode, write_service_account

POLICIES = {
    "receipts": """\
# Customer receipts: a missing mail is worse than a rare duplicate -> retry after misses.
provider = "gmail"
from = "Shop Receipts <receipts@shop.example>"
message_id_domain = "mail.shop.example"
on_unknown = "retry"
search_after = "{search_after}"
search_interval = "{search_interval}"
confirm_misses = 2
max_attempts = 4
retry_backoff = "500ms"
retry_backoff_max = "3s"
# A resent receipt's copies are counted once more when the index has surely caught up.
verify_after = "{verify_after}"
""",
    "payouts": """\
# Payout notices: irreversible -> an unknown outcome goes to a human, never resent.
provider = "gmail"
from = "Payouts <payouts@shop.example>"
message_id_domain = "mail.shop.example"
on_unknown = "review"
irreversible = true
max_attempts = 2
retry_backoff = "500ms"
retry_backoff_max = "3s"
""",
}

CONFIG = """\
[store]
url = "sqlite:///ledger.sqlite"

[daemon]
tick = "250ms"
policies_dir = "policies"
concurrency = 4
deadline_grace = "1s"

[providers.gmail]
kind = "gmail"
credentials_file = "service-account.json"
user = "shop@shop.example"
api_endpoint = "{relay}"
token_uri = "{emulator}/token"
timeout = "{timeout}"
"""

# What the relay does to each send, in order; then every request passes.
SEND_FAULTS: list[Mode] = [
    "pass",
    "drop-response",
    "fail-before-forward",
    "500-after-forward",
    "pass",
    "429",
    "hang",
    "drop-response",
    "503",
    "pass",
    "fail-before-forward",
    "drop-response",
]

JOBS = [
    ("receipts", "order:1001:receipt", "Ana Souza <ana@example.com>", "Your receipt #1001"),
    ("receipts", "order:1002:receipt", "李雷 <lilei@example.com>", "订单 #1002 已发货 🎉"),
    ("receipts", "order:1003:receipt", "bob@example.com", "Your receipt #1003"),
    ("receipts", "order:1004:receipt", "Chloé <chloe@example.com>", "Reçu #1004"),
    ("receipts", "order:1005:receipt", "dmitri@example.com", "Ваш чек #1005"),
    ("receipts", "order:1006:receipt", "eve@example.com", "Your receipt #1006"),
    ("receipts", "order:1007:receipt", "farah@example.com", "Your receipt #1007"),
    ("receipts", "order:1008:receipt", "gus@example.com", "Your receipt #1008"),
    ("payouts", "payout:2001", "seller-1@example.com", "Payout of €120.00 sent"),
    ("payouts", "payout:2002", "seller-2@example.com", "Payout of €75.50 sent"),
    ("payouts", "payout:2003", "seller-3@example.com", "Payout of €310.00 sent"),
    ("payouts", "payout:2004", "seller-4@example.com", "Payout of €18.20 sent"),
]


def register(sub: Any) -> None:
    p = sub.add_parser("demo", help="the daemon against the bundled Gmail emulator, with faults")
    p.add_argument("--lag", default="2s", help="the emulator's search index lag")
    p.add_argument("--timeout", default="90s", help="give up waiting for jobs to settle")
    p.add_argument("--dir", help="work folder (default: a new temporary folder)")
    p.add_argument("--json", action="store_true", help="print the final summary as JSON")
    p.set_defaults(func=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    lag = _seconds("--lag", args.lag, 0.0, 600.0)
    limit = _seconds("--timeout", args.timeout, 1.0, 86400.0)
    if args.dir:
        folder = Path(args.dir)
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise bad_input(f"--dir: cannot create {folder}: {exc.strerror}") from None
        return _demo(folder, lag, limit, args.json)
    with tempfile.TemporaryDirectory(prefix="sendledger-demo-") as tmp:
        return _demo(Path(tmp), lag, limit, args.json)


def _seconds(option: str, value: str, low: float, high: float) -> float:
    from policies.durations import DurationError, parse_duration

    try:
        seconds = parse_duration(value)
    except DurationError as exc:
        raise bad_input(f"{option}: {exc}") from None
    if not low <= seconds <= high:
        raise bad_input(f"{option}: must be between {low:g}s and {high:g}s, got {value!r}")
    return seconds


def _demo(folder: Path, lag: float, limit: float, as_json: bool) -> int:
    # With --json, stdout carries the summary and nothing else; the running commentary
    # goes to stderr.
    out = sys.stderr if as_json else sys.stdout
    setup_logging("warning", journal=False)
    accept_log = folder / "acceptance.jsonl"
    emulator = GmailEmulator(lag=lag, acceptance_log=accept_log).start()
    relay = FaultRelay(
        emulator.url, plan=FaultPlan(send=SEND_FAULTS), hang_seconds=4.0, retry_after=0.5
    ).start()
    try:
        write_service_account(folder / "service-account.json", token_uri=f"{emulator.url}/token")
        # Searches wait out the index lag with a margin; two empty ones are believed.
        search_after = f"{int((lag + 1.0) * 1000)}ms"
        (folder / "policies").mkdir(exist_ok=True)
        for name, text in POLICIES.items():
            (folder / "policies" / f"{name}.toml").write_text(
                text.format(
                    search_after=search_after,
                    search_interval="1s",
                    verify_after=f"{int((lag + 1.5) * 1000)}ms",
                ),
                encoding="utf-8",
            )
        (folder / "sendledger.toml").write_text(
            CONFIG.format(relay=relay.url, emulator=emulator.url, timeout="1500ms"),
            encoding="utf-8",
        )
        settings = load_settings(folder / "sendledger.toml")
        policies = load_policy_dir(settings.policies_dir, known_providers=settings.providers)
        ledger = Ledger(settings.store.url, base_dir=settings.base_dir)
        _intro(out, folder, emulator.url, relay.url, lag)
        for channel, key, to, subject in JOBS:
            policy = policies[channel]
            content = parse_job(
                {
                    "channel": channel,
                    "key": key,
                    "to": to,
                    "subject": subject,
                    "body": f"Hello,\n\n{subject}.\n\n-- sent by the sendledger demo\n",
                }
            )
            sender = policy.sender
            ledger.submit(content, sender)
        service = bootstrap(
            settings, ledger=ledger, policy_loader=lambda: policies, policies=policies
        )
        daemon = Daemon(service, settings.daemon.tick)
        runner = threading.Thread(target=daemon.serve, name="daemon", daemon=True)
        runner.start()
        settled = _watch(out, ledger, limit)
        daemon.request_stop()
        runner.join(timeout=30)
        summary = _summary(ledger, emulator)
        ledger.close()
    finally:
        relay.stop()
        emulator.stop()
    _print_summary(sys.stdout, summary, settled, as_json)
    problems = [row for row in summary["jobs"] if row["verdict"] != "ok"]
    return 0 if settled and not problems else 1


def _intro(out: TextIO, folder: Path, emulator: str, relay: str, lag: float) -> None:
    print("sendledger demo — against the BUNDLED GMAIL EMULATOR, not Gmail", file=out)
    print(f"  work folder   {folder}", file=out)
    print(f"  emulator      {emulator}  (search index lag {lag:g}s)", file=out)
    print(f"  fault relay   {relay}  (send faults, in order: {', '.join(SEND_FAULTS)})", file=out)
    print("  channels      receipts: on_unknown=retry   payouts: irreversible, review", file=out)
    print(f"  {len(JOBS)} jobs submitted; the daemon reconciles each one:\n", file=out)


def _rows(ledger: Ledger) -> list[dict[str, Any]]:
    rows = []
    for channel, key, _to, _subject in JOBS:
        job = ledger.get_job(key)
        rows.append(
            {
                "key": key,
                "channel": channel,
                "state": job.state.value,
                "attempts": job.attempts,
                "searches": job.searches,
                "verifying": job.verifying,
                "reason": (job.reason or "")[:58],
            }
        )
    return rows


def _watch(out: TextIO, ledger: Ledger, limit: float) -> bool:
    tty = out.isatty()
    started = time.monotonic()
    seen: dict[str, str] = {}
    columns = ["key", "channel", "state", "attempts", "searches", "reason"]
    while True:
        rows = _rows(ledger)
        elapsed = time.monotonic() - started
        if tty:
            out.write("\x1b[s" if not seen else "\x1b[u\x1b[J")
            out.write(output.table(rows, columns) + f"\n\n  t={elapsed:5.1f}s\n")
            out.flush()
            seen = {r["key"]: r["state"] for r in rows}
        else:
            for row in rows:
                state = f"{row['state']} (attempts {row['attempts']}, searches {row['searches']})"
                if row["verifying"]:
                    state += ", copies to be counted again"
                if seen.get(row["key"]) != state:
                    seen[row["key"]] = state
                    note = f"  {row['reason']}" if row["reason"] else ""
                    print(f"  t={elapsed:5.1f}s  {row['key']:<20} {state}{note}", file=out)
        if all(JobState(r["state"]) in _SETTLED and not r["verifying"] for r in rows):
            if tty:
                print(file=out)
            return True
        if elapsed > limit:
            print(f"\n  gave up after {limit:g}s with jobs still open", file=out)
            return False
        time.sleep(0.25)


_SETTLED = {JobState.CONFIRMED, JobState.REVIEW, JobState.ABANDONED}


def _summary(ledger: Ledger, emulator: GmailEmulator) -> dict[str, Any]:
    copies = Counter(entry.get("message_id") for entry in emulator.accepted())
    jobs = []
    for channel, key, _to, _subject in JOBS:
        job = ledger.get_job(key)
        count = copies.get(job.message_id, 0)
        if job.state is JobState.CONFIRMED:
            verdict = "ok" if count == 1 else f"WRONG: {count} copies"
        elif job.state is JobState.REVIEW:
            # A human gets the Message-ID; the daemon must not have sent it twice.
            verdict = "ok" if count <= 1 else f"WRONG: {count} copies"
        else:
            verdict = "ok" if count == 0 else f"{count} copies"
        jobs.append(
            {
                "key": key,
                "channel": channel,
                "state": job.state.value,
                "copies": count,
                "attempts": job.attempts,
                "reason": job.reason,
                "message_id": job.message_id,
                "verdict": verdict,
            }
        )
    return {
        "against": "bundled Gmail emulator (not Gmail)",
        "accepted_total": sum(copies.values()),
        "jobs": jobs,
    }


def _print_summary(out: TextIO, summary: dict[str, Any], settled: bool, as_json: bool) -> None:
    if as_json:
        print(json.dumps(summary, ensure_ascii=False, indent=2), file=out)
        return
    print("\nCopies per job, counted in the emulator's acceptance log:", file=out)
    print(
        output.table(summary["jobs"], ["key", "channel", "state", "attempts", "copies", "verdict"]),
        file=out,
    )
    confirmed = sum(1 for j in summary["jobs"] if j["state"] == "confirmed")
    review = [j for j in summary["jobs"] if j["state"] == "review"]
    print(
        f"\n{confirmed} confirmed, {len(review)} in review, "
        f"{summary['accepted_total']} messages accepted in all.",
        file=out,
    )
    for job in review:
        print(
            f"  review: {job['key']} ({job['reason']}); handle {job['message_id']}; "
            f"a human runs `sendledger review check {job['key']}`",
            file=out,
        )
    print(
        "\nThis ran against the bundled Gmail emulator, not Gmail: a green demo is not a "
        "Gmail guarantee.\nWatch a real ambiguous send reconcile against your own mailbox "
        "before trusting it.",
        file=out,
    )
    if not settled:
        print("Some jobs did not settle in time.", file=out)
