"""`sendledger api` reads its token file as the daemon does (docs/http-api.md "Roles"): a file
others can read is warned about at start-up, a bad one refused naming the line(s), exit
2, before the store is created."""

from __future__ import annotations

from typing import Any

import pytest
from tests.e2e.conftest import config_text


def with_tokens(cli: Any, text: str, mode: int) -> None:
    tokens = cli.root / "api-tokens"
    tokens.write_text(text, encoding="utf-8")
    tokens.chmod(mode)
    cli.config.write_text(
        config_text() + '\n[api]\nlisten = "127.0.0.1:1"\ntoken_file = "api-tokens"\n',
        encoding="utf-8",
    )


@pytest.mark.parametrize("mode", [0o644, 0o600])
def test_a_readable_token_file_is_warned_and_a_repeated_token_refused(cli: Any, mode: int) -> None:
    with_tokens(cli, "a:0123456789abcdef-same\nb:0123456789abcdef-same:read\n", mode)
    result = cli.run("api")
    assert result.code == 2, result.stderr
    assert "lines 1 and 2 hold the same token" in result.stderr
    warned = "api.token_file" in result.stderr and "accessible by others (mode 0644)" in (
        result.stderr
    )
    assert warned is (mode == 0o644), result.stderr
    assert "0123456789abcdef" not in result.stderr
    assert not (cli.root / "ledger.sqlite").exists()


def test_an_unknown_role_is_refused_naming_the_line(cli: Any) -> None:
    with_tokens(cli, "# tokens\nn8n:0123456789abcdef-n8n:submit,sned\n", 0o600)
    result = cli.run("api")
    assert result.code == 2, result.stderr
    assert "api-tokens:2: roles are a comma list of submit, read, review, admin" in result.stderr
    assert "not 'sned'" in result.stderr
