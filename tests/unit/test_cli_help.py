"""Help a person reads (docs/cli.md "Command line"): every command and every option has
help text, and `sendledger help [COMMAND] [SUBCOMMAND]` prints what `--help` prints, on
stdout, exit 0; a command it does not know is exit 2 listing the ones there are."""

from __future__ import annotations

import argparse
import contextlib
import io

import pytest

from daemon.cli import COMMANDS, build_parser, main


def _walk(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> list[tuple[tuple[str, ...], argparse.ArgumentParser, dict[str, str | None]]]:
    """(path, parser, the help its parent gives each of its subcommands)."""
    found: list[tuple[tuple[str, ...], argparse.ArgumentParser, dict[str, str | None]]] = [
        (path, parser, {})
    ]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            found[-1] = (path, parser, helps)
            for name, child in action.choices.items():
                found += _walk(child, (*path, name))
    return found


PARSERS = _walk(build_parser())


@pytest.mark.parametrize(("path", "parser", "helps"), PARSERS, ids=lambda v: str(v)[:40])
def test_every_option_argument_and_command_has_help(
    path: tuple[str, ...], parser: argparse.ArgumentParser, helps: dict[str, str | None]
) -> None:
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
            continue
        if action.help == argparse.SUPPRESS:
            continue  # --config after a command: the top level's, documented there
        assert action.help and action.help.strip(), (path, action.option_strings or action.dest)
    for name, text in helps.items():
        assert text and text.strip(), (*path, name)


def _run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def _help_of(*path: str) -> str:
    parser = build_parser(path[0] if path else None)
    for word in path:
        action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = action.choices[word]
    return parser.format_help()


@pytest.mark.parametrize("path", [(), ("submit",), ("review",), ("review", "resolve"), ("try",)])
def test_help_prints_what_help_options_print(path: tuple[str, ...]) -> None:
    if path and path[0] not in COMMANDS:
        pytest.skip(f"no command {path[0]}")
    code, out, err = _run("help", *path)
    assert (code, err) == (0, "")
    assert out == _help_of(*path)


def test_help_of_an_unknown_command_lists_the_known_ones() -> None:
    # A word close to one is answered with it (tests/e2e/test_cli_mistyped_commands.py).
    code, out, err = _run("help", "xyzzy")
    assert code == 2 and out == ""
    assert "no command 'xyzzy'; the commands: submit, status" in err
    code, _out, err = _run("help", "review", "xyzzy")
    assert code == 2 and "review has no command 'xyzzy'; its commands: list, show" in err


def test_the_top_level_help_says_how_to_get_a_commands_help() -> None:
    assert "`sendledger help COMMAND`" in " ".join(_help_of().split())
