"""The `sendledger` console script's entry (`pyproject.toml` `[project.scripts]`, and
`python -m daemon`): `daemon.cli.main`, imported here rather than by the script itself.

Importing the command line takes some 40 ms before `main` can catch anything; a Ctrl-C in
them printed the traceback of the import it stopped and ended the process by SIGINT. Here
it is exit 130 with nothing on stderr, as a Ctrl-C later (docs/cli.md "Exit codes").
"""

from __future__ import annotations

#: `daemon.exit_codes.EXIT_INTERRUPTED`, not imported: its imports are among those a
#: Ctrl-C may stop.
INTERRUPTED = 130


def main() -> int:
    try:
        from daemon.cli import main as command_line
    except KeyboardInterrupt:
        return INTERRUPTED
    return command_line()


__all__ = ["INTERRUPTED", "main"]
