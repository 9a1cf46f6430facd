"""The CLI's table of commands (daemon/cli/__init__.py) against what each module registers:
a command missing from it, or named for the wrong module, would not parse lazily."""

from __future__ import annotations

import argparse
import importlib

import pytest

from daemon.cli import COMMANDS, build_parser, command_named


def registered_by(module: str) -> set[str]:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    importlib.import_module(module).register(sub)
    return set(sub.choices)


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_the_table_names_each_command_with_the_module_that_registers_it() -> None:
    for module in set(COMMANDS.values()):
        assert registered_by(module) == {c for c, m in COMMANDS.items() if m == module}, module


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_lazy_parser_parses_a_command_as_the_whole_one_does(command: str) -> None:
    lazy = subcommands(build_parser(command))
    assert lazy[command].format_help() == subcommands(build_parser())[command].format_help()


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        (["submit", "-"], "submit"),
        (["--config", "f.toml", "status", "k"], "status"),
        (["--config=f.toml", "history", "k"], "history"),
        (["status", "--config", "f.toml", "k"], "status"),
        (["--help"], None),
        ([], None),
        (["--config", "submit"], None),
    ],
)
def test_the_command_is_read_as_argparse_reads_it(argv: list[str], command: str | None) -> None:
    assert command_named(argv) == command
