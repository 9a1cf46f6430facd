"""The one exception tree (ledger/exceptions.py): every class of ours is in it, its drawing is the
code, and each door maps a kind as it always has (docs/cli.md "Exit codes",
docs/http-api.md "Errors and statuses")."""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from daemon.api.errors import ApiError, status_of
from daemon.config.config_file import ConfigError
from daemon.exit_codes import CliError, exit_code_for
from daemon.providers.base import ProviderError
from daemon.service_layer.services import ServiceError
from ledger import exceptions
from ledger.application import ConcurrentUpdate, KeyConflict, UnknownJob
from ledger.content import JobInputError
from ledger.exceptions import Refusal, SendledgerError
from ledger.job import TransitionError
from ledger.message_id import MessageIdError
from ledger.stores.causes import StoreUnavailable
from ledger.stores.identity import IdentityTaken
from sendledger.client import ClientError

SRC = Path(__file__).resolve().parents[2] / "src"


def error_classes(package: str) -> Iterator[type[BaseException]]:
    """Every exception class defined in `package`, nested ones too."""
    for path in sorted((SRC / package).rglob("*.py")):
        parts = path.relative_to(SRC).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if name.endswith("__main__"):
            continue
        yield from _defined(importlib.import_module(name), name)


def _defined(holder: object, module: str) -> Iterator[type[BaseException]]:
    for value in vars(holder).values():
        if inspect.isclass(value) and value.__module__ == module:
            if issubclass(value, BaseException):
                yield value
            yield from _defined(value, module)


@pytest.mark.parametrize("package", ["ledger", "policies", "daemon"])
def test_every_error_of_ours_derives_from_the_base(package: str) -> None:
    outside = [c.__qualname__ for c in error_classes(package) if not issubclass(c, SendledgerError)]
    assert outside == []


def test_the_clients_errors_have_their_own_base() -> None:
    # The client imports only the standard library (docs/http-api.md "Python client"):
    # not the ledger's base, its own.
    classes = list(error_classes("sendledger"))
    assert classes and all(issubclass(c, ClientError) for c in classes), classes
    assert not any(issubclass(c, SendledgerError) for c in classes)


def drawn() -> dict[str, str]:
    """Each class the docstring's tree names, with the branch it is drawn under."""
    branch = ""
    found: dict[str, str] = {}
    doc = exceptions.__doc__ or ""
    for line in doc[doc.index("    Exception") :].split("\n\n")[0].splitlines():
        if marker := re.search(r"kind (BAD_INPUT|CONFLICT|NOT_FOUND|UNAVAILABLE|None)", line):
            branch = marker.group(1)
        words = re.sub(r"\S+/\S*|\([^)]*\)", "", line)  # paths and asides are no classes
        for name in re.findall(r"\b_?[A-Z][A-Za-z]+\b", words):
            found.setdefault(name, branch)
    return found


def test_the_drawing_is_the_tree() -> None:
    tree = drawn()
    classes = {c.__name__: c for p in ("ledger", "policies", "daemon") for c in error_classes(p)}
    assert set(classes) <= set(tree), sorted(set(classes) - set(tree))
    # A class drawn under a kind has that kind; the doors' own and ServiceError (and its
    # NotAtVersion) say theirs.
    for name, branch in tree.items():
        if name in classes and name not in {"ServiceError", "NotAtVersion", "CliError", "ApiError"}:
            error = classes[name]
            assert issubclass(error, SendledgerError), name
            kind = error.kind
            assert (kind.name if kind else "None") == branch, (name, kind, branch)


CASES: list[tuple[SendledgerError, int | None, int | None]] = [
    # (error, exit code, HTTP status); None: a failure ("unexpected failure", 500)
    (KeyConflict("k", "sha256:a", "sha256:b"), 3, 409),
    (IdentityTaken("a", "sqlite:x"), 3, 409),
    (UnknownJob("k"), 4, 404),
    (TransitionError("k", "confirmed", "resend"), 2, 422),
    (JobInputError("to", "not an address"), 2, 422),
    (MessageIdError("bad domain"), 2, 422),
    (ConfigError("daemon.tick: too small"), 2, 422),
    (ServiceError(Refusal.BAD_INPUT, "bad"), 2, 422),
    (ServiceError(Refusal.NOT_FOUND, "gone"), 4, 404),
    (ServiceError(Refusal.CONFLICT, "moved"), 3, 409),
    (ServiceError(Refusal.UNAVAILABLE, "no search"), 1, 503),
    (StoreUnavailable("sqlite:x", "read-only", OSError("ro")), 1, 503),
    (CliError("cannot open store", 1), 1, None),
    (CliError("purged already", 3), 3, None),
    (ApiError(413, "too large"), None, 413),
    (ConcurrentUpdate("changed"), None, None),
    (ProviderError("HTTP 500"), None, None),
]


@pytest.mark.parametrize(("error", "code", "status"), CASES, ids=lambda c: type(c).__name__)
def test_each_door_maps_a_kind_as_it_always_has(
    error: SendledgerError, code: int | None, status: int | None
) -> None:
    assert exit_code_for(error) == code
    assert status_of(error) == status


def test_an_error_outside_the_tree_is_unexpected_at_the_command_line() -> None:
    assert exit_code_for(ValueError("x")) is None
