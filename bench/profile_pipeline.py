"""cProfile of the daemon in the CPU-bound pipeline run ((a) of bench/pipeline.py).

cProfile sees one thread; the engine's work runs on its worker pool. So every worker's
step runs under that thread's own profiler, the tick's own work (the due-job reads, a
dispatch wave's claims and saves) under the main thread's, and the statistics are
merged. Prints the top functions by own time and by cumulative time; `--cpu-clock` times
them by each thread's CPU instead of the wall clock, so that the waits (a worker's for its
commit, a socket's, the interpreter lock's) leave the own times: what to sort by when
hunting CPU per job, with the calls per job beside it (counts do not depend on the load).

    .venv/bin/python bench/profile_pipeline.py [--n 1000] [--store sqlite|postgresql]
        [--variant NAME (bench/pipeline.py: VARIANTS)] [--concurrency 4] [--top 30] [--cpu-clock]
        [--callers RE] [--breakdown [--latency 0.2]] [--switches] [--pages]
    .venv/bin/python bench/profile_pipeline.py --send-path [--n 1000]
        [--between nothing|pause|evict] [--pause-ms 8]

`--switches` profiles nothing: per job, the waits on a threading.Condition (a worker's
for its commit, a gathering commit's for the claims, an idle worker's) and the process's
voluntary and involuntary context switches, from the first tick to the run's end: each is a
thread switch and a hand-off of the interpreter lock; then the same by thread (its CPU
too, /proc/self/task: which threads wake per job); and the file reads (read system
calls: SQLite's pages read back; `--variant pool-in-turn` hands the store's connections
out in turn, as the library's pool does) (`--variant gather-all` or
`gather-on-the-way` fixes the group commit's rule, which otherwise follows the load).

`--pages` profiles nothing either: the pages the run's commits wrote to SQLite's WAL (its
automatic checkpoint off for the run, the WAL emptied at its start), per job and by the
b-tree that holds them (SQLite's `dbstat`: a table, or one of its indexes). Every page a
transaction changes is written whole and synced (docs/performance.md "Commits per job").

`--send-path` measures the Gmail send path alone, in one thread: the bare loop's call
(google-api-python-client on stock httplib2) and `GmailProvider.send_raw` (the same client
through the single-shot transport, with the outcome classified), alternating, 3 rounds,
CPU ms per call. What the provider adds to the client is the difference. `--between`
says what the thread does between two sends, outside the clock: nothing (a loop's shape),
`pause` (sleeps `--pause-ms`, as a send worker waits for its claim's commit and the other
processes of the machine run meanwhile), or `evict` (copies `EVICT_BYTES` over a buffer,
as a process that ran meanwhile fills the caches): the same calls, run from caches the
send's code and data have left (docs/performance.md "Performance and scaling").
"""

from __future__ import annotations

import argparse
import base64
import cProfile
import io
import os
import pstats
import resource
import sqlite3
import struct
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import google_auth_httplib2
import httplib2

sys.path.insert(0, str(Path(__file__).resolve().parent))

from intake import pg_store, sqlite_store
from pipeline import (
    USER,
    VARIANTS,
    Variant,
    bare_raw,
    batch_for,
    daemon_run,
    emulator_process,
    emulator_provider,
    file_reads,
    sqlite_pragma,
)

from daemon.engine import Engine, dispatch
from daemon.providers.gmail import build_gmail_service, load_credentials
from ledger.stores import private_api
from testkit import write_service_account


