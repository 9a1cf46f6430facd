"""Soak: thousands of jobs, random faults, two daemons on PostgreSQL killed with SIGKILL in
turn and restarted (same daemon.name) every --kill-every seconds, and a scripted operator
who checks, resolves, resends and cancels random jobs from the CLI and the HTTP API
meanwhile, until every job settles. Not part of `make test`: `make soak` runs it (10,000
jobs by default; SOAK_ARGS="--jobs 1000" for a short one).

--mode messages (Gmail `users.messages.send`), drafts (Gmail with `send_via = "drafts"`,
the gmail.compose scope) or graph (Microsoft Graph over TLS: a draft, then its send); the
fault relay in front of the emulator in each. PostgreSQL: SENDLEDGER_TEST_PG_URL when it
answers, else a private cluster (tests/pg_cluster.py). docs/performance.md "The chaos
soak" says what the operator does and what each check means.

What it checks, counting effects at the emulator only (its acceptance log):
- no Message-ID accepted twice (any job with two copies is printed with its history);
- confirmed: exactly one copy (resolved "sent" by a person: at most one); abandoned at
  most one; cancelled none, never attempted;
- no false "unsent" record: no Rejected and no DraftPending after the attempt whose call
  made the job's copy (the call is the relay request the emulator's acceptance names);
- review channel ("payouts", on_unknown = review): no attempt after an Unknown unless a
  person resent it or its draft was found unsent (DraftPending);
- once every job is settled (the operator decides what is left in review at the end) and
  its tidy ran (`DraftsDeleted`, why `tidy`, `search_after` after it settled), no unsent
  draft is left in the emulator's mailboxes;
- the operator's every answer is an outcome or a documented refusal (exit 3 / 409,
  exit 1 / 503), never an unexpected failure (exit 1 "unexpected failure", a traceback,
  500);
- the job index equals a rebuild from the events (`admin rebuild-index`).
Figures are printed at the end; the exit code is 0 only when every check holds.

    .venv/bin/python bench/soak.py [--mode messages|drafts|graph] [--jobs 10000]
"""

from __future__ import annotations

import argparse
import collections
import itertools
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/intake.py's PostgreSQL

import psycopg
from intake import postgres_server

from daemon.engine.recover import OWN_REASON, REASON
from daemon.providers.gmail import DRAFT_SCOPES
from daemon.service_layer.read_models import event_record, timeline_details
from ledger.application import Ledger
from ledger.content import parse_job
from ledger.stores.index import IndexRow
from policies.loader import load_policy_dir
from sendledger.client import ApiError, Client, ClientError, Conflict, ConnectionLost
from testkit.credentials import write_service_account
from testkit.gmail_emulator import GmailEmulator
from testkit.graph_emulator import DEFAULT_CLIENT_ID, DEFAULT_TENANT, GraphEmulator
from testkit.mailservers import free_port
from testkit.relay import FaultPlan, FaultRelay, Mode
from testkit.tls import make_loopback_tls

PG_URL = os.environ.get(
    "SENDLEDGER_TEST_PG_URL", "postgresql://sendledger:sendledger@127.0.0.1:5432/sendledger_test"
)
SENDLEDGER = str(Path(sys.executable).parent / "sendledger")
MAILBOX = "shop@shop.example"
SETTLED = ("confirmed", "review", "abandoned", "cancelled")
FINAL = ("confirmed", "abandoned", "cancelled")
MODES = ("messages", "drafts", "graph")
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
# A share of the jobs is submitted with a send_at up to this far ahead (seconds), so a
# cancel can still win against the daemons late in the run.
SEND_AT_SHARE = 0.1
SEND_AT_WITHIN = (5.0, 90.0)
API_TOKEN = "soak-http:soak-token-0123456789abcdef"
GRAPH_SECRET = "soak-graph-secret"
NOTE = "soak operator"
# The events that say an attempt sent nothing.
UNSENT = ("Rejected", "DraftPending")
SETTLING = ("Confirmed", "Resolved", "Cancelled")


def toml_value(value: Any) -> str:
    return f'"{value}"' if isinstance(value, str) else str(value).lower()


def write_policies(folder: Path, policies: dict[str, dict[str, Any]]) -> None:
    (folder / "policies").mkdir()
    for channel, fields in policies.items():
        text = "".join(
            f"{k} = {toml_value(v)}\n" for k, v in {"channel": channel, **fields}.items()
        )
        (folder / "policies" / f"{channel}.toml").write_text(text)


def write_config(folder: Path, store: str, provider: str, *, grace: str = "5s") -> Path:
    """sendledger.toml: the store, the daemon's settings, one provider section and an API
    token file (each daemon listens where SENDLEDGER_API__LISTEN says)."""
    tokens = folder / "api-tokens"
    tokens.write_text(API_TOKEN + "\n")
    tokens.chmod(0o600)
    config = folder / "sendledger.toml"
    config.write_text(
        f'[store]\nurl = "{store}"\n\n'
        '[daemon]\ntick = "200ms"\npolicies_dir = "policies"\nconcurrency = 8\n'
        f'batch_size = 400\ndeadline_grace = "{grace}"\n\n'
        f'[api]\ntoken_file = "{tokens.name}"\n\n' + provider
    )
    return config


