"""Exit codes and the one error type the CLI turns into them."""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_BAD_INPUT = 2
EXIT_CONFLICT = 3
EXIT_UNKNOWN_JOB = 4


class CliError(Exception):
    def __init__(self, message: str, code: int = EXIT_FAILURE) -> None:
        super().__init__(message)
        self.code = code


def bad_input(message: str) -> CliError:
    return CliError(message, EXIT_BAD_INPUT)
