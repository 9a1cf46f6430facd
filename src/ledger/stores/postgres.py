"""The PostgreSQL backend: eventsourcing's PostgreSQL recorder, writing the job index row
in the same transaction as the events, and the store's schema.

Imported only when a postgresql:// store is used, so that SQLite users do not pay for
loading psycopg (`ledger.stores.backend_for` imports it lazily).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Self, TypeVar
from uuid import UUID

import psycopg
import psycopg_pool
from eventsourcing.persistence import (
    IntegrityError,
    InterfaceError,
    Notification,
    OperationalError,
    StoredEvent,
)
from eventsourcing.postgres import PostgresApplicationRecorder, PostgresDatastore
from eventsourcing.utils import get_topic, retry
from psycopg import pq
from psycopg.conninfo import make_conninfo
from psycopg.sql import SQL, Composed

from ledger.exceptions import known
from ledger.stores.causes import StoreUnavailable, UnsureConflict, exception_chain
from ledger.stores.identity import IdentityTaken, NameSession, advisory_key
from ledger.stores.index import (
    ADDED_COLUMNS,
    ADDED_INDEXES,
    ATTEMPT_PROVIDER_BACKFILL,
    CREATE_STATEMENTS,
    INDEX_CONNECT_KWARG,
    INDEX_TABLE,
    SqlJobIndex,
    Withdrawn,
    rows_from,
)
from ledger.stores.keycheck import KEY_TABLE, SqlKeyChecks
from ledger.stores.pg_refusals import (
    TOO_MANY_CONNECTIONS,
    ServerRefusal,
    refusal_fix,
    server_refusal,
)
from ledger.stores.private_api import InsertHook, insert_by_function
from ledger.stores.unchanged import hold_unchanged, takes_turn, unchanged_from
from ledger.stores.url import PostgresStore

DB_FUNCTIONS = "POSTGRES_ENABLE_DB_FUNCTIONS"
# SQLSTATEs of a transaction that lost a lock race and was rolled back: try it again.
_TRANSIENT = frozenset({"40001", "40P01", "55P03"})  # serialization, deadlock, lock timeout
# The session is gone (a database restart, a failover, the network): the same statement on
# another pooled connection may succeed. Class 08 is "connection exception"; 57P01-57P03
# are an administrator's or a crash's shutdown and a server still starting; a connection
# that simply closed reports no SQLSTATE at all.
_CONNECTION_LOST = frozenset({"57P01", "57P02", "57P03"})
# Errors of the pool itself: no connection came within connect_timeout (the database is
# still down: that wait was the retry), or the store is being closed.
_POOL_ERRORS = (psycopg_pool.PoolTimeout, psycopg_pool.PoolClosed, psycopg_pool.TooManyRequests)
# Two processes creating the same tables, types and functions at once.
_SETUP_RACE = _TRANSIENT | {
    "23505",  # unique_violation (in the catalog)
    "42P06",  # duplicate_schema
    "42P07",  # duplicate_table
    "42710",  # duplicate_object
    "42723",  # duplicate_function
    "XX000",  # "tuple concurrently updated": CREATE OR REPLACE FUNCTION raced
}


log = logging.getLogger("sendledger.store")

#: eventsourcing's PostgreSQL factory names the events table after the application
#: (`Ledger.name`).
EVENTS_TABLE = "sendledger_events"


class PostgresJobIndexRecorder(InsertHook, PostgresApplicationRecorder, SqlJobIndex, SqlKeyChecks):
    _p = "%s"
    _blob = "BYTEA"
    _real = "DOUBLE PRECISION"

    def __init__(self, datastore: PostgresDatastore, *, events_table_name: str = "stored_events"):
        # Before the library's own init, whose type adapters take the pool's first
        # connection.
        start, _OPENING.start = _OPENING.start, None
        store, _OPENING.store = _OPENING.store, None
        bound_pool_connects(datastore.pool)
        PoolWait.install(datastore.pool, start=start, store=store)
        super().__init__(datastore, events_table_name=events_table_name)
        schema = datastore.schema.replace('"', '""')
        self._table = f'"{schema}".{INDEX_TABLE}'
        self._key_table = f'"{schema}".{KEY_TABLE}'
        for statement in CREATE_STATEMENTS:
            sql = self._sql(
                statement.replace("{real}", "DOUBLE PRECISION").replace("{options}", "")
            )
            self.sql_create_statements.append(SQL(sql).format())
        # Sent as one simple query (one round trip): the lock timeout, and the
        # transaction's id, by which a commit whose answer was lost is looked up.
        self._set_lock_timeout = SQL(
            "SET LOCAL lock_timeout = '{0}s'; SELECT txid_current() AS xid"
        ).format(datastore.lock_timeout)

    def insert_events(
        self, stored_events: Sequence[StoredEvent], **kwargs: Any
    ) -> Sequence[int] | None:
        # The library's ten tries 0.2 s apart, for a lost connection only. A lost lock
        # race (a lock_timeout, a deadlock, a serialization failure) is tried again by the
        # ledger within its `store_wait`: tried here too, ten lock waits a try of the
        # ledger's 20 held a write 17 minutes at the default 5 s. Nor a pool's error: no
        # connection came within `connect_timeout`, which was the wait (ten of them held
        # a write 100 s, and a stop as long).
        with PoolWait.asking(kwargs.get(INDEX_CONNECT_KWARG)):
            for attempt in range(10):
                try:
                    return self._insert_events_once(stored_events, **kwargs)
                except IntegrityError as exc:
                    if attempt == 0:
                        raise
                    # Met after a try whose commit is not known: maybe that try's rows.
                    raise UnsureConflict(str(exc)) from exc
                except (InterfaceError, OperationalError) as exc:
                    if attempt == 9 or _sqlstates(exc) & _TRANSIENT or _from_pool(exc):
                        raise
                    time.sleep(0.2)
        raise AssertionError("unreachable")

    def _insert_events_once(
        self, stored_events: Sequence[StoredEvent], **kwargs: Any
    ) -> Sequence[int] | None:
        if not self.datastore.enable_db_functions:
            ids: Sequence[int] | None = super().insert_events(stored_events, **kwargs)
            return ids
        # POSTGRES_ENABLE_DB_FUNCTIONS=y (sendledger's default; =n in the environment
        # turns it off): the library calls its insert function and skips
        # `_insert_events`, so the index rows would be lost. Call the same function, then
        # write the rows, in one transaction (ledger/stores/private_api.py).
        xid: int | None = None
        try:
            with (
                self.datastore.get_connection() as conn,
                conn.transaction(),
                conn.cursor() as curs,
            ):
                ids = insert_by_function(self, curs, stored_events, kwargs)
                # The function set the lock_timeout of whoever created the store; the rest
                # of the transaction waits by this one's (`[store] lock_timeout`).
                curs.execute(self._set_lock_timeout)
                curs.nextset()  # the SELECT's result follows the SET's
                row = curs.fetchone()
                xid = None if row is None else int(row["xid"])
                self.beside_events(curs, kwargs)
        except (InterfaceError, OperationalError):
            # The connection died, maybe after COMMIT was sent and applied. Tried again,
            # the insert would meet its own rows and read as another writer's
            # (ConcurrentUpdate: a claim would make no call, a resolve be told it failed):
            # the server says whether this transaction committed.
            if xid is not None and self._committed(xid):
                return ids
            raise
        return ids

    def select_events(self, *args: Any, **kwargs: Any) -> Sequence[StoredEvent]:
        with PoolWait.one_wait():  # a lost connection tried again, not the pool's wait
            events: Sequence[StoredEvent] = super().select_events(*args, **kwargs)
            return events

    def select_notifications(self, *args: Any, **kwargs: Any) -> Sequence[Notification]:
        with PoolWait.one_wait():
            found: Sequence[Notification] = super().select_notifications(*args, **kwargs)
            return found

    def max_notification_id(self) -> int | None:
        with PoolWait.one_wait():
            last: int | None = super().max_notification_id()
            return last

    def _committed(self, xid: int) -> bool:
        with PoolWait.one_wait():
            committed: bool = self._committed_tries(xid)
            return committed

    @retry((InterfaceError, OperationalError), max_attempts=10, wait=0.2)
    def _committed_tries(self, xid: int) -> bool:
        """Whether the transaction `xid` committed; while the server still finishes it
        (the connection only just dropped), asked again."""
        for _ in range(50):
            with self.datastore.transaction(commit=False) as curs:
                curs.execute("SELECT txid_status(%s) AS status", (xid,))
                row = curs.fetchone()
            status = None if row is None else row["status"]
            if status != "in progress":
                return status == "committed"
            time.sleep(0.1)
        return False

    def beside_events(self, curs: Any, kwargs: Mapping[str, Any]) -> None:
        # In the events' transaction (ledger/stores/private_api.py: InsertHook).
        self._rewrite_events(curs, kwargs)
        self._write_rows(curs, kwargs)
        if takes_turn(kwargs) or (unchanged_from(kwargs) is not None and not rows_from(kwargs)):
            # A write of no job row in turn all the same (a handle's mark): never between
            # a guarded write's read below and its commit (ledger/stores/unchanged.py).
            self._serialize_writes(curs)
        # Read once this write holds the turn (`_stamp`), on its own connection: a write
        # that changes the record takes the turn before its commit, so what is read here
        # is what is there at this commit.
        hold_unchanged(kwargs, lambda originator_id: self._last_version(curs, originator_id))

    def _last_version(self, curs: Any, originator_id: UUID) -> int:
        curs.execute(
            f"SELECT MAX(originator_version) AS v FROM {self._events_table()} "
            "WHERE originator_id = %s",
            (originator_id,),
        )
        row = curs.fetchone()
        return 0 if row is None or row["v"] is None else int(row["v"])

    def _lock_rows(self, cursor: Any, keys: Sequence[str]) -> None:
        # In key order, as every writer of the index takes them: no two wait on each other.
        cursor.execute(
            self._sql("SELECT key FROM {t} WHERE key = ANY({p}) ORDER BY key FOR UPDATE"),
            [list(keys)],
        )
        cursor.fetchall()

    def _serialize_writes(self, cursor: Any) -> None:
        # Writers of one store run side by side up to here (the library's insert
        # function takes no lock on the events table); from here to its commit, one at a
        # time: a transaction's stamp then follows every commit before it
        # (`SqlJobIndex._stamp`). Released by the commit, or the rollback.
        cursor.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (self._table,))
        cursor.fetchall()

    def _transaction(self, *, commit: bool) -> AbstractContextManager[Any]:
        return self.datastore.transaction(commit=commit)

    def _tuples(self, cursor: Any) -> list[tuple[Any, ...]]:
        return [tuple(r.values()) for r in cursor.fetchall()]

    def _member(self, column: str) -> str:
        return f"{column} = ANY({{p}})"

    def _members(self, values: Sequence[str]) -> Any:
        return list(values)

    def _rewrite_sql(self) -> tuple[str, Callable[[Any], Any]]:
        sql = (
            f"UPDATE {self._events_table()} SET state = %s "
            "WHERE originator_id = %s AND originator_version = %s RETURNING 1"
        )
        return sql, lambda originator_id: UUID(str(originator_id))

    def _changed(self, cursor: Any) -> int:
        # The library inserts in pipeline mode, where rowcount is not known until a sync:
        # fetching the RETURNING rows waits for this statement's result.
        return len(cursor.fetchall())

    def _events_table(self) -> str:
        schema = self.datastore.schema.replace('"', '""')
        table = self.events_table_name.replace('"', '""')
        return f'"{schema}"."{table}"'

    def _events_of_query(self, job_ids: Sequence[str]) -> tuple[str, list[Any]]:
        sql = (
            "SELECT originator_id, originator_version, topic, state FROM "
            f"{self._events_table()} WHERE originator_id = ANY(%s) "
            "ORDER BY originator_id, originator_version"
        )
        return sql, [[UUID(job_id) for job_id in job_ids]]

    def _has_events_sql(self) -> tuple[str, Callable[[str], Any]]:
        schema = self.datastore.schema.replace('"', '""')
        table = self.events_table_name.replace('"', '""')
        sql = f'SELECT 1 FROM "{schema}"."{table}" WHERE originator_id = %s LIMIT 1'
        return sql, UUID

    def _key_table_exists(self, cursor: Any) -> bool:
        cursor.execute("SELECT to_regclass(%s) AS found", (self._key_table,))
        row = cursor.fetchone()
        return row is not None and row["found"] is not None


def _sqlstates(exc: BaseException) -> set[str]:
    return {
        error.sqlstate
        for error in exception_chain(exc)
        if isinstance(error, psycopg.Error) and error.sqlstate
    }


class PoolWait(threading.local):
    """A write's wait for a pooled connection that its writer may give up
    (`INDEX_CONNECT_KWARG`: a lease renewal of a stopping daemon, `Leases.close`).
    psycopg's pool takes no such question: while a write asks one, its thread waits in
    slices of `SLICE` and asks between them (losing its place in the pool's queue each
    time: a renewal, not a claim or an outcome, waits so), and raises `Withdrawn` once
    told no. Other writes and threads wait as the pool does."""

    SLICE = 0.05
    connect_while: Callable[[], bool] | None = None
    #: Within `one_wait`: None until a wait ran out, then True (the next asks only
    #: take a connection that is there); outside it, None always.
    waited: bool | None = None
    _installed: weakref.WeakSet[psycopg_pool.ConnectionPool[Any]] = weakref.WeakSet()

    @classmethod
    def install(
        cls,
        pool: psycopg_pool.ConnectionPool[Any],
        *,
        start: PostgresStore | None = None,
        store: PostgresStore | None = None,
    ) -> None:
        """The pool's `getconn` (which `connection()`, and so eventsourcing, calls) asks
        the calling thread's question, if any. At a service's start (`start`, the store
        with its `start_wait`) the pool's first connection waits for the server as the
        store's first did (`FirstConnection`), and so do the calls waiting for it. A
        wait that runs out while the server refuses the pool's connections raises the
        line an open would (`RefusedConnects`, for `store`)."""
        if pool in cls._installed:
            return
        cls._installed.add(pool)
        plain = pool.getconn
        first = None if start is None else FirstConnection.install(pool, start)
        refused = None if store is None else RefusedConnects.install(pool, store)

        def getconn(timeout: float | None = None) -> Any:
            again = bool(_WAIT.waited)  # past `one_wait`'s wait: no ping again either
            try:
                return asked(timeout)
            except psycopg_pool.PoolTimeout as exc:
                line = None if refused is None or again else refused.line()
                if line is None:
                    raise
                raise line from exc

        def asked(timeout: float | None) -> Any:
            if first is not None:
                first.wait()
            if _WAIT.waited:
                timeout = cls.SLICE  # this call waited for the pool once: no more
            ask = _WAIT.connect_while
            if ask is None:
                return cls._counted(plain, timeout, refused)
            give_up = time.monotonic() + (pool.timeout if timeout is None else timeout)
            while True:
                try:
                    return plain(max(min(cls.SLICE, give_up - time.monotonic()), 0.001))
                except psycopg_pool.PoolTimeout:
                    if time.monotonic() >= give_up:
                        raise
                    if not ask():
                        raise Withdrawn("the writer gave up its wait for a connection") from None

        pool.getconn = getconn  # type: ignore[method-assign]

    @staticmethod
    def _counted(
        plain: Callable[[float | None], Any],
        timeout: float | None,
        refused: RefusedConnects | None,
    ) -> Any:
        """The pool's own wait; within `one_wait`, one that runs out while the pool's
        last connection attempt failed (the store does not answer) is remembered. One
        that runs out behind busy connections of a store that answers is not: a pool
        smaller than the threads that read, whose queue outlasts `connect_timeout`, is
        waited for again, as before `one_wait`."""
        try:
            return plain(timeout)
        except psycopg_pool.PoolTimeout:
            if _WAIT.waited is not None and (refused is None or refused.failing()):
                _WAIT.waited = True
            raise

    @staticmethod
    @contextlib.contextmanager
    def asking(connect_while: Callable[[], bool] | None) -> Iterator[None]:
        """Within the block, this thread's waits for a connection ask `connect_while`."""
        before, _WAIT.connect_while = _WAIT.connect_while, connect_while
        try:
            yield
        finally:
            _WAIT.connect_while = before

    @staticmethod
    @contextlib.contextmanager
    def one_wait() -> Iterator[None]:
        """Within the block, this thread waits for a pooled connection once while the
        store does not answer: the waits after one that ran out with the pool's last
        connection attempt failed (the library's tries again of a read, ten 0.2 s apart)
        take only a connection that is there; one that ran out behind busy connections
        is no outage and is waited again (`_counted`). Each of those ten waited the pool's
        `connect_timeout` (and a pooled connection the outage cut costs one more try),
        so a read while the server was down held its caller about 40 s: a send worker
        through the read-back of a claim whose commit was not known, twice for the claim
        (docs/operations.md "What a store outage costs"). Nor is the server pinged
        again past that wait (a ping of a server gone waits its connect_timeout too):
        the refusal's line is said once (`RefusedConnects`)."""
        before, _WAIT.waited = _WAIT.waited, False
        try:
            yield
        finally:
            _WAIT.waited = before


