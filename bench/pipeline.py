"""Pipeline throughput: the daemon's own cost next to a bare client loop, in one run.

For each backend (a SQLite file; PostgreSQL when reachable):

  (a) cpu      N jobs (default 2,000), the Gmail emulator with zero latency, quota lifted,
               no faults: jobs/s from submitted to confirmed (the engine ticking back to
               back), next to a bare serial loop of google-api-python-client sends of the
               same messages to the same emulator, and to a durable serial loop (the bare
               loop plus one fsync'd SQLite commit per send, bench/write_ahead.py: the least
               a write-ahead sender must do); CPU ms per job for each. Goals: >= 0.5x the
               bare loop, and faster than the durable loop.
  (b) latency  200 ms per Gmail API call, concurrency 16 and 64: jobs/s against the ideal
               concurrency / 0.2 s. Goal >= 0.85. `--variant` repeats it too.
  (c) https    (a) with the emulator serving HTTPS from a throw-away CA the clients trust.
  (d) idle     how often a reused connection dies: a server that closes idle connections
               after 100 ms, sends at random gaps around that; no send may make two copies.

The emulator runs in its own process, so the CPU time measured here is the daemon's (or
the bare loop's) alone; every run counts the copies at the emulator (each job exactly
one). Connection counters of the daemon's transport (fresh / reused / died unanswered)
are printed per run. `--variant` repeats (a) with parts of the pipeline switched back to
their old behaviour, to show what each change did (`--variant gather-all` / `gather-on-the-way`: a
commit gathers every send worker's claim / only the claims on their way, whatever the
load average, which decides between the two otherwise; `--variant no-commit-window`: it
never gathers; `--variant pool-in-turn`: the SQLite pool hands out its connections in
turn, as the library's does, not the one returned last; `--variant index-rewrites`: each
save assigns every column of the job's row again, its Message-ID's index rewritten). Each
daemon run also prints its
file reads per job (read system calls, SQLite's page reads among them). It is a
measurement: exit code 0
unless a job did not end with exactly one copy.

    .venv/bin/python bench/pipeline.py [--n 2000] [--no-postgres] [--only cpu,latency,https,idle]
"""

from __future__ import annotations

import argparse
import base64
import multiprocessing
import os
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any
from uuid import UUID

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import google_auth_httplib2
import httplib2
from eventsourcing.application import ProcessingEvent, project_aggregate
from intake import available_backends
from write_ahead import WriteAhead

from daemon.bootstrap import bootstrap
from daemon.config.settings import settings_from_dict
from daemon.engine import Engine
from daemon.engine import sends as engine_sends
from daemon.providers.gmail import GmailProvider, build_gmail_service, load_credentials
from daemon.service_layer.services import ChannelPolicies, Services
from ledger import addresses
from ledger import application as ledger_application
from ledger.application import Ledger
from ledger.content import parse_job
from ledger.job import SendJob
from ledger.message_id import message_id_for
from ledger.mime import build_message
from ledger.stores import index as job_index
from ledger.stores.index import (
    INDEX_CLOCK_KWARG,
    INDEX_CONNECT_KWARG,
    INDEX_GUARD_KWARG,
    INDEX_ROWS_KWARG,
)
from ledger.stores.unchanged import UNCHANGED_KWARG, Unchanged
from policies import model as policy_model
from policies.loader import PolicySet
from policies.model import ChannelPolicy
from testkit import GmailEmulator, write_service_account
from testkit.tls import make_loopback_tls

CPU_GOAL = 0.5
LATENCY_GOAL = 0.85  # issue 17
LATENCY = 0.2
USER = "support@example.com"
UNLIMITED_QUOTA = 1_000_000  # settings cap; far above what (a) sends (100 units each)
POLICY = ChannelPolicy.model_validate(
    {
        "channel": "receipts",
        "provider": "gmail",
        "from": "Support <support@example.com>",
        "message_id_domain": "mail.example.com",
        # The emulator's index has no lag: an unknown outcome (a reused connection that
        # died unanswered) is searched for a second later and settles within the run.
        "search_after": "1s",
        "search_interval": "1s",
    }
)


