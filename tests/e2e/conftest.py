"""The `sendledger` command line as processes, against a temporary config folder.

`cli.run` forks each command from one process per test worker that imported sendledger
once (tests/e2e/fork_server.py): a process of its own with its own environment, stdin,
stdout, stderr and exit code, as the console script would be, without a second of
imports per command. `fresh=True` starts the console script itself, for what only a new
interpreter shows (tests/e2e/test_cli_lazy_imports.py runs its own)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from tests.e2e.daemon_kit import ForkServer, NotifyListener, shared_fork_server

POLICY = """\
provider = "support"
from = "Support <support@example.com>"
message_id_domain = "mail.example.com"
"""


def sendledger_command() -> list[str]:
    """The installed console script next to the interpreter, else `python -m daemon`."""
    script = Path(sys.executable).with_name("sendledger")
    if script.is_file():
        return [str(script)]
    return [sys.executable, "-m", "daemon"]


def forked_sendledger(
    *args: str, timeout: float = 60.0, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`sendledger ARGS` to its end, forked from the worker's fork server, in this
    process's working directory and environment (else `env`, its whole environment):
    its own process, stdout, stderr and exit code, as the console script's."""
    environment = dict(os.environ if env is None else env)
    code, out, err = shared_fork_server().call(
        list(args), Path.cwd(), "", environment, timeout=timeout
    )
    return subprocess.CompletedProcess([*sendledger_command(), *args], code, out, err)


def config_text(store_url: str = "sqlite:///ledger.sqlite") -> str:
    return f"""\
[store]
url = "{store_url}"

[daemon]
policies_dir = "policies"

[providers.support]
credentials_file = "x.json"
user = "support@example.com"
"""


@dataclass
class Result:
    code: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        return json.loads(self.stdout)

    @property
    def error_lines(self) -> list[str]:
        return self.stderr.splitlines()


@dataclass
class CliEnv:
    """A config folder (sendledger.toml, policies/receipts.toml) and a way to run the CLI."""

    root: Path
    env: dict[str, str] = field(default_factory=dict)
    server: ForkServer | None = None

    @property
    def config(self) -> Path:
        return self.root / "sendledger.toml"

    @property
    def policies(self) -> Path:
        return self.root / "policies"

    def write_config(self, store_url: str = "sqlite:///ledger.sqlite") -> None:
        self.config.write_text(config_text(store_url), encoding="utf-8")

    def run(
        self,
        *args: str,
        stdin: str | None = None,
        config: bool = True,
        cwd: Path | None = None,
        env: Mapping[str, str] | None = None,
        fresh: bool = False,
    ) -> Result:
        options = ["--config", str(self.config)] if config else []
        if self.server is not None and not fresh:
            code, out, err = self.server.call(
                [*options, *args], cwd or self.root, stdin or "", {**self.env, **(env or {})}
            )
            return Result(code, out, err)
        argv: Sequence[str] = [*sendledger_command(), *options]
        proc = subprocess.run(
            [*argv, *args],
            input=stdin if stdin is not None else "",
            capture_output=True,
            text=True,
            cwd=cwd or self.root,
            env={**self.env, **(env or {})},
            timeout=60,
        )
        return Result(proc.returncode, proc.stdout, proc.stderr)

    def submit(self, job: Mapping[str, Any], **kwargs: Any) -> Result:
        return self.run("submit", "--json", "-", stdin=json.dumps(job), **kwargs)


@pytest.fixture
def cli_server() -> ForkServer:
    return shared_fork_server()


@pytest.fixture
def cli(tmp_path: Path, cli_server: ForkServer) -> CliEnv:
    root = tmp_path / "site"
    (root / "policies").mkdir(parents=True)
    (root / "policies" / "receipts.toml").write_text(POLICY, encoding="utf-8")
    # A clean environment: no SENDLEDGER_* settings leak in from the caller's shell.
    env = {k: v for k, v in os.environ.items() if not k.startswith("SENDLEDGER_")}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    cli_env = CliEnv(root=root, env=env, server=cli_server)
    cli_env.write_config()
    return cli_env


@pytest.fixture
def notify_socket() -> Iterator[NotifyListener]:
    """A stand-in for systemd's $NOTIFY_SOCKET (test_daemon_signals.py, test_pg_open.py)."""
    # AF_UNIX paths are limited to ~107 bytes: pytest's tmp_path can be longer.
    folder = Path(tempfile.mkdtemp(prefix="sl-notify-"))
    listener = NotifyListener(folder / "notify.sock")
    try:
        yield listener
    finally:
        listener.close()
        shutil.rmtree(folder, ignore_errors=True)