_WAIT = PoolWait()


class _PoolConnects:
    """What each connection a pool makes from now on is made through (`connect`, given
    the pool's own way to make it)."""

    def __init__(self, store: PostgresStore) -> None:
        self._store = store

    @classmethod
    def install(cls, pool: psycopg_pool.ConnectionPool[Any], store: PostgresStore) -> Self:
        """psycopg's pool makes each connection by `connection_class.connect`."""
        through = cls(store)
        plain = pool.connection_class

        class Connect:
            @staticmethod
            def connect(conninfo: str = "", **kwargs: Any) -> Any:
                return through.connect(lambda: plain.connect(conninfo, **kwargs))

        pool.connection_class = Connect
        return through

    def connect(self, connect: Callable[[], Connected]) -> Connected:
        raise NotImplementedError


class RefusedConnects(_PoolConnects):
    """A running pool's connections refused by the server (pg_hba.conf edited and
    reloaded, a password or a role changed, the server full): a call whose wait for a
    connection then runs out raises the store's one line as an open says it, the fix
    included (`_cannot_connect`), not the pool's "couldn't get a connection after N
    sec" (the pool's worker logs only the driver's words). The pool's last try is kept
    while it failed; a connection made forgets it."""

    def __init__(self, store: PostgresStore) -> None:
        super().__init__(store)
        self._failed: psycopg.OperationalError | None = None

    def connect(self, connect: Callable[[], Connected]) -> Connected:
        try:
            conn = connect()
        except psycopg.OperationalError as exc:
            self._failed = exc
            raise
        self._failed = None
        return conn

    def failing(self) -> bool:
        """The pool's last connection attempt failed (none made since)."""
        return self._failed is not None

    def line(self) -> StoreUnavailable | None:
        """The refusal of the pool's last try, when it failed and the server answered
        it (libpq's ping); None otherwise (every connection busy, or no answer: the
        pool's own error stands, and a lost server is tried again by the callers)."""
        failed = self._failed
        if failed is None or _ping_after(self._store, failed) != pq.Ping.OK:
            return None
        return _cannot_connect(self._store, failed, answered=True)


