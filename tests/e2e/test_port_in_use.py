"""A port in use names the setting that chooses it and its variable, exit 2, for `run`
and for `api` (docs/troubleshooting.md); `run` says it before it holds its name or
recovers a claim."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
from tests.e2e.conftest import CliEnv

from testkit.credentials import write_service_account


@pytest.fixture
def taken() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        yield sock.getsockname()[1]


@pytest.mark.parametrize("command", [["run"], ["api"]])
def test_a_port_in_use_is_exit_2_naming_api_listen(
    cli: CliEnv, taken: int, command: list[str]
) -> None:
    write_service_account(cli.root / "x.json", token_uri="http://127.0.0.1:1/token")
    tokens = cli.root / "api-tokens"
    tokens.write_text("admin:token-0123456789abcdef0123\n", encoding="utf-8")
    tokens.chmod(0o600)
    with cli.config.open("a", encoding="utf-8") as config:
        config.write(f'\n[api]\nlisten = "127.0.0.1:{taken}"\ntoken_file = "api-tokens"\n')
    result = cli.run(*command)
    assert result.code == 2, result.stderr
    line = result.error_lines[-1]
    assert f"api.listen: 127.0.0.1:{taken} is in use by another process" in line, line
    assert "SENDLEDGER_API__LISTEN=127.0.0.1:PORT" in line, line
