"""A mistyped option named as an operator can act on (docs/cli.md "Exit codes"): the option
itself with its close match among the options of the command it was typed for, rather than
argparse's `unrecognized arguments: --jsn`, or, before the command, `FILE: no such command`
for the path after a `--confg` that argparse passed over."""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Iterable, Sequence


def before_command(parser: argparse.ArgumentParser, argv: Sequence[str]) -> str | None:
    """The refusal of the first word before the command that is an option `parser` (the
    top level) does not have; None when there is none."""
    words = iter(argv)
    for word in words:
        if word == "--" or word == "-" or not word.startswith("-"):
            return None
        name, has_value, _ = word.partition("=")
        action = _action(parser, name)
        if action is None:
            return _refusal(parser, name)
        if not has_value and action.nargs != 0:
            next(words, None)  # the option's value, which may look like anything
    return None


def after_command(
    parser: argparse.ArgumentParser, argv: Sequence[str], extras: Sequence[str]
) -> str | None:
    """The refusal of the first of `extras` (what the command's parser left) that is an
    option the command does not have; None when they are all other words."""
    command = _command_parser(parser, argv)
    for word in extras:
        if word.startswith("-") and word != "-":
            return _refusal(command, word.partition("=")[0])
    return None


def _command_parser(
    parser: argparse.ArgumentParser, argv: Sequence[str]
) -> argparse.ArgumentParser:
    """The parser of the command `argv` runs, read as argparse reads it: past each group's
    options (and their values) to the word naming one of its commands. Not from the parsed
    names: a command's own argument may have its group's dest (`help COMMAND`)."""
    words = iter(argv)
    for word in words:
        group = next(
            (a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None
        )
        if group is None or word == "--":
            break
        if word.startswith("-") and word != "-":
            name, has_value, _ = word.partition("=")
            action = _action(parser, name)
            if action is not None and not has_value and action.nargs != 0:
                next(words, None)  # the option's value, which may look like anything
            continue
        if word not in group.choices:
            break
        parser = group.choices[word]
    return parser


def _action(parser: argparse.ArgumentParser, name: str) -> argparse.Action | None:
    """The action `name` selects, as argparse reads it: whole, or a prefix of a long option
    (an ambiguous prefix is argparse's to refuse)."""
    known = parser._option_string_actions
    if name in known:
        return known[name]
    if parser.allow_abbrev and name.startswith("--"):
        return next((a for o, a in known.items() if o.startswith(name)), None)
    return None


def close_match(word: str, names: Iterable[str]) -> str | None:
    """The one of `names` a mistyped `word` is close to, or None: the `did you mean`
    of a command (`sendledger stauts`, `sendledger help stauts`) and of an option."""
    close = difflib.get_close_matches(word, list(names), n=1)
    return close[0] if close else None


def _refusal(parser: argparse.ArgumentParser, name: str) -> str:
    shown = [
        option
        for action in parser._actions
        if action.help != argparse.SUPPRESS
        for option in action.option_strings
        if option.startswith("--") and option != "--help"
    ]
    where = parser.prog.removeprefix("sendledger").strip()
    about = f"{name}: no such option" + (f" of {where}" if where else "")
    # Compared without their dashes, which every option shares: `--xyz` is not close to
    # `--by`.
    bare = {option.lstrip("-"): option for option in shown}
    close = close_match(name.lstrip("-"), bare)
    if close:
        return f"{about}; did you mean {bare[close]}?"
    if shown:
        return f"{about}; its options: {', '.join(shown)}"
    return f"{about}; it has none but --help"
