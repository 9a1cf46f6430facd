"""The shape every read command shares on the command line: an optional job key and
``--json``; one helper so that no command forgets either."""

from __future__ import annotations

import argparse
import getpass
import os
from collections.abc import Callable
from typing import Any

Command = Callable[[argparse.Namespace], int]


def add_command(
    sub: Any, name: str, func: Command, help: str, *, key: bool = False
) -> argparse.ArgumentParser:
    """A subcommand running `func`, with a KEY argument when `key`, and `--json`."""
    parser: argparse.ArgumentParser = sub.add_parser(name, help=help)
    if key:
        parser.add_argument("key", help="the job's key, as it was submitted")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(func=func)
    return parser


def login_name() -> str:
    """Who runs the command, recorded as who acted when `--by` is not given (who submitted,
    for `submit`): the login name, or `uid-N` where the system has none. A container run
    as an arbitrary uid has no passwd entry and no USER, and `getpass.getuser()` then
    raises (KeyError, OSError from Python 3.13): the command failed after its checks."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return f"uid-{os.getuid()}"