class Breakdown:
    """CPU time (time.thread_time, so each thread's own) and wall time spent inside
    wrapped calls."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.cpu: dict[str, float] = {}
        self.wall: dict[str, float] = {}
        self.calls: dict[str, int] = {}

    def wrap(self, name: str, function: Any) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            started, wall = time.thread_time(), time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                spent, waited = time.thread_time() - started, time.perf_counter() - wall
                with self._lock:
                    self.cpu[name] = self.cpu.get(name, 0.0) + spent
                    self.wall[name] = self.wall.get(name, 0.0) + waited
                    self.calls[name] = self.calls.get(name, 0) + 1

        return timed


class Switches:
    """Condition waits and context switches of the process, counted from `start`."""

    def __init__(self) -> None:
        self.waits = 0
        self._counting = False
        self._started: resource.struct_rusage | None = None
        self.voluntary = self.involuntary = 0
        self.reads = 0
        self._wait: Any = None

    def start(self, engine: Engine) -> None:
        wait = threading.Condition.wait

        def counted(condition: threading.Condition, timeout: float | None = None) -> bool:
            if self._counting:
                self.waits += 1  # from several threads: may rarely lose one (a measurement)
            return wait(condition, timeout)

        self._wait = wait
        threading.Condition.wait = counted  # type: ignore[method-assign,assignment]
        self._counting = True
        self._started = resource.getrusage(resource.RUSAGE_SELF)
        self.reads = -file_reads()

    def stop(self) -> None:
        self._counting = False
        if self._wait is not None:
            threading.Condition.wait = self._wait  # type: ignore[method-assign]
        self.reads += file_reads()
        now, started = resource.getrusage(resource.RUSAGE_SELF), self._started
        assert started is not None, "started by the run's hook"
        self.voluntary = now.ru_nvcsw - started.ru_nvcsw
        self.involuntary = now.ru_nivcsw - started.ru_nivcsw


#: A thread's (user + system CPU in clock ticks, voluntary, involuntary context switches).
TaskCounts = tuple[int, int, int]


def task_counts(tid: int) -> TaskCounts | None:
    """One thread's counters from /proc (None once it has ended, or off Linux)."""
    try:
        with open(f"/proc/self/task/{tid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        switches = {}
        with open(f"/proc/self/task/{tid}/status") as status:
            for line in status:
                name, _, value = line.partition(":")
                if name.endswith("ctxt_switches"):
                    switches[name] = int(value)
    except (OSError, IndexError, ValueError):
        return None
    return (
        int(fields[11]) + int(fields[12]),  # utime + stime
        switches.get("voluntary_ctxt_switches", 0),
        switches.get("nonvoluntary_ctxt_switches", 0),
    )


class PerThread:
    """CPU and context switches of each thread of the process from `start`, by name (the
    send workers, the tick's thread, the lease renewer...): which threads wake per job.
    Sampled every `every` seconds until `stop`, since the engine's threads end with it;
    the sampler's own share is printed beside them."""

    def __init__(self, every: float = 0.1) -> None:
        self._every = every
        self._first: dict[int, TaskCounts] = {}
        self._last: dict[int, tuple[str, TaskCounts]] = {}
        self._done = threading.Event()
        self._sampler: threading.Thread | None = None

    def start(self, engine: Engine) -> None:
        self._sample()
        self._sampler = threading.Thread(target=self._run, name="sampler", daemon=True)
        self._sampler.start()

    def _run(self) -> None:
        while not self._done.wait(self._every):
            self._sample()

    def _sample(self) -> None:
        names = {t.native_id: t.name for t in threading.enumerate()}
        for entry in os.listdir("/proc/self/task"):
            tid = int(entry)
            counts = task_counts(tid)
            if counts is None:
                continue
            self._first.setdefault(tid, counts)
            self._last[tid] = (names.get(tid, self._last.get(tid, ("?",))[0]), counts)

    def stop(self) -> list[tuple[str, float, float, float]]:
        """(thread, CPU ms, voluntary, involuntary switches) per thread that did any."""
        self._done.set()
        if self._sampler is not None:
            self._sampler.join()
        tick = os.sysconf("SC_CLK_TCK")
        rows = []
        for tid, (name, last) in self._last.items():
            first = self._first[tid]
            cpu, voluntary, involuntary = (b - a for a, b in zip(first, last, strict=True))
            if cpu or voluntary or involuntary:
                rows.append((name, cpu * 1000 / tick, float(voluntary), float(involuntary)))
        return sorted(rows, key=lambda row: -row[1])


class ThreadProfiles:
    """One cProfile.Profile per thread that runs a wrapped call. `cpu_clock`: timed by the
    thread's CPU time (`time.thread_time`), not the wall clock, so that a wait (for a
    commit, a socket, the interpreter lock) costs a function nothing of its own time."""

    def __init__(self, *, cpu_clock: bool = False) -> None:
        self._cpu_clock = cpu_clock
        self._local = threading.local()
        self._lock = threading.Lock()
        self.profiles: list[cProfile.Profile] = []

    def profiler(self) -> cProfile.Profile:
        found: cProfile.Profile | None = getattr(self._local, "profile", None)
        if found is None:
            found = cProfile.Profile(time.thread_time) if self._cpu_clock else cProfile.Profile()
            self._local.profile = found
            with self._lock:
                self.profiles.append(found)
        return found

    def wrap(self, function: Any) -> Any:
        def profiled(*args: Any, **kwargs: Any) -> Any:
            profiler = self.profiler()
            profiler.enable()
            try:
                return function(*args, **kwargs)
            finally:
                profiler.disable()

        return profiled


class WalPages:
    """The pages the commits of a run wrote to a SQLite store's WAL, named by b-tree.

    From `start` (the engine's hook, before the first tick) the WAL is emptied and no
    connection opened since `__init__` checkpoints by itself; `count` reads the frames
    before the store's last connection closes (this one stays open meanwhile)."""

    def __init__(self) -> None:
        self._connect = sqlite3.connect
        self._side: sqlite3.Connection | None = None
        self._path = ""
        self.pages: dict[str, int] = {}
        self.commits = 0
        # The store's connections set their own checkpoint (`WAL_CHECKPOINT_PAGES`) after
        # the pragma below: past it the WAL started again from its first frame and the
        # count stopped at its size (4.0 pages a job at --n 1000, whatever was written).
        self._pages = private_api.WAL_CHECKPOINT_PAGES
        private_api.WAL_CHECKPOINT_PAGES = 0
        self._undo = sqlite_pragma("wal_autocheckpoint = 0")

    def watch(self, store_url: str) -> None:
        self._path = store_url.removeprefix("sqlite:///")

    def start(self, engine: Engine) -> None:
        self._side = self._connect(self._path)
        self._side.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def count(self) -> None:
        self._undo()
        private_api.WAL_CHECKPOINT_PAGES = self._pages
        side = self._side
        assert side is not None, "started by the run's hook"
        names = dict(side.execute("SELECT pageno, name FROM dbstat"))
        size = int(side.execute("PRAGMA page_size").fetchone()[0])
        with open(f"{self._path}-wal", "rb") as wal:
            data = wal.read()
        for at in range(32, len(data) - size - 23, 24 + size):
            page, commit = struct.unpack(">II", data[at : at + 8])
            name = str(names.get(page, "?"))
            self.pages[name] = self.pages.get(name, 0) + 1
            self.commits += commit != 0  # a commit's last frame holds the file's size
        side.close()


#: Bytes copied between two sends with `--between evict`: above the caches one core uses
#: (its L2 and its share of a last-level cache that other processes fill too).
EVICT_BYTES = 16 << 20


def between_sends(kind: str, pause_ms: float) -> Any:
    """What `--send-path` runs between two sends, outside the clock (see the docstring)."""
    if kind == "pause":
        return lambda: time.sleep(pause_ms / 1000)
    if kind == "evict":
        target, source = bytearray(EVICT_BYTES), b"\x5a" * EVICT_BYTES

        def evict() -> None:
            target[:] = source

        return evict
    return lambda: None


def send_path(n: int, between: str = "nothing", pause_ms: float = 8.0) -> None:
    """CPU ms per call of the bare client send and of `GmailProvider.send_raw`, in turn,
    each call timed alone, with `between` run before each, outside the clock."""
    before = between_sends(between, pause_ms)
    with tempfile.TemporaryDirectory(prefix="sendledger-profile-") as folder:
        creds = write_service_account(Path(folder) / "sa.json", token_uri="http://unused/token")
        with emulator_process(0.0) as emulator:
            provider = emulator_provider(emulator, creds)
            credentials = load_credentials(creds, user=USER, token_uri=emulator.url + "/token")
            authed = google_auth_httplib2.AuthorizedHttp(
                credentials, http=httplib2.Http(timeout=30)
            )
            api = build_gmail_service(authed, api_endpoint=emulator.url).users().messages()
            messages = [bare_raw(i, f"path{time.monotonic_ns()}")[1] for i in range(n)]

            def bare(raw: bytes) -> None:
                encoded = base64.urlsafe_b64encode(raw).decode("ascii")
                api.send(userId=USER, body={"raw": encoded}).execute(num_retries=0)

            bare(messages[0])  # connections and tokens made before the clock starts
            provider.send_raw(messages[0])
            try:
                for _ in range(3):
                    spent = [0.0, 0.0]
                    for at, call in enumerate((bare, provider.send_raw)):
                        for raw in messages:
                            before()
                            started = time.thread_time()
                            call(raw)
                            spent[at] += time.thread_time() - started
                    bare_ms, provider_ms = (each * 1000 / n for each in spent)
                    print(f"bare client {bare_ms:.3f} cpu-ms/call, provider {provider_ms:.3f}")
            finally:
                provider.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--store", choices=("sqlite", "postgresql"), default="sqlite")
    parser.add_argument("--variant", choices=sorted(VARIANTS))
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--https", action="store_true")
    parser.add_argument(
        "--latency", type=float, default=0.0, help="seconds per Gmail API call, as in (b)"
    )
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument(
        "--cpu-clock",
        action="store_true",
        help="time the profile by each thread's CPU, not the wall clock (waits cost nothing)",
    )
    parser.add_argument("--callers", help="also print who calls functions matching this")
    parser.add_argument(
        "--breakdown",
        action="store_true",
        help="no cProfile: CPU ms per job in loading, rendering, saving and the provider call",
    )
    parser.add_argument(
        "--switches",
        action="store_true",
        help="no cProfile: Condition waits and context switches per job",
    )
    parser.add_argument(
        "--pages",
        action="store_true",
        help="no cProfile: WAL pages the commits wrote per job, by b-tree (SQLite)",
    )
    parser.add_argument(
        "--send-path",
        action="store_true",
        help="only the Gmail send path, one thread: the bare client call against send_raw",
    )
    parser.add_argument(
        "--between",
        choices=("nothing", "pause", "evict"),
        default="nothing",
        help="--send-path: what the thread does between two sends, outside the clock",
    )
    parser.add_argument("--pause-ms", type=float, default=8.0, help="--between pause: its ms")
    args = parser.parse_args(argv)
    if args.send_path:
        send_path(args.n, args.between, args.pause_ms)
        return 0
    variant = VARIANTS[args.variant] if args.variant else Variant()
    profiles = ThreadProfiles(cpu_clock=args.cpu_clock)

    breakdown = Breakdown()
    switches = Switches()
    threads = PerThread()

    def count_switches(engine: Engine) -> None:
        switches.start(engine)
        threads.start(engine)

    if args.pages and args.store != "sqlite":
        parser.error("--pages reads a SQLite store's WAL")
    pages = WalPages() if args.pages else None

    def split(engine: Engine) -> None:
        ledger: Any = engine.ledger
        ledger.get_job = breakdown.wrap("load the job (get_job)", ledger.get_job)
        ledger.get_jobs = breakdown.wrap("load a batch (get_jobs)", ledger.get_jobs)
        ledger.save_job = breakdown.wrap("save events + index (save_job)", ledger.save_job)
        ledger.save_jobs = breakdown.wrap("save a group (save_jobs)", ledger.save_jobs)
        ledger.due = breakdown.wrap("read due jobs (due)", ledger.due)
        provider: Any = engine.providers["gmail"]
        provider.send_raw = breakdown.wrap("provider send_raw", provider.send_raw)
        provider.read_message_id = breakdown.wrap("provider read-back", provider.read_message_id)
        runner: Any = engine._runner
        runner.run = breakdown.wrap("whole step (runner.run)", runner.run)
        one: Any = engine._dispatch
        one.dispatch = breakdown.wrap("one job, claim to saved outcome (dispatch)", one.dispatch)
        steps: Any = engine._send_steps
        steps.load = breakdown.wrap("load due jobs (send workers)", steps.load)
        commits: Any = engine.commits
        commits.save = breakdown.wrap("a claim's save, waited for (commits.save)", commits.save)
        steps.flush = breakdown.wrap("a worker's flush before it sleeps", steps.flush)
        dispatching: Any = dispatch
        dispatching.render_checked = breakdown.wrap(
            "render + prove MIME (dispatch.render_checked)", dispatching.render_checked
        )

    def instrument(engine: Engine) -> None:
        runner: Any = engine._runner
        runner.run = profiles.wrap(runner.run)
        # Each send worker loads a batch of due jobs, then runs one job from its claim to
        # its saved outcome (a wait for a group commit shows as a lock acquire).
        runner.load = profiles.wrap(runner.load)
        one: Any = engine._dispatch
        one.dispatch = profiles.wrap(one.dispatch)
        steps: Any = engine._send_steps
        steps.load = profiles.wrap(steps.load)
        ledger: Any = engine.ledger
        ledger.due = profiles.wrap(ledger.due)

    store = sqlite_store if args.store == "sqlite" else pg_store
    with tempfile.TemporaryDirectory(prefix="sendledger-profile-") as folder:
        creds = write_service_account(Path(folder) / "sa.json", token_uri="http://unused/token")
        with emulator_process(args.latency, https=args.https) as emulator, store() as url:
            if pages is not None:
                pages.watch(url)
            run = daemon_run(
                emulator,
                creds,
                url,
                args.n,
                concurrency=args.concurrency,
                batch_size=batch_for(args.concurrency),
                variant=variant,
                hook=(
                    count_switches
                    if args.switches
                    else pages.start
                    if pages is not None
                    else split
                    if args.breakdown
                    else instrument
                ),
            )
            if args.switches:
                switches.stop()
                by_thread = threads.stop()
            if pages is not None:
                pages.count()
    print(
        f"{args.store} {variant.name}: {run.rate:.0f} jobs/s, {run.cpu_ms:.2f} cpu-ms/job, "
        f"ok={run.copies_ok}"
    )
    if args.switches:
        print(
            f"  per job: {switches.waits / args.n:.2f} Condition waits, "
            f"{switches.voluntary / args.n:.1f} voluntary and "
            f"{switches.involuntary / args.n:.1f} involuntary context switches, "
            f"{switches.reads / args.n:.1f} file reads, "
            f"{run.extra['commits'] / args.n:.2f} commits"
        )
        for name, cpu_ms, voluntary, involuntary in by_thread:
            print(
                f"    {name:<24} {cpu_ms / args.n:6.3f} cpu-ms, {voluntary / args.n:5.2f} "
                f"voluntary and {involuntary / args.n:5.2f} involuntary switches per job"
            )
        return 0
    if pages is not None:
        frames = sum(pages.pages.values())
        print(
            f"  {frames / args.n:.2f} WAL pages per job, {pages.commits / args.n:.2f} commits "
            f"per job, {frames / max(pages.commits, 1):.1f} pages per commit; per job by b-tree:"
        )
        for name, count in sorted(pages.pages.items(), key=lambda item: -item[1]):
            print(f"    {name:<40} {count / args.n:5.2f}")
        return 0
    if args.breakdown:
        for name, spent in sorted(breakdown.cpu.items(), key=lambda item: -item[1]):
            calls = breakdown.calls[name]
            print(
                f"  {name:<34} {spent * 1000 / args.n:6.3f} cpu-ms/job "
                f"({calls} calls, {breakdown.wall[name] * 1000 / calls:.2f} ms each)"
            )
        return 0
    stats = pstats.Stats(*profiles.profiles, stream=(out := io.StringIO()))
    if os.environ.get("PERF_DUMP"):
        stats.dump_stats(os.environ["PERF_DUMP"])
    merged: Any = stats  # total_calls is not in pstats' stubs
    print(f"  {merged.total_calls / args.n:.0f} function calls per job (the profile's threads)")
    for order in ("tottime", "cumulative"):
        stats.sort_stats(order).print_stats(args.top)
    if args.callers:
        stats.print_callers(args.callers)
    print("\n".join(line for line in out.getvalue().splitlines() if line.strip()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
