"""The Ledger application: send jobs stored as events, with the job index beside them."""

from __future__ import annotations

import contextlib
import random
import sqlite3
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar
from uuid import UUID

from eventsourcing.application import AggregateNotFoundError, Application
from eventsourcing.persistence import IntegrityError, OperationalError
from eventsourcing.utils import get_topic

from ledger.content import JobContent
from ledger.index import (
    INDEX_ROWS_KWARG,
    INDEX_TABLE,
    IndexRow,
    JobIndexQueries,
    SQLiteJobIndexRecorder,
    index_row,
)
from ledger.job import SendJob, TransitionError, job_id_for
from ledger.message_id import message_id_for
from ledger.provider_handle import ProviderHandle, handle_id_for
from ledger.store_url import SqliteStore, StoreSpec, parse_store_url

Clock = Callable[[], datetime]
T = TypeVar("T")


def utcnow() -> datetime:
    return datetime.now(UTC)


class KeyConflict(Exception):
    """The key is known with other content; the stored job was left as it was."""

    def __init__(self, key: str, stored_hash: str, submitted_hash: str) -> None:
        super().__init__(
            f"key {key!r} already exists with other content "
            f"(stored {stored_hash[:19]}, submitted {submitted_hash[:19]})"
        )
        self.key = key


class UnknownJob(Exception):
    def __init__(self, key: str) -> None:
        super().__init__(f"no job with key {key!r}")
        self.key = key


class ConcurrentUpdate(Exception):
    """Another writer appended to the job first (optimistic concurrency)."""


@dataclass(frozen=True)
class SubmitResult:
    key: str
    message_id: str
    state: str
    created: bool

    def as_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "message_id": self.message_id,
            "state": self.state,
            "created": self.created,
        }


@dataclass(frozen=True)
class Sender:
    """What the channel's policy contributes to a new job."""

    from_addr: str
    message_id_domain: str
    policy: str
    fingerprint: str


def store_env(spec: StoreSpec) -> dict[str, str]:
    if isinstance(spec, SqliteStore):
        return {
            "PERSISTENCE_MODULE": "eventsourcing.sqlite",
            "SQLITE_DBNAME": str(spec.path),
            # Seconds the sqlite3 busy handler waits for a writer: several processes
            # share the file, and "database is locked" must never reach a caller.
            "SQLITE_LOCK_TIMEOUT": "30",
            "APPLICATION_RECORDER_TOPIC": get_topic(SQLiteJobIndexRecorder),
        }
    return {
        "PERSISTENCE_MODULE": "eventsourcing.postgres",
        "POSTGRES_DBNAME": spec.dbname,
        "POSTGRES_HOST": spec.host,
        "POSTGRES_PORT": str(spec.port),
        "POSTGRES_USER": spec.user,
        "POSTGRES_PASSWORD": spec.password,
        "POSTGRES_SCHEMA": spec.schema,
        "POSTGRES_POOL_SIZE": "4",
        "POSTGRES_MAX_OVERFLOW": "4",
        "POSTGRES_CONNECT_TIMEOUT": "10",
        # A topic string, so that SQLite users never import psycopg.
        "APPLICATION_RECORDER_TOPIC": "ledger.index_postgres:PostgresJobIndexRecorder",
    }


def _is_lock_error(exc: BaseException) -> bool:
    text = str(exc).lower()
    return "locked" in text or "busy" in text


