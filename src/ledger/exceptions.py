"""The one exception tree: everything sendledger raises derives from `SendledgerError`.

It lives in the ledger, the innermost layer, so every layer may import it (docs/
architecture.md "Layers and what each may import"). An error's `kind` says which refusal
it is, and each door maps the kinds once: the command line to an exit code
(`daemon/exit_codes.py: exit_code_for`, in `daemon/cli/__init__.py: main`), the HTTP API
and the review page to a status (`daemon/api/errors.py: status_of`). An error without a
kind is a failure, not a refusal: exit 1 "unexpected failure", HTTP 500. The two doors'
own errors carry their answer: `CliError` an exit code, `ApiError` a status.

Two packages keep their own base: the test kit (`testkit`) imports nothing of ours, and
the Python client (`sendledger.client.ClientError`) imports only the standard library,
so a user's program runs it without the daemon's packages.

    Exception
     └── SendledgerError                 kind None: a failure (exit 1, HTTP 500)
          │
          ├── bad input                  kind BAD_INPUT (exit 2, HTTP 422)
          │    ├── JobInputError                         ledger/content.py: one field
          │    │    ├── JobInputErrors                   several fields of one job
          │    │    └── RenderMismatch                   ledger/wire_check.py
          │    ├── AddressError, AttachmentError, MessageIdError        ledger/
          │    ├── TransitionError                       ledger/job.py: the state refuses
          │    │    └── BounceRefused                    a report not recorded, and why
          │    ├── StoreRefused                          ledger/stores/url.py
          │    │    ├── StoreUrlError, StoreKeyRefused, LibraryVariableSet,
          │    │    │   StoreFormatNewer (ledger/event_format.py),
          │    │    │   UnfinishedCopy (ledger/stores/keycheck.py: a copy never verified)
          │    │    └── StoreFolderNotThere (a StoreUrlError): a folder linked to nothing
          │    ├── DurationError, FileProblem, SenderRefused, PolicyLoadError   policies/
          │    │    └── FileMissing                      policies/files.py: nothing there
          │    │         └── SecretFileMissing           daemon/config/secret_text.py
          │    ├── ConfigError                           daemon/config/config_file.py
          │    ├── IntakeError                           daemon/service_layer/intake.py
          │    ├── TokenFileError                        daemon/api/auth.py
          │    └── MissingScope, DelegationRequired, CredentialsFileUnreadable,
          │        CredentialsFileInvalid                daemon/providers/gmail.py
          ├── conflict                   kind CONFLICT (exit 3, HTTP 409)
          │    ├── KeyConflict, IdentityTaken            ledger/
          │    ├── OlderReleaseLive                      ledger/event_format.py
          │    └── CopyRefused                           daemon/service_layer/copy_store.py
          ├── not found                  kind NOT_FOUND (exit 4, HTTP 404)
          │    └── UnknownJob                            ledger/application.py
          ├── unavailable                kind UNAVAILABLE (exit 1, HTTP 503)
          │    ├── StoreUnavailable                      ledger/stores/causes.py: read-only,
          │    │    │                                    disk full, locked (PersistenceError too)
          │    │    └── StoreNotMounted                  ledger/stores/mount_points.py: its
          │    │                                         folder's disk not mounted
          │    ├── CopyMismatch                          daemon/service_layer/copy_store.py:
          │    │                                         a copy's verification failed, a
          │    │                                         server started on its source, or
          │    │                                         its SQLite file was removed
          │    ├── CopyFailed                            daemon/service_layer/copy_store.py:
          │    │                                         a store refused the copy (I/O error)
          │    └── BackupFailed                          ledger/stores/sqlite_backup.py: the
          │                                              copy could not be written to its end
          ├── ServiceError               the kind given where it is raised (UNAVAILABLE:
          │    │                         exit 1, HTTP 503): daemon/service_layer/problems.py
          │    └── NotAtVersion                          the same file: a decision's
          │                                              version moved on (If-Match: 412)
          ├── CliError                   its own exit code: daemon/exit_codes.py
          ├── ApiError                   its own status: daemon/api/errors.py
          └── failures                   kind None
               ├── BrokenInvariant                       ledger/exceptions.py: a fact
               │                                         the code rests on did not hold
               ├── ConcurrentUpdate                      ledger/application.py
               ├── RewriteFailed                         ledger/stores/purge.py
               ├── EventKeyMissing                       ledger/stores/cipher.py
               ├── ProviderError                         daemon/providers/outcomes.py
               │    ├── DraftRefused                     daemon/providers/draft_handle.py
               │    └── DeleteRefused                    daemon/providers/outcomes.py: a
               │                                         draft's deletion refused for good
               ├── HistoryTooOld                         daemon/providers/history_handle.py: an
               │                                         answer (the search decides), never shown
               ├── TransportFailure (httplib2's too)     daemon/providers/transport.py
               │    └── NotSentError, ResponseLostError
               ├── TokenError, DraftAlreadySent, DraftChanged, DraftVanished, NotOurs,
               │   SimulatedCrash (daemon/doubles/)
               ├── ListenRefused (an OSError too)         daemon/api/server.py
               │    └── ListenBusy                       an address in use or not up yet
               ├── AnswerTooLong (an OSError too)          daemon/providers/early_answers.py
               └── internal signals, never shown: wire_check._Bad, smtp_submit._Retry
                   and _Refused, delivery_reports._Refused, gmail_reports._QuotaKept,
                   testkit_doubles._BadOption, ScopeLost (providers/base.py: a scope
                   moved between two calls), Withdrawn (ledger/stores/index.py: a write
                   its writer withdrew; loaded_policies.py: a stopped server's beat;
                   its Changed, ledger/stores/unchanged.py: what it was decided on changed),
                   LeftToRecovery (daemon/engine/commit.py: a
                   stopping daemon's save whose window passed), copy_store._Stopped (a
                   Ctrl-C during a copy's rebuild or walk), UnsureConflict
                   (ledger/stores/causes.py: a write tried again met rows its own
                   failed try may have stored; an IntegrityError too), form_text._Enough
                   (daemon/api/form_text.py: a form read as far as its check needs)

`MayClearLater`, mixed into `SecretFileMissing` (a `FileProblem`), `StoreFolderNotThere`
and `ListenBusy`, marks a cause that may be gone at the next start: `run` exits 1 for it,
not 2 (`on_chain`).

A class keeps the standard base it had (`ValueError`, `OSError`, httplib2's
`HttpLib2Error`) beside this one, so every `except ValueError` still catches what it did.
`tests/unit/test_errors.py` fails when a class of ours leaves the tree or a door's answer
to a kind changes.
"""

