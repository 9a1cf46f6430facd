"""The daemon as a process with a Microsoft Graph provider: real msal and httplib2 in the
daemon, the TLS fault relay in front of the Graph emulator, the throw-away CA trusted
through REQUESTS_CA_BUNDLE as an operator would.

The crash matrix of tests/e2e/test_crash_matrix.py, for Graph: each crash point x each relay
mode, one job; the daemon is killed with SIGKILL at the point, a daemon of the same name
starts again, and the job must end confirmed with exactly one copy in the emulator's
acceptance log. Plus `sendledger emulator graph` as a process driving a daemon.
Emulator results, not Microsoft's.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from tests.e2e.daemon_kit import (
    RETRY_POLICY,
    SENDLEDGER,
    ForkServer,
    Rig,
    api_section,
    job,
    shared_fork_server,
)
from tests.e2e.test_crash_matrix import (
    LAG,
    MATRIX_DAEMON,
    MATRIX_POLICY,
    MODES,
    POINTS,
    POLICY,
    matrix_row,
)

from ledger.application import Ledger
from testkit.graph_emulator import DEFAULT_CLIENT_ID, DEFAULT_TENANT, GraphEmulator
from testkit.relay import FaultRelay
from testkit.tls import make_loopback_tls

# The same crash points and relay modes as the Gmail matrix. For Graph a 503 with
# Retry-After (the relay gives one) is "not sent, wait": only these modes leave the send's
# outcome unknown and lead to a search.
UNKNOWN_OUTCOME = {"drop-response", "fail-before-forward", "500-after-forward", "hang"}
GRAPH_POLICY: dict[str, Any] = {**POLICY, "provider": "graph"}
SECRET = "e2e-graph-secret"


class GraphRig(Rig):
    """Rig's folder, store, policies and ledger readers, with the Graph emulator (TLS)
    and a TLS relay in front of it instead of Gmail's."""

    def __init__(
        self,
        folder: Path,
        *,
        lag: float = 0.2,
        hang_seconds: float = 3.0,  # past `timeout`: the daemon gives up first
        timeout: str = "2s",  # generous: TLS handshakes on a loaded machine
        deadline_grace: str = "60s",
        user: str = "{from}",
        policies: Mapping[str, Mapping[str, Any]] | None = None,
        concurrency: int = 1,
        relay_options: Mapping[str, Any] | None = None,
        api_port: int | None = None,
        daemon_extra: str = "",
    ) -> None:
        """`daemon_extra`: TOML lines added to `[daemon]`."""
        self.dir = folder
        self.dir.mkdir(parents=True, exist_ok=True)
        self.acceptance_log = folder / "acceptance.jsonl"
        self.tls = make_loopback_tls(folder / "tls")
        self.emulator = GraphEmulator(  # type: ignore[assignment]
            tls=self.tls,
            lag=lag,
            acceptance_log=self.acceptance_log,
            clients={DEFAULT_CLIENT_ID: SECRET},
        ).start()
        self.relay = FaultRelay(
            self.emulator.url,
            tls=self.tls,
            upstream_ca=str(self.tls.ca_file),
            hang_seconds=hang_seconds,
            retry_after=0.3,
            **(relay_options or {}),
        ).start()
        self.daemons = []
        self._ledger = None
        self.policies_dir = folder / "policies"
        self.policies_dir.mkdir(exist_ok=True)
        (folder / "client-secret").write_text(SECRET + "\n", encoding="utf-8")
        (folder / "client-secret").chmod(0o600)
        self.config = folder / "sendledger.toml"
        self.config.write_text(
            graph_config(
                authority=self.relay.url,
                api_endpoint=self.relay.url + "/v1.0",
                user=user,
                timeout=timeout,
                deadline_grace=deadline_grace,
                concurrency=concurrency,
                daemon_extra=daemon_extra,
            )
            + api_section(folder, api_port),
            encoding="utf-8",
        )
        self.api_url = None if api_port is None else f"http://127.0.0.1:{api_port}"
        for channel, fields in (policies or {"receipts": GRAPH_POLICY}).items():
            self.write_policy(channel, fields)

    @property
    def trust(self) -> dict[str, str]:
        return {"REQUESTS_CA_BUNDLE": str(self.tls.ca_file)}

    def child_env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        return super().child_env({**self.trust, **(extra or {})})


