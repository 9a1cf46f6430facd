"""`sendledger demo`: the daemon on SQLite against the bundled Gmail emulator, with faults.

Everything runs on loopback in this process's threads: the emulator (with search index
lag), the fault relay in front of it, and the real daemon (APScheduler ticks, the real
google-api-python-client). The copies per job are counted in the emulator's acceptance
log, where the effects happen, not in the daemon.

`--provider smtp-imap` runs the same jobs on the smtp-imap provider against private Postfix
and Dovecot instances (`testkit.mailservers`), behind the SMTP fault relay; the copies are
counted in the sender's real Sent folder (Maildir files). Without the servers it exits 2
saying what is missing and how to install it.

`--provider graph` runs them on the Microsoft Graph provider against the bundled Graph
emulator, served over TLS from a throw-away CA (`testkit.tls`) that this process trusts
through REQUESTS_CA_BUNDLE (as an operator's would), with the TLS fault relay in front of
both the token endpoint and the API; the copies are counted in the emulator's acceptance
log (docs/providers.md "Providers").
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from daemon.bootstrap import bootstrap
from daemon.cli import output
from daemon.config.settings import load_settings
from daemon.exit_codes import EXIT_INTERRUPTED, bad_input
from daemon.logs import setup_logging
from daemon.runtime import Daemon
from daemon.service_layer.read_models import event_record
from daemon.tools.ctrl_c import CtrlC
from daemon.tools.demo_story import line, steps
from daemon.tools.work_folder import kept_folder, seconds_option
from ledger.application import Ledger
from ledger.content import parse_job
from ledger.display import command_line, printable
from ledger.job import JobState
from policies.loader import PolicySet, load_policy_dir
from testkit import FaultPlan, FaultRelay, GmailEmulator, Mode, write_service_account
from testkit.graph_emulator import DEFAULT_CLIENT_ID, DEFAULT_TENANT, GraphEmulator
from testkit.mailservers import PASSWORD, RECIPIENT, SENDER, MailServers, mail_servers
from testkit.mailservers import missing_reason as mailservers_missing
from testkit.smtp_relay import SmtpFaultRelay, SmtpMode
from testkit.tls import make_loopback_tls

POLICIES = {
    "receipts": """\
# Customer receipts: a missing mail is worse than a rare duplicate -> retry after misses.
provider = "{provider}"
from = "Shop Receipts <{receipts_from}>"
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
provider = "{provider}"
from = "Payouts <{payouts_from}>"
message_id_domain = "mail.shop.example"
on_unknown = "review"
irreversible = true
# How long a human's resend waits after the last attempt, for the index to show a copy.
search_after = "{search_after}"
max_attempts = 2
retry_backoff = "500ms"
retry_backoff_max = "3s"
# A payout a human resent is counted once more when the index has surely caught up.
verify_after = "{verify_after}"
""",
}

# The store and daemon both demos run with; each adds its one provider table.
BASE_CONFIG = """\
[store]
url = "sqlite:///ledger.sqlite"

[daemon]
tick = "250ms"
policies_dir = "policies"
concurrency = 4
deadline_grace = "1s"

"""

CONFIG = (
    BASE_CONFIG
    + """\
[providers.gmail]
kind = "gmail"
credentials_file = "service-account.json"
user = "shop@shop.example"
api_endpoint = "{relay}"
token_uri = "{emulator}/token"
timeout = "{timeout}"
"""
)

GRAPH_CONFIG = (
    BASE_CONFIG
    + """\
