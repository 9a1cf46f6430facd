"""Helpers for the daemon's end-to-end tests.

A `Rig` is one complete setup in a temporary folder, as `sendledger demo` builds it but with
the daemon as a separate PROCESS: the Gmail emulator (in the test process, with search index
lag and an acceptance log), the fault relay in front of it, a service-account JSON whose
token_uri is the emulator's /token, a sendledger.toml and a policies folder. Jobs are
submitted with the `sendledger submit` CLI; the daemon is `sendledger run`, forked from the
worker's fork server (tests/e2e/fork_server.py) and stopped with SIGTERM.

Effects are counted ONLY in the emulator's acceptance log (`Rig.copies`), never in the
daemon's records; the ledger is only read (job states and histories) to see what the daemon
decided. Every wait is bounded and fails with the tail of the daemon's stderr.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import Any, Self
from urllib.parse import unquote

import httpx
import pytest
from tests.thread_guard import lives_for_the_session

from daemon.service_layer.read_models import event_record
from ledger.application import Ledger
from ledger.stores.index import IndexRow
from testkit.credentials import write_service_account
from testkit.gmail_emulator import ApiError, GmailEmulator
from testkit.relay import FaultPlan, FaultRelay

VENV_BIN = Path(sys.executable).parent
SENDLEDGER = str(VENV_BIN / "sendledger")
MAILBOX = "shop@shop.example"
SETTLED = frozenset({"confirmed", "review", "abandoned"})
WAIT = 30.0
FORK_SERVER = Path(__file__).with_name("fork_server.py")

# Environment that would change how the daemon behaves if inherited from the test runner.
_SCRUB_PREFIXES = ("SENDLEDGER_",)
_SCRUB = frozenset(
    {"NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "INVOCATION_ID", "JOURNAL_STREAM"}
)

#: The matrix's channel: windows longer than the emulator's 0.3 s index lag.
RETRY_POLICY: dict[str, Any] = {
    "provider": "gmail",
    "from": "Shop Receipts <receipts@shop.example>",
    "message_id_domain": "mail.shop.example",
    "on_unknown": "retry",
    "search_after": "800ms",
    "search_interval": "400ms",
    "confirm_misses": 2,
    "max_attempts": 4,
    "retry_backoff": "200ms",
    "retry_backoff_max": "1s",
}


class RefusingGmailEmulator(GmailEmulator):
    """The emulator, refusing sends to chosen recipients with 400 as Gmail does for a bad
    To header ("Invalid To header"). The relay modes cover 429/5xx/network faults but no
    permanent 4xx; this is the one way to get a definite refusal for a single job."""

    def __init__(self, *, refuse_to: Iterable[str] = (), **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.refuse_to = frozenset(address.lower() for address in refuse_to)
        self.refused: list[str] = []

    def _deliver(self, user: str, raw: bytes, metadata: dict[str, Any], *, via: str) -> Any:
        text = raw.decode("utf-8", "replace").lower()
        for address in self.refuse_to:
            if address in text:
                self.refused.append(address)
                raise ApiError(400, "Invalid To header", "invalidArgument")
        return super()._deliver(user, raw, metadata, via=via)


#: The token file's one line (every right) and the header that uses it.
API_TOKEN = "e2e-token-0123456789abcdef"
API_AUTH = {"Authorization": f"Bearer {API_TOKEN}"}


def api_section(folder: Path, port: int | None) -> str:
    """A config's `[api]` section on loopback `port` (none without one), with the token
    file it names written into `folder` (the name `e2e`: who acted, in histories)."""
    tokens = folder / "api-tokens"
    tokens.write_text(f"e2e:{API_TOKEN}\n", encoding="utf-8")
    tokens.chmod(0o600)
    if port is None:
        return ""
    return f'\n[api]\nlisten = "127.0.0.1:{port}"\ntoken_file = "api-tokens"\n'


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    return json.dumps(str(value), ensure_ascii=False)


def policy_text(fields: Mapping[str, Any]) -> str:
    return "".join(f"{name} = {_toml_value(value)}\n" for name, value in fields.items())


class DaemonProcess:
    """`sendledger --config X run` as a process of its own, forked from the worker's fork
    server (tests/e2e/fork_server.py: its imports paid once, not per daemon); stdout and
    stderr go to a file. Signals sent to `pid` reach the daemon alone."""

    def __init__(self, rig: Rig, name: str, env: Mapping[str, str] | None = None) -> None:
        self.rig = rig
        self.name = name
        self.stderr_path = rig.dir / f"{name}.stderr.log"
        self._server = shared_fork_server()
        self.pid = self._server.start(
            ["--config", str(rig.config), "run"],
            rig.dir,
            self.stderr_path,
            env=rig.child_env(env),
        )
        self.started = time.monotonic()
        self.returncode: int | None = None

    def poll(self) -> int | None:
        """None while it runs; else its exit code (-N when killed by signal N)."""
        if self.returncode is None:
            try:
                self.returncode, _at = self._server.exited(self.pid, timeout=0)
            except TimeoutError:
                return None
        return self.returncode

    def alive(self) -> bool:
        return self.poll() is None

    def stderr_text(self) -> str:
        try:
            return self.stderr_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    def tail(self, lines: int = 40) -> str:
        text = self.stderr_text().splitlines()[-lines:]
        return f"--- {self.name} stderr (last {len(text)} lines) ---\n" + "\n".join(text)

    def signal(self, signum: int) -> None:
        if self.alive():
            os.kill(self.pid, signum)

    def wait(self, timeout: float) -> int:
        """The exit code; fails the test (with stderr) if it does not exit in time."""
        if self.returncode is None:
            try:
                self.returncode, _at = self._server.exited(self.pid, timeout=timeout)
            except TimeoutError:
                pytest.fail(f"{self.name} did not exit within {timeout:g}s\n{self.tail()}")
        return self.returncode

    def terminate(self, timeout: float = 15.0) -> int:
        self.signal(signal.SIGTERM)
        return self.wait(timeout)

    def kill9(self) -> int:
        self.signal(signal.SIGKILL)
        return self.wait(10.0)

    def close(self) -> None:
        if self.alive():
            self.signal(signal.SIGTERM)
            try:
                self.returncode, _at = self._server.exited(self.pid, timeout=10)
            except TimeoutError:
                self.signal(signal.SIGKILL)
                self.wait(10)


class Rig:
    """Emulator + relay + config + policies in `folder`; daemons as processes."""

    def __init__(
        self,
        folder: Path,
        *,
        lag: float = 0.3,
        plan: FaultPlan | None = None,
        hang_seconds: float = 3.0,
        retry_after: float | None = 0.3,
        timeout: str = "1s",
        tick: str = "100ms",
        deadline_grace: str = "500ms",
        concurrency: int = 1,
        quota: float = 100_000.0,
        emulator: GmailEmulator | None = None,
        policies: Mapping[str, Mapping[str, Any]] | None = None,
        daemon_extra: str = "",
        provider_extra: str = "",
        relay_options: Mapping[str, Any] | None = None,
        api_port: int | None = None,
        read_history: bool = False,
    ) -> None:
        """`daemon_extra` and `provider_extra`: TOML lines added to `[daemon]` and to
        `[providers.gmail]`; `relay_options`: more keywords for the `FaultRelay`.
        `read_history`: the provider reads the mailbox's history after an unknown outcome
        (docs/providers.md "What each handle proves"); off, as in the integration tier,
        so a test of the search path sees the search decide."""
        self.dir = folder
        self.dir.mkdir(parents=True, exist_ok=True)
        self.acceptance_log = folder / "acceptance.jsonl"
        self.emulator = emulator or GmailEmulator(lag=lag, acceptance_log=self.acceptance_log)
        self.emulator.start()
        self.relay = FaultRelay(
            self.emulator.url,
            plan=plan or FaultPlan(),
            hang_seconds=hang_seconds,
            retry_after=retry_after,
            **(relay_options or {}),
        ).start()
        self.daemons: list[DaemonProcess] = []
        self._ledger: Ledger | None = None
        self.policies_dir = folder / "policies"
        self.policies_dir.mkdir(exist_ok=True)
        write_service_account(folder / "service-account.json", token_uri=self.emulator.token_uri)
        self.config = folder / "sendledger.toml"
        self.config.write_text(
            "[store]\n"
            'url = "sqlite:///ledger.sqlite"\n\n'
            "[daemon]\n"
            f'tick = "{tick}"\n'
            'policies_dir = "policies"\n'
            f"concurrency = {concurrency}\n"
            f'deadline_grace = "{deadline_grace}"\n'
            f"{daemon_extra}\n"
            "[providers.gmail]\n"
            'kind = "gmail"\n'
            'credentials_file = "service-account.json"\n'
            f'user = "{MAILBOX}"\n'
            f'api_endpoint = "{self.relay.url}"\n'
            f'token_uri = "{self.emulator.token_uri}"\n'
            f'timeout = "{timeout}"\n'
            f"quota_units_per_second = {quota}\n"
            f"read_history = {'true' if read_history else 'false'}\n"
            f"{provider_extra}" + api_section(folder, api_port),
            encoding="utf-8",
        )
        self.api_url = None if api_port is None else f"http://127.0.0.1:{api_port}"
        for channel, fields in (policies or {"receipts": RETRY_POLICY}).items():
            self.write_policy(channel, fields)

    # -- lifecycle --------------------------------------------------------------------

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        for daemon in self.daemons:
            daemon.close()
        if self._ledger is not None:
            self._ledger.close()
            self._ledger = None
        self.relay.stop()
        self.emulator.stop()

    def child_env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in _SCRUB and not k.startswith(_SCRUB_PREFIXES)
        }
        env["PYTHONUNBUFFERED"] = "1"
        env.update(extra or {})
        return env

    # -- policies and the CLI ---------------------------------------------------------

    def write_policy(self, channel: str, fields: Mapping[str, Any], *, name: str = "") -> Path:
        path = self.policies_dir / f"{name or channel}.toml"
        path.write_text(policy_text({"channel": channel, **fields}), encoding="utf-8")
        return path

    def cli(
        self,
        *args: str,
        stdin: str | None = None,
        env: Mapping[str, str] | None = None,
        check: bool = True,
        timeout: float = 60.0,
    ) -> subprocess.CompletedProcess[str]:
        """`sendledger ARGS` to its end, forked from the worker's fork server (a process of
        its own, as the console script would be, without a second of imports)."""
        argv = ["--config", str(self.config), *args]
        code, out, err = shared_fork_server().call(
            argv, self.dir, stdin or "", self.child_env(env), timeout
        )
        result = subprocess.CompletedProcess([SENDLEDGER, *argv], code, out, err)
        if check and result.returncode != 0:
            pytest.fail(
                f"sendledger {' '.join(args)} exited {result.returncode}\n"
                f"stdout: {result.stdout}\nstderr: {result.stderr}"
            )
        return result

    def cli_parallel(self, *commands: Sequence[str], timeout: float = 60.0) -> None:
        """Independent CLI commands at once."""
        with ThreadPoolExecutor(len(commands)) as pool:
            results = list(pool.map(lambda a: self.cli(*a, check=False, timeout=timeout), commands))
        failures = []
        for args, proc in zip(commands, results, strict=True):
            if proc.returncode != 0:
                failures.append(
                    f"sendledger {' '.join(args)} exited {proc.returncode}: {proc.stderr}"
                )
        if failures:
            pytest.fail("\n".join(failures))

    def cli_json(self, *args: str, env: Mapping[str, str] | None = None) -> Any:
        return json.loads(self.cli(*args, "--json", env=env).stdout)

    def submit(
        self, jobs: Sequence[Mapping[str, Any]], env: Mapping[str, str] | None = None
    ) -> list[dict[str, Any]]:
        """One `sendledger submit --json -` call for all the jobs (a JSON list)."""
        out = self.cli("submit", "--json", "-", stdin=json.dumps(list(jobs)), env=env).stdout
        result = json.loads(out)
        return result if isinstance(result, list) else [result]

    def submit_api(self, jobs: Sequence[Mapping[str, Any]]) -> None:
        """The jobs through the running daemon's API (`POST /v1/jobs`, a list, all or
        nothing): no interpreter to start, so the jobs are stored when a test says."""
        answer = httpx.post(
            f"{self.wait_api()}/v1/jobs", json=list(jobs), headers=API_AUTH, timeout=60
        )
        assert answer.status_code == 201, answer.text

    # -- the daemon -------------------------------------------------------------------

    def start_daemon(self, env: Mapping[str, str] | None = None) -> DaemonProcess:
        daemon = DaemonProcess(self, f"daemon{len(self.daemons) + 1}", env)
        self.daemons.append(daemon)
        return daemon

    @property
    def daemon(self) -> DaemonProcess | None:
        return self.daemons[-1] if self.daemons else None

    # -- reading the ledger (never writing) -------------------------------------------

    @property
    def ledger(self) -> Ledger:
        if self._ledger is None:
            self._ledger = Ledger(f"sqlite:///{self.dir / 'ledger.sqlite'}")
        return self._ledger

    def row(self, key: str) -> IndexRow | None:
        return self.ledger.row(key)

    def state(self, key: str) -> str | None:
        row = self.row(key)
        return row.state if row else None

    def rows(self) -> list[IndexRow]:
        return list(self.ledger.jobs())

    def states(self) -> dict[str, str]:
        """Every job's state, from one read of the index (not a query per job: a poll
        of 100 jobs every 0.1 s would take this process's CPU, which the emulator and
        the relay, threads of it, serve the daemon with)."""
        return {row.key: row.state for row in self.ledger.jobs()}

    def history(self, key: str) -> list[dict[str, Any]]:
        """The job's events as `sendledger history --json` prints them."""
        return [event_record(event) for event in self.ledger.history(key)]

    def types(self, key: str) -> list[str]:
        return [record["type"] for record in self.history(key)]

    def message_id(self, key: str) -> str:
        row = self.row(key)
        assert row is not None, f"no job {key!r}"
        return row.message_id

    # -- effects: the emulator's acceptance log ---------------------------------------

    def copies(self, key: str) -> int:
        return self.emulator.copies(self.message_id(key))

    def copies_in_log_file(self, message_id: str) -> int:
        if not self.acceptance_log.exists():
            return 0
        with self.acceptance_log.open(encoding="utf-8") as handle:
            return sum(1 for line in handle if json.loads(line)["message_id"] == message_id)

    def searches_for(self, key: str) -> list[dict[str, Any]]:
        """Relay log entries of `rfc822msgid:` searches for this job's Message-ID."""
        wanted = self.message_id(key).strip("<>").lower()
        return [
            entry
            for entry in list(self.relay.log)
            if entry["kind"] == "search"
            and "rfc822msgid" in unquote(entry["path"]).lower()
            and wanted in unquote(entry["path"]).lower()
        ]

    def sends(self, *, forwarded: bool | None = None) -> list[dict[str, Any]]:
        return [
            entry
            for entry in list(self.relay.log)
            if entry["kind"] == "send" and (forwarded is None or entry["forwarded"] == forwarded)
        ]

    # -- bounded waits ----------------------------------------------------------------

    def diagnostics(self) -> str:
        parts = []
        try:
            parts.append(
                "jobs: " + ", ".join(f"{r.key}={r.state}({r.reason})" for r in self.rows()[:30])
            )
        except Exception as exc:  # the store may not exist yet
            parts.append(f"jobs: unreadable ({exc})")
        parts.append(f"relay: {[(e['kind'], e['mode'], e['forwarded']) for e in self.relay.log]}")
        if self.daemon is not None:
            parts.append(self.daemon.tail())
        return "\n".join(parts)

    def wait_for(
        self,
        predicate: Callable[[], bool],
        what: str,
        *,
        timeout: float = WAIT,
        interval: float = 0.1,
        daemon_must_live: bool = True,
    ) -> float:
        """Poll until `predicate()`; returns the seconds it took. Fails (with the daemon's
        stderr) on timeout, or at once if the daemon died meanwhile."""
        start = time.monotonic()
        while True:
            if predicate():
                return time.monotonic() - start
            daemon = self.daemon
            if daemon_must_live and daemon is not None and not daemon.alive():
                if predicate():
                    return time.monotonic() - start
                pytest.fail(
                    f"the daemon exited ({daemon.returncode}) while waiting for {what}\n"
                    + self.diagnostics()
                )
            if time.monotonic() - start > timeout:
                pytest.fail(
                    f"timed out after {timeout:g}s waiting for {what}\n" + self.diagnostics()
                )
            time.sleep(interval)

    def wait_api(self) -> str:
        """The daemon's API URL, once /healthz answers (200, or 503 while it starts)."""
        url = self.api_url
        assert url is not None, "a Rig made without api_port has no API"
        self.wait_for(lambda: _answers(url), "the API to answer", timeout=WAIT)
        return url

    def wait_state(self, key: str, *states: str, timeout: float = WAIT) -> float:
        return self.wait_for(
            lambda: self.state(key) in states, f"{key} in {'/'.join(states)}", timeout=timeout
        )

    def wait_settled(self, keys: Iterable[str], *, timeout: float = WAIT) -> float:
        wanted = list(keys)

        def settled() -> bool:
            states = self.states()
            return all(states.get(key) in SETTLED for key in wanted)

        return self.wait_for(
            settled,
            f"{len(wanted)} jobs to settle",
            timeout=timeout,
        )