def write_setup(
    folder: Path,
    store: str,
    policies: dict[str, dict[str, Any]],
    emulator: GmailEmulator,
    relay: FaultRelay,
    *,
    send_via: str = "messages",
    user: str = MAILBOX,
) -> Path:
    """The service account, one policy file per channel and a sendledger.toml sending
    through the relay, in `folder`; returns the config's path (bench/daemons.py too)."""
    write_service_account(folder / "service-account.json", token_uri=emulator.token_uri)
    write_policies(folder, policies)
    return write_config(
        folder,
        store,
        '[providers.gmail]\nkind = "gmail"\ncredentials_file = "service-account.json"\n'
        f'user = "{user}"\napi_endpoint = "{relay.url}"\n'
        f'token_uri = "{emulator.token_uri}"\ntimeout = "1s"\n'
        f'quota_units_per_second = 1000000\nsend_via = "{send_via}"\n',
    )


# -- which request made each copy --------------------------------------------------------

RELAY_SEQ = "X-Soak-Relay-Seq"


class SoakRelay(FaultRelay):
    """The fault relay, numbering each request it forwards (a header the emulator reads),
    so each copy the emulator accepts names the request that made it, and the time that
    request reached the relay: when its call started, which says which attempt it was."""

    def __init__(self, upstream: str, **kwargs: Any) -> None:
        super().__init__(upstream, **kwargs)
        self._numbers = itertools.count(1)
        self.by_seq: dict[int, dict[str, Any]] = {}

    def _forward(self, handler: Any, body: bytes, entry: dict[str, Any]) -> Any:
        seq = next(self._numbers)
        entry["seq"] = seq
        self.by_seq[seq] = entry
        handler.headers[RELAY_SEQ] = str(seq)
        return super()._forward(handler, body, entry)


class _Numbered:
    """An emulator whose acceptances carry the relay's number of the request (`relay_seq`):
    the request is read in `handle` and accepted in the same thread."""

    _request = threading.local()
    _lock: threading.RLock
    _accepted: list[dict[str, Any]]
    made_by: dict[str, int | None]  # draft id -> the relay's number of its request

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.made_by = {}

    def handle(self, method: str, target: str, headers: dict[str, str], body: bytes) -> Any:
        self._request.seq = headers.get(RELAY_SEQ.lower())
        return super().handle(method, target, headers, body)  # type: ignore[misc]

    def _number_last(self) -> None:
        self._accepted[-1]["relay_seq"] = self._request_number()

    def _request_number(self) -> int | None:
        seq = getattr(self._request, "seq", None)
        return None if seq is None else int(seq)


@dataclass(frozen=True)
class Draft:
    """An unsent draft in the emulator's mailbox: whose (Message-ID), and the relay's
    number of the request that made it."""

    mailbox: str
    draft_id: str
    message_id: str | None
    made_by: int | None


class NumberedGmail(_Numbered, GmailEmulator):
    def _log_accepted(self, stored: Any, raw: bytes, via: str) -> None:
        with self._lock:
            super()._log_accepted(stored, raw, via)
            self._number_last()

    def _new_draft_id(self) -> str:
        draft_id = super()._new_draft_id()  # in the thread of the drafts.create request
        self.made_by[draft_id] = self._request_number()
        return draft_id

    def unsent_drafts(self) -> list[Draft]:
        with self._lock:
            return [
                Draft(m.user, d, m.message_id, self.made_by.get(d)) for d, m in self._drafts.items()
            ]


class NumberedGraph(_Numbered, GraphEmulator):
    def _dispatch(self, item: Any, via: str, request_raw: bytes) -> None:
        with self._lock:
            super()._dispatch(item, via, request_raw)
            self._number_last()

    def _store_draft(self, user: str, raw: bytes) -> Any:
        item = super()._store_draft(user, raw)
        self.made_by[item.immutable_id] = self._request_number()
        return item

    def unsent_drafts(self) -> list[Draft]:
        with self._lock:
            self._settle()
            return [
                Draft(i.user, i.immutable_id, i.message_id, self.made_by.get(i.immutable_id))
                for i in self._items
                if i.folder == "drafts"
            ]


# -- one mode's emulator, relay and config ------------------------------------------------


@dataclass
class Rig:
    mode: str
    folder: Path
    emulator: NumberedGmail | NumberedGraph
    relay: SoakRelay
    config: Path
    env: dict[str, str]  # every child's: daemons and CLI commands

    def stop(self) -> None:
        self.relay.stop()
        self.emulator.stop()


def soak_policies(provider: str) -> dict[str, dict[str, Any]]:
    # A confirmed job that was resent has its copies counted again at verify_after (1h by
    # default): soon, so that a late second copy is seen and the run can end.
    return {c: {**f, "provider": provider, "verify_after": "2s"} for c, f in POLICIES.items()}


