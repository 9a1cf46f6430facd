"""`sendledger try`: a look before a real mailbox, in one command (README "Try it").

In this process's threads: the bundled Gmail emulator, a fault relay in front of it (its
first three sends meet a lost answer or a refused request, so three jobs land in review
and the page has something to show), and the real daemon with its HTTP API and review
page. The folder is what `sendledger init --emulator` writes (config, policies, an API
token, a first job), kept afterwards; the daemon's log lines go to `daemon.log` in it.
It prints the page's URL, the token, a curl line and a `sendledger submit` line that work
as printed, then runs until Ctrl-C (a second Ctrl-C stops at once).
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from daemon.bootstrap import bootstrap
from daemon.cli.init_command import (
    FIRST_KEY,
    REVIEW_CHANNEL,
    Emulated,
    installation,
    planned_files,
    write_all,
)
from daemon.config.settings import load_settings
from daemon.exit_codes import bad_input
from daemon.from_settings import load_policies, open_ledger
from daemon.logs import setup_logging
from daemon.runtime import Daemon
from daemon.tools.ctrl_c import ours
from daemon.tools.work_folder import kept_folder, seconds_option
from daemon.wakeup import WakeUp
from ledger.addresses import parse_mailbox
from ledger.application import Ledger
from ledger.content import parse_job
from ledger.display import command_line
from ledger.vocabulary import JobState
from testkit import FaultPlan, FaultRelay, GmailEmulator, Mode, write_service_account

MAILBOX = "support@example.com"
DEFAULT_PORT = 8025
#: What the relay does to the first sends (the review channel's jobs, sent first), then
#: every send passes: two answers lost after Gmail took the message, one request dropped
#: before it reached Gmail. The daemon cannot tell these apart: all three are unknown
#: outcomes, and the review channel hands each to a human.
FIRST_SENDS: list[Mode] = ["drop-response", "drop-response", "fail-before-forward"]
REVIEW_KEYS = ("try-payout-1", "try-payout-2", "try-payout-3")
CONFIRMED_KEYS = ("try-receipt-1", "try-receipt-2")


def register(sub: Any) -> None:
    p = sub.add_parser(
        "try",
        help="the daemon, its API and the review page against the bundled Gmail emulator, "
        "until Ctrl-C: a look before a real mailbox",
        description="Start the bundled Gmail emulator, the daemon and its HTTP API with the "
        "review page on a folder that is kept, put three jobs in review, and print the page's "
        "URL, a token, and a curl and a `sendledger submit` line that work as printed. "
        "Ctrl-C stops it.",
    )
    p.add_argument(
        "--dir",
        metavar="DIR",
        help="the folder (created; default: a new one in the temporary folder); it is kept",
    )
    p.add_argument(
        "--port",
        type=int,
        default=DEFAULT_PORT,
        help=f"the API's port on 127.0.0.1 (default {DEFAULT_PORT}, another free one when "
        "it is taken; 0: a free one)",
    )
    p.add_argument("--lag", default="2s", help="the emulator's search index lag (default 2s)")
    p.set_defaults(func=cmd_try)


def cmd_try(args: argparse.Namespace) -> int:
    lag = seconds_option("--lag", args.lag, 0.0, 60.0)
    if not 0 <= args.port < 65536:
        raise bad_input(f"--port: from 1 to 65535, or 0 for a free one, got {args.port}")
    folder = kept_folder(args.dir, option="--dir", prefix="sendledger-try-", what="a try")
    return _run(folder, lag, _port(args.port), sys.stdout)


def _port(wanted: int) -> int:
    """`wanted` when it is free; the default port when taken gives way to a free one."""
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", wanted))
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE or wanted != DEFAULT_PORT:
                raise bad_input(f"--port: 127.0.0.1:{wanted}: {exc.strerror}") from None
            sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _run(folder: Path, lag: float, port: int, out: TextIO) -> int:
    log_file = (folder / "daemon.log").open("a", encoding="utf-8")
    setup_logging("info", journal=False, stream=log_file)
    wake = WakeUp()
    for signum in (signal.SIGINT, signal.SIGTERM):
        if ours(signum):  # one its starter ignores stays ignored, as in the demo
            signal.signal(signum, lambda signum, _frame: wake.post(signum))
    emulator = GmailEmulator(lag=lag, acceptance_log=folder / "accepted.jsonl").start()
    relay = FaultRelay(emulator.url, plan=FaultPlan(send=list(FIRST_SENDS))).start()
    try:
        token = _write_folder(folder, emulator, relay, lag, port)
        settings = load_settings(folder / "sendledger.toml")
        policies = load_policies(settings)
        with open_ledger(settings) as ledger:
            service = bootstrap(
                settings, ledger=ledger, policy_loader=lambda: load_policies(settings),
                policies=policies,
            )  # fmt: skip
            daemon = Daemon(service, settings.daemon.tick)
            runner = threading.Thread(target=daemon.serve, name="daemon", daemon=True)
            runner.start()
            print(_intro(folder, emulator.url, lag), file=out, flush=True)
            # A Ctrl-C (or SIGTERM) while the page's jobs settle stops it there.
            stopped = _jobs_for_the_page(ledger, policies, emulator, out, wake)
            if stopped is None:
                print(_how_to_use(folder, port, token), file=out, flush=True)
            asked = _until_stopped(wake, runner) if stopped is None else stopped
            print("\nstopping: the daemon finishes its calls in flight ...", file=out, flush=True)
            daemon.request_stop()
            while runner.is_alive():
                if any(code in (signal.SIGINT, signal.SIGTERM) for code in wake.wait(0.2)):
                    print("stopped at once (Ctrl-C again)", file=out, flush=True)
                    os._exit(130)
    finally:
        relay.stop()
        emulator.stop()
        log_file.close()
    print(_goodbye(folder), file=out, flush=True)
    return 130 if asked == signal.SIGINT else 0


def _write_folder(
    folder: Path, emulator: GmailEmulator, relay: FaultRelay, lag: float, port: int
) -> str:
    """What `init --emulator` writes (no systemd unit: this is not a service), pointed at
    the relay; the emulator's throw-away credentials. The API token."""
    emulated = Emulated(
        api_endpoint=relay.url,
        token_uri=emulator.token_uri,
        search_after=f"{int((lag + 2.0) * 1000)}ms",
        listen=f"127.0.0.1:{port}",
    )
    plan = planned_files("gmail", parse_mailbox(MAILBOX), installation(folder), emulated)
    write_all(folder, [p for p in plan if p.path != "sendledger.service"])
    write_service_account(folder / "gmail-service-account.json", token_uri=emulator.token_uri)
    line = (folder / "api-tokens").read_text(encoding="utf-8").strip()
    return line.split(":", 1)[1]