def graph_config(
    *,
    authority: str,
    api_endpoint: str,
    user: str,
    timeout: str = "2s",
    deadline_grace: str = "60s",
    concurrency: int = 1,
    tenant_id: str = DEFAULT_TENANT,
    client_id: str = DEFAULT_CLIENT_ID,
    secret_file: str = "client-secret",
    daemon_extra: str = "",
) -> str:
    return (
        '[store]\nurl = "sqlite:///ledger.sqlite"\n\n'
        '[daemon]\ntick = "100ms"\npolicies_dir = "policies"\n'
        f"concurrency = {concurrency}\n"
        f'deadline_grace = "{deadline_grace}"\n{daemon_extra}\n'
        '[providers.graph]\nkind = "graph"\n'
        f'tenant_id = "{tenant_id}"\nclient_id = "{client_id}"\n'
        f'client_secret_file = "{secret_file}"\n'
        f'user = "{user}"\nauthority = "{authority}"\napi_endpoint = "{api_endpoint}"\n'
        f'timeout = "{timeout}"\nconfirm_wait = "1s"\n'
    )


@pytest.fixture(scope="module")
def results() -> Iterator[dict[tuple[str, str], str]]:
    table: dict[tuple[str, str], str] = {}
    yield table
    if table:
        print("\nGraph: crash point x relay mode -> copies, final state (crashed?)")
        for (point, mode), cell in sorted(table.items()):
            print(f"  {point:<13} {mode:<20} {cell}")


@pytest.mark.parametrize("point", POINTS)
def test_graph_crash_point_by_relay_mode(
    point: str, tmp_path: Path, results: dict[tuple[str, str], str]
) -> None:
    policy = {**MATRIX_POLICY, "provider": "graph"}
    with GraphRig(
        tmp_path, lag=LAG, daemon_extra=MATRIX_DAEMON, policies={"receipts": policy}
    ) as rig:
        wrong = matrix_row(rig, point, MODES, UNKNOWN_OUTCOME, results, env=rig.trust)
        assert wrong == [], "\n".join(wrong)


def test_emulator_graph_command_serves_a_daemon(tmp_path: Path) -> None:
    """`sendledger emulator graph` and `sendledger relay --upstream-ca` as processes, the
    emulator's printed facts wired into a config, a daemon process sending through the
    relay, which drops the reply to the first send: the job is confirmed by the search, one
    line in the acceptance log. Every command is forked from the worker's fork server
    (tests/e2e/fork_server.py): a process of its own, as the console script would be,
    without an interpreter start and its imports (six of them)."""
    server = shared_fork_server()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SENDLEDGER_")}
    log = tmp_path / "accepted.jsonl"
    relay: int | None = None
    emulator = server.start(
        ["emulator", "graph", "--accept-log", str(log), "--tls-dir", "tls"],
        tmp_path,
        tmp_path / "emulator.stderr",
        stdout=str(tmp_path / "emulator.stdout"),
        env=env,
    )
    try:
        facts = json.loads(_first_line(server, emulator, tmp_path / "emulator"))
        assert facts["api_endpoint"] == facts["url"] + "/v1.0"
        relay = server.start(
            [
                *("relay", "--upstream", facts["url"]),
                *("--upstream-ca", facts["ca_file"], "--port", "0", "--send", "drop-response"),
            ],
            tmp_path,
            tmp_path / "relay.stderr",
            stdout=str(tmp_path / "relay.stdout"),
            env=env,
        )
        relay_url = _first_line(server, relay, tmp_path / "relay").strip()
        (tmp_path / "policies").mkdir()
        (tmp_path / "policies" / "receipts.toml").write_text(
            'channel = "receipts"\n'
            + "".join(
                f"{k} = {json.dumps(v)}\n" for k, v in {**RETRY_POLICY, "provider": "graph"}.items()
            ),
            encoding="utf-8",
        )
        config = tmp_path / "sendledger.toml"
        config.write_text(
            graph_config(
                authority=facts["authority"],
                api_endpoint=relay_url + "/v1.0",
                user="receipts@shop.example",
                timeout="5s",
                tenant_id=facts["tenant_id"],
                client_id=facts["client_id"],
                secret_file=facts["client_secret_file"],
            ),
            encoding="utf-8",
        )
        env |= {"REQUESTS_CA_BUNDLE": facts["ca_file"]}
        code, _out, err = server.call(
            ["--config", str(config), "submit", "--json", "-"],
            tmp_path,
            json.dumps(job("cli-1")),
            env,
        )
        assert code == 0, err
        daemon_log = tmp_path / "daemon.stderr"
        daemon = server.start(["--config", str(config), "run"], tmp_path, daemon_log, env=env)
        try:
            end = time.monotonic() + 30
            # Polled in this process (an interpreter every 0.3 s would take the daemon's
            # CPU); `status` below reads the result as a user does.
            with Ledger(f"sqlite:///{tmp_path / 'ledger.sqlite'}") as ledger:
                while time.monotonic() < end:
                    row = ledger.row("cli-1")
                    if row is not None and row.state == "confirmed":
                        break
                    time.sleep(0.1)
        finally:
            os.kill(daemon, signal.SIGTERM)
            server.exited(daemon, timeout=20)
            daemon_err = daemon_log.read_text(encoding="utf-8", errors="replace")

        def shown(*args: str) -> Any:
            argv = ["--config", str(config), *args, "cli-1", "--json"]
            code, out, err = server.call(argv, tmp_path, "", env)
            assert code == 0, err + daemon_err[-3000:]
            return json.loads(out)

        assert shown("status")["state"] == "confirmed", daemon_err[-3000:]
        records = shown("history")
        assert [r["type"] for r in records if r["type"] in ("Unknown", "Confirmed")] == [
            "Unknown",
            "Confirmed",
        ]
        assert [r["via"] for r in records if r["type"] == "Confirmed"] == ["search"]
        lines = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]
        assert [(e["user"], e["via"]) for e in lines] == [("receipts@shop.example", "send")]
        os.kill(relay, signal.SIGTERM)
        assert server.exited(relay, timeout=10)[0] == 0
        relay = None
    finally:
        if relay is not None:
            _end(server, relay, signal.SIGKILL)
        assert _end(server, emulator, signal.SIGTERM) == 0