class Ledger(Application[UUID]):
    name = "sendledger"
    # The ledger must see other daemons' writes: no aggregate cache.
    env = {"AGGREGATE_CACHE_MAXSIZE": "", "IS_SNAPSHOTTING_ENABLED": "n"}

    def __init__(
        self,
        store: str | StoreSpec,
        *,
        base_dir: Path | None = None,
        clock: Clock = utcnow,
    ) -> None:
        spec = parse_store_url(store, base_dir=base_dir) if isinstance(store, str) else store
        if isinstance(spec, SqliteStore):
            spec.path.parent.mkdir(parents=True, exist_ok=True)
        self.store = spec
        self.clock = clock
        # Several processes may create the schema at once; CREATE ... IF NOT EXISTS
        # can still collide in PostgreSQL's catalog, so try again briefly.
        env = store_env(spec)
        if _schema_exists(spec):
            # Opening an existing store must not run DDL: concurrent CREATE OR REPLACE
            # FUNCTION in PostgreSQL fails with "tuple concurrently updated".
            env["CREATE_TABLE"] = "n"
        for attempt in range(10):
            try:
                super().__init__(env=env)
                break
            except Exception as exc:  # psycopg UniqueViolation, sqlite lock
                if attempt == 9 or not _retryable_setup(exc):
                    raise
                time.sleep(random.uniform(0.05, 0.2) * (attempt + 1))

    @property
    def index(self) -> JobIndexQueries:
        recorder = self.recorder
        assert isinstance(recorder, JobIndexQueries)
        return recorder

    # -- reading ----------------------------------------------------------------------

    def get_job(self, key: str) -> SendJob:
        try:
            job: object = self._retry_locked(lambda: self.repository.get(job_id_for(key)))
        except AggregateNotFoundError:
            raise UnknownJob(key) from None
        assert isinstance(job, SendJob)
        return job

    def find_job(self, key: str) -> SendJob | None:
        try:
            return self.get_job(key)
        except UnknownJob:
            return None

    def history(self, key: str) -> list[Any]:
        events = list(self._retry_locked(lambda: list(self.events.get(job_id_for(key)))))
        if not events:
            raise UnknownJob(key)
        return events

    # -- writing ----------------------------------------------------------------------

    def save_job(self, job: SendJob) -> None:
        """Append the job's pending events and its index row in one transaction.

        Raises ConcurrentUpdate when another writer got there first: the caller's
        command did not happen and must not be acted on (e.g. no provider call)."""
        row = index_row(job)
        try:
            self._retry_locked(lambda: self.save(job, **{INDEX_ROWS_KWARG: [row]}))
        except IntegrityError as exc:
            raise ConcurrentUpdate(f"job {job.key!r} was changed by another writer") from exc

    def submit(self, content: JobContent, sender: Sender) -> SubmitResult:
        """Idempotent on the key: same content is a no-op, other content a conflict.

        New keys are the common case, so the Requested event is written without a read
        first; the store's uniqueness on (job id, version 1) tells a known key apart."""
        job = SendJob.request(
            key=content.key,
            channel=content.channel,
            to=list(content.to),
            cc=list(content.cc),
            reply_to=content.reply_to,
            from_addr=sender.from_addr,
            subject=content.subject,
            body=content.body,
            html=content.html,
            message_id=message_id_for(content.key, sender.message_id_domain),
            content_hash=content.content_hash,
            policy=sender.policy,
            fingerprint=sender.fingerprint,
            at=self.clock(),
        )
        try:
            self.save_job(job)
        except ConcurrentUpdate:
            # Known key (submitted earlier, or just now by another process).
            return self._same_or_conflict(self.get_job(content.key), content)
        return SubmitResult(job.key, job.message_id, job.state.value, created=True)

    def _same_or_conflict(self, job: SendJob, content: JobContent) -> SubmitResult:
        if job.content_hash != content.content_hash:
            raise KeyConflict(content.key, job.content_hash, content.content_hash)
        return SubmitResult(job.key, job.message_id, job.state.value, created=False)

    def update(self, key: str, command: Callable[[SendJob], T]) -> tuple[SendJob, T]:
        """Load, run one command, save. TransitionError and ConcurrentUpdate propagate."""
        job = self.get_job(key)
        result = command(job)
        self.save_job(job)
        return job, result

    # -- provider handles --------------------------------------------------------------

    def handle(self, provider: str) -> ProviderHandle | None:
        try:
            handle: object = self._retry_locked(
                lambda: self.repository.get(handle_id_for(provider))
            )
        except AggregateNotFoundError:
            return None
        assert isinstance(handle, ProviderHandle)
        return handle

    def handle_reliable(self, provider: str) -> bool:
        handle = self.handle(provider)
        return handle is None or handle.reliable

    def mark_handle(
        self, provider: str, change: Callable[[ProviderHandle], None], *, attempts: int = 5
    ) -> ProviderHandle:
        """Apply `change` to the provider's handle record (created on first use)."""
        for attempt in range(attempts):
            handle = self.handle(provider) or ProviderHandle.register(provider, at=self.clock())
            change(handle)
            try:
                self._retry_locked(lambda h=handle: self.save(h))  # type: ignore[misc]
                return handle
            except IntegrityError:
                if attempt == attempts - 1:
                    raise
        raise AssertionError("unreachable")

    # -- index ------------------------------------------------------------------------

    def all_job_ids(self) -> Iterator[UUID]:
        seen: set[UUID] = set()
        start = 1
        while True:
            notifications = self._retry_locked(
                lambda s=start: self.recorder.select_notifications(start=s, limit=1000)  # type: ignore[misc]
            )
            if not notifications:
                return
            for notification in notifications:
                originator = notification.originator_id
                oid = originator if isinstance(originator, UUID) else UUID(str(originator))
                if oid not in seen:
                    seen.add(oid)
                    yield oid
            start = notifications[-1].id + 1

    def projected_rows(self, progress: Callable[[int], None] | None = None) -> Iterator[IndexRow]:
        count = 0
        for aggregate_id in self.all_job_ids():
            job: object = self.repository.get(aggregate_id)
            if not isinstance(job, SendJob):
                continue  # e.g. a ProviderHandle: not a job, not indexed
            count += 1
            yield index_row(job)
            if progress is not None and count % 1000 == 0:
                progress(count)

    def rebuild_index(self, progress: Callable[[int], None] | None = None) -> int:
        rows = sorted(self.projected_rows(progress), key=lambda r: r.key)
        self._retry_locked(lambda: self.index.replace_all(rows))
        return len(rows)

    def index_rows(self) -> list[IndexRow]:
        rows: list[IndexRow] = []
        after: str | None = None
        while True:
            page = self.index.all_rows(limit=1000, after_key=after)
            if not page:
                return rows
            rows.extend(page)
            after = page[-1].key

    # -- helpers ----------------------------------------------------------------------

    def _retry_locked(self, action: Callable[[], T], attempts: int = 20) -> T:
        """SQLite: the busy handler waits for writers, but a WAL snapshot conflict is
        reported at once. Back off and try again instead of surfacing it."""
        for attempt in range(attempts):
            try:
                return action()
            except (OperationalError, sqlite3.OperationalError) as exc:
                if attempt == attempts - 1 or not _is_lock_error(exc):
                    raise
                time.sleep(random.uniform(0.01, 0.05) * (attempt + 1))
        raise AssertionError("unreachable")


