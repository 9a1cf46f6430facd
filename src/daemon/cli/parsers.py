"""The shape every read command shares on the command line: an optional job key and
``--json``; one helper so that no command forgets either."""

from __future__ import annotations

import argparse
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