class FirstConnection(_PoolConnects):
    """A pool's first connection at a service's start, made through the start's wait
    (`waited_connect`) by the pool's worker: between the store's first connection and
    the pool's, a server may fill up again (53300), and the pool's own tries (1, 2, 4,
    8... s apart) outlasted by `store.connect_timeout` failed the start. Once that
    connection is made, or its wait given up, the pool connects as it always does."""

    def __init__(self, store: PostgresStore) -> None:
        super().__init__(store)
        self._settled = threading.Event()
        self._one_at_a_time = threading.Lock()
        self._failure: Exception | None = None

    def connect(self, connect: Callable[[], Connected]) -> Connected:
        if not self._settled.is_set():
            # One worker waits; the others, for the same server, wait for it.
            with self._one_at_a_time:
                if not self._settled.is_set():
                    try:
                        return waited_connect(self._store, connect)
                    except Exception as exc:
                        self._failure = exc
                        raise
                    finally:
                        self._settled.set()
        return connect()

    def wait(self) -> None:
        """A call asking the pool for a connection waits for the first one (the pool's
        own wait is `connect_timeout`); one that waited for its failure gets it: the
        start's one line."""
        if self._settled.is_set():
            return
        store = self._store
        # The first connection's wait and its last try, with its ping.
        self._settled.wait(max(store.start_wait, store.connect_timeout) + 3 * store.connect_timeout)
        if self._failure is not None:
            raise self._failure


