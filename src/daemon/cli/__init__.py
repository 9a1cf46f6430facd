"""The `sendledger` command line.

Exit codes (stable, docs/cli.md "Exit codes"): 0 ok; 1 unexpected failure; 2 bad input
(usage, job, config, policy); 3 conflict (a key reused with other content, or an action the
job's state refuses); 4 unknown job; 130 interrupted. Errors are one line on stderr.
"""

from __future__ import annotations

import argparse
import importlib
import re
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from daemon.cli import mistyped_options, output
from daemon.exit_codes import (
    EXIT_BAD_INPUT,
    EXIT_CONFLICT,
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    EXIT_UNKNOWN_JOB,
    exit_code_for,
)

Handler = Callable[[argparse.Namespace], int]


#: argparse's wording for a word that is none of a command's subcommands.
_INVALID_CHOICE = re.compile(r"invalid choice: '?(?P<word>.*?)'? \(choose from")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # Usage errors are bad input: exit 2 with one line, like every other refusal.
        self.exit(EXIT_BAD_INPUT, f"sendledger: error: {self._about_commands(message)}\n")

    def _about_commands(self, message: str) -> str:
        """A mistyped or missing subcommand named as an operator can act on: the close match
        (`stauts` -> status), or the list a bare `sendledger review` has to choose from,
        rather than argparse's quoted list or "arguments are required: COMMAND"."""
        action = self._commands()
        if action is None:
            return message
        names = list(action.choices)
        where = self.prog.removeprefix("sendledger").strip()
        typed = _INVALID_CHOICE.search(message)
        if typed:
            word = typed.group("word")
            close = mistyped_options.close_match(word, names)
            hint = f"did you mean {close}?" if close else f"one of: {', '.join(names)}"
            return f"{' '.join([*where.split(), word])}: no such command; {hint}"
        if message.startswith(f"the following arguments are required: {action.metavar}"):
            needs = f"{where} needs a command" if where else "a command is needed"
            shown = f"sendledger help {where}".strip()
            return f"{needs}: {', '.join(names)} (`{shown}` says what each does)"
        return message

    def _commands(self) -> argparse._SubParsersAction[argparse.ArgumentParser] | None:
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                return action
        return None


#: Which module registers each command, so that a command imports only its own module: the
#: others may import the test kit (demo, probe, emulator), APScheduler (run, review) or the
#: HTTP stack, none of which `submit` or `status` needs (docs/architecture.md, "Layers").
#: tests/unit/test_cli_commands.py checks this table against what the modules register.
COMMANDS: dict[str, str] = {
    "submit": "daemon.cli.job_commands",
    "status": "daemon.cli.job_commands",
    "history": "daemon.cli.job_commands",
    "policy": "daemon.cli.job_commands",
    "admin": "daemon.cli.job_commands",
    "run": "daemon.cli.service",
    "review": "daemon.cli.service",
    "cancel": "daemon.cli.service",
    "audit": "daemon.cli.audit",
    "demo": "daemon.tools.demo",
    "try": "daemon.tools.try_it",
    "init": "daemon.cli.init_command",
    "probe": "daemon.tools.probe",
    "emulator": "daemon.cli.testkit_doubles",
    "relay": "daemon.cli.testkit_doubles",
    "api": "daemon.cli.api_server",
    "webhooks": "daemon.cli.webhooks",
    "help": "daemon.cli.help_command",
}