def make_rig(mode: str, folder: Path, store: str, seed: int) -> Rig:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SENDLEDGER_")}
    env["PYTHONUNBUFFERED"] = "1"
    plan = FaultPlan.random(seed, FAULTS)
    accepted = folder / "acceptance.jsonl"
    if mode == "graph":
        tls = make_loopback_tls(folder / "tls")
        graph = NumberedGraph(
            tls=tls,
            lag=0.3,
            file_delay=0.2,
            acceptance_log=accepted,
            clients={DEFAULT_CLIENT_ID: GRAPH_SECRET},
        ).start()
        # The hang outlasts the provider's timeout: the daemon gives up first.
        relay = SoakRelay(
            graph.url,
            plan=plan,
            tls=tls,
            upstream_ca=str(tls.ca_file),
            hang_seconds=3.0,
            retry_after=0.3,
        ).start()
        secret = folder / "client-secret"
        secret.write_text(GRAPH_SECRET + "\n")
        secret.chmod(0o600)
        write_policies(folder, soak_policies("graph"))
        # Two daemons share Graph's 4 requests in flight per mailbox; a send is up to
        # three requests plus confirm_wait, which the grace covers (docs/providers.md).
        config = write_config(
            folder,
            store,
            '[providers.graph]\nkind = "graph"\n'
            f'tenant_id = "{DEFAULT_TENANT}"\nclient_id = "{DEFAULT_CLIENT_ID}"\n'
            f'client_secret_file = "{secret.name}"\nuser = "{{from}}"\n'
            f'authority = "{relay.url}"\napi_endpoint = "{relay.url}/v1.0"\n'
            'timeout = "2s"\nconfirm_wait = "1s"\nmax_concurrent = 2\n',
            grace="6s",
        )
        env["REQUESTS_CA_BUNDLE"] = str(tls.ca_file)
        return Rig(mode, folder, graph, relay, config, env)
    gmail = NumberedGmail(
        lag=0.3,
        acceptance_log=accepted,
        # As domain-wide delegation lists them: drafts need gmail.compose too.
        grantable_scopes=DRAFT_SCOPES,
    ).start()
    relay = SoakRelay(gmail.url, plan=plan, hang_seconds=1.5, retry_after=0.3).start()
    config = write_setup(
        folder,
        store,
        soak_policies("gmail"),
        gmail,
        relay,
        send_via="drafts" if mode == "drafts" else "messages",
    )
    return Rig(mode, folder, gmail, relay, config, env)


# -- the daemons ---------------------------------------------------------------------------


class Daemon:
    def __init__(
        self,
        folder: Path,
        config: Path,
        name: str,
        generation: int,
        extra_env: Mapping[str, str] | None = None,
    ) -> None:
        self.name = name
        self.log = folder / f"{name}.{generation}.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("SENDLEDGER_")}
        env.update(extra_env or {})
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

    def tail(self, lines: int = 15) -> str:
        text = self.log.read_text(errors="replace").splitlines()[-lines:]
        return f"--- {self.log.name} (last {len(text)} lines) ---\n" + "\n".join(text)


class Fleet:
    """Two daemons, each with its own API port; one of them killed -9 and started again
    (same name, same port) every `kill_every` seconds, in turn."""

    NAMES = ("soak-a", "soak-b")

    def __init__(self, rig: Rig, kill_every: float) -> None:
        self.rig = rig
        self.kill_every = kill_every
        self.ports = {name: free_port() for name in self.NAMES}
        self.generation = collections.Counter[str]()
        self.daemons = {name: self._start(name) for name in self.NAMES}
        self.kills = 0
        self.killed: list[str] = []  # when, which
        self.next_kill = time.monotonic() + kill_every
        self.logs: list[Path] = [d.log for d in self.daemons.values()]

    def _start(self, name: str) -> Daemon:
        env = {**self.rig.env, "SENDLEDGER_API__LISTEN": f"127.0.0.1:{self.ports[name]}"}
        return Daemon(self.rig.folder, self.rig.config, name, self.generation[name], env)

    @property
    def api_urls(self) -> list[str]:
        return [f"http://127.0.0.1:{port}" for port in self.ports.values()]

    def wait_for_apis(self, timeout: float = 120.0) -> None:
        """Until each daemon's API answers (/healthz: 200 or 503), so that the operator's
        "down" counts only the restarts."""
        deadline = time.monotonic() + timeout
        for url in self.api_urls:
            while time.monotonic() < deadline:
                try:
                    with urllib.request.urlopen(url + "/healthz", timeout=5):
                        break
                except urllib.error.HTTPError:
                    break  # it answered
                except OSError:
                    time.sleep(0.2)

    def tend(self, say: Callable[[str], None]) -> str | None:
        """Kill and restart the next victim when due; a daemon that exited on its own is
        the answer (a problem)."""
        for name, daemon in self.daemons.items():
            code = daemon.proc.poll()
            if code is not None:
                return f"{name} exited {code}; see {daemon.log}\n{daemon.tail()}"
        now = time.monotonic()
        if now >= self.next_kill:
            name = self.NAMES[self.kills % len(self.NAMES)]
            victim = self.daemons[name]
            victim.proc.send_signal(signal.SIGKILL)
            victim.proc.wait()
            self.kills += 1
            self.killed.append(f"{iso(time.time())} {name}")
            self.generation[name] += 1
            self.daemons[name] = self._start(name)
            self.logs.append(self.daemons[name].log)
            self.next_kill = now + self.kill_every
            say(f"killed {name} (#{self.kills})")
        return None

    def stop(self) -> None:
        for daemon in self.daemons.values():
            daemon.proc.send_signal(signal.SIGTERM)
        for daemon in self.daemons.values():
            try:
                daemon.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                daemon.proc.kill()
                daemon.proc.wait()

    def tails(self) -> str:
        return "\n".join(daemon.tail() for daemon in self.daemons.values())


