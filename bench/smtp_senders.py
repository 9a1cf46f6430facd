"""The SMTP path side by side (issue 31): the same messages into the same local sink, in one
run, from

  loop          a bare smtplib loop on one connection (the messages rendered before its
                clock starts, by sendledger's own writer, so the bytes are the daemon's);
  loop-auth     the same loop with a connection and a login per message;
  durable-loop  the one-connection loop plus one fsync'd SQLite commit per message before
                its send (bench/write_ahead.py): the least a write-ahead sender must do;
  post-office   django-post_office's `send_queued_mail_until_done` (what its
                `send_queued_mail` command runs), one process, its defaults (a batch of 100,
                5 threads, a log row per sent mail), Django's SMTP backend, on SQLite;
  sendledger    the engine with `kind = "smtp-imap"`, ticking back to back until every job
                is confirmed (concurrency 4, the default), on SQLite and on PostgreSQL; the
                jobs taken through the intake, as `sendledger submit` and the API take
                them (`--proved-at-claim` adds a run with them written straight to the
                store, whose claims prove each message again; `--gather-variants`
                two with the commits gathering every send worker's claim and only the
                claims on their way, whatever the load average that decides otherwise).

Each sender runs in a process of its own and the sink (bench/smtp_sink.py, aiosmtpd) in
another, so a sender's CPU time is its own; messages/s and CPU ms per message are over the
sending alone (queueing the jobs or emails is before the clock). Every copy is counted at
the sink: each message exactly once in every run, or the script exits 1. Median of
`--rounds`; the senders alternate within a round.

`--kill`: each sender (as a process: the loop, `send_queued_mail`, `sendledger run`) is
killed with SIGKILL when half of its messages have reached the sink, restarted, and run to
the end; the table is copies per message at the sink. For sendledger the sink files every
accepted message in the sender's sent folder of a private Dovecot (`testkit.mailservers`),
as a server with `sent_copy = "server"` does, so its search after the restart can count.

Needs the bench extra (`pip install -e '.[bench]'`, which `make bench` installs):
django-post_office, Django and aiosmtpd. PostgreSQL: SENDLEDGER_TEST_PG_URL when it
answers, else a private cluster (tests/pg_cluster.py) when the server binaries are here.

    .venv/bin/python bench/smtp_senders.py [--n 2000] [--rounds 3] [--attachment-kb 20]
        [--only loop,loop-auth,durable-loop,post-office,sendledger] [--no-postgres] [--kill]
        [--breakdown] [--proved-at-claim] [--gather-variants]
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import importlib.util
import json
import logging
import multiprocessing
import os
import re
import signal
import smtplib
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from smtp_sink import Sink, receive, round_trip, sink_process
from write_ahead import WriteAhead

#: The modules of pyproject.toml's `bench` extra: the sink and django-post_office.
BENCH_EXTRA = ("aiosmtpd", "django", "post_office")
SENDER = "sender@example.test"
DOMAIN = "example.test"
PASSWORD = "s3cret-test-password"  # testkit.mailservers' (Dovecot's passwd-file)
RECIPIENT = "Alice <alice@example.test>"
BODY_LINE = "Thanks for your order {i}: it ships within two working days from our store.\n"
#: About 2 KB a message with its headers (issue 31's size).
BODY_LINES = 22
POST_OFFICE_GOAL = 1.0  # sendledger on SQLite at least post_office's messages/s
LOOP_MOONSHOT = 0.7  # within 0.7x of the one-connection loop


# -- the messages ------------------------------------------------------------------------


def documents(n: int, prefix: str, attachment_kb: int) -> list[dict[str, Any]]:
    """Job JSON (docs/cli.md "Message fields"): the same to, subject, body, attachment for
    every sender."""
    attachment = []
    if attachment_kb:
        data = bytes((i * 7 + 3) % 256 for i in range(attachment_kb * 1024))
        attachment = [
            {
                "filename": "invoice.pdf",
                "content_type": "application/pdf",
                "content_base64": base64.b64encode(data).decode("ascii"),
            }
        ]
    return [
        {
            "channel": "receipts",
            "key": f"{prefix}-{i:06d}",
            "to": RECIPIENT,
            "subject": f"Your receipt {i}",
            "body": "".join(BODY_LINE.format(i=i) for _ in range(BODY_LINES)),
            "attachments": attachment,
        }
        for i in range(n)
    ]


def policy_table() -> dict[str, Any]:
    return {
        "channel": "receipts",
        "provider": "mail",
        "from": f"Support <{SENDER}>",
        "message_id_domain": "mail.example.test",
        "on_unknown": "retry",
        "search_after": "1s",
        "search_interval": "1s",
        "confirm_misses": 1,
        "verify_after": "1s",
    }


def rendered(docs: list[dict[str, Any]]) -> list[tuple[str, bytes]]:
    """(Message-ID, bytes) of each job exactly as the daemon renders it."""
    from ledger.application import Ledger
    from ledger.content import parse_job
    from ledger.message import render
    from policies.model import ChannelPolicy

    policy = ChannelPolicy.model_validate(policy_table())
    ledger = Ledger(f"memory://render-{uuid.uuid4().hex}")
    out = []
    for doc in docs:
        result = ledger.submit(parse_job(doc), policy.sender)
        out.append((result.message_id, render(ledger.get_job(doc["key"]))))
    return out


# -- the senders, each in a process of its own -----------------------------------------


@dataclass
class Run:
    sender: str
    store: str
    n: int
    seconds: float
    cpu: float
    message_ids: list[str]
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.n / self.seconds

    @property
    def cpu_ms(self) -> float:
        return self.cpu * 1000 / self.n


def _timed(work: Callable[[], Any]) -> tuple[float, float, Any]:
    wall, cpu = time.perf_counter(), time.process_time()
    result = work()
    return time.perf_counter() - wall, time.process_time() - cpu, result


def run_loop(
    port: int, docs: list[dict[str, Any]], per_message_login: bool, durable: bool = False
) -> dict[str, Any]:
    """The bare smtplib loop; `durable`: with a `WriteAhead` commit before each send."""
    from ledger.message import Envelope

    messages = [(mid, raw, Envelope(raw).recipients) for mid, raw in rendered(docs)]

    def send_all(record: WriteAhead | None) -> None:
        smtp: smtplib.SMTP | None = None
        for mid, raw, recipients in messages:
            if smtp is None:
                smtp = smtplib.SMTP("127.0.0.1", port, timeout=30)
                smtp.login(SENDER, PASSWORD)
            if record is not None:
                record.claim(mid)
            smtp.sendmail(SENDER, recipients, raw)
            if record is not None:
                record.sent(mid)
            if per_message_login:
                smtp.quit()
                smtp = None
        if smtp is not None:
            smtp.quit()
        if record is not None:
            record.close()

    with tempfile.TemporaryDirectory(prefix="sendledger-bench-wal-") as folder:
        record = WriteAhead(Path(folder) / "sends.sqlite") if durable else None
        seconds, cpu, _ = _timed(lambda: send_all(record))
    return {"seconds": seconds, "cpu": cpu, "message_ids": [m for m, _, _ in messages]}


def django_settings(folder: Path, port: int) -> None:
    import django
    from django.conf import settings

    settings.configure(
        DATABASES={
            "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": str(folder / "po.sqlite")}
        },
        INSTALLED_APPS=["post_office"],
        # Where post_office stores attachment files: the run's folder, not the working one.
        MEDIA_ROOT=str(folder),
        # post_office renders every subject and body as a template, even without context.
        TEMPLATES=[{"BACKEND": "django.template.backends.django.DjangoTemplates"}],
        EMAIL_BACKEND="django.core.mail.backends.smtp.EmailBackend",
        EMAIL_HOST="127.0.0.1",
        EMAIL_PORT=port,
        EMAIL_HOST_USER=SENDER,
        EMAIL_HOST_PASSWORD=PASSWORD,
        EMAIL_USE_TLS=False,
        DEFAULT_FROM_EMAIL=f"Support <{SENDER}>",
        USE_TZ=True,
        POST_OFFICE={"DEFAULT_PRIORITY": "medium"},
        LOGGING_CONFIG=None,
    )
    django.setup()
    # Its INFO lines per batch on stderr; the Log rows it writes per mail are kept (default).
    logging.getLogger("post_office").setLevel(logging.WARNING)


def post_office_queue(
    folder: Path, port: int, docs: list[dict[str, Any]]
) -> tuple[list[str], float]:
    """The emails queued in post_office's tables, our Message-IDs in their headers; and the
    CPU seconds the queueing took (`mail.send` of each, Django's setup not counted)."""
    django_settings(folder, port)
    from django.core.files.base import ContentFile
    from django.core.management import call_command
    from post_office import mail

    call_command("migrate", verbosity=0)
    ids = []
    started = time.process_time()
    for doc in docs:
        message_id = f"<{doc['key']}@post-office.example.test>"
        attachments = {
            a["filename"]: ContentFile(base64.b64decode(a["content_base64"]))
            for a in doc["attachments"]
        }
        mail.send(
            [doc["to"]],
            f"Support <{SENDER}>",
            subject=doc["subject"],
            message=doc["body"],
            headers={"Message-ID": message_id},
            attachments=attachments or None,
        )
        ids.append(message_id)
    return ids, time.process_time() - started


def post_office_send(folder: Path) -> None:
    from post_office.mail import send_queued_mail_until_done

    send_queued_mail_until_done(lockfile=str(folder / "post_office"), processes=1)


def run_post_office(port: int, docs: list[dict[str, Any]]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="sendledger-bench-po-") as name:
        folder = Path(name)
        ids, queued = post_office_queue(folder, port, docs)
        seconds, cpu, _ = _timed(lambda: post_office_send(folder))
    extra = {"queue cpu-ms/msg": round(queued * 1000 / len(docs), 2)}
    return {"seconds": seconds, "cpu": cpu, "message_ids": ids, "extra": extra}


def smtp_provider(
    port: int, imap_port: int = 1, *, reuse: bool = True, pipelining: bool = True
) -> Any:
    from daemon.providers.kept import ReuseLimits
    from daemon.providers.smtp_imap import SmtpImapProvider

    return SmtpImapProvider(
        "mail",
        smtp_host="127.0.0.1",
        smtp_port=port,
        smtp_security="none",
        imap_host="127.0.0.1",
        imap_port=imap_port,
        imap_security="none",
        username=SENDER,
        password=PASSWORD,
        timeout=30.0,
        # connection_max_messages = 1: a connection and a login per send, as before.
        reuse=None if reuse else ReuseLimits(max_uses=1),
        pipelining=pipelining,
    )


def run_sendledger(
    port: int,
    docs: list[dict[str, Any]],
    store_url: str,
    breakdown: bool,
    concurrency: int,
    reuse: bool,
    pipelining: bool = True,
    through_intake: bool = True,
    gather: bool | None = None,
) -> dict[str, Any]:
    from daemon.bootstrap import bootstrap
    from daemon.config.settings import settings_from_dict
    from daemon.service_layer.services import ChannelPolicies, Services
    from ledger.application import Ledger
    from ledger.content import parse_job
    from policies.loader import PolicySet
    from policies.model import ChannelPolicy

    policy = ChannelPolicy.model_validate(policy_table())
    ledger = Ledger(store_url)
    # Through the intake, as `sendledger submit` and the API take jobs (it proves each
    # message once: docs/architecture.md "The message"); not part of the measured time.
    door = Services(ledger, lambda: ChannelPolicies(PolicySet({"receipts": policy}), {}))
    started = time.process_time()
    if through_intake:
        ids = [door.submit(doc, by="bench").results[0].message_id for doc in docs]
    else:
        ids = [ledger.submit(parse_job(doc), policy.sender).message_id for doc in docs]
    queued = time.process_time() - started
    provider = smtp_provider(port, reuse=reuse, pipelining=pipelining)
    policies = PolicySet({"receipts": policy})
    settings = settings_from_dict(
        {"store": {"url": store_url}, "daemon": {"concurrency": concurrency, "batch_size": 200}}
    )
    service = bootstrap(
        settings,
        ledger=ledger,
        policy_loader=lambda: policies,
        policies=policies,
        providers={"mail": provider},
    )
    if gather is not None:
        service.engine.commits.busy = lambda: gather
    spent = wrap_breakdown(service.engine) if breakdown else None

    def tick_until_confirmed() -> int:
        confirmed = 0
        progress = time.monotonic()
        while confirmed < len(docs) and time.monotonic() - progress < 30:
            report = service.engine.tick()
            confirmed += report.confirmed
            if report.busy():
                progress = time.monotonic()
            else:
                time.sleep(0.01)
        return confirmed

    try:
        seconds, cpu, confirmed = _timed(tick_until_confirmed)
    finally:
        service.close()
        ledger.close()
    extra: dict[str, Any] = {
        "queue cpu-ms/msg": round(queued * 1000 / len(docs), 2),
        "confirmed": confirmed,
        "commits/msg": round(service.engine.commits.commits / len(docs), 2),
        **provider.connection_stats()["smtp"],
    }
    if spent is not None:
        extra["breakdown"] = spent
    return {"seconds": seconds, "cpu": cpu, "message_ids": ids, "extra": extra}


def wrap_breakdown(engine: Any) -> dict[str, Any]:
    """CPU per part of a send (each thread's own time): the parts of the SMTP path named in
    docs/performance.md "The SMTP path"."""
    from profile_pipeline import Breakdown

    from daemon.engine import dispatch, work
    from daemon.providers import smtp_submit
    from ledger import message

    parts = Breakdown()
    wrapped = [
        (dispatch, "render_checked", "render + proof + envelope"),
        (message, "checked_message", "  render + proof"),
        (message.Envelope, "__init__", "  envelope parse"),
        (smtp_submit.SmtpSubmitter, "submit", "SMTP transaction"),
        (dispatch.Dispatch, "claim", "claim (decide, render, event)"),
        (dispatch.Dispatch, "outcome_to_events", "outcome events"),
        (work.Work, "save", "claim's commit (waited)"),
        (work.Work, "flush", "flush before sleeping"),
    ]
    for owner, name, label in wrapped:
        setattr(owner, name, parts.wrap(label, getattr(owner, name)))
    commits: Any = engine.commits
    commit = parts.wrap("commits (all)", commits._commit)
    # How many waited-for saves (claims) each transaction carried: what grouping reached.
    shapes: dict[int, int] = {}

    def counted(batch: list[Any]) -> None:
        claims = sum(1 for save in batch if save.job is not None and save.then is None)
        shapes[claims] = shapes.get(claims, 0) + 1
        commit(batch)

    commits._commit = counted
    return {"cpu": parts.cpu, "calls": parts.calls, "claims per commit": shapes}


def _child(conn: Any, target: str, args: tuple[Any, ...]) -> None:
    try:
        conn.send(("ok", globals()[target](*args)))
    except BaseException as exc:
        import traceback

        conn.send(("error", "".join(traceback.format_exception(exc))))


def in_process(target: str, *args: Any) -> dict[str, Any]:
    """`target(*args)` in a fresh interpreter (spawn): its CPU time is its own."""
    parent, child = multiprocessing.Pipe()
    process = multiprocessing.get_context("spawn").Process(
        target=_child, args=(child, target, args), daemon=True
    )
    process.start()
    status, value = receive(parent, process, target)
    process.join(timeout=30)
    if status != "ok":
        raise SystemExit(f"{target} failed:\n{value}")
    result: dict[str, Any] = value
    return result


# -- stores ------------------------------------------------------------------------------


def store(kind: str, pg_url: str | None) -> contextlib.AbstractContextManager[str]:
    """A fresh store URL: a SQLite file, or a schema on the PostgreSQL server."""
    from intake import pg_store, sqlite_store

    if kind == "sqlite":
        return sqlite_store()
    assert pg_url is not None
    return pg_store(pg_url)


# -- one round ---------------------------------------------------------------------------


def measure(
    sink: Sink,
    sender: str,
    store_kind: str,
    docs: list[dict[str, Any]],
    pg_url: str | None,
    breakdown: bool,
    concurrency: int = 4,
) -> Run:
    if sender.startswith("sendledger"):
        reuse = sender != "sendledger-per-message"
        pipelining = sender != "sendledger-unpipelined"
        intake = sender != "sendledger-proved-at-claim"
        gather = {"sendledger-gather-all": True, "sendledger-gather-on-the-way": False}.get(sender)
        with store(store_kind, pg_url) as url:
            result = in_process(
                "run_sendledger",
                sink.port,
                docs,
                url,
                breakdown,
                concurrency,
                reuse,
                pipelining,
                intake,
                gather,
            )
    elif sender == "post-office":
        result = in_process("run_post_office", sink.port, docs)
    else:
        per_login, durable = sender == "loop-auth", sender == "durable-loop"
        result = in_process("run_loop", sink.port, docs, per_login, durable)
    run = Run(
        sender,
        store_kind,
        len(docs),
        result["seconds"],
        result["cpu"],
        result["message_ids"],
        result.get("extra", {}),
    )
    copies = Counter(sink.copies(run.message_ids).values())
    if copies != Counter({1: len(docs)}):
        raise SystemExit(f"{sender} ({store_kind}): copies at the sink {dict(copies)}")
    return run


LABELS = {
    "loop": "smtplib loop, one connection",
    "loop-auth": "smtplib loop, a connection and AUTH per message",
    "durable-loop": "smtplib loop, one connection, one fsync'd SQLite commit per message",
    "post-office": "django-post_office `send_queued`, 1 process",
    "sendledger": 'sendledger, `kind = "smtp-imap"`',
    "sendledger-per-message": "sendledger, `connection_max_messages = 1` (a connection per send)",
    "sendledger-unpipelined": "sendledger, `pipelining = false` (one command a round trip)",
    "sendledger-proved-at-claim": "sendledger, jobs written straight to the store (each claim"
    " proves its message again)",
    "sendledger-gather-all": "sendledger, a commit gathering every worker's claim",
    "sendledger-gather-on-the-way": "sendledger, a commit gathering the claims on their way",
}


def print_breakdown(run: Run) -> None:
    spent = run.extra.get("breakdown")
    if not spent:
        return
    print(f"    where the CPU went ({run.store}), ms per message:")
    for name, seconds in spent["cpu"].items():
        print(f"      {name:<34} {seconds * 1000 / run.n:6.3f}  ({spent['calls'][name]} calls)")
    shapes = sorted(spent["claims per commit"].items())
    carried = ", ".join(f"{claims}: {count}" for claims, count in shapes)
    print(f"    transactions by the claims they carried: {carried}")


def throughput(args: argparse.Namespace) -> int:
    senders = args.only.split(",")
    plan = [(s, "sqlite") for s in senders if not s.startswith("sendledger")]
    from intake import postgres_server

    with postgres_server(args.no_postgres or "sendledger" not in senders) as pg_url:
        daemons = (
            ["sendledger"]
            + (["sendledger-per-message"] if args.connection_per_message else [])
            + (["sendledger-unpipelined"] if args.unpipelined else [])
            + (["sendledger-proved-at-claim"] if args.proved_at_claim else [])
            + (
                ["sendledger-gather-all", "sendledger-gather-on-the-way"]
                if args.gather_variants
                else []
            )
        )
        if "sendledger" in senders:
            for daemon in daemons:
                plan.append((daemon, "sqlite"))
                if pg_url is not None:
                    plan.append((daemon, "postgresql"))
        runs: dict[tuple[str, str], list[Run]] = {key: [] for key in plan}
        with sink_process(PASSWORD) as direct, round_trip(direct, args.rtt / 1000) as sink:
            for round_ in range(args.rounds):
                for sender, kind in plan if round_ % 2 == 0 else list(reversed(plan)):
                    docs = documents(args.n, f"r{round_}-{sender}-{kind}", args.attachment_kb)
                    run = measure(
                        sink, sender, kind, docs, pg_url, args.breakdown, args.concurrency
                    )
                    runs[(sender, kind)].append(run)
                    extra = {k: v for k, v in run.extra.items() if k != "breakdown"}
                    print(
                        f"  round {round_ + 1} {sender:<12} {kind:<10} {run.rate:7.0f} msg/s "
                        f"{run.cpu_ms:5.2f} cpu-ms/msg  {extra or ''}",
                        flush=True,
                    )
                    print_breakdown(run)
    load = os.getloadavg()
    print()
    print(
        f"{args.n} messages of {len(rendered(documents(1, 'size', args.attachment_kb))[0][1])}"
        f" bytes, {args.rounds} rounds (median; range), every copy counted at the sink;"
        f" load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}, {os.cpu_count()} CPUs"
    )
    print()
    print("| sender | store | messages/s | CPU-ms per message |")
    print("|---|---|---|---|")
    medians: dict[tuple[str, str], tuple[float, float]] = {}
    for (sender, kind), done in runs.items():
        rates = [r.rate for r in done]
        cpus = [r.cpu_ms for r in done]
        medians[(sender, kind)] = (statistics.median(rates), statistics.median(cpus))
        store_name = {"sqlite": "SQLite", "postgresql": "PostgreSQL"}[kind]
        if "loop" in sender:
            store_name = "-"
        print(
            f"| {LABELS[sender]} | {store_name} | {statistics.median(rates):.0f} "
            f"({min(rates):.0f}-{max(rates):.0f}) | {statistics.median(cpus):.2f} "
            f"({min(cpus):.2f}-{max(cpus):.2f}) |"
        )
    ours = medians.get(("sendledger", "sqlite"))
    theirs = medians.get(("post-office", "sqlite"))
    loop = medians.get(("loop", "sqlite"))
    durable = medians.get(("durable-loop", "sqlite"))
    print()
    if ours and durable:
        ratio = ours[0] / durable[0]
        print(
            f"sendledger (SQLite) / durable loop: {ratio:.2f}x the messages/s "
            f"({'BEATS' if ratio > 1.0 else 'DOES NOT BEAT'} it); CPU per message "
            f"{ours[1] / durable[1]:.2f}x"
        )
    if ours and theirs:
        ratio = ours[0] / theirs[0]
        verdict = "MEETS" if ratio >= POST_OFFICE_GOAL else "MISSES"
        print(
            f"sendledger (SQLite) / post_office: {ratio:.2f}x the messages/s {verdict} "
            f"(>= {POST_OFFICE_GOAL}); CPU per message {ours[1] / theirs[1]:.2f}x "
            f"({'MEETS' if ours[1] <= theirs[1] else 'MISSES'} <= 1.0)"
        )
    if ours and loop:
        ratio = ours[0] / loop[0]
        verdict = "MEETS" if ratio >= LOOP_MOONSHOT else "MISSES"
        print(f"sendledger (SQLite) / one-connection loop: {ratio:.2f}x {verdict} moonshot")
    return 0


# -- kill -9 and a restart ---------------------------------------------------------------


def _wait_for(sink: Sink, base: int, count: int, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 300
    while sink.total() - base < count:
        if process.poll() is not None or time.monotonic() > deadline:
            return
        time.sleep(0.005)


def _killed(
    sink: Sink,
    command: list[str],
    n: int,
    env: dict[str, str] | None = None,
    stderr: Path | None = None,
) -> None:
    """Start `command` and SIGKILL it once n/2 of its messages have reached the sink."""
    base = sink.total()
    with (
        open(stderr or os.devnull, "ab") as err,
        subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=err) as first,
    ):
        _wait_for(sink, base, n // 2, first)
        first.send_signal(signal.SIGKILL)
        first.wait()


def kill_loop(sink: Sink, docs: list[dict[str, Any]], folder: Path) -> list[str]:
    """The loop keeps no record: the restart sends the whole list again."""
    (folder / "docs.json").write_text(json.dumps(docs))
    command = [sys.executable, __file__, "--as-child", "loop", str(sink.port), str(folder)]
    _killed(sink, command, len(docs))
    subprocess.run(command, check=True)
    return [mid for mid, _ in rendered(docs)]


def kill_post_office(sink: Sink, docs: list[dict[str, Any]], folder: Path) -> list[str]:
    (folder / "docs.json").write_text(json.dumps(docs))
    queue = [
        sys.executable,
        __file__,
        "--as-child",
        "post-office-queue",
        str(sink.port),
        str(folder),
    ]
    subprocess.run(queue, check=True)
    command = [sys.executable, __file__, "--as-child", "post-office", str(sink.port), str(folder)]
    _killed(sink, command, len(docs))
    subprocess.run(command, check=True)
    ids: list[str] = json.loads((folder / "ids.json").read_text())
    return ids


def kill_sendledger(
    sink: Sink,
    docs: list[dict[str, Any]],
    folder: Path,
    imap_port: int,
    store_url: str,
    notes: dict[str, int],
) -> list[str]:
    from ledger.application import Ledger
    from ledger.content import parse_job
    from policies.model import ChannelPolicy

    (folder / "mail-password").write_text(PASSWORD + "\n")
    (folder / "mail-password").chmod(0o600)
    (folder / "policies").mkdir()
    (folder / "policies" / "receipts.toml").write_text(
        "\n".join(f"{k} = {json.dumps(v)}" for k, v in policy_table().items() if k != "channel")
        + "\n"
    )
    provider = {
        "kind": "smtp-imap",
        "smtp_host": "127.0.0.1",
        "smtp_port": sink.port,
        "smtp_security": "none",
        "imap_host": "127.0.0.1",
        "imap_port": imap_port,
        "imap_security": "none",
        "username": SENDER,
        "password_file": "mail-password",
        "timeout": "10s",
    }
    (folder / "sendledger.toml").write_text(
        f'[store]\nurl = {json.dumps(store_url)}\n\n[daemon]\ntick = "50ms"\n'
        'deadline_grace = "1s"\n\n[providers.mail]\n'
        + "\n".join(f"{k} = {json.dumps(v)}" for k, v in provider.items())
        + "\n"
    )
    policy = ChannelPolicy.model_validate(policy_table())
    ledger = Ledger(store_url)
    ids = [ledger.submit(parse_job(doc), policy.sender).message_id for doc in docs]
    ledger.close()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SENDLEDGER_")}
    command = [sys.executable, "-m", "daemon", "--config", str(folder / "sendledger.toml"), "run"]
    log = folder / "daemon.err"
    _killed(sink, command, len(docs), env, log)
    with (
        log.open("ab") as err,
        subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=err) as second,
    ):
        try:
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                counts = Ledger(store_url)
                try:
                    open_jobs = sum(counts.open_counts().values())
                finally:
                    counts.close()
                if open_jobs == 0:
                    break
                time.sleep(0.5)
        finally:
            second.send_signal(signal.SIGTERM)
            second.wait(timeout=30)
    text = log.read_text(errors="replace")
    found = re.search(r"(\d+) claims? of an earlier run recovered", text)
    notes["recovered"] = int(found.group(1)) if found else 0
    return ids


def kills(args: argparse.Namespace) -> int:
    from testkit.mailservers import mail_servers, missing_reason

    reason = missing_reason()
    if reason is not None:
        print(f"--kill needs the private Dovecot for sendledger's search: {reason}")
        return 1
    senders = args.only.split(",")
    rows = []
    with (
        mail_servers() as servers,
        sink_process(PASSWORD, file_sent=(servers.lmtp_port, DOMAIN)) as sink,
    ):
        for sender in senders:
            if sender in ("loop-auth", "durable-loop"):  # no kill run of their own
                continue
            docs = documents(args.n, f"kill-{sender}-{time.monotonic_ns()}", args.attachment_kb)
            notes: dict[str, int] = {}
            with tempfile.TemporaryDirectory(prefix="sendledger-bench-kill-") as name:
                folder = Path(name)
                started = time.monotonic()
                if sender == "loop":
                    ids = kill_loop(sink, docs, folder)
                elif sender == "post-office":
                    ids = kill_post_office(sink, docs, folder)
                else:
                    with store("sqlite", None) as url:
                        ids = kill_sendledger(sink, docs, folder, servers.imap_port, url, notes)
                seconds = time.monotonic() - started
            copies = Counter(sink.copies(ids).values())
            rows.append((sender, copies, seconds, notes))
            print(f"  {sender:<12} copies per message {dict(sorted(copies.items()))}", flush=True)
    print()
    print(f"kill -9 at half of {args.n} messages, then a restart; copies counted at the sink:")
    print()
    print("| sender | store | messages with 0 copies | 1 copy | 2 copies | more | how long, why |")
    print("|---|---|---|---|---|---|---|")
    for sender, copies, seconds, notes in rows:
        store_name = "-" if sender == "loop" else "SQLite"
        more = sum(v for k, v in copies.items() if k > 2)
        why = {
            "loop": "no record of what was sent: the restart sends the list again",
            "post-office": "the batch's sent mails were still queued (marked sent per batch)",
            "sendledger": f"{notes.get('recovered', 0)} claims recovered at start-up "
            "(Unknown, then found by the search or resent after a miss)",
        }[sender]
        print(
            f"| {LABELS[sender]} | {store_name} | {copies.get(0, 0)} | {copies.get(1, 0)} |"
            f" {copies.get(2, 0)} | {more} | {seconds:.0f} s; {why} |"
        )
    return 0


def as_child(kind: str, port: int, folder: Path) -> int:
    """A sender as a process of its own, for --kill."""
    docs = json.loads((folder / "docs.json").read_text())
    if kind == "loop":
        run_loop(port, docs, per_message_login=False)
    elif kind == "post-office-queue":
        (folder / "ids.json").write_text(json.dumps(post_office_queue(folder, port, docs)[0]))
    else:
        django_settings(folder, port)
        post_office_send(folder)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000, help="messages per sender and round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (median)")
    parser.add_argument(
        "--attachment-kb", type=int, default=0, help="one attachment of this size per message"
    )
    parser.add_argument(
        "--only",
        default="loop,loop-auth,durable-loop,post-office,sendledger",
        help="which senders (comma-separated)",
    )
    parser.add_argument(
        "--concurrency", type=int, default=4, help="the daemon's send workers (its default: 4)"
    )
    parser.add_argument(
        "--connection-per-message",
        action="store_true",
        help="also the daemon with connection_max_messages = 1 (each send connects and logs in)",
    )
    parser.add_argument("--no-postgres", action="store_true")
    parser.add_argument(
        "--rtt",
        type=float,
        default=0.0,
        help="ms: every sender reaches the sink across this round trip (a delaying proxy)",
    )
    parser.add_argument(
        "--unpipelined",
        action="store_true",
        help="also the daemon with pipelining = false (one SMTP command a round trip)",
    )
    parser.add_argument(
        "--proved-at-claim",
        action="store_true",
        help="also the daemon with its jobs written straight to the store, not through the"
        " intake, so each claim proves its message again (as every claim did before)",
    )
    parser.add_argument(
        "--gather-variants",
        action="store_true",
        help="also the daemon with its commits gathering every send worker's claim, and"
        " only the claims on their way, whatever the load average (daemon/engine/commit.py)",
    )
    parser.add_argument("--kill", action="store_true", help="kill -9 each sender mid-run instead")
    parser.add_argument(
        "--breakdown", action="store_true", help="also print where sendledger's CPU went"
    )
    parser.add_argument("--as-child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.as_child:
        kind, port, folder = args.as_child
        return as_child(kind, int(port), Path(folder))
    missing = [name for name in BENCH_EXTRA if importlib.util.find_spec(name) is None]
    if missing:
        print(
            f"bench/smtp_senders.py: the bench extra is not installed (no {', '.join(missing)}):"
            " `make bench` installs it, or .venv/bin/uv pip install -e '.[bench]'",
            file=sys.stderr,
        )
        return 2
    with contextlib.suppress(KeyboardInterrupt):
        return kills(args) if args.kill else throughput(args)
    return 1


if __name__ == "__main__":
    sys.exit(main())