def _from_pool(exc: BaseException) -> bool:
    return any(isinstance(error, _POOL_ERRORS) for error in exception_chain(exc))


def connection_lost(exc: BaseException) -> bool:
    """True when `exc` (or what it wraps) says the connection died under the statement,
    not that the statement was wrong. After a database restart every pooled connection
    fails so once; psycopg's pool drops each one as it fails."""
    for error in exception_chain(exc):
        if isinstance(error, _POOL_ERRORS):
            return False
        if isinstance(error, psycopg.OperationalError):
            state = error.sqlstate
            return state is None or state.startswith("08") or state in _CONNECTION_LOST
    return False


#: Seconds between two tries of a connection at open (`connect_at_open`).
OPEN_RETRY_PAUSE = 0.5
#: How an English server with no free connection slot (SQLSTATE 53300: every slot taken,
#: the rest reserved, a role's or a database's CONNECTION LIMIT reached) words its
#: refusal: recognized by them only where no trace shows its code
#: (`ledger.stores.pg_refusals`), and so a server whose `lc_messages` is another
#: language's only there (its refusal then fails a service's start at once, as a
#: command's).
_NO_FREE_SLOT = (
    "too many clients already",
    "remaining connection slots are reserved",
    "too many connections for ",
)


def connect_at_open(store: PostgresStore, **kwargs: Any) -> psycopg.Connection[Any]:
    """A connection of a process's open to its store, made directly (the first one
    before the pool is started). StoreUnavailable naming the store, its host:port, and
    what the driver said (refused, no route, authentication failed, no such database),
    not the pool's "couldn't get a connection after 10 s":

    - at once when the server answered and refused this connection (`_ping_after`:
      a password, a role, a database, pg_hba.conf, which no wait changes; a command, no
      free slot too: its caller may try again);
    - else after trying again for `store.connect_timeout`: a server starting up or
      failing over answers meanwhile, as the pool would wait for it.

    A service's start (`PostgresStore.start_wait`, longer) tries for that long instead, and a
    server with no free slot is tried again too (one is usually freed within seconds); it
    logs one line when its wait begins and one when it connects, where a command's one
    line is its error. Every connection of that start waits so (`upgrade_schema`, the
    identity lock's first, the pool's first: `PoolWait.install`), not only the first: a
    server that fills up again between two of them failed the start."""
    return waited_connect(store, lambda: psycopg.connect(**_connect_args(store), **kwargs))


Connected = TypeVar("Connected")


def _cannot_connect(
    store: PostgresStore, exc: psycopg.OperationalError, *, answered: bool
) -> StoreUnavailable:
    """The store's one line for a connection that failed with `exc`, with the fix of a
    refusal when the server `answered` (libpq's ping said so)."""
    needs_password = bool(getattr(getattr(exc, "pgconn", None), "needs_password", False))
    refusal = _refusal(store, exc) if answered else None
    fix = refusal_fix(store, str(exc), refusal, needs_password)
    return StoreUnavailable(store.describe(), "cannot connect", exc, fix)


def _refusal(store: PostgresStore, exc: psycopg.OperationalError) -> ServerRefusal | None:
    """The code and words of the refusal `exc` reports, where a trace shows them
    (`server_refusal`)."""
    conninfo = make_conninfo("", **_connect_args(store))
    return server_refusal(conninfo, store.connect_timeout, str(exc))