[providers.m365]
kind = "graph"
tenant_id = "{tenant}"
client_id = "{client}"
client_secret_file = "graph-client-secret"
user = "{{from}}"
authority = "{relay}"
api_endpoint = "{relay}/v1.0"
timeout = "{timeout}"
confirm_wait = "1s"
"""
)

# What the SMTP relay does at each end of DATA, in order; then every message passes.
SMTP_FAULTS: list[SmtpMode] = [
    "pass",
    "drop-response",
    "fail-before-forward",
    "pass",
    "hang",
    "drop-response",
    "pass",
    "fail-before-forward",
    "drop-response",
    "pass",
    "fail-before-forward",
    "drop-response",
]

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


@dataclass(frozen=True)
class _Wording:
    """What the summary says about where the copies were counted."""

    heading: str
    total: str
    closing: str


GMAIL_WORDING = _Wording(
    heading="Copies per job, counted in the emulator's acceptance log:",
    total="messages accepted in all",
    closing=(
        "\nThis ran against the bundled Gmail emulator, not Gmail: a green demo is not a "
        "Gmail guarantee.\nWatch a real ambiguous send reconcile against your own mailbox "
        "before trusting it."
    ),
)

GRAPH_WORDING = _Wording(
    heading="Copies per job, counted in the Graph emulator's acceptance log:",
    total="messages accepted in all",
    closing=(
        "\nThis ran against the bundled Microsoft Graph emulator, not Microsoft 365: a green "
        "demo is not a Microsoft guarantee.\nRun `sendledger probe` against your own mailbox "
        "before trusting it."
    ),
)

SMTP_WORDING = _Wording(
    heading="Copies per job, counted in the Maildir files of the sender's Sent folder:",
    total="copies in the Sent folder in all",
    closing=(
        "\nThis ran against local Postfix + Dovecot, which file every submitted message in "
        'Sent (sent_copy = "server").\nYour provider may not: run `sendledger probe` '
        "against your own mailbox before trusting it."
    ),
)


def register(sub: Any) -> None:
    p = sub.add_parser("demo", help="the daemon against the bundled Gmail emulator, with faults")
    p.add_argument(
        "--provider",
        choices=("gmail", "smtp-imap", "graph"),
        default="gmail",
        help="gmail: the bundled emulator; smtp-imap: private Postfix + Dovecot on loopback "
        "(installed, run as root); graph: the bundled Microsoft Graph emulator over TLS",
    )
    p.add_argument("--lag", help="the emulator's search index lag (gmail and graph; default 2s)")
    p.add_argument("--timeout", default="90s", help="give up waiting for jobs to settle")
    p.add_argument(
        "--keep",
        "--dir",
        dest="keep",
        metavar="DIR",
        help="the work folder, kept afterwards with its store and config so the commands the "
        "demo suggests can be run (default: a new folder in the temporary folder, kept too)",
    )
    p.add_argument("--json", action="store_true", help="print the final summary as JSON")
    p.set_defaults(func=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    limit = seconds_option("--timeout", args.timeout, 1.0, 86400.0)
    run: Callable[[Path, CtrlC], int]
    if args.provider == "smtp-imap":
        if args.lag is not None:
            raise bad_input("--lag: only with --provider gmail (Dovecot's search has no lag)")
        missing = mailservers_missing()
        if missing is not None:
            raise bad_input(
                f"--provider smtp-imap: local Postfix + Dovecot cannot run here: {missing}"
            )
        run = lambda folder, ctrl_c: _demo_smtp(folder, limit, args.json, ctrl_c)  # noqa: E731
    elif args.provider == "graph":
        lag = seconds_option("--lag", args.lag or "2s", 0.0, 600.0)
        run = lambda folder, ctrl_c: _demo_graph(folder, lag, limit, args.json, ctrl_c)  # noqa: E731
    else:
        lag = seconds_option("--lag", args.lag or "2s", 0.0, 600.0)
        run = lambda folder, ctrl_c: _demo(folder, lag, limit, args.json, ctrl_c)  # noqa: E731
    folder = kept_folder(args.keep, option="--keep", prefix="sendledger-demo-", what="a demo")
    ctrl_c = CtrlC()
    try:
        with ctrl_c:
            code = run(folder, ctrl_c)
            # A Ctrl-C noted after the demo's last wait (its daemon's stop at the end, the
            # summary): acted on too, not dropped with the handler (exit 130, not 0).
            ctrl_c.pause(0)
            return code
    except KeyboardInterrupt:
        # The daemon and then the emulator stopped with the demo's own `finally`s; what
        # the person still has is the folder, which the first lines named long ago.
        output.error(
            f"interrupted: the demo stopped; its work folder is kept: {folder} (the store "
            "ledger.sqlite, the config sendledger.toml and daemon.log)"
        )
        if ctrl_c.at_once:
            # Worker threads still in their calls would hold the interpreter's exit.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(EXIT_INTERRUPTED)
        return EXIT_INTERRUPTED


def _demo(folder: Path, lag: float, limit: float, as_json: bool, ctrl_c: CtrlC) -> int:
    # With --json, stdout carries the summary and nothing else; the running commentary
    # goes to stderr.
    out = sys.stderr if as_json else sys.stdout
    log_to_file(folder)
    accept_log = folder / "acceptance.jsonl"
    emulator = GmailEmulator(lag=lag, acceptance_log=accept_log).start()
    relay = FaultRelay(
        emulator.url, plan=FaultPlan(send=SEND_FAULTS), hang_seconds=4.0, retry_after=0.5
    ).start()
    try:
        write_service_account(folder / "service-account.json", token_uri=f"{emulator.url}/token")
        _write_emulator_policies(folder, "gmail", lag)
        (folder / "sendledger.toml").write_text(
            CONFIG.format(relay=relay.url, emulator=emulator.url, timeout="1500ms"),
            encoding="utf-8",
        )
        _intro(out, folder, emulator.url, relay.url, lag, "GMAIL EMULATOR, not Gmail")
        settled, ledger, operator, stories = _run_jobs(
            out, folder, limit, JOBS, index_wait=lag + 1.0, provider="Gmail", ctrl_c=ctrl_c
        )
        try:
            copies = Counter(entry.get("message_id") for entry in emulator.accepted())
            summary = _summary(ledger, copies, "bundled Gmail emulator (not Gmail)", operator)
            summary["stories"] = stories
        finally:
            ledger.close()
    finally:
        relay.stop()
        emulator.stop()
    return _finish(summary, settled, as_json, GMAIL_WORDING, folder, operator)


def _demo_smtp(folder: Path, limit: float, as_json: bool, ctrl_c: CtrlC) -> int:
    out = sys.stderr if as_json else sys.stdout
    log_to_file(folder)
    with (
        mail_servers() as servers,
        SmtpFaultRelay(
            "127.0.0.1", servers.smtp_port, modes=SMTP_FAULTS, hang_seconds=4.0
        ) as relay,
    ):
        # Dovecot indexes at delivery: the searches only wait for Postfix to file the copy.
        _write_policies(
            folder,
            provider="mail",
            receipts_from=SENDER,
            payouts_from=SENDER,
            search_after="1s",
            search_interval="500ms",
            verify_after="1500ms",
        )
        secret = folder / "mail-password"
        secret.touch(mode=0o600)  # never readable by others, not even for a moment
        secret.write_text(PASSWORD + "\n", encoding="utf-8")
        table = servers.config(Path("mail-password"), smtp_port=relay.port, timeout="1500ms")
        lines = [f"{key} = {json.dumps(value)}" for key, value in table.items()]
        (folder / "sendledger.toml").write_text(
            BASE_CONFIG + "[providers.mail]\n" + "\n".join(lines) + "\n", encoding="utf-8"
        )
        _intro_smtp(out, folder, servers, relay.port)
        # The servers deliver only to their own domain: every job goes to its one mailbox.
        jobs = [(c, k, _to_local(to), subject) for c, k, to, subject in JOBS]
        settled, ledger, operator, stories = _run_jobs(
            out, folder, limit, jobs, index_wait=1.0, provider="the SMTP server", ctrl_c=ctrl_c
        )
        try:
            servers.settle()  # a copy Postfix still has queued counts too
            summary = _summary(
                ledger,
                servers.message_ids(),
                "local Postfix + Dovecot (private instances)",
                operator,
            )
            summary["stories"] = stories
        finally:
            ledger.close()
    return _finish(summary, settled, as_json, SMTP_WORDING, folder, operator)


def _demo_graph(folder: Path, lag: float, limit: float, as_json: bool, ctrl_c: CtrlC) -> int:
    out = sys.stderr if as_json else sys.stdout
    log_to_file(folder)
    secret = "demo-" + os.urandom(12).hex()
    tls = make_loopback_tls(folder / "tls")
    with (
        _trusting(str(tls.ca_file)),
        GraphEmulator(
            tls=tls,
            lag=lag,
            file_delay=0.3,  # Graph files the copy in Sent Items after its 202
            acceptance_log=folder / "acceptance.jsonl",
            clients={DEFAULT_CLIENT_ID: secret},
        ) as emulator,
        FaultRelay(
            emulator.url,
            tls=tls,
            upstream_ca=str(tls.ca_file),
            plan=FaultPlan(send=SEND_FAULTS),
            hang_seconds=4.0,
            retry_after=0.5,
        ) as relay,
    ):
        secret_file = folder / "graph-client-secret"
        secret_file.touch(mode=0o600)  # never readable by others, not even for a moment
        secret_file.write_text(secret + "\n", encoding="utf-8")
        _write_emulator_policies(folder, "m365", lag)
        (folder / "sendledger.toml").write_text(
            GRAPH_CONFIG.format(
                tenant=DEFAULT_TENANT, client=DEFAULT_CLIENT_ID, relay=relay.url, timeout="2s"
            ),
            encoding="utf-8",
        )
        _intro(out, folder, emulator.url, relay.url, lag, "MICROSOFT GRAPH EMULATOR (TLS)")
        settled, ledger, operator, stories = _run_jobs(
            out, folder, limit, JOBS, index_wait=lag + 1.0, provider="Graph", ctrl_c=ctrl_c
        )
        try:
            ids = [ledger.get_job(key).message_id for _c, key, _t, _s in JOBS]
            copies = Counter({mid: emulator.copies(mid) for mid in ids})
            summary = _summary(
                ledger, copies, "bundled Microsoft Graph emulator (not Microsoft 365)", operator
            )
            summary["stories"] = stories
        finally:
            ledger.close()
    return _finish(summary, settled, as_json, GRAPH_WORDING, folder, operator)


@contextlib.contextmanager
def _trusting(ca_file: str) -> Iterator[None]:
    """The daemon in this process trusts the demo's throw-away CA as an operator's would:
    through REQUESTS_CA_BUNDLE (msal and the Graph calls read it), for the demo only."""
    before = os.environ.get("REQUESTS_CA_BUNDLE")
    os.environ["REQUESTS_CA_BUNDLE"] = ca_file
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("REQUESTS_CA_BUNDLE", None)
        else:
            os.environ["REQUESTS_CA_BUNDLE"] = before


def _to_local(to: str) -> str:
    name, _, _address = to.rpartition("<")
    return f"{name}<{RECIPIENT}>" if name else RECIPIENT


def _write_emulator_policies(folder: Path, provider: str, lag: float) -> None:
    """The channels on an emulator with search lag `lag`: searches wait out the lag with a
    margin; two empty ones are believed."""
    _write_policies(
        folder,
        provider=provider,
        receipts_from="receipts@shop.example",
        payouts_from="payouts@shop.example",
        search_after=f"{int((lag + 1.0) * 1000)}ms",
        search_interval="1s",
        verify_after=f"{int((lag + 1.5) * 1000)}ms",
    )


def _write_policies(folder: Path, **fields: str) -> None:
    (folder / "policies").mkdir(exist_ok=True)
    for name, text in POLICIES.items():
        (folder / "policies" / f"{name}.toml").write_text(text.format(**fields), encoding="utf-8")


def _submit(ledger: Ledger, policies: PolicySet, jobs: list[tuple[str, str, str, str]]) -> None:
    """The demo's jobs, each (channel, key, to, subject), in the store."""
    for channel, key, to, subject in jobs:
        content = parse_job(
            {
                "channel": channel,
                "key": key,
                "to": to,
                "subject": subject,
                "body": f"Hello,\n\n{subject}.\n\n-- sent by the sendledger demo\n",
            }
        )
        ledger.submit(content, policies[channel].sender)


