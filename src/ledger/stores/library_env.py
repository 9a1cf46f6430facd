"""eventsourcing's own environment variables: refused, never honoured.

eventsourcing builds an application's settings from the process environment first
(`Application.construct_env`), so an unprefixed `COMPRESSOR_TOPIC`, `CIPHER_TOPIC` plus
`CIPHER_KEY`, `PERSISTENCE_MODULE` or `AGGREGATE_CACHE_MAXSIZE` left in a shell would
change how sendledger writes its store, and what it wrote no other process could read.
sendledger configures eventsourcing from its own settings only (`Ledger.construct_env`
passes the backend's and the cipher's values, nothing from `os.environ`), and refuses to
open a store while one of these names is set, naming it: a variable silently ignored
would leave its author believing it applied. docs/configuration.md "Stored mail: file modes,
encryption, daemon names".
"""

from __future__ import annotations

from collections.abc import Mapping

from ledger.stores.url import StoreRefused

#: Every name eventsourcing 9.5 reads from an application's environment (its factories,
#: recorders, cipher, compressor, cache and snapshotting), plus `TZINFO_TOPIC`, which it
#: reads at import to stamp event times. `tests/unit/test_library_env.py` checks the
#: installed library for names missing here.
LIBRARY_VARIABLES = frozenset(
    {
        "AGGREGATE_CACHE_FASTFORWARD",
        "AGGREGATE_CACHE_FASTFORWARD_SKIPPING",
        "AGGREGATE_CACHE_MAXSIZE",
        "APPLICATION_RECORDER_TOPIC",
        "CIPHER_KEY",
        "CIPHER_TOPIC",
        "COMPRESSOR_TOPIC",
        "CREATE_TABLE",
        "DEEPCOPY_FROM_AGGREGATE_CACHE",
        "FACTORY_TOPIC",
        "INFRASTRUCTURE_FACTORY",
        "IS_SNAPSHOTTING_ENABLED",
        "MAPPER_TOPIC",
        "ORIGINATOR_ID_TYPE",
        "PERSISTENCE_MODULE",
        "POSTGRES_CONNECT_TIMEOUT",
        "POSTGRES_CONN_MAX_AGE",
        "POSTGRES_DBNAME",
        "POSTGRES_GET_PASSWORD_TOPIC",
        "POSTGRES_HOST",
        "POSTGRES_IDLE_IN_TRANSACTION_SESSION_TIMEOUT",
        "POSTGRES_LOCK_TIMEOUT",
        "POSTGRES_MAX_OVERFLOW",
        "POSTGRES_MAX_WAITING",
        "POSTGRES_PASSWORD",
        "POSTGRES_POOL_SIZE",
        "POSTGRES_PORT",
        "POSTGRES_PRE_PING",
        "POSTGRES_SCHEMA",
        "POSTGRES_USER",
        "PROCESS_RECORDER_TOPIC",
        "SINGLE_ROW_TRACKING",
        "SQLITE_DBNAME",
        "SQLITE_LOCK_TIMEOUT",
        "TRACKING_RECORDER_TOPIC",
        "TRANSCODER_TOPIC",
        "TZINFO_TOPIC",
    }
)
#: Read by sendledger itself and passed on explicitly (`PostgresBackend.env`): it picks
#: one of two insert paths that write the same rows (docs/how-it-works.md "How it works").
READ_BY_SENDLEDGER = frozenset({"POSTGRES_ENABLE_DB_FUNCTIONS"})
#: eventsourcing also looks each name up prefixed with the application's name first.
APPLICATION_PREFIX = "SENDLEDGER_"


class LibraryVariableSet(StoreRefused):
    def __init__(self, variable: str) -> None:
        super().__init__(
            f"environment variable {variable} is set: it is eventsourcing's own, and "
            "sendledger configures its store only from its settings (store.url, "
            f"store.encryption_key_file), never from it; unset {variable}"
        )
        self.variable = variable


def library_variables_in(environ: Mapping[str, str]) -> list[str]:
    """The names of `environ` that eventsourcing would read, sorted."""
    found = []
    for name in environ:
        bare = name.removeprefix(APPLICATION_PREFIX)
        if bare in LIBRARY_VARIABLES or (name != bare and bare in READ_BY_SENDLEDGER):
            found.append(name)
    return sorted(found)


def refuse_library_variables(environ: Mapping[str, str]) -> None:
    """LibraryVariableSet naming the first such variable of `environ`."""
    found = library_variables_in(environ)
    if found:
        raise LibraryVariableSet(found[0])


__all__ = [
    "LIBRARY_VARIABLES",
    "READ_BY_SENDLEDGER",
    "LibraryVariableSet",
    "library_variables_in",
    "refuse_library_variables",
]
