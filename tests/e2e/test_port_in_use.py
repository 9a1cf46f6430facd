"""A port in use names the setting that chooses it and its variable, exit 2, for `run`
and for `api` (docs/troubleshooting.md); `run` says it before it holds its name or
recovers a claim, and leaves the store as it found it. A port in use by a running daemon
of the same name is that daemon running: its name's line, exit 3."""

from __future__ import annotations

import socket
import sqlite3
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest
from tests.e2e.conftest import CliEnv
from tests.e2e.daemon_kit import Rig

from ledger.stores.format_rows import FORMAT_TABLE
from testkit.credentials import write_service_account
from testkit.mailservers import free_port

JOB = {"channel": "receipts", "key": "k-1", "to": "a@example.com", "subject": "s", "body": "b"}


@pytest.fixture
def taken() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        yield sock.getsockname()[1]


#: `run` exits 1 for a port in use (its holder may give it back by the unit's next try),
#: `api` 2 (docs/cli.md "Exit codes").
IN_USE = {"run": 1, "api": 2}


@pytest.mark.parametrize("command", [["run"], ["api"]])
def test_a_port_in_use_names_api_listen(cli: CliEnv, taken: int, command: list[str]) -> None:
    write_service_account(cli.root / "x.json", token_uri="http://127.0.0.1:1/token")
    tokens = cli.root / "api-tokens"
    tokens.write_text("admin:token-0123456789abcdef0123\n", encoding="utf-8")
    tokens.chmod(0o600)
    with cli.config.open("a", encoding="utf-8") as config:
        config.write(f'\n[api]\nlisten = "127.0.0.1:{taken}"\ntoken_file = "api-tokens"\n')
    result = cli.run(*command)
    assert result.code == IN_USE[command[0]], result.stderr
    line = result.error_lines[-1]
    assert f"api.listen: 127.0.0.1:{taken} is in use by another process" in line, line
    assert "SENDLEDGER_API__LISTEN=127.0.0.1:PORT" in line, line


def _declared(store: Path) -> dict[str, tuple[int, float]]:
    """The event format rows of a SQLite store, by holder (none before the first server's
    open made the table)."""
    with closing(sqlite3.connect(store)) as db:
        made = db.execute("SELECT 1 FROM sqlite_master WHERE name = ?", [FORMAT_TABLE])
        if made.fetchone() is None:
            return {}
        rows = db.execute(f"SELECT holder, format, at FROM {FORMAT_TABLE}").fetchall()
    return {str(holder): (int(format), float(at)) for holder, format, at in rows}


@pytest.mark.parametrize("command", [["run"], ["api"]])
def test_a_start_refused_at_its_port_leaves_the_declarations_as_it_found_them(
    cli: CliEnv, taken: int, command: list[str]
) -> None:
    """The open declared this server's event format; a refusal at the port left
    the declaration, a fresh one: for a minute `admin copy-store` took the store for one
    a server was starting on."""
    assert cli.submit(JOB).code == 0
    before = _declared(cli.root / "ledger.sqlite")
    test_a_port_in_use_names_api_listen(cli, taken, command)
    assert _declared(cli.root / "ledger.sqlite") == before


def test_a_second_start_of_a_running_daemon_says_it_runs_not_that_the_port_is_taken(
    tmp_path: Path,
) -> None:
    """A daemon started again by mistake (the same config, its port taken by the first)
    was told to choose another api.listen; given one, it was then refused for its name.
    Now the name's line first, exit 3, and the running daemon's declaration is kept."""
    with Rig(tmp_path / "rig", api_port=free_port()) as rig:
        first = rig.start_daemon()
        rig.wait_api()
        before = _declared(rig.dir / "ledger.sqlite")
        second = rig.cli("run", check=False)
        assert second.returncode == 3, second.stderr
        [line] = second.stderr.splitlines()
        assert "is held by another running daemon on" in line, line
        assert _declared(rig.dir / "ledger.sqlite") == before
        assert first.alive()
        assert first.terminate() == 0


@pytest.mark.parametrize("command", [["run"], ["run", "--once"]])
def test_a_start_refused_for_its_webhook_leaves_the_declarations_as_it_found_them(
    cli: CliEnv, command: list[str]
) -> None:
    """A webhook whose secret file is not there (exit 1 for `run`, which the unit tries
    again: the file may be mounted later; naming it): `run --once` left
    the declaration its open wrote, a fresh one in place of a live daemon's of its name,
    as `run` did before the give-back."""
    assert cli.submit(JOB).code == 0
    write_service_account(cli.root / "x.json", token_uri="http://127.0.0.1:1/token")
    with cli.config.open("a", encoding="utf-8") as config:
        config.write('\n[webhooks.ops]\nurl = "http://127.0.0.1:9/hook"\nsecret_file = "nope"\n')
    before = _declared(cli.root / "ledger.sqlite")
    result = cli.run(*command)
    assert result.code == 1, result.stderr
    assert "webhooks.ops.secret_file" in result.error_lines[-1], result.stderr
    assert _declared(cli.root / "ledger.sqlite") == before