# -- the operator --------------------------------------------------------------------------


@dataclass(frozen=True)
class Action:
    kind: str  # "check", "resolve", "cancel", "triage"
    decision: str = ""  # resolve: "sent", "resend" or "abandon"
    expected_version: int | None = None

    @property
    def name(self) -> str:
        return f"resolve {self.decision}" if self.kind == "resolve" else self.kind


# What an answer was: an outcome, a documented refusal, or (else) a failure.
OK, CONFLICT, UNAVAILABLE, DOWN, LOST, FAILURE = (
    "ok",
    "conflict",
    "unavailable",
    "down",
    "answer lost",
    "FAILURE",
)


@dataclass
class Tally:
    """Operator actions by (door, action, outcome); the unexpected answers in full."""

    counts: collections.Counter[tuple[str, str, str]] = field(default_factory=collections.Counter)
    # The refusals' sentences, keys and numbers taken out: what the doors said, how often.
    refusals: collections.Counter[str] = field(default_factory=collections.Counter)
    # Two doors on one job at once: what each answered ("cli resolve resend ok + ...").
    pairs: collections.Counter[str] = field(default_factory=collections.Counter)
    failures: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, door: str, key: str, action: Action, outcome: str, detail: str) -> None:
        with self.lock:
            self.counts[(door, action.name, outcome)] += 1
            if outcome == FAILURE:
                self.failures.append(f"{door} {action.name} {key}: {detail}")
            elif outcome in (CONFLICT, UNAVAILABLE):
                sentence = re.sub(r"^(sendledger: |\d+: )", "", detail.splitlines()[-1])
                sentence = re.sub(r"'[^']*'", "K", sentence)
                sentence = re.sub(r"\d[\d.:TZ+-]*", "N", sentence)
                self.refusals[f"{outcome}: {sentence[:140]}"] += 1

    def lines(self) -> list[str]:
        with self.lock:
            rows = sorted(self.counts.items())
        by_action: dict[tuple[str, str], list[str]] = collections.defaultdict(list)
        for (door, action, outcome), n in rows:
            by_action[(door, action)].append(f"{outcome} {n}")
        return [f"{door:<5} {action:<15} {', '.join(v)}" for (door, action), v in by_action.items()]


class CliDoor:
    """`sendledger review check|resolve|triage` and `sendledger cancel`, as processes."""

    name = "cli"

    def __init__(self, rig: Rig) -> None:
        self.rig = rig

    def act(self, key: str, action: Action) -> tuple[str, str]:
        args = {
            "check": ["review", "check", key],
            "resolve": ["review", "resolve", key, "--as", action.decision, "--note", NOTE],
            "cancel": ["cancel", key, "--note", NOTE],
            "triage": ["review", "triage"],
        }[action.kind]
        if action.expected_version is not None:
            args += ["--expected-version", str(action.expected_version)]
        result = subprocess.run(
            [SENDLEDGER, "--config", str(self.rig.config), *args, "--by", "soak-cli", "--json"],
            capture_output=True,
            text=True,
            cwd=self.rig.folder,
            env=self.rig.env,
            timeout=180,
        )
        detail = result.stderr.strip()[-2000:].removeprefix("error: ")
        if "Traceback" in result.stderr or "unexpected failure" in result.stderr:
            return FAILURE, f"exit {result.returncode}: {detail}"
        # Exit 1 without them: the search could not be made (docs/cli.md "Exit codes").
        outcome = {0: OK, 3: CONFLICT, 1: UNAVAILABLE}.get(result.returncode, FAILURE)
        return outcome, (f"exit {result.returncode}: {detail}" if outcome == FAILURE else detail)