from __future__ import annotations

from enum import StrEnum
from typing import TypeVar

_T = TypeVar("_T")


class Refusal(StrEnum):
    """Which refusal an error is: each door maps these once."""

    BAD_INPUT = "bad-input"  # exit 2, HTTP 422
    NOT_FOUND = "not-found"  # exit 4, HTTP 404
    CONFLICT = "conflict"  # exit 3, HTTP 409
    UNAVAILABLE = "unavailable"  # exit 1, HTTP 503: a search could not be made, a store written


class SendledgerError(Exception):
    """The base of every error sendledger raises (the tree is in this module's docstring).
    `kind`: the refusal it is, or None for a failure."""

    kind: Refusal | None = None


class BrokenInvariant(SendledgerError):
    """A fact the code rests on did not hold (a bug, or a store holding what no release
    wrote): a failure, raised where an `assert` would vanish under `python -O` and let
    the wrong value go on into a decision or an event."""


class MayClearLater:
    """Mixed into an error whose cause may be gone at the next start: a secret file
    mounted after the daemon's, an address not up yet, a port its last holder is still
    giving back. `run` refused for one exits 1, which the systemd unit restarts, not 2,
    a config it can never start with, which it does not (docs/cli.md "Exit codes")."""


def on_chain(exc: BaseException, kind: type[object]) -> bool:
    """Whether `exc`, or an error it was raised from or while handling, is a `kind`. A
    door that names the setting raises an error of its own while it handles the reader's:
    that one stays on the chain as its context (`raise ... from None` hides it from a
    traceback, it does not drop it)."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, kind):
            return True
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return False


def known(value: _T | None, fact: str) -> _T:
    """`value`, which `fact` says is there; BrokenInvariant naming the fact when it is
    not."""
    if value is None:
        raise BrokenInvariant(fact)
    return value


def of_type(value: object, kind: type[_T], fact: str) -> _T:
    """`value`, which `fact` says is a `kind`; BrokenInvariant naming the fact and what
    it is when it is not."""
    if not isinstance(value, kind):
        raise BrokenInvariant(f"{fact}: {type(value).__name__}, not {kind.__name__}")
    return value


__all__ = [
    "BrokenInvariant",
    "MayClearLater",
    "Refusal",
    "SendledgerError",
    "known",
    "of_type",
    "on_chain",
]