# -- the emulator, in its own process ----------------------------------------------------


def _serve(
    conn: Connection,
    latency: float,
    tls_dir: str | None,
    idle_timeout: float | None,
    user_quota: float | None = None,
) -> None:
    tls = make_loopback_tls(Path(tls_dir)) if tls_dir else None
    emulator = GmailEmulator(
        latency=latency, tls=tls, idle_timeout=idle_timeout, user_quota=user_quota
    ).start()
    conn.send((emulator.url, str(tls.ca_file) if tls else None))
    while True:
        command, arg = conn.recv()
        if command == "stop":
            emulator.stop()
            conn.send(None)
            return
        if command == "latency":
            emulator.set_latency(arg)
            conn.send(None)
        elif command == "copies":
            # {message_id: copies} of the ids asked for.
            wanted = set(arg)
            counts: dict[str, int] = dict.fromkeys(wanted, 0)
            for entry in emulator.accepted():
                if entry["message_id"] in wanted:
                    counts[entry["message_id"]] += 1
            conn.send(counts)
        elif command == "mailboxes":
            # bench/mailboxes.py: who sent each id asked for, each user's peak units in
            # one second, and the requests refused over quota.
            places: dict[str, list[str]] = {}
            asked = set(arg)
            for entry in emulator.accepted():
                if entry["message_id"] in asked:
                    places.setdefault(entry["message_id"], []).append(entry["user"])
            peaks = {
                user: (u.max_units_per_second, u.max_mean_units_per_second)
                for user, u in emulator.usage().items()
            }
            conn.send((places, peaks, emulator.quota_refusals))
        elif command == "tokens":
            # bench/mailboxes.py: tokens granted per delegated subject.
            granted = Counter(
                str(record.get("sub", ""))
                for record in emulator.token_requests
                if record.get("status") == 200
            )
            conn.send(dict(granted))


@dataclass
class Emulator:
    url: str
    ca_file: str | None
    _conn: Connection
    _process: Any

    def call(self, command: str, arg: Any = None) -> Any:
        self._conn.send((command, arg))
        return self._conn.recv()


@contextmanager
def emulator_process(
    latency: float = 0.0,
    *,
    https: bool = False,
    idle_timeout: float | None = None,
    user_quota: float | None = None,
) -> Iterator[Emulator]:
    with tempfile.TemporaryDirectory(prefix="sendledger-bench-tls-") as folder:
        parent, child = multiprocessing.Pipe()
        process = multiprocessing.get_context("spawn").Process(
            target=_serve,
            args=(child, latency, folder if https else None, idle_timeout, user_quota),
            daemon=True,
        )
        process.start()
        url, ca_file = parent.recv()
        emulator = Emulator(url, ca_file, parent, process)
        try:
            yield emulator
        finally:
            emulator.call("stop")
            process.join(timeout=10)


# -- the messages ------------------------------------------------------------------------


def job_document(i: int, prefix: str) -> dict[str, Any]:
    return {
        "channel": "receipts",
        "key": f"{prefix}-{i:07d}",
        "to": "Alice <alice@example.com>",
        "subject": f"Your receipt {i}",
        "body": f"Thanks for order {i}.\n",
    }


def bare_raw(i: int, prefix: str) -> tuple[str, bytes]:
    """What the daemon would send for job i: same headers, same body, our Message-ID."""
    document = job_document(i, prefix)
    message_id = message_id_for(document["key"], POLICY.message_id_domain)
    raw = build_message(
        from_addr=POLICY.from_,
        to=[document["to"]],
        subject=document["subject"],
        body=document["body"],
        message_id=message_id,
        date=datetime.now(UTC),
    )
    return message_id, raw


# -- one measured run --------------------------------------------------------------------


@dataclass
class Run:
    jobs: int
    seconds: float
    cpu: float
    copies_ok: bool
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.jobs / self.seconds

    @property
    def cpu_ms(self) -> float:
        return self.cpu * 1000 / self.jobs