class PostgresRig(Rig):
    """The rig with its store on PostgreSQL (the Rig's keywords pass through)."""

    def __init__(self, folder: Path, store_url: str, **options: Any) -> None:
        super().__init__(folder, **options)
        self.store_url = store_url
        text = self.config.read_text().replace(
            'url = "sqlite:///ledger.sqlite"', f'url = "{store_url}"'
        )
        self.config.write_text(text)

    @property
    def ledger(self) -> Ledger:
        if self._ledger is None:
            self._ledger = Ledger(self.store_url)
        return self._ledger


def _answers(url: str) -> bool:
    try:
        return httpx.get(url + "/healthz", timeout=1).status_code in (200, 503)
    except httpx.HTTPError:
        return False


class NotifyListener:
    """A unix datagram socket standing in for systemd's $NOTIFY_SOCKET: collects every
    datagram the daemon sends (each is newline-separated KEY=VALUE lines)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.messages: list[list[str]] = []
        self._lock = threading.Lock()
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.bind(str(path))
        self._sock.settimeout(0.1)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="notify", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data = self._sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                self.messages.append(data.decode("utf-8").split("\n"))

    def lines(self) -> list[str]:
        with self._lock:
            return [line for message in self.messages for line in message]

    def count(self, prefix: str) -> int:
        return sum(1 for line in self.lines() if line.startswith(prefix))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self._sock.close()


_SHARED: list[ForkServer] = []


def shared_fork_server() -> ForkServer:
    """The test process's fork server (one per xdist worker), started at first use and
    closed when the process exits. Each call passes the command's own environment."""
    if not _SHARED or _SHARED[0].proc.poll() is not None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SENDLEDGER_")}
        env["PYTHONUNBUFFERED"] = "1"  # the children's print() reaches their log at once
        _SHARED[:] = [ForkServer(env)]
        atexit.register(_SHARED[0].close)
        lives_for_the_session(_SHARED[0].reader)
    return _SHARED[0]