def _run_jobs(
    out: TextIO,
    folder: Path,
    limit: float,
    jobs: list[tuple[str, str, str, str]],
    *,
    index_wait: float,
    provider: str,
    ctrl_c: CtrlC,
) -> tuple[bool, Ledger, dict[str, Any] | None, dict[str, list[str]]]:
    """Submit `jobs`, run the daemon until they settle (or `limit`), let the operator
    handle one job in review while the daemon still runs (searching no sooner than
    `index_wait` after the job's last step, as a policy's search_after would), and wait for
    the jobs to settle again; the open ledger, what the operator did, and each job's story
    as it was printed."""
    settings = load_settings(folder / "sendledger.toml")
    policies = load_policy_dir(settings.policies_dir, known_providers=settings.providers)
    ledger = Ledger(settings.store.url, base_dir=settings.base_dir)
    _submit(ledger, policies, jobs)
    # Said once it is true: a submit that fails leaves no claim of jobs that never were.
    print(
        f"\n{len(jobs)} jobs submitted. One line a job once it has settled: what was observed "
        "-> what the daemon did:\n",
        file=out,
    )
    ctrl_c.pause(0)  # a Ctrl-C while the jobs were written: no daemon to start
    service = bootstrap(settings, ledger=ledger, policy_loader=lambda: policies, policies=policies)
    daemon = Daemon(service, settings.daemon.tick)
    runner = threading.Thread(target=daemon.serve, name="daemon", daemon=True)
    runner.start()
    stopping = False
    try:
        started = time.monotonic()
        story = Story(out, ledger, provider, started)
        settled = _watch(out, ledger, limit, story, ctrl_c)
        operator = _operator_step(out, folder, ledger, index_wait, ctrl_c) if settled else None
        if operator is not None:
            # Resolved as sent, the job has settled already; resent, it settles again:
            # either way its second line tells what the human did and what followed.
            left = max(1.0, limit - (time.monotonic() - started))
            settled = _watch(out, ledger, left, story, ctrl_c)
        stopping = True
        daemon.request_stop()
        _join_at_the_end(runner, ctrl_c)
    except BaseException:
        # The daemon is stopped before the emulator it calls (the callers' `finally`s),
        # whatever ended the demo: its calls in flight end and are recorded.
        print("\nstopping the daemon: its calls in flight finish (Ctrl-C again: at once)",
              file=sys.stderr, flush=True)  # fmt: skip
        _stop_daemon(daemon, runner, ctrl_c, requested=stopping)
        ledger.close()
        raise
    return settled, ledger, operator, story.told