def _intro(folder: Path, emulator: str, lag: float) -> str:
    return "\n".join(
        [
            "sendledger try — the daemon, its HTTP API and the review page against the "
            "BUNDLED GMAIL EMULATOR, not Gmail",
            f"  folder     {folder}  (kept: config, policies, store, api-tokens)",
            f"  emulator   {emulator}  (search index lag {lag:g}s)",
            f"  log        {folder / 'daemon.log'}  (the daemon's own lines)",
            "",
            f'Three jobs on the {REVIEW_CHANNEL!r} channel (on_unknown = "review"): the fault '
            "relay loses the answer",
            "to the first two sends (the emulator has their copies) and drops the third before "
            "it arrives.",
        ]
    )


def _jobs_for_the_page(
    ledger: Ledger, policies: Any, emulator: GmailEmulator, out: TextIO, wake: WakeUp
) -> int | None:
    """Three jobs in review (their sends meet FIRST_SENDS), one of them with a second copy
    in the mailbox, as if sent twice; then two that are simply confirmed. The stop signal
    that came while they settled (seconds: searched after `--lag` and 2 s), if one did."""
    for key in REVIEW_KEYS:
        _submit(
            ledger,
            policies,
            REVIEW_CHANNEL,
            key,
            f"Payout {key[-1]} of €{40 * int(key[-1])}.00 sent",
        )
    stopped = _wait(lambda: all(_state(ledger, k) is JobState.REVIEW for k in REVIEW_KEYS), wake)
    if stopped is not None:
        return stopped
    copied = [k for k in REVIEW_KEYS if emulator.copies(ledger.get_job(k).message_id)]
    twice = copied[0] if copied else None
    if twice is not None:
        job = ledger.get_job(twice)
        emulator.inject(_copy(job.message_id, job.content.subject), user=MAILBOX)
    for key in REVIEW_KEYS:
        copies = emulator.copies(ledger.get_job(key).message_id)
        said = {0: "none arrived", 1: "one copy arrived"}.get(copies, f"{copies} copies arrived")
        print(f"  {key}  in review, outcome unknown to the daemon ({said})", file=out)
    for key in CONFIRMED_KEYS:
        _submit(ledger, policies, "receipts", key, f"Your receipt {key[-1]}")
    stopped = _wait(
        lambda: all(_state(ledger, k) is JobState.CONFIRMED for k in CONFIRMED_KEYS), wake
    )
    if stopped is not None:
        return stopped
    for key in CONFIRMED_KEYS:
        print(f"  {key} confirmed (one copy, sent once)", file=out)
    return None