class ChildExits:
    """The fork server's children's exits, by pid. Linux gives a pid out again once its
    process is reaped (pid_max is 32,768 on the CI machine, and a machine running several
    sessions goes round it within one): a child may get an earlier child's pid. Its start
    puts a new entry in place, so a wait for it never takes the earlier child's exit for
    its own (it answered at once, exit 0 and nothing printed, and the later child's exit
    then met a settled entry, which raised in the reader and left every later command of
    the worker waiting 90 s for its start)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_pid: dict[int, Future[tuple[int, float]]] = {}

    def _entry(self, pid: int) -> Future[tuple[int, float]]:
        with self._lock:
            return self._by_pid.setdefault(pid, Future())

    def started(self, pid: int) -> None:
        """A child started as `pid`: whatever an earlier child of that pid left is not its."""
        with self._lock:
            self._by_pid[pid] = Future()

    def ended(self, pid: int, code: int, at: float) -> None:
        self._entry(pid).set_result((code, at))

    def wait(self, pid: int, timeout: float) -> tuple[int, float]:
        """(exit code, when) of the child that last started as `pid`; TimeoutError while
        it still runs."""
        return self._entry(pid).result(timeout=timeout)


class ForkServer:
    """`fork_server.py` as a child process: starts `sendledger` commands (a daemon, a
    CLI command) as forked processes, each a second of imports cheaper than a console
    script's start, and reports their exits."""

    def __init__(self, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(FORK_SERVER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )
        self._lock = threading.Lock()
        self._started: dict[int, Future[int]] = {}
        self.exits = ChildExits()
        self._next = 0
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            message = json.loads(line)
            if "id" in message:
                self.exits.started(message["pid"])  # before start() returns the pid
                with self._lock:
                    self._started[message["id"]].set_result(message["pid"])
            else:
                self.exits.ended(message["pid"], message["code"], message["at"])

    def start(self, argv: list[str], cwd: Path, log: Path, **more: object) -> int:
        """`more`: the protocol's optional "stdout", "stderr", "stdin" and "env"."""
        with self._lock:
            ident, self._next = self._next, self._next + 1
            started: Future[int] = Future()
            self._started[ident] = started
            assert self.proc.stdin is not None
            request = {"id": ident, "argv": argv, "cwd": str(cwd), "log": str(log), **more}
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
        # The first request waits for the server's imports too: 20 s and more on a loaded
        # machine, when the two workers' servers start at once.
        return started.result(timeout=90)

    def exited(self, pid: int, timeout: float) -> tuple[int, float]:
        """(exit code, when) of a child; TimeoutError while it still runs."""
        return self.exits.wait(pid, timeout)

    def run(
        self,
        argv: list[str],
        cwd: Path,
        log: Path,
        timeout: float = 60.0,
        env: Mapping[str, str] | None = None,
    ) -> tuple[int, str]:
        """A command to its end: its exit code and what it printed (stdout and stderr);
        `env`: its whole environment (else the server's)."""
        more = {} if env is None else {"env": dict(env)}
        code, _at = self.exited(self.start(argv, cwd, log, **more), timeout)
        return code, log.read_text(encoding="utf-8", errors="replace")

    def call(
        self, argv: list[str], cwd: Path, stdin: str, env: Mapping[str, str], timeout: float = 60.0
    ) -> tuple[int, str, str]:
        """A CLI command to its end as a console script runs it (its own environment,
        stdin, stdout and stderr): (exit code, stdout, stderr)."""
        folder = Path(tempfile.mkdtemp(prefix="fork-call-"))  # beside, never in, `cwd`
        files = {name: folder / name for name in ("stdin", "stdout", "stderr")}
        files["stdin"].write_text(stdin, encoding="utf-8", errors="surrogateescape")
        try:
            pid = self.start(
                argv, cwd, files["stdout"], **{k: str(v) for k, v in files.items()}, env=dict(env)
            )
            code, _at = self.exited(pid, timeout)
            read = {
                n: files[n].read_text(encoding="utf-8", errors="replace")
                for n in ("stdout", "stderr")
            }
            return code, read["stdout"], read["stderr"]
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def job(
    key: str,
    *,
    channel: str = "receipts",
    to: str = "customer@example.com",
    subject: str | None = None,
) -> dict[str, Any]:
    return {
        "channel": channel,
        "key": key,
        "to": to,
        "subject": subject or f"Your receipt {key}",
        "body": f"Hello,\n\nthis is {key}.\n",
    }


def events_of(history: Sequence[Mapping[str, Any]], kind: str) -> list[Mapping[str, Any]]:
    return [record for record in history if record["type"] == kind]


def types_with_calls(history: Sequence[Mapping[str, Any]]) -> list[str]:
    """The history's event types without the claims that made no provider call: an
    Attempted followed by a Rejected "not sent: ..." (its circuit withheld it, its lease
    ran short while a loaded machine saved it, the daemon was stopping). Such a claim is
    sent again by the next attempt; a test that counts the provider's calls reads this."""
    types: list[str] = []
    for record in history:
        unsent = record["type"] == "Rejected" and str(record.get("reason", "")).startswith(
            "not sent:"
        )
        if unsent and types and types[-1] == "Attempted":
            types.pop()
        else:
            types.append(record["type"])
    return types


__all__ = [
    "API_AUTH",
    "MAILBOX",
    "RETRY_POLICY",
    "SETTLED",
    "DaemonProcess",
    "ForkServer",
    "NotifyListener",
    "RefusingGmailEmulator",
    "Rig",
    "api_section",
    "events_of",
    "job",
    "policy_text",
    "shared_fork_server",
    "types_with_calls",
]
