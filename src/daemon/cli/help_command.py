"""`sendledger help [COMMAND] [SUBCOMMAND]`: the help of the whole command line or of one
command, on stdout, exit 0 (docs/cli.md "Command line"); the same text as `--help`."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from daemon.exit_codes import EXIT_OK, bad_input


def register(sub: Any) -> None:
    p = sub.add_parser(
        "help",
        help="this help, or a command's: sendledger help review resolve",
        description="Print the help of sendledger, or of one command (the same as "
        "`sendledger COMMAND --help`).",
    )
    p.add_argument("command", nargs="?", metavar="COMMAND", help="a command, e.g. submit")
    p.add_argument(
        "subcommand", nargs="?", metavar="SUBCOMMAND", help="one of its own, e.g. resolve"
    )
    p.set_defaults(func=cmd_help)


def cmd_help(args: argparse.Namespace) -> int:
    from daemon.cli import COMMANDS, build_parser

    words = [word for word in (args.command, args.subcommand) if word]
    if words and words[0] not in COMMANDS:
        close = _close(words[0], list(COMMANDS)) or f"the commands: {', '.join(COMMANDS)}"
        raise bad_input(f"help: no command {words[0]!r}; {close}")
    parser = build_parser(words[0] if words else None)
    for depth, word in enumerate(words):
        children = _children(parser)
        if word not in children:
            known = ", ".join(children) or "none"
            where = " ".join(words[:depth]) or "sendledger"
            close = _close(word, list(children)) or f"its commands: {known}"
            raise bad_input(f"help: {where} has no command {word!r}; {close}")
        parser = children[word]
    parser.print_help(sys.stdout)
    return EXIT_OK


def _close(word: str, names: list[str]) -> str | None:
    """`did you mean NAME?` for a mistyped command, as `sendledger stauts` is answered."""
    from daemon.cli.mistyped_options import close_match

    close = close_match(word, names)
    return f"did you mean {close}?" if close else None


def _children(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


__all__ = ["register"]
