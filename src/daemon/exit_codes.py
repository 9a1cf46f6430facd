"""Exit codes, the CLI's own error, and the one table that turns every error of the tree
(ledger/exceptions.py) into an exit code (docs/cli.md "Exit codes")."""

from __future__ import annotations

from ledger.exceptions import Refusal, SendledgerError

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_BAD_INPUT = 2
EXIT_CONFLICT = 3
EXIT_UNKNOWN_JOB = 4
EXIT_INTERRUPTED = 130  # Ctrl-C, as a shell reports a process SIGINT ended


class CliError(SendledgerError):
    """A command's refusal with its exit code."""

    def __init__(self, message: str, code: int = EXIT_FAILURE) -> None:
        super().__init__(message)
        self.code = code


#: The exit code of each kind of refusal.
REFUSAL_CODES = {
    Refusal.BAD_INPUT: EXIT_BAD_INPUT,
    Refusal.NOT_FOUND: EXIT_UNKNOWN_JOB,
    Refusal.CONFLICT: EXIT_CONFLICT,
    Refusal.UNAVAILABLE: EXIT_FAILURE,
}


def exit_code_for(exc: BaseException) -> int | None:
    """The exit code of a refusal; None for a failure or an error outside the tree (exit 1,
    "unexpected failure")."""
    if isinstance(exc, CliError):
        return exc.code
    if not isinstance(exc, SendledgerError) or exc.kind is None:
        return None
    return REFUSAL_CODES[exc.kind]


def bad_input(message: str) -> CliError:
    return CliError(message, EXIT_BAD_INPUT)