def waited_connect(store: PostgresStore, connect: Callable[[], Connected]) -> Connected:
    """`connect()` tried as `connect_at_open` says; the pool's first connection at a
    service's start comes through here too. `PostgresStore.start_watch` is told before
    each try again and once connected."""
    bound = max(store.connect_timeout, store.start_wait)
    started = time.monotonic()
    give_up = started + bound
    waiting = False
    # What a watch may see pass before the next word: the pause, then a try and the
    # ping judging it, each bounded by libpq's connect_timeout.
    within = OPEN_RETRY_PAUSE + 2 * store.connect_timeout
    watch = store.start_watch if store.start_wait else None
    while True:
        try:
            conn = connect()
            break
        except psycopg.OperationalError as exc:
            cause = _wait_cause(store, exc)
            if cause is None:
                conn = _connect_once_more(store, connect)
                break
            left = give_up - time.monotonic()
            if left <= 0:
                # The driver's words are one line here; its hint lines ("Is the server
                # running...?") are cut by StoreUnavailable.
                raise _cannot_connect(store, exc, answered=cause == NO_FREE_SLOT) from exc
            if store.start_wait and not waiting:
                waiting = True
                said = StoreUnavailable(store.describe(), "cannot connect yet", exc)
                log.warning("%s; waiting up to %d s for it", said, bound)
            if watch is not None:
                watch.waiting(store.describe(), cause, within)
            time.sleep(min(OPEN_RETRY_PAUSE, left))
    if waiting:
        took = time.monotonic() - started
        log.info("store %s: connected after %.1f s", store.describe(), took)
        if watch is not None:
            watch.connected(store.describe(), within)
    return conn


#: Why a service's start waits, as its watch is told (`StartWatch.waiting`).
STARTING_UP = "starting up"
NO_FREE_SLOT = "no free connection slot"
NO_ANSWER = "no answer"


def _wait_cause(store: PostgresStore, exc: psycopg.OperationalError) -> str | None:
    """Why the same connection may succeed later, or None when no wait changes the
    failure: nothing answered, or the server is starting up, shutting down or in
    recovery (57P03, told apart by libpq's ping from a refusal that stands); at a
    service's start, a server with no free slot too."""
    ping = _ping_after(store, exc)
    if ping == pq.Ping.OK:
        if store.start_wait and _no_free_slot(store, exc):
            return NO_FREE_SLOT
        return None
    return STARTING_UP if ping == pq.Ping.REJECT else NO_ANSWER


def _no_free_slot(store: PostgresStore, exc: psycopg.OperationalError) -> bool:
    """A refusal for want of a free connection slot: by its code when a trace shows it,
    else by an English server's words."""
    refusal = _refusal(store, exc)
    if refusal is not None:
        return refusal.code == TOO_MANY_CONNECTIONS
    return any(words in str(exc) for words in _NO_FREE_SLOT)


def _ping_after(store: PostgresStore, exc: psycopg.OperationalError) -> pq.Ping:
    """What libpq's ping says of the server whose connection failed with `exc`: OK when
    it was up and refused that connection.

    libpq keeps the SQLSTATE a server sends while a connection starts to itself: the
    error has none, nor any diagnostic field, only the server's words in its translated
    message (psycopg's `pgconn.error_message`). libpq's ping judges by that SQLSTATE: OK
    when the server answered with any refusal but "cannot connect now" (57P03: starting
    up, shutting down, in recovery), which it calls REJECT; NO_RESPONSE when nothing
    answered. Asked again with the same parameters, it says which failure this was.
    Which refusal it was (a full server, 53300, or a wrong password) is its code, where a
    traced try shows it (`ledger.stores.pg_refusals`), else its words. A connect that
    timed out had no answer: not asked (the ask would wait as long again)."""
    if isinstance(exc, psycopg.errors.ConnectionTimeout):
        return pq.Ping.NO_RESPONSE
    conninfo = make_conninfo("", **_connect_args(store))
    return pq.Ping(pq.PGconn.ping(conninfo.encode()))


def _connect_once_more(store: PostgresStore, connect: Callable[[], Connected]) -> Connected:
    """After a refusal by a server that is up: one more try, in case it only came up
    between the failed connect and the ping; its refusal is the line, at once."""
    try:
        return connect()
    except psycopg.OperationalError as exc:
        raise _cannot_connect(store, exc, answered=True) from exc


def schema_exists(store: PostgresStore) -> bool:
    """True when the job index table (created last) is in the store's schema. Creates
    nothing: read-only commands ask this before they open a store."""
    with connect_at_open(store) as conn:
        found = conn.execute(
            "SELECT to_regclass(%s)", (f'"{store.schema}".{INDEX_TABLE}',)
        ).fetchone()
        return found is not None and found[0] is not None


def prepare_schema(store: PostgresStore) -> bool:
    """True when the job index table (created last) is already in the store's schema;
    else create the schema if it is missing (the application creates the tables).
    StoreUnavailable when no connection can be made (`connect_at_open`)."""
    conn = connect_at_open(store)
    try:
        with conn:
            found = conn.execute(
                "SELECT to_regclass(%s)", (f'"{store.schema}".{INDEX_TABLE}',)
            ).fetchone()
            if found is not None and found[0] is not None:
                return True
            quoted = store.schema.replace('"', '""')
            conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{quoted}"')
            conn.commit()
            return False
    except psycopg.Error:
        # Unknown: let the normal set-up (with its retries) find out.
        return False


def upgrade_schema(store: PostgresStore) -> None:
    """What a store from an earlier release lacks in its job index, added on one
    connection: DDL only when something is missing. At a service's start that connection
    waits for the server as the first one did (`connect_at_open`)."""
    with connect_at_open(store) as conn:
        # An ALTER TABLE waits for every transaction on the table (a pg_dump, an open psql
        # session) and every reader and writer queues behind it: with no limit the
        # daemons stalled as long as that transaction. `[store] lock_timeout` bounds it;
        # the next open tries again. It bounds as well the index builds' waits for the
        # transactions before them.
        conn.execute(SQL("SET lock_timeout = '{0}s'").format(store.lock_timeout))
        _add_missing_columns(conn, store)
        conn.autocommit = True  # CREATE INDEX CONCURRENTLY runs in no transaction
        _add_missing_indexes(conn, store)