#: How long the demo's end waits for its daemon's stop (its calls settled by then).
END_JOIN_SECONDS = 30.0


def _join_at_the_end(runner: threading.Thread, ctrl_c: CtrlC) -> None:
    """Wait for the daemon's thread, asked to stop once every job settled, at most
    `END_JOIN_SECONDS`; a Ctrl-C meanwhile raises KeyboardInterrupt (the stop already
    asked: a second request would end it at once, without its calls in flight)."""
    ends = time.monotonic() + END_JOIN_SECONDS
    while runner.is_alive() and time.monotonic() < ends:
        runner.join(0.05)
        ctrl_c.pause(0)


def _stop_daemon(
    daemon: Daemon, runner: threading.Thread, ctrl_c: CtrlC, *, requested: bool = False
) -> None:
    """Stop the daemon as SIGTERM stops `run` (docs/operations.md "Stopping"): its calls in
    flight finish and are recorded, at most `daemon.stop_timeout`, past which it stops
    without them by itself; a second Ctrl-C meanwhile ends the demo at once. Either way
    without them: KeyboardInterrupt, with the at_once flag of `ctrl_c` set. `requested`:
    the stop was asked already (the demo's end), and a second request is the daemon's
    "at once"."""
    if not requested:
        daemon.request_stop()
    while runner.is_alive():
        runner.join(0.05)
        try:
            ctrl_c.pause(0)
        except KeyboardInterrupt:
            ctrl_c.at_once = True
            raise
    if daemon.abandoned:
        ctrl_c.at_once = True
        raise KeyboardInterrupt