class HttpDoor:
    """The HTTP API of one daemon or the other (each killed in turn), through the Python
    client with no retries, so every answer is counted as it came."""

    name = "http"

    def __init__(self, urls: Sequence[str], rng: random.Random) -> None:
        token = API_TOKEN.split(":", 1)[1]
        self.clients = [Client(url, token, timeout=60.0, retries=0) for url in urls]
        self.rng = rng

    def act(self, key: str, action: Action) -> tuple[str, str]:
        # One daemon, else (refused: it is being restarted) the other, as a person would.
        first, other = self.rng.sample(self.clients, 2)
        outcome, detail = self._call(first, key, action)
        if outcome == DOWN:
            outcome, detail = self._call(other, key, action)
        return outcome, detail

    def _call(self, client: Client, key: str, action: Action) -> tuple[str, str]:
        version = action.expected_version
        try:
            if action.kind == "check":
                client.check(key)
            elif action.kind == "resolve":
                client.resolve(key, action.decision, NOTE, expected_version=version)
            elif action.kind == "cancel":
                client.cancel(key, NOTE, expected_version=version)
            else:
                client.triage()
        except Conflict as exc:
            return CONFLICT, str(exc)
        except ConnectionLost as exc:
            # A daemon killed or restarting: refused (nothing done) or no answer.
            return (LOST if exc.sent else DOWN), str(exc)
        except ApiError as exc:
            return (UNAVAILABLE if exc.status == 503 else FAILURE), f"{exc.status}: {exc}"
        except ClientError as exc:
            return FAILURE, f"{type(exc).__name__}: {exc}"
        return OK, ""


Door = CliDoor | HttpDoor


class Operator:
    """Picks random jobs from the index and acts on them through the two doors, sometimes
    both at once on the same job; at most `in_flight` actions run at a time."""

    RESOLUTIONS = ("resend", "resend", "abandon", "sent")

    def __init__(
        self,
        ledger: Ledger,
        doors: Sequence[Door],
        tally: Tally,
        rng: random.Random,
        every: float,
        in_flight: int = 4,
    ) -> None:
        self.ledger = ledger
        self.doors = list(doors)
        self.tally = tally
        self.rng = rng
        self.every = every
        self.in_flight = in_flight
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="operator", daemon=True)

    def start(self) -> Operator:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join()

    def act(self, door: Door, key: str, action: Action) -> str:
        try:
            outcome, detail = door.act(key, action)
        except Exception as exc:  # the operator's own bug: counted, never silent
            outcome, detail = FAILURE, f"{type(exc).__name__}: {exc}"
        self.tally.add(door.name, key, action, outcome, detail)
        return outcome

    def act_together(self, key: str, acts: list[tuple[Door, Action]]) -> None:
        """Two doors on one job at once, as two people clicking; the pair's outcomes."""
        with ThreadPoolExecutor(len(acts)) as both:
            outcomes = list(both.map(lambda act: self.act(act[0], key, act[1]), acts))
        with self.tally.lock:
            self.tally.pairs[
                " + ".join(
                    f"{d.name} {a.name} {o}" for (d, a), o in zip(acts, outcomes, strict=True)
                )
            ] += 1

    def _run(self) -> None:
        pending: set[Future[Any]] = set()
        with ThreadPoolExecutor(self.in_flight, thread_name_prefix="operator") as pool:
            while not self.stopping.wait(self.rng.uniform(0.5, 1.5) * self.every):
                pending = {f for f in pending if not f.done()}
                if len(pending) >= self.in_flight:
                    continue
                rows = list(self.ledger.jobs())
                if not rows:
                    continue
                key, acts = self.plan(rows)
                if len(acts) == 1:
                    pending.add(pool.submit(self.act, acts[0][0], key, acts[0][1]))
                else:
                    pending.add(pool.submit(self.act_together, key, acts))
            for future in pending:
                future.result()

    def _resolve(self) -> Action:
        return Action("resolve", self.rng.choice(self.RESOLUTIONS))

    def plan(self, rows: Sequence[IndexRow]) -> tuple[str, list[tuple[Door, Action]]]:
        rng = self.rng
        by_state: dict[str, list[IndexRow]] = collections.defaultdict(list)
        for row in rows:
            by_state[row.state].append(row)
        fresh = [r for r in by_state["requested"] if r.attempts == 0]
        busy = by_state["attempted"] + by_state["unknown"] + by_state["review"]
        roll = rng.random()
        if roll < 0.4 and by_state["review"]:
            row, first = rng.choice(by_state["review"]), self._resolve()
        elif roll < 0.6 and fresh:
            row, first = rng.choice(fresh), Action("cancel")
        elif roll < 0.8:
            row, first = rng.choice(busy or list(rows)), Action("check")
        else:  # any job: mostly refused, since its state does not allow it
            row, first = rng.choice(list(rows)), rng.choice([self._resolve(), Action("cancel")])
        if first.kind != "check" and rng.random() < 0.3:  # on the version seen, maybe stale
            first = replace(first, expected_version=row.version)
        doors = rng.sample(self.doors, len(self.doors))
        acts = [(doors[0], first)]
        if len(doors) > 1 and rng.random() < 0.25:
            second = {
                "check": Action("resolve", "resend"),
                "cancel": Action("cancel"),
                "resolve": self._resolve(),
            }[first.kind]
            acts.append((doors[1], second))
        return row.key, acts


