"""The memory backend: eventsourcing's POPO recorder with the job index in a dict.

The index is updated under the recorder's own lock, in the same insert as the events and
after their uniqueness check: a version conflict raises eventsourcing's IntegrityError
(so `Ledger.save_job` raises ConcurrentUpdate, as with SQL) and leaves both unchanged.
The queries answer what the SQL ones answer (`ledger.stores.index.JobIndex`).

Ledgers opened on `memory://name` in one process share that store until
`discard_memory_store(name)`; each `memory://` Ledger has a store of its own. Nothing
here touches a file or a socket.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any
from uuid import UUID

from eventsourcing.persistence import ApplicationRecorder
from eventsourcing.popo import POPOApplicationRecorder, POPOFactory
from eventsourcing.utils import get_topic

from ledger.exceptions import known
from ledger.stores.identity import MemoryIdentityLock, memory_names_held
from ledger.stores.index import (
    ALL_JOBS,
    PURGEABLE_STATES,
    DueScope,
    Held,
    IndexRow,
    JobFilter,
    ScopeFilter,
    WatchedMailbox,
    check_guard,
    clock_from,
    next_stamp,
    rows_from,
)
from ledger.stores.keycheck import KeyCheck
from ledger.stores.private_api import MemoryHook
from ledger.stores.purge import REWRITES_KWARG, RewriteFailed, rewrites_from
from ledger.stores.unchanged import hold_unchanged
from ledger.stores.url import MemoryStore

#: The environment key naming the shared store ("" for a store of its own).
MEMORY_STORE_NAME = "MEMORY_STORE_NAME"


class MemoryJobIndexRecorder(MemoryHook, POPOApplicationRecorder):
    def __init__(self) -> None:
        super().__init__()
        self._rows: dict[str, IndexRow] = {}
        self._last_written: float | None = None  # the latest `written_at` stamped
        self._key_checks: dict[str, KeyCheck] = {}

    # -- KeyChecks (ledger.stores.keycheck) ----------------------------------------------

    def key_checks(self) -> list[KeyCheck]:
        with self.database_lock:
            return list(self._key_checks.values())

    def add_key_check(self, check: KeyCheck) -> None:
        with self.database_lock:
            self._key_checks.setdefault(check.check_id, check)

    def remove_key_check(self, check_id: str) -> None:
        with self.database_lock:
            self._key_checks.pop(check_id, None)

    # The insert's hooks (ledger/stores/private_api.py: MemoryHook), under the lock.

    def check_beside(self, kwargs: Mapping[str, Any]) -> None:
        check_guard(kwargs)
        # Under the lock every write holds: nothing changes until this one is stored.
        hold_unchanged(kwargs, self.last_version)
        if REWRITES_KWARG not in kwargs:  # a save: only a purge rewrites events
            return
        for event in rewrites_from(kwargs):  # checked before anything changes: all or nothing
            if self.stored_position(event.originator_id, event.originator_version) is None:
                raise RewriteFailed(event.originator_id, event.originator_version)

    def write_beside(self, kwargs: Mapping[str, Any]) -> None:
        if REWRITES_KWARG in kwargs:
            for event in rewrites_from(kwargs):
                position = known(
                    self.stored_position(event.originator_id, event.originator_version),
                    "a rewritten event is stored (check_beside saw it, under the same lock)",
                )
                self.replace_stored(position, event)
        rows = rows_from(kwargs)
        if rows:
            stamp = self._stamp(clock_from(kwargs))
            for row in rows:
                self._upsert(replace(row, written_at=stamp))

    def _stamp(self, clock: Callable[[], float]) -> float:
        # As SqlJobIndex._stamp: under the lock every write holds, past the last stamp.
        self._last_written = next_stamp(clock, self._last_written)
        return self._last_written

    def _upsert(self, row: IndexRow) -> None:
        # As the SQL upsert: only a newer version replaces a row.
        current = self._rows.get(row.key)
        if current is None or row.version > current.version:
            self._rows[row.key] = row

    # -- JobIndex ----------------------------------------------------------------------

    def job_by_key(self, key: str) -> IndexRow | None:
        with self.database_lock:
            return self._rows.get(key)

    def job_by_message_id(self, message_id: str) -> IndexRow | None:
        with self.database_lock:
            return next((r for r in self._rows.values() if r.message_id == message_id), None)

    def jobs_due(
        self, state: str, now: float, limit: int, scopes: ScopeFilter | None = None, held: Held = ()
    ) -> list[IndexRow]:
        with self.database_lock:
            due = [
                r
                for r in self._rows.values()
                if r.state == state
                and r.due_at is not None
                and r.due_at <= now
                and (scopes is None or scopes.matches(r))
                and not any(hold.holds(r, now) for hold in held)
            ]
        due.sort(key=lambda r: (r.due_at, r.key))
        return due[: max(limit, 0)]

    def scopes_due(self, states: Sequence[str], before: float) -> list[DueScope]:
        wanted = set(states)
        with self.database_lock:
            found = {
                (r.channel, r.mailbox, r.attempt_provider)
                for r in self._rows.values()
                if r.state in wanted and r.due_at is not None and r.due_at <= before
            }
        return sorted(found, key=lambda due: (due[0], due[1] or "", due[2] or ""))

    def without_mailbox(self, states: Sequence[str], limit: int) -> list[tuple[str, int]]:
        wanted = set(states)
        with self.database_lock:
            keys = [
                (r.key, r.version)
                for r in self._rows.values()
                if r.state in wanted
                and r.due_at is not None
                and (r.mailbox is None or r.attempt_provider is None)
            ]
        return sorted(keys)[: max(limit, 0)]

    def set_mailboxes(self, mailboxes: Sequence[tuple[str, int, str, str]]) -> None:
        with self.database_lock:
            for key, version, mailbox, provider in mailboxes:
                row = self._rows.get(key)
                if row is not None and row.version == version:
                    self._rows[key] = replace(
                        row,
                        mailbox=row.mailbox if row.mailbox is not None else mailbox,
                        attempt_provider=(
                            row.attempt_provider if row.attempt_provider is not None else provider
                        ),
                    )

    def without_other_due(self, after_key: str, limit: int) -> list[str]:
        with self.database_lock:
            keys = [
                r.key
                for r in self._rows.values()
                if r.watch_until is not None and r.other_due_at is None and r.key > after_key
            ]
        return sorted(keys)[: max(limit, 0)]

    def set_other_dues(self, dues: Sequence[tuple[str, int, float]]) -> None:
        with self.database_lock:
            for key, version, value in dues:
                row = self._rows.get(key)
                if row is not None and row.version == version and row.other_due_at is None:
                    self._rows[key] = replace(row, other_due_at=value)

    def find(
        self, where: JobFilter = ALL_JOBS, *, after_key: str | None = None, limit: int = 1000
    ) -> list[IndexRow]:
        with self.database_lock:
            rows = [
                r
                for r in self._rows.values()
                if where.matches(r) and (after_key is None or r.key > after_key)
            ]
        rows.sort(key=lambda r: r.key)
        return rows[: max(limit, 0)]

    def changed(
        self,
        where: JobFilter = ALL_JOBS,
        *,
        after: tuple[float, str] | None = None,
        limit: int = 100,
    ) -> list[IndexRow]:
        with self.database_lock:
            rows = [
                r
                for r in self._rows.values()
                if where.matches(r)
                and r.written_at is not None
                and (after is None or (r.written_at, r.key) > after)
            ]
        rows.sort(key=lambda r: (r.written_at or 0.0, r.key))
        return rows[: max(limit, 0)]

    def next_due(self, states: Sequence[str]) -> float | None:
        wanted = set(states)
        with self.database_lock:
            due = [
                r.due_at for r in self._rows.values() if r.state in wanted and r.due_at is not None
            ]
        return min(due) if due else None

    def purgeable(self, before: float, *, after_key: str | None, limit: int) -> list[IndexRow]:
        with self.database_lock:
            rows = [
                r
                for r in self._rows.values()
                if r.state in PURGEABLE_STATES
                and r.due_at is None
                and r.purged_at is None
                and r.updated_at < before
                and (after_key is None or r.key > after_key)
            ]
        rows.sort(key=lambda r: r.key)
        return rows[: max(limit, 0)]

    def watched(self) -> list[WatchedMailbox]:
        groups: dict[tuple[str, str], list[tuple[str, float]]] = {}
        with self.database_lock:
            for r in self._rows.values():
                if r.watch_until is not None and r.watch_mailbox is not None:
                    groups.setdefault((r.channel, r.watch_mailbox), []).append(
                        (r.key, r.watch_until)
                    )
        return [
            WatchedMailbox(c, m, len(k), min(k)[0], min(u for _, u in k))
            for (c, m), k in sorted(groups.items())
        ]

    def count_in_states(self, states: Sequence[str]) -> dict[str, int]:
        counts = dict.fromkeys(states, 0)
        with self.database_lock:
            for row in self._rows.values():
                if row.state in counts:
                    counts[row.state] += 1
        return counts

    def count_by_state(self) -> dict[str, int]:
        with self.database_lock:
            return dict(Counter(row.state for row in self._rows.values()))

    def replace_all(self, rows: Iterable[IndexRow]) -> None:
        with self.database_lock:
            self._rows = {}
            stamp = self._stamp(time.time)
            for row in rows:
                self._upsert(replace(row, written_at=stamp))

    def rebuild(self, rows: Sequence[IndexRow]) -> None:
        # As SqlJobIndex.rebuild, under the one lock.
        with self.database_lock:
            stamp = self._stamp(time.time)
            for row in rows:
                current = self._rows.get(row.key)
                if current is None or row.version >= current.version:
                    kept = None if current is None else current.written_at
                    self._rows[row.key] = replace(row, written_at=kept or stamp)
            projected = {row.key for row in rows}
            for key, row in list(self._rows.items()):
                if key not in projected and not self._stored_events_index.get(
                    str(UUID(row.job_id))
                ):
                    del self._rows[key]


_stores: dict[str, MemoryJobIndexRecorder] = {}
_stores_lock = threading.Lock()


def shared_recorder(name: str) -> MemoryJobIndexRecorder:
    """The recorder of the named store, created on first use."""
    with _stores_lock:
        recorder = _stores.get(name)
        if recorder is None:
            recorder = _stores[name] = MemoryJobIndexRecorder()
        return recorder


def discard_memory_store(name: str) -> None:
    """Forget a named store (Ledgers still open on it keep their recorder)."""
    with _stores_lock:
        _stores.pop(name, None)


class MemoryFactory(POPOFactory):
    """POPOFactory, but its application recorder keeps the job index (POPOFactory does
    not read APPLICATION_RECORDER_TOPIC) and may be shared by name."""

    def application_recorder(self) -> ApplicationRecorder:
        name = self.env.get(MEMORY_STORE_NAME) or ""
        return shared_recorder(name) if name else MemoryJobIndexRecorder()


@dataclass(frozen=True)
class MemoryBackend:
    spec: MemoryStore

    @property
    def env(self) -> dict[str, str]:
        return {
            "PERSISTENCE_MODULE": get_topic(MemoryFactory),
            MEMORY_STORE_NAME: self.spec.name or "",
        }

    def prepare(self) -> bool:
        with _stores_lock:
            return self.spec.name is not None and self.spec.name in _stores

    def upgrade(self) -> None:
        """A memory store is always of this release: nothing to add."""

    def identity_lock(self, name: str) -> MemoryIdentityLock:
        return MemoryIdentityLock(self._names_scope(), name)

    def names_held(self, names: Collection[str]) -> set[str]:
        return memory_names_held(self._names_scope(), names)

    def _names_scope(self) -> str:
        # An unnamed store is this backend's own: the names are scoped to it.
        return self.spec.name or f"unnamed-{id(self)}"

    def scrub(self) -> bool:
        return True  # a rewritten event replaced the old one in the list: nothing is left

    def access_problem(self) -> str | None:
        return None

    def is_retryable(self, exc: BaseException) -> bool:
        return False  # one lock, held for each whole read or write: nothing to wait out

    def is_setup_race(self, exc: BaseException) -> bool:
        return False


__all__ = [
    "MemoryBackend",
    "MemoryFactory",
    "MemoryJobIndexRecorder",
    "discard_memory_store",
    "shared_recorder",
]