def _add_missing_columns(conn: psycopg.Connection[Any], store: PostgresStore) -> None:
    """Add the index columns a store from an earlier release lacks (`ADDED_COLUMNS`);
    DDL only when one is missing, so that opening a current store takes no lock."""
    present = {
        row[0]
        for row in conn.execute(
            "SELECT column_name FROM information_schema.columns "
            "WHERE table_schema = %s AND table_name = %s",
            (store.schema, INDEX_TABLE),
        ).fetchall()
    }
    quoted = store.schema.replace('"', '""')
    for name, kind in ADDED_COLUMNS:
        if name not in present:
            sql = f'ALTER TABLE "{quoted}".{INDEX_TABLE} ADD COLUMN IF NOT EXISTS {name} {kind}'
            conn.execute(sql.replace("{real}", "DOUBLE PRECISION"))
            if name == "written_at":  # the listing pages by it: every row has one
                conn.execute(
                    f'UPDATE "{quoted}".{INDEX_TABLE} SET written_at = updated_at '
                    "WHERE written_at IS NULL"
                )
            if name == "attempt_provider":
                conn.execute(ATTEMPT_PROVIDER_BACKFILL.replace("{t}", f'"{quoted}".{INDEX_TABLE}'))
    conn.commit()


def index_build_key(schema: str) -> int:
    """The session advisory lock an index build holds (`_add_missing_indexes`): one
    process at a time builds the indexes of a schema. Keyed as a daemon name is
    (`advisory_key`)."""
    return advisory_key(schema, "index-builds")


def _index_validity(conn: psycopg.Connection[Any], store: PostgresStore) -> dict[str, bool]:
    """Each index of the job index table: whether it is valid (a build that stopped
    half-way, CONCURRENTLY, leaves one that is not: it is kept up by every write and
    used by no read)."""
    rows = conn.execute(
        "SELECT c.relname, i.indisvalid FROM pg_index i "
        "JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_class t ON t.oid = i.indrelid "
        "JOIN pg_namespace n ON n.oid = t.relnamespace "
        "WHERE n.nspname = %s AND t.relname = %s",
        (store.schema, INDEX_TABLE),
    ).fetchall()
    return {str(name): bool(valid) for name, valid in rows}


def _add_missing_indexes(conn: psycopg.Connection[Any], store: PostgresStore) -> None:
    """Create the index-table indexes a store from an earlier release lacks
    (`ADDED_INDEXES`), on an autocommit connection: DDL only when one is missing or
    invalid. CONCURRENTLY, so that the daemons' writes go on during a build of a large
    table (a plain CREATE INDEX holds every writer until it ends). One process at a time
    (a session advisory lock, tried): another process opening meanwhile goes on without
    the index, which no read needs to be right, only fast. Holding the lock, an invalid
    index is no build under way but one that was stopped (its process killed, its wait
    past `lock_timeout`): dropped and built again."""
    validity = _index_validity(conn, store)
    if all(validity.get(name) for name, _statement in ADDED_INDEXES):
        return  # a current store: no lock taken, no DDL
    key = index_build_key(store.schema)
    row = conn.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()
    if row is None or not row[0]:
        return  # another process builds them now
    try:
        validity = _index_validity(conn, store)  # as they are once the lock is held
        quoted = store.schema.replace('"', '""')
        for name, statement in ADDED_INDEXES:
            if validity.get(name):
                continue
            if name in validity:  # invalid: a build that was stopped
                conn.execute(f'DROP INDEX CONCURRENTLY IF EXISTS "{quoted}".{name}')
            sql = statement.replace("{t}", f'"{quoted}".{INDEX_TABLE}').replace("{n}", INDEX_TABLE)
            # A process of an earlier release may create it at the same moment.
            with contextlib.suppress(psycopg.errors.UniqueViolation, psycopg.errors.DuplicateTable):
                conn.execute(sql.replace("CREATE INDEX ", "CREATE INDEX CONCURRENTLY ", 1))
    finally:
        with contextlib.suppress(psycopg.Error):
            conn.execute("SELECT pg_advisory_unlock(%s)", (key,))


def vacuum(store: PostgresStore) -> bool:
    """VACUUM the events and index tables after a purge, so that the row versions it
    replaced are pruned from the tables (docs/configuration.md "Retention" says what this does and
    does not erase). True when it ran."""
    quoted = store.schema.replace('"', '""')
    tables = ", ".join(f'"{quoted}".{name}' for name in (EVENTS_TABLE, INDEX_TABLE))
    try:
        with psycopg.connect(**_connect_args(store), autocommit=True) as conn:
            conn.execute(f"VACUUM {tables}")
        return True
    except psycopg.Error:
        return False


#: TCP keepalives of the store's sessions: a peer that vanishes (no FIN) while a session
#: is idle, or waits for a statement's answer, is found out within 25 s, not after the
#: kernel's two hours.
_KEEPALIVES: dict[str, Any] = {
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
}

#: Seconds a session's sent bytes may go unacknowledged before the kernel drops the
#: connection (libpq's `tcp_user_timeout`). Keepalives stop while bytes are in flight:
#: a statement sent to a host gone silent (packets dropped, no RST) waited for the
#: kernel's retransmissions, about 15 minutes (tcp_retries2 = 15). Only the peer's TCP
#: acknowledgement counts, which a live host's kernel sends at once however long the
#: statement runs: no slow statement trips it. A fixed bound, the keepalives' own
#: (10 + 3 x 5 s), so that a silent host is noticed within the same 25 s whether the
#: session was idle or had just sent; not `connect_timeout`, which bounds a server's
#: answer to a new connection, and at its floor of 2 s would take a few lost packets on
#: a lossy link for a dead host.
SILENT_HOST_SECONDS = 25