def client_messages(emulator: Emulator, creds: Path) -> Any:
    """google-api-python-client's `users().messages()` on stock httplib2 (keep-alive)."""
    http = httplib2.Http(timeout=30, ca_certs=emulator.ca_file)
    credentials = load_credentials(creds, user=USER, token_uri=emulator.url + "/token")
    authed = google_auth_httplib2.AuthorizedHttp(credentials, http=http)
    return build_gmail_service(authed, api_endpoint=emulator.url).users().messages()


def bare_loop(emulator: Emulator, creds: Path, n: int) -> Run:
    """A serial loop of client sends: no ledger, stock httplib2 (keep-alive), no retries."""
    messages = [bare_raw(i, f"bare{time.monotonic_ns()}") for i in range(n)]
    api = client_messages(emulator, creds)
    wall, cpu = time.perf_counter(), time.process_time()
    for _message_id, raw in messages:
        encoded = base64.urlsafe_b64encode(raw).decode("ascii")
        api.send(userId=USER, body={"raw": encoded}).execute(num_retries=0)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    counts = emulator.call("copies", [mid for mid, _ in messages])
    return Run(n, wall, cpu, all(c == 1 for c in counts.values()))


def durable_loop(emulator: Emulator, creds: Path, n: int) -> Run:
    """The bare loop plus one fsync'd SQLite commit per send, before it (`WriteAhead`)."""
    messages = [bare_raw(i, f"durable{time.monotonic_ns()}") for i in range(n)]
    api = client_messages(emulator, creds)
    with tempfile.TemporaryDirectory(prefix="sendledger-bench-wal-") as folder:
        record = WriteAhead(Path(folder) / "sends.sqlite")
        wall, cpu = time.perf_counter(), time.process_time()
        for message_id, raw in messages:
            record.claim(message_id)
            encoded = base64.urlsafe_b64encode(raw).decode("ascii")
            api.send(userId=USER, body={"raw": encoded}).execute(num_retries=0)
            record.sent(message_id)
        record.close()
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    counts = emulator.call("copies", [mid for mid, _ in messages])
    return Run(n, wall, cpu, all(c == 1 for c in counts.values()))


def emulator_provider(emulator: Emulator, creds: Path, **options: Any) -> GmailProvider:
    """The daemon's Gmail provider on the emulator, quota lifted, trusting its CA."""
    return GmailProvider(
        "gmail",
        credentials_file=creds,
        user=USER,
        api_endpoint=emulator.url,
        token_uri=emulator.url + "/token",
        timeout=30.0,
        quota_units_per_second=UNLIMITED_QUOTA,
        ca_certs=emulator.ca_file,
        **options,
    )


@dataclass(frozen=True)
class Variant:
    """How the daemon is set up for a run; the defaults are today's behaviour."""

    name: str = "daemon"
    reuse_connections: bool = True
    readback_first: int = 10
    readback_rate: float = 0.01
    fingerprint_cache: bool = True
    group_commit: bool = True  # False: every save its own transaction
    address_cache: bool = True  # False: every address parsed (and round-tripped) anew
    protocol_checks: bool = False  # True: eventsourcing's collect and projection, as before
    outcome_rides: bool = True  # False: a send's outcome waits for a commit of its own
    # False: SQLite's synchronous=OFF, a measurement of what the fsyncs cost. Never the
    # daemon's setting: a claim must be durable before its call (invariant 1).
    fsync: bool = True
    idle_wakes_idle: bool = False  # True: an idle send worker wakes the others, as before
    load_min: int = engine_sends.LOAD_MIN  # 1: a worker may load a single key, as before
    # False: jobs written straight to the ledger, not through the intake, so each claim
    # proves its message again, as every claim did before (docs/architecture.md "The
    # message").
    through_intake: bool = True
    # False: a commit starts at once, never gathering the other workers' claims for up to
    # `commit.WINDOW` (daemon/engine/commit.py).
    commit_window: bool = True
    # True / False: a commit gathers as on a machine busier than its cores (every send
    # worker's claim) or as on one with cores to spare (the claims on their way), whatever
    # the load average; None: by the load average (daemon/engine/commit.py).
    busy: bool | None = None
    # False: the SQLite pool hands out its connections in turn, as the library's does,
    # instead of the one returned last (ledger/stores/private_api.py `LastReturnedFirst`).
    pool_last_first: bool = True
    # True: each save of a job's row assigns every column again, its Message-ID too, so
    # that SQLite rewrites that index's entry (ledger/stores/index.py `FIXED_COLUMNS`).
    index_rewrites: bool = False