class Story:
    """Each job's line, printed once it has settled (docs/operations.md "What the demo
    shows"): what was observed and what was done, from its events
    (`daemon/tools/demo_story.py`). A job that moves again (a human's resend) gets a
    second line for what came after."""

    def __init__(self, out: TextIO, ledger: Ledger, provider: str, started: float) -> None:
        self.out, self.ledger, self.provider, self.started = out, ledger, provider, started
        self.told: dict[str, list[str]] = {}
        self._seen: dict[str, int] = {}

    def moved(self, key: str, version: int) -> bool:
        """Whether the job has events not yet told."""
        return self._seen.get(key, 0) != version

    def tell(self, key: str) -> None:
        records = [event_record(event) for event in self.ledger.history(key)]
        new = records[self._seen.get(key, 0) :]
        self._seen[key] = len(records)
        parts = steps(new, self.provider)
        if not parts:
            return
        lines = self.told.setdefault(key, [])
        text = ("then: " if lines else "") + line(parts)
        lines.append(text)
        elapsed = time.monotonic() - self.started
        print(f"  t={elapsed:5.1f}s  {printable(key):<20} {text}", file=self.out, flush=True)


OPERATOR = "demo-operator"


def log_to_file(folder: Path) -> Path:
    """The daemon's log lines go to `daemon.log` in the work folder, not into the story
    (docs/operations.md "What the demo shows")."""
    path = folder / "daemon.log"
    setup_logging("info", journal=False, stream=path.open("a", encoding="utf-8"))
    return path