def _schema_exists(spec: StoreSpec) -> bool:
    """True when the job index table (created last) is already there. For PostgreSQL,
    a missing schema is created (the tables are created by the caller)."""
    try:
        if isinstance(spec, SqliteStore):
            if not spec.path.exists():
                return False
            with contextlib.closing(sqlite3.connect(spec.path, timeout=30)) as conn:
                row = conn.execute(
                    "SELECT 1 FROM sqlite_master WHERE type='table' AND name=?", (INDEX_TABLE,)
                ).fetchone()
                return row is not None
        import psycopg

        with psycopg.connect(
            dbname=spec.dbname,
            host=spec.host,
            port=spec.port,
            user=spec.user,
            password=spec.password or None,
            connect_timeout=10,
        ) as conn:
            found = conn.execute(
                "SELECT to_regclass(%s)", (f'"{spec.schema}".{INDEX_TABLE}',)
            ).fetchone()
            if found is not None and found[0] is not None:
                return True
            # A new store in a schema of its own: create the schema, then the tables.
            quoted = spec.schema.replace('"', '""')
            conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{quoted}"')
            conn.commit()
            return False
    except Exception:
        # Unknown: let the normal set-up (with its retries) find out.
        return False


def _retryable_setup(exc: BaseException) -> bool:
    text = f"{type(exc).__name__} {exc}".lower()
    # "tuple concurrently updated": two processes ran CREATE OR REPLACE FUNCTION at once.
    words = ("unique", "duplicate", "locked", "busy", "exists", "concurrently")
    return any(word in text for word in words)


__all__ = [
    "ConcurrentUpdate",
    "KeyConflict",
    "Ledger",
    "Sender",
    "SubmitResult",
    "TransitionError",
    "UnknownJob",
    "utcnow",
]