def _submit(ledger: Ledger, policies: Any, channel: str, key: str, subject: str) -> None:
    data = {"channel": channel, "key": key, "to": "customer@example.com",
            "subject": subject, "body": f"{subject}\n\n-- sent by sendledger try\n"}  # fmt: skip
    ledger.submit(parse_job(data), policies[channel].sender)


def _copy(message_id: str, subject: str) -> bytes:
    return (
        f"From: Support <{MAILBOX}>\r\nTo: customer@example.com\r\nSubject: {subject}\r\n"
        f"Date: Tue, 01 Dec 2026 09:00:00 +0000\r\nMessage-ID: {message_id}\r\n\r\nAgain.\r\n"
    ).encode()


def _state(ledger: Ledger, key: str) -> JobState | None:
    row = ledger.row(key)
    return JobState(row.state) if row else None


def _wait(done: Callable[[], bool], wake: WakeUp, limit: float = 60.0) -> int | None:
    """Until `done`: None; or the stop signal (SIGINT, SIGTERM) that came first."""
    deadline = time.monotonic() + limit
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError(f"the jobs did not settle within {limit:g}s (see daemon.log)")
        for code in wake.wait(0.1):
            if code in (signal.SIGINT, signal.SIGTERM):
                return code
    return None


def _how_to_use(folder: Path, port: int, token: str) -> str:
    from daemon.cli.init_command import console_command

    url = f"http://127.0.0.1:{port}"
    base = [*console_command(), "--config", str(folder / "sendledger.toml")]
    job = {"channel": "receipts", "key": "try-curl-1", "to": "customer@example.com",
           "subject": "Hello from curl", "body": "Sent with sendledger try.\n"}  # fmt: skip
    curl = command_line(
        "curl", "-sS", "-X", "POST", f"{url}/v1/jobs",
        "-H", f"Authorization: Bearer {token}", "-H", "Content-Type: application/json",
        "-d", json.dumps(job),
    )  # fmt: skip
    submit = command_line(*base, "submit", str(folder / "first-job.json"))
    status = command_line(*base, "status", FIRST_KEY)
    review = command_line(*base, "review", "list")
    return "\n".join(
        [
            "",
            "Ready. Open the review page and sign in with the token:",
            f"  review page  {url}/ui/",
            f"  token        {token}",
            "",
            "Submit a job over HTTP:",
            f"  $ {curl}",
            "or from the command line (then its state: confirmed):",
            f"  $ {submit}",
            f"  $ {status}",
            f"  $ {review}",
            "",
            "Ctrl-C stops (the folder is kept). To send for real: `sendledger init DIR` and "
            "the README's quick start.",
        ]
    )


def _until_stopped(wake: WakeUp, runner: threading.Thread) -> int:
    while True:
        for code in wake.wait(1.0):
            if code in (signal.SIGINT, signal.SIGTERM):
                return code
        if not runner.is_alive():
            return signal.SIGTERM  # the daemon stopped on its own: see daemon.log


def _goodbye(folder: Path) -> str:
    from daemon.cli.init_command import console_command

    base = command_line(*console_command(), "--config", str(folder / "sendledger.toml"))
    return (
        f"stopped. The folder is kept: {folder}\n"
        f"  {base} review list     (its store, read without the emulator)\n"
        f"  {base} audit --format table"
    )


__all__ = ["register"]