def _cli(folder: Path, *args: str) -> tuple[int, str]:
    """One `sendledger` command on the demo's config, in this process: its exit code and
    what it printed (stdout and its one-line errors)."""
    from daemon.cli import main

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
        code = main(["--config", str(folder / "sendledger.toml"), *args])
    return code, buffer.getvalue()


def _operator_step(
    out: TextIO, folder: Path, ledger: Ledger, index_wait: float, ctrl_c: CtrlC
) -> dict[str, Any] | None:
    """What a human does with the first job in review: `review check` (a search of the
    sender's mailbox now), then `review resolve` by what the search found: one copy is
    `sent`, none (the index has long caught up) is `resend`, two or more are left for a
    closer look. None when no job is in review."""
    keys = [key for _c, key, _t, _s in JOBS if ledger.get_job(key).state is JobState.REVIEW]
    if not keys:
        return None
    key = keys[0]
    # An empty search before the index has caught up proves nothing: wait as long as the
    # daemon's own searches would.
    last_step = ledger.history(key)[-1].timestamp
    ctrl_c.pause(max(0.0, index_wait - (ledger.clock() - last_step).total_seconds()))
    print(f"\nA human takes {key} out of review ({ledger.get_job(key).reason}):", file=out)
    print(f"  $ {command_line('sendledger', 'review', 'check', key, '--by', OPERATOR)}", file=out)
    code, text = _cli(folder, "review", "check", key, "--json", "--by", OPERATOR)
    if code != 0:
        print(f"    {text.strip()}", file=out)
        return {"key": key, "check": None, "decision": None}
    hits = json.loads(text)["hits"]
    print(
        f"    {len(hits)} SENT cop{'y' if len(hits) == 1 else 'ies'} found for "
        f"{json.loads(text)['message_id']}",
        file=out,
    )
    for hit in hits:
        print(f"    {hit['provider_message_id']}  {','.join(hit['labels'])}", file=out)
    if len(hits) > 1:
        print("    two or more: a duplicate, left in review for a closer look", file=out)
        return {"key": key, "check": len(hits), "decision": None}
    decision = "sent" if hits else "resend"
    note = f"review check found {len(hits)} cop{'y' if len(hits) == 1 else 'ies'}"
    resolve = ["review", "resolve", key, "--as", decision, "--note", note, "--by", OPERATOR]
    print(f"  $ {command_line('sendledger', *resolve)}", file=out)
    code, text = _cli(folder, *resolve)
    print(f"    {text.strip()}", file=out)
    if code == 3 and decision == "resend" and "resolve as sent" in text:
        # The resend searched again first and found the copy the check had not seen yet
        # (docs/review.md "Review"): nothing was sent; the human resolves it as sent.
        decision = "sent"
        resolve = ["review", "resolve", key, "--as", "sent", "--note",
                   "the resend's own search found the copy", "--by", OPERATOR]  # fmt: skip
        print(f"  $ {command_line('sendledger', *resolve)}", file=out)
        code, text = _cli(folder, *resolve)
        print(f"    {text.strip()}", file=out)
    return {"key": key, "check": len(hits), "decision": decision if code == 0 else None}