def library_protocol_checks() -> Callable[[], None]:
    """Saves and loads through eventsourcing's `collect_events` and `project_aggregate`
    again (a runtime Protocol isinstance per event); returns the undo."""
    saved, projector = Ledger._save_retrying, ledger_application.project_events

    def save_retrying(
        self: Ledger,
        jobs: Sequence[SendJob],
        guard: Callable[[], bool] | None = None,
        keep_trying: Callable[[], bool] | None = None,
        connect_while: Callable[[], bool] | None = None,
        unchanged: Unchanged | None = None,
    ) -> None:
        # Ledger._save_retrying with the library's collect_events in place of ours: the
        # same rows, guard and retries, so that only the collection differs.
        processing: ProcessingEvent[UUID] = ProcessingEvent()
        processing.collect_events(
            *[event for job in jobs for event in job.pending_events],
            **{
                INDEX_ROWS_KWARG: [self.index_row(j) for j in jobs],
                INDEX_CLOCK_KWARG: self.clock,
                INDEX_GUARD_KWARG: guard,
                INDEX_CONNECT_KWARG: connect_while,
                UNCHANGED_KWARG: unchanged,
            },
        )
        self._record_processing(processing, keep_trying)
        for job in jobs:
            job.collect_events()

    def project_checked(aggregate: Any, events: Iterable[Any]) -> Any:
        return project_aggregate(aggregate, events)

    Ledger._save_retrying = save_retrying  # type: ignore[method-assign]
    ledger_application.project_events = project_checked

    def undo() -> None:
        Ledger._save_retrying = saved  # type: ignore[method-assign]
        ledger_application.project_events = projector

    return undo