def command_named(argv: Sequence[str]) -> str | None:
    """The command `argv` runs, read as the parser will read it; None for `--help` or none."""
    items = iter(argv)
    for item in items:
        if item == "--config":
            next(items, None)
        elif item.startswith("--config="):
            continue
        elif item.startswith("-"):
            return None
        else:
            return item
    return None


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole parser, or (given a known `command`) one holding only that command's module:
    argparse needs no other subparser to parse a command's arguments."""
    parser = _Parser(
        prog="sendledger",
        description="Email sends that are safe to retry when the provider has no idempotency "
        "key: a Message-ID derived from the job's key, reconciliation by searching the "
        "sender's mailbox, and every step recorded as an event.",
        epilog="`sendledger help COMMAND` (or `COMMAND --help`) shows a command's options. "
        "Exit codes: 0 ok, 1 unexpected failure, 2 bad input, 3 conflict (a key reused "
        "with other content, or an action the job's state refuses), 4 unknown job, "
        "130 interrupted.",
    )
    parser.add_argument("--config", help="config file (else $SENDLEDGER_CONFIG, ./sendledger.toml)")
    parser.add_argument(
        "--version",
        action=_Version,
        help="the release and the event format it reads and writes, then exit",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    wanted = [COMMANDS[command]] if command in COMMANDS else list(dict.fromkeys(COMMANDS.values()))
    for name in wanted:
        importlib.import_module(name).register(sub)
    _config_anywhere(parser)
    return parser


class _Version(argparse.Action):
    """`--version`: the release and its event format (docs/operations.md "Upgrading": a
    store refused for its format says to upgrade the release on this host). Read when
    asked, so that no other command pays for importlib.metadata."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        kwargs.update(nargs=0, default=argparse.SUPPRESS)
        super().__init__(option_strings, argparse.SUPPRESS, **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        from importlib.metadata import version

        from ledger.event_format import EVENT_FORMAT

        release = version("sendledger")
        print(f"sendledger {release} (reads and writes event format {EVENT_FORMAT})")
        parser.exit()


def _config_anywhere(parser: argparse.ArgumentParser) -> None:
    """`--config` after the command too (`sendledger status KEY --config F`), as users type
    it: every subcommand accepts it, and its default leaves the top level's value alone."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in set(action.choices.values()):
                if "--config" not in child._option_string_actions:
                    child.add_argument(
                        "--config", default=argparse.SUPPRESS, help=argparse.SUPPRESS
                    )
                _config_anywhere(child)


#: Arguments that name files: a file name need not be UTF-8 on Linux.
_PATH_ARGUMENTS = frozenset({"config", "file", "dir", "accept_log"})


def _not_text(args: argparse.Namespace) -> str | None:
    """A key, note or name given as bytes that are not UTF-8 arrives as lone surrogates
    (Python's surrogateescape) and could be neither looked up nor stored: one line naming
    the argument (exit 2), not an encoding failure later (exit 1). docs/cli.md "Keys"."""
    for name, value in vars(args).items():
        values = value if isinstance(value, list) else [value]
        for item in values:
            if name in _PATH_ARGUMENTS or not isinstance(item, str):
                continue
            bad = next((c for c in item if 0xD800 <= ord(c) <= 0xDFFF), None)
            if bad is not None:
                byte = ord(bad) - 0xDC00 if 0xDC80 <= ord(bad) <= 0xDCFF else None
                where = f" (byte 0x{byte:02x})" if byte is not None else ""
                return f"{name}: not UTF-8 text{where}"
    return None


#: The SIGHUPs `run` and `api` received before their own handlers were in place, for a
#: reload once they serve. Kept from the first line of `main`: importing a service's
#: modules takes a fraction of a second, in which the signal's default action ended it.
HANGUPS: list[int] = []

#: The commands that serve until stopped and reload their policies on SIGHUP.
SERVICES = frozenset({"run", "api"})


def keep_hangups() -> None:
    """Until the service's own handlers: a SIGHUP is noted in `HANGUPS` (a list append
    takes no lock: safe in a handler, daemon/wakeup.py)."""
    signal.signal(signal.SIGHUP, lambda signum, _frame: HANGUPS.append(signum))


def _parse(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.Namespace:
    """`parser.parse_args(argv)`, a mistyped option named with its close match
    (daemon/cli/mistyped_options.py)."""
    problem = mistyped_options.before_command(parser, argv)
    if problem is not None:
        parser.error(problem)
    args, extras = parser.parse_known_args(argv)
    if extras:
        problem = mistyped_options.after_command(parser, argv, extras)
        parser.error(problem or f"unrecognized arguments: {' '.join(extras)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    output.guard_streams()  # nothing a caller typed acts on the terminal (docs/cli.md "Keys")
    argv = sys.argv[1:] if argv is None else argv
    command = command_named(argv)
    if command in SERVICES:
        HANGUPS.clear()
        keep_hangups()
    try:
        parser = build_parser(command)
        args = _parse(parser, argv)
    except KeyboardInterrupt:
        # A Ctrl-C while the command's modules load (a few tenths of a second): exit 130
        # as later, not Python's traceback of the import it stopped.
        return EXIT_INTERRUPTED
    problem = _not_text(args)
    if problem:
        output.error(problem)
        return EXIT_BAD_INPUT
    func: Handler | None = getattr(args, "func", None)
    if func is None:
        parser.print_help(sys.stderr)
        print("\nTo look before a real mailbox: sendledger try", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        return func(args)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return 0
    except Exception as exc:
        # Every error of the tree (ledger/exceptions.py) by one table (daemon/exit_codes.py);
        # a failure, or anything outside the tree, is unexpected.
        code = exit_code_for(exc)
        if code is None:
            output.error(f"unexpected failure: {type(exc).__name__}: {exc}")
            return EXIT_FAILURE
        output.error(str(exc))
        return code


__all__ = [
    "COMMANDS",
    "EXIT_CONFLICT",
    "EXIT_UNKNOWN_JOB",
    "HANGUPS",
    "build_parser",
    "command_named",
    "keep_hangups",
    "main",
]