def _finish(
    summary: dict[str, Any],
    settled: bool,
    as_json: bool,
    wording: _Wording,
    folder: Path,
    operator: dict[str, Any] | None,
) -> int:
    summary["folder"] = str(folder)
    summary["operator"] = operator
    summary["commands"] = _suggestions(folder, summary["jobs"])
    _print_summary(sys.stdout, summary, settled, as_json, wording)
    problems = [row for row in summary["jobs"] if row["verdict"] != "ok"]
    return 0 if settled and not problems else 1


def _intro(out: TextIO, folder: Path, emulator: str, relay: str, lag: float, what: str) -> None:
    print(f"sendledger demo — against the BUNDLED {what}", file=out)
    print(f"  work folder   {folder}", file=out)
    print(f"  emulator      {emulator}  (search index lag {lag:g}s)", file=out)
    print(f"  fault relay   {relay}  (send faults, in order: {', '.join(SEND_FAULTS)})", file=out)
    _intro_end(out, folder)


def _intro_end(out: TextIO, folder: Path) -> None:
    print("  channels      receipts: on_unknown=retry   payouts: irreversible, review", file=out)
    print(f"  log           {folder / 'daemon.log'}  (the daemon's own lines)", file=out)


def _intro_smtp(out: TextIO, folder: Path, servers: MailServers, relay_port: int) -> None:
    print("sendledger demo — against LOCAL POSTFIX + DOVECOT (private instances)", file=out)
    print(f"  work folder   {folder}", file=out)
    print(
        f"  servers       Postfix submission 127.0.0.1:{servers.smtp_port}, "
        f"Dovecot IMAP 127.0.0.1:{servers.imap_port}, files in {servers.root}",
        file=out,
    )
    print(
        f"  fault relay   127.0.0.1:{relay_port}  (SMTP faults at the end of DATA, in order: "
        f"{', '.join(SMTP_FAULTS)})",
        file=out,
    )
    print(f"  sender        {SENDER}", file=out)
    _intro_end(out, folder)


def _watch(out: TextIO, ledger: Ledger, limit: float, story: Story, ctrl_c: CtrlC) -> bool:
    """Tell each job's story as it settles, until all have (True) or `limit` passes
    (False); a job told before is told again only when it has moved on."""
    started = time.monotonic()
    while True:
        open_keys = []
        for _channel, key, _to, _subject in JOBS:
            job = ledger.get_job(key)
            if job.state in _SETTLED and not job.verifying:
                if story.moved(key, job.version):
                    story.tell(key)
            else:
                open_keys.append(key)
        if not open_keys:
            return True
        if time.monotonic() - started > limit:
            print(f"\n  gave up after {limit:g}s with jobs still open", file=out)
            return False
        ctrl_c.pause(0.25)


_SETTLED = {JobState.CONFIRMED, JobState.REVIEW, JobState.ABANDONED}