def settle_the_rest(ledger: Ledger, doors: Sequence[Door], tally: Tally) -> int:
    """The operator's last round: triage (one copy found: resolved as sent), then abandon
    what is still in review, so every job ends confirmed, abandoned or cancelled and its
    drafts are tidied (counted as the doors "cli end" and "http end"). Returns how many
    jobs are still in review."""
    cli, http = doors
    triage = Action("triage")
    tally.add("cli end", "", triage, *cli.act("", triage))
    abandon = Action("resolve", "abandon")
    for row in list(ledger.jobs(state="review")):
        tally.add("http end", row.key, abandon, *http.act(row.key, abandon))
    return sum(1 for _ in ledger.jobs(state="review"))


# -- the checks ----------------------------------------------------------------------------


def attempt_of(events: Sequence[Any], at: float) -> int | None:
    """The index in `events` of the Attempted whose call reached the relay at `at`: the
    latest claim before it (a call starts after its claim is stored, and the job's next
    claim comes only after it, or after its lease lapsed)."""
    found = None
    for i, event in enumerate(events):
        if type(event).__name__ == "Attempted" and event.timestamp.timestamp() <= at:
            found = i
    return found


def iso(at: float | None) -> str:
    """An epoch time as the histories show theirs."""
    if at is None:
        return "?"
    return datetime.fromtimestamp(at, UTC).isoformat(timespec="milliseconds")[:-6] + "Z"


def show_history(events: Sequence[Any]) -> list[str]:
    lines = []
    for record in map(event_record, events):
        details = ", ".join(f"{n}={v}" for n, v in timeline_details(record))
        lines.append(f"    v{record['version']} {record['at']} {record['type']} {details}")
    return lines


@dataclass
class Findings:
    problems: list[str] = field(default_factory=list)
    evidence: list[str] = field(default_factory=list)
    false_unsent: int = 0
    resent_after_unknown: int = 0
    index_equal: bool = False


def copies_wrong(row: IndexRow, names: list[str], evs: list[Any], made: int) -> str | None:
    """The job's copies against its state, or None."""
    confirmed = [e for e in evs if type(e).__name__ == "Confirmed"]
    by_person = bool(confirmed) and confirmed[-1].via == "operator"
    if made > 1:
        return f"{made} copies"
    if row.state == "confirmed" and made != 1 and not by_person:
        return f"confirmed with {made} copies"
    if row.state == "cancelled" and (made or "Attempted" in names):
        return f"cancelled with {made} copies, attempts {names.count('Attempted')}"
    if row.state not in FINAL:
        return f"left {row.state}"
    return None


def false_unsent(evs: list[Any], maker: int) -> str | None:
    """A Rejected or DraftPending after the attempt (`evs[maker]`) whose call made the
    job's copy, or None."""
    unsent = [e for e in evs[maker + 1 :] if type(e).__name__ in UNSENT]
    if unsent:
        return f"{type(unsent[0]).__name__} after attempt {evs[maker].attempt}, which sent"
    return None


def resent_without_a_person(evs: list[Any]) -> bool:
    """On the review channel: an attempt after an Unknown with neither a person's resend
    nor a draft found unsent (DraftPending) in between."""
    since_unknown: list[str] | None = None
    for event in evs:
        name = type(event).__name__
        if name == "Resolved":
            name = f"Resolved {event.decision}"
        if name == "Unknown":
            since_unknown = []
        elif since_unknown is not None and name == "Attempted":
            if not {"DraftPending", "Resolved resend"} & set(since_unknown):
                return True
            since_unknown = None
        elif since_unknown is not None:
            since_unknown.append(name)
    return False


def untidied(names: list[str], evs: list[Any]) -> bool:
    """A settled job with no DraftsDeleted (why tidy) after its last settling event."""
    settled_at = max(i for i, n in enumerate(names) if n in SETTLING)
    return not any(
        n == "DraftsDeleted" and evs[i].why == "tidy"
        for i, n in enumerate(names[settled_at:], settled_at)
    )


def check(
    rig: Rig,
    rows: dict[str, IndexRow],
    events: dict[str, list[Any]],
    accepted: list[dict[str, Any]],
) -> Findings:
    found = Findings()
    copies: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for entry in accepted:
        copies[entry["message_id"]].append(entry)

    def problem(key: str, why: str) -> None:
        row = rows[key]
        found.problems.append(f"{key}: {why}")
        found.evidence += [f"{key} ({why}): {row.state} {row.reason}", *show_history(events[key])]
        for entry in copies.get(row.message_id, []):
            request = rig.relay.by_seq.get(entry.get("relay_seq") or 0, {})
            found.evidence.append(
                f"    accepted {entry['at']} via {entry['via']} id {entry['id']}; its request "
                f"reached the relay at {iso(request.get('at'))} ({request.get('mode')})"
            )

    for key, row in sorted(rows.items()):
        evs = events[key]
        names = [type(e).__name__ for e in evs]
        made = copies.get(row.message_id, [])
        if wrong := copies_wrong(row, names, evs, len(made)):
            problem(key, wrong)
        for entry in made[:1]:
            request = rig.relay.by_seq.get(entry.get("relay_seq") or 0)
            at = request["at"] if request else datetime.fromisoformat(entry["at"]).timestamp()
            maker = attempt_of(evs, at)
            if maker is None:
                problem(key, "a copy before any attempt")
            elif wrong := false_unsent(evs, maker):
                found.false_unsent += 1
                problem(key, wrong)
        if row.channel == "payouts" and resent_without_a_person(evs):
            found.resent_after_unknown += 1
            problem(key, "review channel sent again after an Unknown without a person")
        if rig.mode != "messages" and row.state in FINAL and untidied(names, evs):
            problem(key, "settled, no tidy after it")
    return found


