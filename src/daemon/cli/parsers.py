"""The shape every read command shares on the command line: an optional job key and
``--json``; one helper so that no command forgets either."""

from __future__ import annotations

import argparse
import getpass
import os
import pwd
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
    raises (KeyError, OSError from Python 3.13): the command failed after its checks.

    `getpass.getuser()` reads `LOGNAME` and `USER` first, which hold any bytes: one that
    is not UTF-8 arrived as lone surrogates, and `submit` failed with exit 1 (an encoding
    error at the store's write) while `cancel` refused the name as `--by`, which nobody gave.
    A name the name rule refuses (docs/cli.md "Keys") gives way to the passwd entry's,
    then to `uid-N`."""
    uid = f"uid-{os.getuid()}"
    # getpass.getuser() asks the passwd entry itself once the environment names no one:
    # when it raises, there is no entry to ask.
    try:
        found = getpass.getuser()
        if not _a_name(found):
            found = pwd.getpwuid(os.getuid()).pw_name
    except (KeyError, OSError):
        return uid
    return found if _a_name(found) else uid


def _a_name(found: str) -> bool:
    from ledger.content import JobInputError  # the commands that record who acted only
    from ledger.job import check_name

    try:
        check_name(found)
    except JobInputError:
        return False
    return True