def _summary(
    ledger: Ledger, copies: Counter[Any], against: str, operator: dict[str, Any] | None
) -> dict[str, Any]:
    """Each job's state against the copies counted where the effects happen, and who
    settled it: the daemon, or the daemon after a human's decision."""
    jobs = []
    human = {operator["key"]: operator["decision"]} if operator and operator["decision"] else {}
    for channel, key, _to, _subject in JOBS:
        job = ledger.get_job(key)
        count = copies.get(job.message_id, 0)
        if job.state is JobState.CONFIRMED:
            verdict = "ok" if count == 1 else f"WRONG: {count} copies"
            outcome = {
                "sent": "confirmed by a human",
                "resend": "confirmed, resent by a human",
            }.get(human.get(key, ""), "confirmed")
        elif job.state is JobState.REVIEW:
            # A human gets the Message-ID; the daemon must not have sent it twice.
            verdict = "ok" if count <= 1 else f"WRONG: {count} copies"
            outcome = "WAITING FOR A HUMAN"
        else:
            verdict = "ok" if count == 0 else f"{count} copies"
            outcome = job.state.value
        jobs.append(
            {
                "key": key,
                "channel": channel,
                "state": job.state.value,
                "copies": count,
                "attempts": job.attempts,
                "reason": job.reason,
                "message_id": job.message_id,
                "outcome": outcome,
                "verdict": verdict,
            }
        )
    return {
        "against": against,
        "accepted_total": sum(copies.values()),
        "jobs": jobs,
    }


def _suggestions(folder: Path, jobs: list[dict[str, Any]]) -> list[str]:
    """Commands that work on the kept folder after the demo has exited: they read or
    change the store only (a `review check` searches the mailbox, and the demo's provider
    stops with the demo)."""
    from daemon.cli.init_command import console_command

    base = command_line(*console_command(), "--config", str(folder / "sendledger.toml"))
    waiting = [j["key"] for j in jobs if j["state"] == "review"]
    resent = [j["key"] for j in jobs if j["state"] == "confirmed" and j["attempts"] > 1]
    commands = [f"{base} review list", f"{base} audit --format table"]
    if resent:
        commands.append(f"{base} {command_line('history', resent[0])}")
    # `review show` prints the job's history and the commands a human would run next.
    commands += [f"{base} {command_line('review', 'show', key)}" for key in waiting[:1]]
    return commands


def _print_summary(
    out: TextIO, summary: dict[str, Any], settled: bool, as_json: bool, wording: _Wording
) -> None:
    if as_json:
        print(json.dumps(summary, ensure_ascii=False, indent=2), file=out)
        return
    print(f"\n{wording.heading}", file=out)
    print(
        output.table(
            summary["jobs"], ["key", "channel", "state", "attempts", "copies", "outcome", "verdict"]
        ),
        file=out,
    )
    outcomes = Counter(j["outcome"] for j in summary["jobs"])
    by_human = outcomes["confirmed by a human"] + outcomes["confirmed, resent by a human"]
    print(
        f"\n{outcomes['confirmed']} confirmed by the daemon alone, {by_human} after a "
        f"human's decision, {outcomes['WAITING FOR A HUMAN']} waiting for a human; "
        f"{summary['accepted_total']} {wording.total}.\nVERDICT ok: the copies counted agree "
        "with the state (one for a confirmed job, at most one for a job in review).",
        file=out,
    )
    for job in summary["jobs"]:
        if job["state"] == "review":
            print(
                f"  waiting: {printable(job['key'])} ({job['reason']}), "
                f"Message-ID {job['message_id']}",
                file=out,
            )
    print(wording.closing, file=out)
    if not settled:
        print("Some jobs did not settle in time.", file=out)
    print(
        f"\nThe work folder is kept: {summary['folder']}\n(the store ledger.sqlite, the "
        "config sendledger.toml, policies/). These commands read what the demo left\n"
        "(`review check` searches the mailbox: its provider stopped with the demo):",
        file=out,
    )
    for command in summary["commands"]:
        print(f"  {command}", file=out)