def print_figures(
    rig: Rig,
    rows: dict[str, IndexRow],
    events: dict[str, list[Any]],
    accepted: list[dict[str, Any]],
    findings: Findings,
    drafts_left: list[Draft],
    tally: Tally,
) -> None:
    copies = collections.Counter(entry["message_id"] for entry in accepted)
    per_job = collections.Counter(copies.get(r.message_id, 0) for r in rows.values())
    states = collections.Counter((r.channel, r.state) for r in rows.values())
    every = [e for evs in events.values() for e in evs]
    names = collections.Counter(type(e).__name__ for e in every)
    deleted = collections.Counter(e.why for e in every if type(e).__name__ == "DraftsDeleted")
    recovered = collections.Counter(
        {REASON: "at the deadline", OWN_REASON: "at restart"}.get(e.reason, "")
        for e in every
        if type(e).__name__ == "Unknown"
    )
    recovered.pop("", None)
    modes = collections.Counter(e["mode"] for e in rig.relay.log if e["kind"] == "send")
    print(
        f"  states: {dict(sorted(states.items()))}\n"
        f"  provider calls {names['Attempted']}; send modes at the relay {dict(modes)}\n"
        f"  crashed claims recovered {dict(recovered)}; leases renewed {names['LeaseRenewed']}; "
        f"DraftPending {names['DraftPending']}; DraftsDeleted by why {dict(deleted)}\n"
        f"  copies accepted {sum(copies.values())} "
        f"({sum(1 for e in accepted if e.get('relay_seq') in rig.relay.by_seq)} named their "
        "request at the relay); "
        f"jobs by copies {dict(sorted(per_job.items()))}; "
        f"duplicates {sum(1 for n in copies.values() if n > 1)}\n"
        f"  drafts made at the emulator {len(rig.emulator.made_by)}\n"
        f"  false unsent records {findings.false_unsent}; review channel sends after an "
        f"Unknown without a person {findings.resent_after_unknown}; unsent drafts left "
        f"{len(drafts_left)}\n"
        "  operator (door, action: outcomes):"
    )
    for line in tally.lines():
        print("    " + line)
    print(f"  two doors at once on one job ({sum(tally.pairs.values())}), most frequent first:")
    for pair, n in tally.pairs.most_common(12):
        print(f"    {n:5d}  {pair}")
    print("  refusals, most frequent first:")
    for sentence, n in tally.refusals.most_common(15):
        print(f"    {n:5d}  {sentence}")


def judge(
    ledger: Ledger, rig: Rig, drafts_left: list[Draft], tally: Tally, jobs: int
) -> tuple[dict[str, IndexRow], dict[str, list[Any]], list[dict[str, Any]], Findings]:
    """Every check, on the store and the emulator once the daemons have stopped."""
    rows = {row.key: row for row in ledger.jobs()}
    by_id = {row.job_id: row for row in rows.values()}
    events: dict[str, list[Any]] = collections.defaultdict(list)
    for event in ledger.job_events():
        events[by_id[event.originator_id.hex].key].append(event)
    accepted = rig.emulator.accepted()
    findings = check(rig, rows, events, accepted)
    by_message_id = {row.message_id: key for key, row in rows.items()}
    for draft in drafts_left:
        key = by_message_id.get(draft.message_id or "", "no job's")
        findings.problems.append(f"{key}: an unsent draft left: {draft}")
        request = rig.relay.by_seq.get(draft.made_by or 0, {})
        findings.evidence.append(
            f"{key}: an unsent draft left: {draft}; its request reached the relay at "
            f"{iso(request.get('at'))}"
        )
        findings.evidence += show_history(events.get(key, []))
    findings.problems += [f"operator: {failure}" for failure in tally.failures]
    live = sorted(rows.values(), key=lambda r: r.key)
    rebuilt_count = ledger.rebuild_index()
    findings.index_equal = rebuilt_count == jobs and list(ledger.jobs()) == live
    if not findings.index_equal:
        findings.problems.append("the index differs from a rebuild")
    return rows, events, accepted, findings


# -- the run -------------------------------------------------------------------------------


def submit_all(ledger: Ledger, folder: Path, jobs: int, rng: random.Random) -> int:
    """Every job in the store before the daemons start; a share with a send_at a little
    ahead. The number with a send_at."""
    policies = load_policy_dir(folder / "policies")
    now = datetime.now(UTC)
    later = {n for n in range(jobs) if rng.random() < SEND_AT_SHARE}

    def submit(n: int) -> None:
        channel = "payouts" if n % 5 == 0 else "receipts"
        job = {
            "channel": channel,
            "key": f"soak-{n:05d}",
            "to": f"customer{n}@example.com",
            "subject": f"Soak {n}",
            "body": f"job {n}\n",
        }
        if n in later:
            ahead = timedelta(seconds=random.Random(n).uniform(*SEND_AT_WITHIN))
            job["send_at"] = (now + ahead).isoformat()
        policy = policies.get(channel)
        assert policy is not None
        ledger.submit(parse_job(job), policy.sender)

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(submit, range(jobs)))
    return len(later)


