"""Store URLs: sqlite:///relative.sqlite, sqlite:////absolute.sqlite, postgresql://...,
memory:// and memory://name.

Parsing, and the one look a SQLite spec takes at the host before it is opened
(`SqliteStore.refuse_unmounted`): which backend serves a spec is
`ledger.stores.backend_for`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol
from urllib.parse import parse_qs, unquote, urlsplit

from ledger.exceptions import MayClearLater, Refusal, SendledgerError

if TYPE_CHECKING:
    from ledger.stores.mount_points import MountTable


class StoreRefused(SendledgerError, ValueError):
    """The store cannot be opened as configured: bad input, named in the message, and
    nothing was written (the CLI's exit 2)."""

    kind = Refusal.BAD_INPUT


class StoreUrlError(StoreRefused):
    pass


class StoreFolderNotThere(StoreUrlError, MayClearLater):
    """The store cannot be made because a symbolic link on its path points at nothing: a
    mount not up yet as often as a typo, so `run` says it with exit 1, which the systemd
    unit starts again, not 2 (docs/cli.md "Exit codes")."""


class StartWatch(Protocol):
    """Told of a service's start while it waits for its PostgreSQL server
    (`postgres.connect_at_open`): the daemon tells systemd, whose start timeout knows
    nothing of the wait otherwise."""

    def waiting(self, store: str, cause: str, within: float) -> None:
        """Before each try again: `store` (`PostgresStore.describe`, no password) is not
        accepting connections for `cause` ("starting up", "no free connection slot", "no
        answer"); the next word comes within `within` seconds."""
        ...

    def connected(self, store: str, within: float) -> None:
        """The wait is over; the start goes on (its next wait, if any, is said within
        `within` seconds)."""
        ...


@dataclass(frozen=True)
class SqliteStore:
    path: Path
    # `store.check_mounts`: a folder on a mount point with nothing mounted on it is
    # refused (`mount_points.refuse_unmounted`), told by `mounts` or, None, by this host.
    check_mounts: bool = field(default=True, compare=False)
    mounts: MountTable | None = field(default=None, repr=False, compare=False)

    def describe(self) -> str:
        return f"sqlite:{self.path}"

    def refuse_unmounted(self) -> None:
        """StoreNotMounted when its folder's disk is not mounted (`check_mounts`)."""
        if self.check_mounts:
            from ledger.stores.mount_points import refuse_unmounted

            refuse_unmounted(self.describe(), self.path, self.mounts)


#: A daemon's threads hold a connection only while they read or write the store, never
#: across a provider call: its `concurrency` send threads and the tick thread fit in five,
#: overflow covers the HTTP API and the status line (docs/performance.md "Performance and scaling").
DEFAULT_POOL_SIZE = 5
DEFAULT_MAX_OVERFLOW = 5
#: Seconds a write waits for the events table's lock before it fails and is tried again.
DEFAULT_LOCK_TIMEOUT = 5
#: Seconds a new connection may take, and a thread may wait for one from the pool, before
#: the store call fails (the database is down or unreachable) and is tried again.
DEFAULT_CONNECT_TIMEOUT = 10


@dataclass(frozen=True)
class PostgresStore:
    dbname: str
    host: str
    port: int
    user: str
    password: str = field(repr=False)  # never in logs or tracebacks
    schema: str = "public"
    # Not part of the URL: `[store]` settings, applied by the daemon's configuration.
    pool_size: int = DEFAULT_POOL_SIZE
    max_overflow: int = DEFAULT_MAX_OVERFLOW
    lock_timeout: int = DEFAULT_LOCK_TIMEOUT
    connect_timeout: int = DEFAULT_CONNECT_TIMEOUT
    # Seconds a service's start (`run`, `api`) may wait for its first connection, when
    # longer than `connect_timeout`; 0 for a command (`postgres.connect_at_open`).
    start_wait: int = 0
    # Told of that wait (a service under systemd); not part of what the store is.
    start_watch: StartWatch | None = field(default=None, repr=False, compare=False)

    def describe(self) -> str:
        # Never print the password.
        return f"postgresql://{self.user}@{self.host}:{self.port}/{self.dbname}"


@dataclass(frozen=True)
class MemoryStore:
    """Events and index in this process's memory, gone when it exits (tests, embedding).

    Ledgers opened on the same `name` in one process share one store, as processes
    share a SQLite file; with no name, each Ledger has a store of its own."""

    name: str | None = None

    def describe(self) -> str:
        return f"memory://{self.name or ''}"


StoreSpec = SqliteStore | PostgresStore | MemoryStore


#: The schemes of a PostgreSQL store URL.
POSTGRES_SCHEMES = ("postgresql", "postgres", "postgresql+psycopg")


def is_postgres_url(url: str) -> bool:
    """Whether `url` names a PostgreSQL store (its scheme; the rest is `parse_store_url`'s)."""
    return url.strip().partition("://")[0].lower() in POSTGRES_SCHEMES


def parse_store_url(url: str, *, base_dir: Path | None = None) -> StoreSpec:
    """Parse a store URL; relative SQLite paths are relative to `base_dir`
    (the config file's folder), else the working directory."""
    if not isinstance(url, str) or not url.strip():
        raise StoreUrlError("store.url: must not be empty")
    url = url.strip()
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise StoreUrlError(f"store.url: not a URL: {url!r} (sqlite:///file or postgresql://...)")
    scheme = scheme.lower()
    if scheme == "sqlite":
        if not rest.startswith("/") or rest == "/":
            raise StoreUrlError(
                f"store.url: {url!r}: use sqlite:///relative/path or sqlite:////absolute/path"
            )
        raw = unquote(rest[1:])
        if "\x00" in raw:  # no file name holds one: open() would fail, unexplained
            raise StoreUrlError(f"store.url: {url!r}: the path holds a NUL character (%00)")
        if raw == ":memory:":
            raise StoreUrlError("store.url: an in-memory SQLite store would lose every job")
        if raw.startswith("~") and (raw == "~" or "/" in raw):
            # No shell expands a `~` or `~user` inside a URL: it was a folder named so in
            # the config's folder, which a later `rm -rf ~` to tidy it up would take for the
            # home folder. A file named `~old.sqlite` there is only a file.
            raise StoreUrlError(
                f"store.url: {url!r}: a '~' is not expanded in a URL: write the folder out "
                "(sqlite:////home/NAME/...)"
            )
        path = Path(raw)
        if not path.is_absolute():
            path = (base_dir or Path.cwd()) / path
        return SqliteStore(path=path)
    if scheme in POSTGRES_SCHEMES:
        try:
            parts = urlsplit("postgresql://" + rest)
            query = parse_qs(parts.query)
            parts.hostname  # noqa: B018 (an unclosed "[" raises only here on some Pythons)
        except ValueError as exc:
            raise StoreUrlError(f"store.url: not a URL: {_safe(url)} ({exc})") from None
        dbname = unquote(parts.path.lstrip("/"))
        if not dbname:
            raise StoreUrlError(f"store.url: {_safe(url)}: the database name is missing")
        typed_host, port_text = _host_and_port(parts.netloc)
        queried_host = (query.get("host") or [""])[0]
        if typed_host and queried_host:
            # libpq would take the query's: refuse rather than pick the other one.
            raise StoreUrlError(f"store.url: {_safe(url)}: the host is given twice")
        host = typed_host or queried_host or "/var/run/postgresql"
        port = _port(port_text, url)
        unknown = sorted(set(query) - {"host", "schema"})
        if unknown:
            raise StoreUrlError(f"store.url: unknown parameter {unknown[0]!r}")
        spec = PostgresStore(
            dbname=dbname,
            host=host,
            port=port,
            user=unquote(parts.username or "") or "postgres",
            password=unquote(parts.password or ""),
            schema=(query.get("schema") or ["public"])[0],
        )
        # PostgreSQL's text holds no NUL: a %00 would fail at the first query, unexplained.
        for name in ("dbname", "host", "user", "password", "schema"):
            if "\x00" in getattr(spec, name):
                raise StoreUrlError(
                    f"store.url: {_safe(url)}: the {name} holds a NUL character (%00)"
                )
        return spec
    if scheme == "memory":
        return MemoryStore(name=unquote(rest).strip("/") or None)
    raise StoreUrlError(f"store.url: unsupported scheme {scheme!r} (sqlite or postgresql)")


def _host_and_port(netloc: str) -> tuple[str, str | None]:
    """The host as typed, percent escapes decoded (a socket folder, `%2Frun%2Fpg`, is
    case-sensitive: `SplitResult.hostname` lowercases it and keeps its escapes), and the
    port's text (None: no colon)."""
    hostport = netloc.rpartition("@")[2]
    if hostport.startswith("["):  # an IPv6 address; urlsplit checked the brackets
        host, _, after = hostport[1:].partition("]")
        port = after[1:] if after.startswith(":") else (after or None)
        return unquote(host), port
    host, colon, port_text = hostport.partition(":")
    return unquote(host), port_text if colon else None


def _port(text: str | None, url: str) -> int:
    """The port as typed: only an ASCII decimal number from 1 to 65535. libpq reads an
    empty or 0 port as 5432 and Python's `int` reads "+5432", "5_432" or other scripts'
    digits: each would reach a server other than the one the text names."""
    if text is None:
        return 5432
    if not (text.isascii() and text.isdigit() and 1 <= int(text) <= 65535):
        why = " (libpq would read this one as 5432)" if text.strip("0") == "" else ""
        raise StoreUrlError(f"store.url: {_safe(url)}: bad port: 1 to 65535{why}")
    return int(text)


def _safe(url: str) -> str:
    try:
        parts = urlsplit(url)
        parts.password  # noqa: B018 (raises for a malformed host)
    except ValueError:
        # Not a URL urlsplit reads: whatever is before the host may hold a password.
        scheme, _, rest = url.partition("://")
        _userinfo, at, host = rest.rpartition("@")
        return f"{scheme}://***@{host}" if at else url
    if parts.password:
        return url.replace(f":{parts.password}@", ":***@")
    return url


__all__ = [
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_LOCK_TIMEOUT",
    "DEFAULT_MAX_OVERFLOW",
    "DEFAULT_POOL_SIZE",
    "POSTGRES_SCHEMES",
    "MemoryStore",
    "PostgresStore",
    "SqliteStore",
    "StoreFolderNotThere",
    "StoreRefused",
    "StoreSpec",
    "StoreUrlError",
    "is_postgres_url",
    "parse_store_url",
]
