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


def _refused(cli: Any, *args: str, config: bool = True) -> str:
    result = cli.run(*args, config=config)
    assert result.code == 2, result.stderr
    return one_error_line(result)


def test_a_mistyped_option_is_answered_with_the_close_match_of_its_command(cli: Any) -> None:
    typed = {
        ("status", "--jsn", "k1"): "--jsn: no such option of status; did you mean --json?",
        ("review", "list", "--chanel", "payouts"): (
            "--chanel: no such option of review list; did you mean --channel?"
        ),
        ("audit", "--sinse=24h"): "--sinse: no such option of audit; did you mean --since?",
        # `help`'s own COMMAND argument is not the command the option was typed for.
        ("help", "status", "--jsn"): "--jsn: no such option of help; it has none but --help",
    }
    for args, said in typed.items():
        assert _refused(cli, *args).endswith(said)


def test_a_mistyped_config_option_is_named_not_the_path_after_it(cli: Any) -> None:
    # `--confg FILE status`: the path was taken for the command (`FILE: no such command`).
    line = _refused(cli, "--confg", "mail/sendledger.toml", "status", "k1", config=False)
    assert line.endswith("--confg: no such option; did you mean --config?")


def test_an_option_close_to_none_lists_the_command_s_options(cli: Any) -> None:
    line = _refused(cli, "history", "--xyzzy", "k1")
    assert "--xyzzy: no such option of history; its options: " in line
    assert "--json" in line and "--config" not in line


def test_help_of_a_mistyped_command_is_answered_with_the_close_match(cli: Any) -> None:
    assert _refused(cli, "help", "stauts").endswith(
        "help: no command 'stauts'; did you mean status?"
    )
    line = _refused(cli, "help", "review", "lst")
    assert line.endswith("help: review has no command 'lst'; did you mean list?")