def run(args: argparse.Namespace, pg_url: str) -> int:
    folder = Path(tempfile.mkdtemp(prefix=f"sendledger-soak-{args.mode}-"))
    schema = f"soak_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    store = f"{pg_url}?schema={schema}"
    rig = make_rig(args.mode, folder, store, args.seed)
    fleet: Fleet | None = None
    operator: Operator | None = None
    ok = False
    rng = random.Random(args.seed)
    try:
        ledger = Ledger(store)
        started = time.monotonic()
        later = submit_all(ledger, folder, args.jobs, rng)
        print(
            f"submitted {args.jobs} jobs ({later} with a send_at) in "
            f"{time.monotonic() - started:.1f}s",
            flush=True,
        )

        fleet = Fleet(rig, args.kill_every)
        print(f"daemons {', '.join(fleet.NAMES)}, their APIs at {', '.join(fleet.api_urls)}")
        tally = Tally()
        doors = (CliDoor(rig), HttpDoor(fleet.api_urls, random.Random(args.seed + 1)))
        if args.operator_every > 0:
            fleet.wait_for_apis()
            operator = Operator(Ledger(store), doors, tally, rng, args.operator_every).start()
        start_settle = time.monotonic()

        def say(what: str) -> None:
            print(
                f"  {time.monotonic() - start_settle:6.0f}s: {what}; {ledger.counts()}", flush=True
            )

        def wait_until(done: Callable[[], bool], limit: float) -> str | None:
            while not done():
                if time.monotonic() - start_settle > limit:
                    return f"gave up after {limit:.0f}s: {ledger.counts()}"
                assert fleet is not None
                if problem := fleet.tend(say):
                    return problem
                time.sleep(0.5)
            return None

        failed = wait_until(lambda: sum(ledger.counts(SETTLED).values()) == args.jobs, args.limit)
        settle = time.monotonic() - start_settle
        if operator is not None:
            operator.stop()
        say(f"every job settled once in {settle:.0f}s; the operator decides what is in review")

        def all_final() -> bool:
            # Nothing due either: verifications counted, drafts tidied.
            rows = list(ledger.jobs())
            if any(r.state == "review" for r in rows):
                settle_the_rest(ledger, doors, tally)
                return False
            return all(r.state in FINAL and r.due_at is None for r in rows)

        failed = failed or wait_until(all_final, args.limit)
        wall = time.monotonic() - start_settle
        drafts_left = rig.emulator.unsent_drafts()
        fleet.stop()
        if failed:
            print(failed)
            return 1

        rows, events, accepted, findings = judge(ledger, rig, drafts_left, tally, args.jobs)
        problems = findings.problems
        print(
            f"soak --mode {args.mode}: {args.jobs} jobs ({later} with a send_at), two daemons "
            f"on PostgreSQL killed -9 {fleet.kills} times in turn; every job settled once in "
            f"{settle:.0f}s, final and tidied in {wall:.0f}s"
        )
        print_figures(rig, rows, events, accepted, findings, drafts_left, tally)
        print(f"  index equals a rebuild: {findings.index_equal}")
        for problem in problems[:20]:
            print("PROBLEM:", problem)
        if findings.evidence:
            (folder / "evidence.txt").write_text("\n".join(findings.evidence) + "\n")
            print("\n".join(findings.evidence[:80]))
            print("killed -9:", ", ".join(fleet.killed))
            print(fleet.tails())
        ok = not problems
        ledger.close()
        return 0 if ok else 1
    finally:
        if operator is not None and operator.thread.is_alive():
            operator.stop()
        if fleet is not None:
            for daemon in fleet.daemons.values():
                if daemon.proc.poll() is None:
                    daemon.proc.kill()
                    daemon.proc.wait()
        rig.stop()
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        if ok:
            shutil.rmtree(folder, ignore_errors=True)
        else:
            print(f"logs in {folder}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=MODES, default="messages")
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--kill-every", type=float, default=20.0)
    parser.add_argument(
        "--operator-every",
        type=float,
        default=0.5,
        help="mean seconds between the operator's actions (0: no operator)",
    )
    parser.add_argument("--limit", type=float, default=3600.0, help="give up after (s)")
    parser.add_argument("--seed", type=int, default=20261130)
    args = parser.parse_args()
    # A SIGTERM (timeout, make interrupted) unwinds like Ctrl-C: the daemons are killed,
    # the schema dropped and a private PostgreSQL stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with postgres_server() as pg_url:
        if pg_url is None:
            return 2
        return run(args, pg_url)


if __name__ == "__main__":
    raise SystemExit(main())