def _first_line(server: ForkServer, pid: int, name: Path) -> str:
    """The first line a forked command printed on its stdout (`name`.stdout); fails with
    its stderr if it exits or prints none within 30 s."""
    stdout, stderr = name.with_suffix(".stdout"), name.with_suffix(".stderr")
    end = time.monotonic() + 30
    while time.monotonic() < end:
        text = stdout.read_text(encoding="utf-8") if stdout.exists() else ""
        if "\n" in text:
            return text.split("\n", 1)[0]
        try:
            code, _at = server.exited(pid, timeout=0.02)
        except TimeoutError:
            continue
        pytest.fail(f"{name.name} exited {code}: {stderr.read_text(encoding='utf-8')}")
    pytest.fail(f"{name.name} printed nothing in 30 s: {stderr.read_text(encoding='utf-8')}")


def _end(server: ForkServer, pid: int, signum: int) -> int:
    """Signal a forked command (unless it exited) and its exit code."""
    try:
        return server.exited(pid, timeout=0)[0]
    except TimeoutError:
        os.kill(pid, signum)
        return server.exited(pid, timeout=10)[0]


def test_probe_on_a_graph_provider(tmp_path: Path) -> None:
    """`sendledger probe` through its drop-response relay, against the Graph emulator: the
    reply to the send is lost, the search finds the one copy, the Message-ID was kept."""
    tls = make_loopback_tls(tmp_path / "tls")
    log = tmp_path / "accepted.jsonl"
    with GraphEmulator(
        tls=tls, acceptance_log=log, clients={DEFAULT_CLIENT_ID: SECRET}, file_delay=0.3, lag=1.0
    ) as emulator:
        (tmp_path / "client-secret").write_text(SECRET + "\n", encoding="utf-8")
        (tmp_path / "policies").mkdir()
        config = tmp_path / "sendledger.toml"
        config.write_text(
            graph_config(
                authority=emulator.authority,
                api_endpoint=emulator.api_endpoint,
                user="probe@example.com",
            ),
            encoding="utf-8",
        )
        # The probe's relay checks the emulator's certificate with the default trust,
        # which SSL_CERT_FILE replaces; msal and the Graph calls read REQUESTS_CA_BUNDLE.
        env = {k: v for k, v in os.environ.items() if not k.startswith("SENDLEDGER_")} | {
            "REQUESTS_CA_BUNDLE": str(tls.ca_file),
            "SSL_CERT_FILE": str(tls.ca_file),
        }
        probe = subprocess.run(
            [
                *(SENDLEDGER, "--config", str(config), "probe", "--provider", "graph"),
                *("--to", "you@example.net", "--yes", "--max-wait", "20s"),
                *("--interval", "200ms", "--json"),
            ],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env=env,
            timeout=90,
        )
        assert probe.returncode == 0, probe.stderr
        report = json.loads(probe.stdout)
        assert (report["kind"], report["send_outcome"]) == ("graph", "unknown")
        assert (report["found"], report["copies"], report["kept_message_id"]) == (True, 1, True)
        assert "internetMessageId eq" in report["query"]
        assert emulator.copies(report["message_id"]) == 1