def _session_bounds() -> dict[str, Any]:
    """What every connection of the store carries, pooled or not: how long a silent
    peer may keep it (read when connecting: tests shorten `SILENT_HOST_SECONDS`)."""
    return {**_KEEPALIVES, "tcp_user_timeout": SILENT_HOST_SECONDS * 1000}


#: The identity lock's session (the keepalives are in every connection's arguments:
#: `_connect_args`).
_IDENTITY_SESSION: dict[str, Any] = {"autocommit": True}


def _server_notices() -> Composed:
    """The same bounds on the server's side of the identity lock's session, which holds
    the daemon's name: a daemon's host that vanishes (no FIN), or a network gone silent,
    must not keep the name for the server's default of over two hours (its kernel's
    keepalives), refusing the daemon that takes over, or this one once the network is
    back. Settings any role may set for its own session; ignored over a Unix socket."""
    return SQL(
        "SET tcp_keepalives_idle = {0}; SET tcp_keepalives_interval = {1}; "
        "SET tcp_keepalives_count = {2}; SET tcp_user_timeout = {3}"
    ).format(
        _KEEPALIVES["keepalives_idle"],
        _KEEPALIVES["keepalives_interval"],
        _KEEPALIVES["keepalives_count"],
        SILENT_HOST_SECONDS * 1000,
    )


#: How many `connect_timeout`s the pool tries to replace a lost connection before it
#: gives the slot up (`bound_pool_connects`): the longest pause between two tries is
#: then about one `connect_timeout`.
RECONNECT_TIMEOUTS = 2


def bound_pool_connects(pool: psycopg_pool.ConnectionPool[Any]) -> None:
    """Each connection the pool makes gives up after `[store] connect_timeout` and is
    dropped by a silent peer (`_session_bounds`), as the store's own connections are
    (`_connect_args`). eventsourcing
    gives the pool neither: its `timeout` bounds only a caller's wait in `getconn`, so
    against a host that accepts and never answers (a blackholed network, a hung server,
    a half-open proxy) each of the pool's few workers waited for good, and once they all
    did the pool never connected again, the host back or not. Called before the pool
    opens: it hands `kwargs` to every connection it makes.

    A lost connection's slot is tried again for `RECONNECT_TIMEOUTS` connect timeouts,
    not psycopg's 5 minutes: the pauses between tries double from 1 s over that span,
    and a host back after a few minutes away waited for the next try up to 128 s, each
    store call meanwhile failing after `connect_timeout`. Past the span the slot is
    given up, and the pool grows back to its size as calls ask for connections, each
    growth trying at once (`tests/integration/test_pg_pool_connect.py`)."""
    kwargs = pool.kwargs
    if not isinstance(kwargs, dict):  # the library built its pool otherwise: say so
        raise TypeError(f"eventsourcing's pool takes its kwargs as {type(kwargs).__name__}")
    # libpq counts whole seconds, at least 2; the pool's timeout is `connect_timeout`
    # (`PostgresBackend.env`).
    pool.kwargs = {**kwargs, **_session_bounds(), "connect_timeout": max(2, round(pool.timeout))}
    pool.reconnect_timeout = RECONNECT_TIMEOUTS * pool.timeout


