"""A mistyped command gets the close match and a command group typed alone lists what it
holds: one line, exit 2, as every usage error (docs/cli.md "Exit codes")."""

from __future__ import annotations

from typing import Any

from tests.e2e.test_cli_intake import one_error_line


def test_a_mistyped_command_is_answered_with_the_close_match(cli: Any) -> None:
    result = cli.run("stauts", "k1")
    assert result.code == 2, result.stderr
    one_error_line(result, "stauts: no such command; did you mean status?")
    result = cli.run("review", "lst")
    assert result.code == 2, result.stderr
    one_error_line(result, "review lst: no such command; did you mean list?")


def test_a_word_close_to_no_command_lists_them_all(cli: Any) -> None:
    result = cli.run("admin", "xyzzy")
    assert result.code == 2, result.stderr
    one_error_line(
        result,
        "admin xyzzy: no such command; one of: rebuild-index, new-key, purge, copy-store, backup",
    )


def test_a_command_group_alone_lists_its_commands(cli: Any) -> None:
    result = cli.run("review")
    assert result.code == 2, result.stderr
    line = one_error_line(result, "review needs a command: list, show, resolve")
    assert "`sendledger help review`" in line