def sqlite_pragma(pragma: str) -> Callable[[], None]:
    """Every SQLite connection opened from now on runs `PRAGMA <pragma>` first; returns
    the undo."""
    connect = sqlite3.connect

    def pragmatic(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        conn: sqlite3.Connection = connect(*args, **kwargs)
        conn.execute(f"PRAGMA {pragma}")
        return conn

    sqlite3.connect = pragmatic  # type: ignore[assignment]

    def undo() -> None:
        sqlite3.connect = connect

    return undo


def sqlite_without_fsync() -> Callable[[], None]:
    """Every SQLite connection opened from now on commits without fsync; returns the undo."""
    return sqlite_pragma("synchronous = OFF")


def one_commit_per_save(engine: Engine) -> None:
    """Saves as before the group commit: each claim and each outcome its own transaction."""
    runner: Any = engine._runner
    runner._commits = None  # Work.save then calls Ledger.save_job itself


def file_reads() -> int:
    """The process's read system calls so far (`syscr` of /proc/self/io: read and pread,
    a SQLite page read back among them; a socket's recv is not counted), 0 where the
    kernel does not say."""
    try:
        with open("/proc/self/io") as io:
            for line in io:
                if line.startswith("syscr:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def daemon_run(
    emulator: Emulator,
    creds: Path,
    store_url: str,
    n: int,
    *,
    concurrency: int,
    batch_size: int,
    variant: Variant = Variant(),
    hook: Callable[[Engine], Any] | None = None,
) -> Run:
    """Submit n jobs, then tick the engine back to back until every one is confirmed."""
    settings = settings_from_dict(
        {
            "store": {"url": store_url},
            "daemon": {"concurrency": concurrency, "batch_size": batch_size},
            "providers": {
                "gmail": {
                    "credentials_file": str(creds),
                    "api_endpoint": emulator.url,
                    "token_uri": emulator.url + "/token",
                    "timeout": "30s",
                    "quota_units_per_second": UNLIMITED_QUOTA,
                }
            },
        }
    )
    policies = PolicySet({"receipts": POLICY})
    undo_fsync = None if variant.fsync else sqlite_without_fsync()
    ledger = Ledger(store_url)
    if not variant.pool_last_first and store_url.startswith("sqlite"):
        datastore: Any = getattr(ledger.recorder, "datastore", None)
        datastore.pool._pool = deque(datastore.pool._pool)
    prefix = f"job{time.monotonic_ns()}"
    message_ids = []
    door = Services(ledger, lambda: ChannelPolicies(PolicySet({"receipts": POLICY}), {}))
    for i in range(n):
        if variant.through_intake:
            result = door.submit(job_document(i, prefix), by="bench").results[0]
        else:
            result = ledger.submit(parse_job(job_document(i, prefix)), POLICY.sender)
        message_ids.append(result.message_id)
    provider = emulator_provider(
        emulator,
        creds,
        readback_first=variant.readback_first,
        readback_rate=variant.readback_rate,
        reuse_connections=variant.reuse_connections,
    )
    service = bootstrap(
        settings,
        ledger=ledger,
        policy_loader=lambda: policies,
        policies=policies,
        providers={"gmail": provider},
    )
    if hook is not None:
        hook(service.engine)
    if not variant.group_commit:
        one_commit_per_save(service.engine)
    service.engine.commits.defer = variant.outcome_rides
    if not variant.commit_window:
        service.engine.commits.window = 0.0
    if variant.busy is not None:
        service.engine.commits.busy = lambda: bool(variant.busy)
    if variant.idle_wakes_idle:
        sends: Any = service.engine._sends
        sends._drained = sends._cond  # the drain's wake-ups wake every idle worker again
    commits = service.engine.commits
    confirmed = ticks = 0
    cached = policy_model._fingerprint
    if not variant.fingerprint_cache:
        policy_model._fingerprint = cached.__wrapped__  # type: ignore[assignment]
    parse_text = addresses._parse_text
    if not variant.address_cache:
        addresses._parse_text = parse_text.__wrapped__  # type: ignore[assignment]
    undo_checks = library_protocol_checks() if variant.protocol_checks else None
    load_min, engine_sends.LOAD_MIN = engine_sends.LOAD_MIN, variant.load_min
    upsert = job_index.UPSERT
    if variant.index_rewrites:
        every = (f"{c} = excluded.{c}" for c in job_index.COLUMNS if c != "key")
        job_index.UPSERT = job_index._upsert(every, ">")
    try:
        wall, cpu, reads = time.perf_counter(), time.process_time(), file_reads()
        progress = time.monotonic()
        # Until all are confirmed, or nothing moved for 30 s (a job left unknown, or lost).
        while confirmed < n and time.monotonic() - progress < 30:
            report = service.engine.tick()
            ticks += 1
            confirmed += report.confirmed
            if report.busy():
                progress = time.monotonic()
            else:
                time.sleep(0.01)  # waiting for a search to fall due
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        reads = file_reads() - reads
    finally:
        policy_model._fingerprint = cached
        addresses._parse_text = parse_text
        engine_sends.LOAD_MIN = load_min
        job_index.UPSERT = upsert
        if undo_checks is not None:
            undo_checks()
        service.close()
        ledger.close()
        if undo_fsync is not None:
            undo_fsync()
    counts = emulator.call("copies", message_ids)
    ok = confirmed == n and all(c == 1 for c in counts.values())
    stats = provider.transport_stats.snapshot()
    # What went wrong when not ok: {copies: jobs} and how many were confirmed.
    outcome = {"copies": dict(Counter(counts.values())), "confirmed": confirmed}
    # Transactions the group commit made (0 with --variant no-group-commit: one per save).
    extra = {
        "ticks": ticks,
        "outcome": outcome,
        "commits": commits.commits,
        "reads": reads,
        **stats,
    }
    return Run(n, wall, cpu, ok, extra)


# -- the three measurements --------------------------------------------------------------


def connection_line(run: Run) -> str:
    e = run.extra
    requests = e["fresh"] + e["reused"]
    died = e["reused_lost"]
    share = f"{died / e['reused']:.2%}" if e["reused"] else "n/a"
    per_job = f"{e['commits'] / run.jobs:.2f}" if e.get("commits") else "n/a"
    reads = f"{e['reads'] / run.jobs:.1f}" if "reads" in e else "n/a"
    return (
        f"{per_job} commits/job, {reads} file reads/job; "
        f"{requests} requests: {e['fresh']} fresh connections, "
        f"{e['reused']} reused "
        f"({died} reused died unanswered: {share}); {e['retired']} retired idle/closed"
    )


def measure_cpu(
    name: str,
    store: Callable[[], Any],
    creds: Path,
    n: int,
    *,
    https: bool,
    concurrency: int,
    rounds: int,
    variants: list[Variant],
) -> list[CpuRow]:
    """Medians over rounds for each variant; the bare loop, the durable loop and the
    daemon alternate within a round, and so do the variants (a machine that slows down
    between rounds slows every variant alike)."""
    results: dict[str, list[tuple[Run, Run, Run]]] = {v.name: [] for v in variants}
    with emulator_process(0.0, https=https) as emulator:
        for _ in range(rounds):
            for variant in variants:
                bare = bare_loop(emulator, creds, n)
                durable = durable_loop(emulator, creds, n)
                with store() as url:
                    daemon = daemon_run(
                        emulator,
                        creds,
                        url,
                        n,
                        concurrency=concurrency,
                        batch_size=200,
                        variant=variant,
                    )
                if not (bare.copies_ok and durable.copies_ok and daemon.copies_ok):
                    raise SystemExit(
                        f"{name}: a job did not end with exactly one copy: "
                        f"{daemon.extra['outcome']} of {daemon.jobs}"
                    )
                results[variant.name].append((bare, durable, daemon))
                print(
                    f"  {name:<10} {'https' if https else 'http':<5} {variant.name:<22} "
                    f"bare {bare.rate:7.0f}/s {bare.cpu_ms:5.2f} cpu-ms   "
                    f"durable {durable.rate:7.0f}/s {durable.cpu_ms:5.2f} cpu-ms   "
                    f"daemon {daemon.rate:7.0f}/s {daemon.cpu_ms:5.2f} cpu-ms   "
                    f"ratio {daemon.rate / bare.rate:5.2f} / {daemon.rate / durable.rate:5.2f}"
                    f"   load {os.getloadavg()[0]:.1f}   {connection_line(daemon)}",
                    flush=True,
                )
    return [CpuRow.of(name, done) for name, done in results.items()]


@dataclass(frozen=True)
class CpuRow:
    """One variant's medians (and ranges) over the rounds of (a) or (c)."""

    variant: str
    bare: float  # jobs/s
    durable: float
    daemon: float
    ratio: tuple[float, float, float]  # daemon / bare: median, min, max
    durable_ratio: tuple[float, float, float]  # daemon / durable
    bare_ms: float  # CPU ms per job
    durable_ms: float
    daemon_ms: tuple[float, float, float]

    @classmethod
    def of(cls, variant: str, results: list[tuple[Run, Run, Run]]) -> CpuRow:
        def spread(values: list[float]) -> tuple[float, float, float]:
            return statistics.median(values), min(values), max(values)

        return cls(
            variant,
            statistics.median(b.rate for b, _, _ in results),
            statistics.median(w.rate for _, w, _ in results),
            statistics.median(d.rate for _, _, d in results),
            spread([d.rate / b.rate for b, _, d in results]),
            spread([d.rate / w.rate for _, w, d in results]),
            statistics.median(b.cpu_ms for b, _, _ in results),
            statistics.median(w.cpu_ms for _, w, _ in results),
            spread([d.cpu_ms for _, _, d in results]),
        )


def batch_for(concurrency: int) -> int:
    """About 200 due jobs read at a time, and never fewer than the workers."""
    return max(200, concurrency * 2)


def measure_latency(
    name: str,
    store: Callable[[], Any],
    creds: Path,
    concurrency: int,
    n: int,
    variant: Variant = Variant(),
) -> tuple[float, float]:
    with emulator_process(LATENCY) as emulator, store() as url:
        run = daemon_run(
            emulator,
            creds,
            url,
            n,
            concurrency=concurrency,
            batch_size=batch_for(concurrency),
            variant=variant,
        )
    if not run.copies_ok:
        raise SystemExit(
            f"{name}: a job did not end with exactly one copy: {run.extra['outcome']} of "
            f"{run.jobs}; {connection_line(run)}"
        )
    ideal = concurrency / LATENCY
    print(
        f"  {name:<10} {variant.name:<22} concurrency {concurrency:<3} "
        f"{run.rate:7.1f} jobs/s of {ideal:.0f} "
        f"ideal: {run.rate / ideal:.2f}   {connection_line(run)}",
        flush=True,
    )
    return run.rate, run.rate / ideal


def measure_idle_reuse(creds: Path, sends: int, server_idle: float) -> str:
    """(d) How often a reused connection dies: the server closes connections idle for
    `server_idle` s, and sends come at random gaps around it (the client's own max_idle is
    longer, so only the closed-socket check stands between a stale connection and a
    write). Every send must still end with exactly one copy, or none when the request
    was lost before the server read it - never two."""
    rng = random.Random(7)
    prefix = f"idle{time.monotonic_ns()}"
    with emulator_process(0.0, idle_timeout=server_idle) as emulator:
        provider = emulator_provider(emulator, creds)
        outcomes: dict[str, str] = {}
        try:
            for i in range(sends):
                message_id, raw = bare_raw(i, prefix)
                outcomes[message_id] = provider.send_raw(raw).kind.value
                time.sleep(rng.uniform(0.5, 1.5) * server_idle)
        finally:
            provider.close()
        counts = emulator.call("copies", list(outcomes))
    stats = provider.transport_stats.snapshot()
    doubled = sum(1 for c in counts.values() if c > 1)
    unknown = sum(1 for kind in outcomes.values() if kind != "confirmed")
    if doubled:
        raise SystemExit(f"(d): {doubled} sends made two copies")
    return (
        f"(d) idle   server closes after {server_idle * 1000:.0f} ms idle, {sends} sends at "
        f"random gaps of 0.5-1.5x that: {stats['reused']} on reused connections, "
        f"{stats['retired']} stale connections replaced before writing, "
        f"{stats['reused_lost']} reused died unanswered ({unknown} unknown outcomes), "
        f"0 sends with two copies"
    )


VARIANTS = {
    "old": Variant("old: all three off", False, 1, 1.0, False),
    "no-fingerprint-cache": Variant("fingerprint per decision", fingerprint_cache=False),
    "no-reuse": Variant("no connection reuse", False),
    "readback-all": Variant("read back every send", True, 1, 1.0),
    "no-group-commit": Variant("one commit per save", group_commit=False),
    "no-address-cache": Variant("addresses parsed anew", address_cache=False),
    "protocol-checks": Variant("library collect/projection", protocol_checks=True),
    "outcome-waited": Variant("outcome waited for", outcome_rides=False),
    "no-fsync": Variant("SQLite without fsync", fsync=False),
    "idle-wakes-idle": Variant("idle workers wake idle", idle_wakes_idle=True),
    "load-one": Variant("loads of one key", load_min=1),
    "no-cpu-levers": Variant("both of the above", address_cache=False, protocol_checks=True),
    "proved-at-claim": Variant("proved again at the claim", through_intake=False),
    "no-commit-window": Variant("commits not gathered", commit_window=False),
    "gather-all": Variant("gathered for all workers", busy=True),
    "gather-on-the-way": Variant("gathered on their way", busy=False),
    "pool-in-turn": Variant("pool's connections in turn", pool_last_first=False),
    "index-rewrites": Variant("every row column assigned", index_rewrites=True),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000, help="jobs per (a)/(c) run")
    parser.add_argument("--rounds", type=int, default=1, help="rounds of (a)/(c) (median)")
    parser.add_argument("--concurrency", type=int, default=4, help="daemon concurrency in (a)")
    parser.add_argument(
        "--only", default="cpu,latency,https,idle", help="which measurements (comma-separated)"
    )
    parser.add_argument(
        "--latency-concurrency", default="16,64", help="concurrencies of (b), comma-separated"
    )
    parser.add_argument(
        "--latency-seconds", type=float, default=8.0, help="ideal seconds of sending in (b)"
    )
    parser.add_argument("--idle-sends", type=int, default=200, help="sends in (d)")
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        choices=sorted(VARIANTS),
        help="also run (a) and (b) with this part switched back to the old behaviour",
    )
    parser.add_argument("--no-postgres", action="store_true")
    args = parser.parse_args(argv)
    only = set(args.only.split(","))

    backends = available_backends(no_postgres=args.no_postgres)
    variants = [Variant(), *(VARIANTS[v] for v in args.variant)]
    print(
        f"pipeline benchmark: n={args.n}, daemon concurrency {args.concurrency} in (a)/(c), "
        f"{os.cpu_count()} CPUs; emulator in its own process"
    )
    summary: list[str] = []
    with tempfile.TemporaryDirectory(prefix="sendledger-bench-") as folder:
        creds = write_service_account(Path(folder) / "sa.json", token_uri="http://unused/token")
        for name, store in backends:
            for https in (False, True):
                if ("https" if https else "cpu") not in only:
                    continue
                label = "(c) https" if https else "(a) cpu"
                rows = measure_cpu(
                    name,
                    store,
                    creds,
                    args.n,
                    https=https,
                    concurrency=args.concurrency,
                    rounds=args.rounds,
                    variants=variants,
                )
                for row in rows:
                    ratio, low, high = row.ratio
                    verdict = "MEETS" if ratio >= CPU_GOAL else "MISSES"
                    over = row.durable_ratio
                    beats = "BEATS" if over[0] > 1.0 else "DOES NOT BEAT"
                    ms = row.daemon_ms
                    summary.append(
                        f"{label:<10} {name:<10} {row.variant:<26} bare {row.bare:6.0f}/s "
                        f"({row.bare_ms:4.2f} cpu-ms/job)  durable {row.durable:6.0f}/s "
                        f"({row.durable_ms:4.2f})  daemon {row.daemon:6.0f}/s "
                        f"({ms[0]:4.2f} cpu-ms/job, {ms[1]:4.2f}-{ms[2]:4.2f})  "
                        f"ratio {ratio:4.2f} ({low:4.2f}-{high:4.2f}) {verdict} (>= {CPU_GOAL}); "
                        f"to the durable loop {over[0]:4.2f} ({over[1]:4.2f}-{over[2]:4.2f}) "
                        f"{beats} it"
                    )
            if "latency" in only:
                for concurrency in map(int, args.latency_concurrency.split(",")):
                    # About `latency_seconds` of ideal sending.
                    n = int(concurrency / LATENCY * args.latency_seconds)
                    for variant in variants:
                        rate, ratio = measure_latency(name, store, creds, concurrency, n, variant)
                        verdict = "MEETS" if ratio >= LATENCY_GOAL else "MISSES"
                        summary.append(
                            f"(b) 200ms  {name:<10} {variant.name:<22} concurrency "
                            f"{concurrency:<3} {rate:6.1f} jobs/s of "
                            f"{concurrency / LATENCY:.0f}  ratio {ratio:4.2f}"
                            f"  {verdict} (>= {LATENCY_GOAL})"
                        )
        if "idle" in only:
            summary.append(measure_idle_reuse(creds, args.idle_sends, 0.1))
    print()
    load = os.getloadavg()
    print(f"load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}, {os.cpu_count()} CPUs")
    print("\n".join(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