class AdvisoryIdentityLock:
    """`ledger.stores.identity`: a session advisory lock on a connection of its own.

    A database restart ends the session and the lock with it. `check` (before every
    tick) notices and takes the name again; when another process took it meanwhile it
    raises IdentityTaken and the daemon stops (docs/performance.md "Performance and scaling").

    A network that went silent ends the session on this side only (`_session_bounds`):
    the server keeps it, and the name, until it notices. It is told to notice as soon
    (`_server_notices`), and when this process takes its name again before it did, the
    session found holding it is this process's own earlier one (`_orphan`): ended, and
    the name taken, not refused as another daemon's."""

    # Ended under a live daemon by a database restart: the process that takes the name
    # then may find that daemon's call still in flight (`recover_own_claims`).
    ends_only_with_holder = False

    def __init__(self, store: PostgresStore, name: str) -> None:
        self._key = advisory_key(store.schema, name)
        self._store = store
        self._name = name
        self._conn: psycopg.Connection[Any] | None = None
        # The server's pid and start time of the session that last held the name: no
        # other session, now or later, has both.
        self._orphan: tuple[int, Any] | None = None
        # Taken at a service's start: its connection waits for the server as the
        # store's first did. Taken again by `check`, between ticks: a tick must not wait
        # that long, the next one tries again.
        self._take(wait=True)

    def _take(self, *, wait: bool = False) -> None:
        if wait:
            self._conn = connect_at_open(self._store, **_IDENTITY_SESSION)
        else:
            self._conn = _connect_between_ticks(self._store, **_IDENTITY_SESSION)
        try:
            self._conn.execute(_server_notices())
        except psycopg.errors.UndefinedObject as exc:
            # A server before PostgreSQL 12 has no tcp_user_timeout: the name is held all
            # the same, as long as that server's own keepalives let it.
            log.warning("daemon.name %r: the server keeps its own TCP bounds (%s)", self._name, exc)
        if not (self._try_lock() or self._end_orphan()):
            self.release()
            store = self._store
            raise IdentityTaken(self._name, f"{store.host}:{store.port}/{store.dbname}")
        row = self._conn.execute(
            "SELECT pid, backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()"
        ).fetchone()
        self._orphan = None if row is None else (int(row[0]), row[1])

    def _try_lock(self) -> bool:
        conn = known(self._conn, "the name's lock is tried on its open session")
        row = conn.execute("SELECT pg_try_advisory_lock(%s)", (self._key,)).fetchone()
        return row is not None and bool(row[0])

    def _end_orphan(self) -> bool:
        """The name held by this process's earlier session, which the server still
        keeps: ended, and the name taken. False when another session holds it."""
        if self._orphan is None or self._conn is None:
            return False
        pid, started = self._orphan
        try:
            row = self._conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE pid = %s AND backend_start = %s",
                (pid, started),
            ).fetchone()
        except psycopg.errors.InsufficientPrivilege:
            return False
        if row is None or not row[0]:
            return False  # gone meanwhile: its lock with it, or another's now
        log.warning(
            "daemon.name %r: ended this daemon's earlier session on the store (pid %d), "
            "cut off by the network and still holding the name",
            self._name,
            pid,
        )
        # The session ends, and its lock is dropped, a moment after it is told to.
        give_up = time.monotonic() + self._store.connect_timeout
        while not self._try_lock():
            if time.monotonic() >= give_up:
                return False
            time.sleep(0.05)
        return True

    def session(self) -> NameSession:
        """The session holding the name (pid 0 when none does: a write conditioned on it
        is then made nowhere)."""
        held = self._orphan if self._conn is not None else None
        if held is None:
            return NameSession(self._key, 0)
        return NameSession(self._key, held[0], held[1])

    def check(self) -> None:
        """Still held, or held again. psycopg.Error while the database is unreachable,
        StoreUnavailable when it refuses the session (`_connect_between_ticks`): the
        caller must not claim work until a later check passes."""
        conn = self._conn
        if conn is not None and not conn.closed:
            try:
                conn.execute("SELECT 1")
                return  # the session lives: a session lock is only dropped with it
            except psycopg.Error:
                pass  # the session ended here (a server restart, the network)
        self.release()
        self._take()

    def release(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(psycopg.Error):
                # Let go before the session ends: a closed connection's backend drops its
                # locks when it exits, a moment later, and until then the name still
                # reads as held (`pg_locks`: a stopped daemon's row counted as live).
                self._conn.execute("SELECT pg_advisory_unlock(%s)", (self._key,))
            with contextlib.suppress(psycopg.Error):
                self._conn.close()  # the session ends: its advisory locks with it
            self._conn = None


def _connect_between_ticks(store: PostgresStore, **kwargs: Any) -> psycopg.Connection[Any]:
    """A running daemon's connection made outside the pool, tried once: refused by a
    server that answered (pg_hba.conf edited and reloaded meanwhile, say), the store's
    line as an open says it, fix included (`_cannot_connect`); the driver's error when
    nothing answered, for the next tick to try again."""
    try:
        return psycopg.connect(**_connect_args(store), **kwargs)
    except psycopg.OperationalError as exc:
        if _ping_after(store, exc) != pq.Ping.OK:
            raise
        raise _cannot_connect(store, exc, answered=True) from exc


def _connect_args(store: PostgresStore) -> dict[str, Any]:
    return {
        "dbname": store.dbname,
        "host": store.host,
        "port": store.port,
        "user": store.user,
        "password": store.password or None,
        "connect_timeout": store.connect_timeout,
        **_session_bounds(),
    }


class _Opening(threading.local):
    """Handed from `PostgresBackend.prepare` to the recorder the same thread builds next:
    the store, and the same at a service's start."""

    start: PostgresStore | None = None
    store: PostgresStore | None = None


_OPENING = _Opening()


@dataclass(frozen=True)
class PostgresBackend:
    spec: PostgresStore

    @property
    def env(self) -> dict[str, str]:
        spec = self.spec
        return {
            "PERSISTENCE_MODULE": "eventsourcing.postgres",
            "POSTGRES_DBNAME": spec.dbname,
            "POSTGRES_HOST": spec.host,
            "POSTGRES_PORT": str(spec.port),
            "POSTGRES_USER": spec.user,
            "POSTGRES_PASSWORD": spec.password,
            "POSTGRES_SCHEMA": spec.schema,
            "POSTGRES_POOL_SIZE": str(spec.pool_size),
            "POSTGRES_MAX_OVERFLOW": str(spec.max_overflow),
            "POSTGRES_LOCK_TIMEOUT": str(spec.lock_timeout),
            # On unless the environment says otherwise (docs/performance.md "Performance and
            # scaling"): the library's insert function takes no EXCLUSIVE lock on the events table,
            # so writers of different jobs, in one daemon or several, no longer queue for it.
            DB_FUNCTIONS: os.environ.get(DB_FUNCTIONS) or "y",
            # The pool's wait for a connection (`[store] connect_timeout`), as libpq's for
            # the connections opened outside the pool (`_connect_args`).
            "POSTGRES_CONNECT_TIMEOUT": str(spec.connect_timeout),
            "APPLICATION_RECORDER_TOPIC": get_topic(PostgresJobIndexRecorder),
        }

    def prepare(self) -> bool:
        # The recorder, built next by eventsourcing from its environment (strings only),
        # learns here that its pool opens at a service's start (`FirstConnection`).
        _OPENING.start = self.spec if self.spec.start_wait else None
        _OPENING.store = self.spec
        # Opening an existing store must not run DDL: concurrent CREATE OR REPLACE
        # FUNCTION fails with "tuple concurrently updated".
        return prepare_schema(self.spec)

    def upgrade(self) -> None:
        upgrade_schema(self.spec)

    def identity_lock(self, name: str) -> AdvisoryIdentityLock:
        return AdvisoryIdentityLock(self.spec, name)

    def names_held(self, names: Collection[str]) -> None:
        return None  # asked in the statement that reads the rows (PostgresLoadedPolicies)

    def scrub(self) -> bool:
        return vacuum(self.spec)

    def access_problem(self) -> str | None:
        return None

    def is_retryable(self, exc: BaseException) -> bool:
        # A lost connection is retried like a lost lock race. A write whose commit went
        # through before its acknowledgement was lost then meets its own row: the store's
        # uniqueness refuses it (never a second event). The insert asks the server first
        # whether its transaction committed (`PostgresJobIndexRecorder.insert_events`),
        # so that this happens only when that answer is lost too, or with
        # POSTGRES_ENABLE_DB_FUNCTIONS=n: then the save reads as another writer's
        # (ConcurrentUpdate), and a claim so refused makes no provider call.
        return bool(_sqlstates(exc) & _TRANSIENT) or connection_lost(exc)

    def is_setup_race(self, exc: BaseException) -> bool:
        return bool(_sqlstates(exc) & _SETUP_RACE)


__all__ = [
    "AdvisoryIdentityLock",
    "PoolWait",
    "PostgresBackend",
    "PostgresJobIndexRecorder",
    "connection_lost",
    "index_build_key",
    "prepare_schema",
]
