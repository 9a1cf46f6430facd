"""`sendledger admin copy-store`: the configured store's whole ledger into an empty store
(SQLite to PostgreSQL, say), as stored, then verified (docs/operations.md "Moving to
PostgreSQL").

What a daemon needs to carry on, table by table, and what the copy does with it:

- the events (and the provider handles', which are events too): copied as stored, the
  bytes of each (an encrypted store's stay encrypted under the same key), with their
  originator ids, versions and topics, in notification order. The destination numbers
  them itself: its ids follow the same order, from 1 on an empty store;
- the key checks (`ledger/stores/keycheck.py`): copied before any event, so the
  destination opens with the source's key file and digests the index's mailboxes alike;
- the event format the store records (`ledger/stores/format_rows.py`): copied with the
  key checks, so a release too old for the events refuses the copy as it does the source;
  the servers' declarations are left behind with their other rows;
- the job index: rebuilt from the copied events on the destination (it is a pure function
  of them), not copied;
- the webhook positions: copied, each moved to the destination's id of the last event it
  had handled (found by the verification's walk), so no event is skipped or delivered
  twice; their counts of deliveries and their last error start afresh;
- the loaded policies, the scope leases and the daemons sharing them: left behind. They are
  rows of running servers, and none runs on the source (refused); the destination's
  daemons write their own as they start;
- daemon names: locks of live processes, never stored.

A copy taken while a daemon writes would be a fork: the daemon's later sends would be
known to one store only. So the source must have no live server (`running_on`, and the
servers that declared their event format within `STARTING_SECONDS`: starting), asked
before the copy and again before it is marked finished (with the servers that declared
their event format since it began), and the destination must be empty. A server's stop
removes its declaration.
The destination is marked `copy-started` before its first event and `copy-finished` once
verified, a mark that stands only once the source's end, read again after it with no save
in flight, is still the last event copied; until then no Ledger opens it, nor a second copy
(`ledger/stores/keycheck.py: refuse_unfinished_copy`): an interrupted copy is emptied (the
file removed, the schema dropped) and run again, never resumed.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from itertools import zip_longest
from typing import Any
from uuid import UUID

from eventsourcing.persistence import PersistenceError, StoredEvent

from ledger.application import Ledger
from ledger.display import iso
from ledger.event_format import STARTING_SECONDS
from ledger.exceptions import Refusal, SendledgerError
from ledger.stores import store_exists
from ledger.stores.format_rows import STORE_HOLDER, format_rows_for
from ledger.stores.identity import names_held
from ledger.stores.keycheck import (
    COPY_FINISHED,
    COPY_STARTED,
    STORE_CHECK,
    KeyCheck,
    KeyChecks,
    refuse_unfinished_copy,
)
from ledger.stores.sqlite_companions import companion_of
from ledger.stores.url import PostgresStore, SqliteStore, StoreSpec, StoreUrlError

#: Events read and written per transaction.
PAGE = 500
#: Past every notification id: the upper bound of a read to the end of the log.
_END = 1 << 62
_MARKERS = frozenset({COPY_STARTED, COPY_FINISHED})


class CopyRefused(SendledgerError):
    """The copy cannot be made between these stores now; nothing was written to the
    destination."""

    kind = Refusal.CONFLICT


class CopyMismatch(SendledgerError):
    """The verification found the destination's events other than the source's, a
    server started on the source while it was copied, or the destination's SQLite file
    was removed or replaced meanwhile: it stays an unfinished copy. One line, exit 1, as
    a store that cannot be written (not an "unexpected failure")."""

    kind = Refusal.UNAVAILABLE


class CopyFailed(SendledgerError):
    """A store refused the copy's reads or writes for a reason `Ledger.unavailable` has no
    words for (an I/O error, a file size limit): one line naming the destination, exit 1;
    it stays an unfinished copy."""

    kind = Refusal.UNAVAILABLE


@dataclass(frozen=True)
class CopyResult:
    source: str
    destination: str
    events: int  # copied
    total: int  # the source's last notification id when the copy began
    aggregates: int  # jobs and provider handles, each with the same count and last version
    jobs: int  # index rows rebuilt
    webhooks: int  # positions copied
    seconds: float
    finished: bool  # False: interrupted, the destination marked unfinished

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def where(spec: StoreSpec) -> str:
    """The store as an operator names it, without its password, with its schema."""
    if isinstance(spec, PostgresStore) and spec.schema != "public":
        return f"{spec.describe()}?schema={spec.schema}"
    return spec.describe()


def same_store(a: StoreSpec, b: StoreSpec) -> bool:
    if isinstance(a, SqliteStore) and isinstance(b, SqliteStore):
        if a.path.exists() and b.path.exists():
            return a.path.samefile(b.path)
        return a.path.resolve() == b.path.resolve()
    if isinstance(a, PostgresStore) and isinstance(b, PostgresStore):
        return (a.host, a.port, a.dbname, a.schema) == (b.host, b.port, b.dbname, b.schema)
    return a == b


def _refuse_companion(source: StoreSpec, destination: StoreSpec) -> None:
    """StoreUrlError when either SQLite store is the other's -wal, -shm or -journal: the
    source's last connection would delete the copy as its own file, or SQLite would take
    the source for the copy's (`ledger/stores/sqlite_companions.py`)."""
    if not (isinstance(source, SqliteStore) and isinstance(destination, SqliteStore)):
        return
    suffix = companion_of(source.path, destination.path)
    if suffix is not None:
        raise StoreUrlError(
            f"--to names the configured store's own {suffix} file ({where(destination)}), "
            "which SQLite writes and removes: a copy goes elsewhere"
        )
    suffix = companion_of(destination.path, source.path)
    if suffix is not None:
        raise StoreUrlError(
            f"--to names a store whose {suffix} file is the configured store "
            f"({where(destination)}): a copy goes elsewhere"
        )


def running_on(ledger: Ledger, now: Callable[[], float] = time.time) -> list[str]:
    """What runs on the store: each server whose loaded-policy heartbeat is live (a
    daemon or `sendledger api`, `ledger/stores/loaded_policies.py`), and on SQLite any
    daemon name held on the file (`ledger/stores/identity.py: names_held`)."""
    rows = ledger.loaded_policies()
    at = rows.now()
    found = [
        f"{row.kind} {row.name!r} (heartbeat until {iso(row.seen_until)})"
        for row in rows.live(now() if at is None else at)
    ]
    if isinstance(ledger.store, SqliteStore) and names_held(ledger.store.path):
        found.append("a daemon holding its daemon.name on the store file")
    return found


def copy_store(
    source: Ledger,
    destination: StoreSpec,
    *,
    encryption_keys: Sequence[str] = (),
    progress: Callable[[int, int], None] | None = None,
    stop: Callable[[], bool] = lambda: False,
    page: int = PAGE,
    clock: Callable[[], float] = time.time,
) -> CopyResult:
    """Copy `source` into the empty store `destination` (opened with the source's
    `encryption_keys`), rebuild its index, verify it, copy the webhook positions, and
    mark it finished. `progress(copied, total)` hears every page; `stop()` asked between
    pages, during the rebuild and the walk, and once more after the last check ends the
    copy early (`finished` False, the destination marked unfinished); from the mark on
    it is not asked (the copy is whole and verified).

    CopyRefused (nothing written) when something runs on either store, or the
    destination holds events or another store's keys; UnfinishedCopy when it is an
    unfinished copy, StoreUrlError when it is the source (bad input, nothing written);
    CopyMismatch when the verification fails; StoreUnavailable or CopyFailed when a store
    refuses a write or a read on the way."""
    started = time.monotonic()
    since = _refuse_source(source, destination, clock)
    total = int(source.recorder.max_notification_id() or 0)
    source_checks = _checks(source).key_checks()
    target = Ledger(destination, encryption_keys=encryption_keys, copying=True)
    try:
        _refuse_unless_empty(target, source_checks, clock)
        rows = _checks(target)
        _begin(source, target, source_checks, clock)
        written = _file_of(destination)
        copied = last = 0
        interrupted = CopyResult(
            where(source.store), where(destination), 0, total, 0, 0, 0, 0.0, finished=False
        )
        for batch in _pages(source, page):
            if stop():
                return replace(interrupted, events=copied, seconds=time.monotonic() - started)
            target.recorder.insert_events([_as_stored(n) for n in batch])
            copied += len(batch)
            last = int(batch[-1].id)
            if progress is not None:
                progress(copied, total)
        # The rebuild and the walk take as long again as the pages, and the checks after
        # them may wait `[store] lock_timeout` for a save in flight: a Ctrl-C during them
        # ends the copy too (asked every 1000 jobs, every page, and once all is checked),
        # unmarked. From the mark on it is not asked: the copy is whole and verified.
        webhooks = source.positions().read_all()
        try:
            _stop_if(stop)
            jobs = target.rebuild_index(progress=lambda _jobs: _stop_if(stop))
            aggregates, moved = _verify(
                source, target, page, [row.position for row in webhooks], stop
            )
            if webhooks:
                positions = target.positions()
                positions.ensure()
                for row in webhooks:
                    positions.force(row.name, moved[row.position], clock(), expected=0)
            _refuse_writers_since(source, destination, since, (copied, last), clock)
            _refuse_replaced(destination, written)
            _stop_if(stop)
        except _Stopped:
            return replace(interrupted, events=copied, seconds=time.monotonic() - started)
        _mark_finished(source, rows, destination, (copied, last), clock)
    except SendledgerError:
        raise
    except (PersistenceError, sqlite3.Error, OSError) as exc:
        raise _refused_write(target, destination, exc) from exc
    finally:
        target.close()
    return CopyResult(
        where(source.store),
        where(destination),
        copied,
        total,
        aggregates,
        jobs,
        len(webhooks),
        time.monotonic() - started,
        finished=True,
    )


def _refuse_source(source: Ledger, destination: StoreSpec, clock: Callable[[], float]) -> float:
    """Before anything is written: StoreUrlError when `destination` is the source or one
    of its own files, CopyRefused when a server runs or starts on the source. When the
    copy begins, by the store's clock."""
    if same_store(source.store, destination):
        raise StoreUrlError(f"--to names the configured store itself ({where(destination)})")
    _refuse_companion(source.store, destination)
    since = _store_now(source, clock)
    # A server declares its format at its open and writes its heartbeat once started:
    # one that declared a moment ago is starting (its heartbeat may come after the last
    # check, which counts only declarations since the copy began).
    busy = running_on(source, clock) + _started_since(source, since - STARTING_SECONDS)
    if busy:
        raise CopyRefused(
            f"{where(source.store)} is in use by {'; '.join(busy)}: stop it first (a copy "
            "taken while a daemon writes would be a fork: its later sends known to one "
            "store only)"
        )
    return since


def _refused_write(target: Ledger, destination: StoreSpec, exc: Exception) -> SendledgerError:
    """A write the destination refused (its disk full, read-only, a file size limit's
    I/O error): one line naming it, not the driver's bare error as an "unexpected
    failure". The unfinished mark stays: the next copy or open says to empty it."""
    said = target.unavailable(exc)
    if said is not None:
        return said
    words = str(exc).strip().splitlines() or [type(exc).__name__]
    return CopyFailed(
        f"the copy into {where(destination)} stopped ({words[0]}): empty it and copy again"
    )


def _begin(
    source: Ledger, target: Ledger, source_checks: Sequence[KeyCheck], clock: Callable[[], float]
) -> None:
    """What the copy writes before the events: the unfinished mark, the source's key
    checks, and the format its events are in."""
    rows = _checks(target)
    # First the mark, so that no Ledger opens what follows until it is verified.
    rows.add_key_check(KeyCheck(COPY_STARTED, COPY_STARTED, where(source.store).encode(), clock()))
    for check in source_checks:
        if check.kind not in _MARKERS:
            rows.add_key_check(check)
    target.judge_copied_keys()  # before the events: keys that do not fit copy nothing
    # The events' format goes with them: without it the copy reads as FIRST_FORMAT, and
    # a release that reads only older formats would open it (ledger/event_format.py).
    held = format_rows_for(source.recorder).rows().get(STORE_HOLDER)
    if held is not None:
        format_rows_for(target.recorder).raise_to(held.format, held.at)


def _refuse_replaced(destination: StoreSpec, written: tuple[int, int] | None) -> None:
    """CopyMismatch when the destination's SQLite file is no longer the one the copy
    wrote (`written`, `_file_of` at its start): removed or replaced meanwhile."""
    if _file_of(destination) != written:
        raise CopyMismatch(
            f"{where(destination)} was removed or replaced while it was copied: the "
            "copy went into a file no longer there; copy again"
        )


def _file_of(spec: StoreSpec) -> tuple[int, int] | None:
    """The SQLite file at the store's path (device, inode); None when there is none, or
    for a server's store. An open connection writes on into a file removed meanwhile
    (an operator emptying what a second copy's refusal called unfinished)."""
    if not isinstance(spec, SqliteStore):
        return None
    try:
        found = spec.path.stat()
    except FileNotFoundError:
        return None
    return (found.st_dev, found.st_ino)


def _refuse_writers_since(
    source: Ledger,
    destination: StoreSpec,
    since: float,
    walked: tuple[int, int],
    clock: Callable[[], float],
) -> None:
    """CopyMismatch when anything wrote to the source, or a server started on it, since
    the copy began (`since`, by the store's clock; `walked`: the events copied, and the
    id of the last)."""
    copied, last = walked
    # A server that started after the first check and has written no event yet passed
    # the verification; it would write to the source alone from now on.
    late = running_on(source, clock) + _started_since(source, since)
    if late:
        raise CopyMismatch(
            f"a server started on {where(source.store)} while it was copied "
            f"({'; '.join(late)}): its writes would be known to the source only (a "
            f"fork); {where(destination)} stays an unfinished copy: stop the server, "
            "empty the destination and copy again"
        )
    # A command is no server (no heartbeat, name or declaration): its write after the
    # walk is seen only as the source's log going on past what was copied.
    _refuse_moved_end(source, destination, last, int(source.recorder.max_notification_id() or 0))
    # On PostgreSQL a save takes its id, then commits: one in flight while the walk
    # passed its id commits below the last event copied, or may still (the count waits
    # for the saves in flight).
    held = source.positions().events_up_to(last)
    if held is None:
        raise CopyMismatch(
            f"a save on {where(source.store)} was still in flight after [store] "
            f"lock_timeout, and may commit below the last event copied ({last}): nothing "
            f"may write to it meanwhile; {where(destination)} stays an unfinished copy: "
            "empty it and copy again"
        )
    if held != copied:
        raise CopyMismatch(
            f"the source changed while it was copied (events up to the last copied, "
            f"{last}: {held} in the source, {copied} copied; a save committed after the "
            "walk passed it: nothing may write to it meanwhile); "
            f"{where(destination)} stays an unfinished copy: empty it and copy again"
        )


def _refuse_moved_end(source: Ledger, destination: StoreSpec, last: int, end: int) -> None:
    """CopyMismatch when the source's last event, `end`, is no longer `last`, the last
    copied."""
    if end != last:
        raise CopyMismatch(
            f"the source changed while it was copied (its last event is {end}, the "
            f"last copied {last}: nothing may write to it meanwhile); "
            f"{where(destination)} stays an unfinished copy: empty it and copy again"
        )


def _mark_finished(
    source: Ledger,
    rows: KeyChecks,
    destination: StoreSpec,
    walked: tuple[int, int],
    clock: Callable[[], float],
) -> None:
    """The finished mark, then the source's last event read once more, once no save is
    in flight (`settled_end`): a save that began before this read, and committed after
    the checks before the mark or commits later (a command's; on PostgreSQL its id is
    taken before its commit, on SQLite it holds the write lock), has an id past `last`,
    the source's alone. The mark is then taken back and the copy stays unfinished, as it
    is when this read fails or is interrupted (a second Ctrl-C): the mark stands only
    with the read passed. A save that begins after it is a write after the copy, as
    after any backup."""
    copied, last = walked
    try:
        rows.add_key_check(
            KeyCheck(COPY_FINISHED, COPY_FINISHED, f"{copied} events".encode(), clock())
        )
        end = source.positions().settled_end()
        if end is None:
            raise CopyMismatch(
                f"a save on {where(source.store)} was still in flight as the copy was "
                "marked finished, past the store's wait for a writer, and would commit "
                f"after the last event copied ({last}) to the source alone: nothing may "
                f"write to it meanwhile; {where(destination)} stays an unfinished copy: "
                "empty it and copy again"
            )
        _refuse_moved_end(source, destination, last, end)
    except BaseException:
        rows.remove_key_check(COPY_FINISHED)
        raise


def left_at(destination: StoreSpec, encryption_keys: Sequence[str] = ()) -> str | None:
    """The mark a copy interrupted at once (a second Ctrl-C) left at `destination`:
    COPY_FINISHED (it was finished and verified before the interruption), COPY_STARTED
    (an unfinished copy), or None when no copy wrote to it. Read without creating a
    store that is not there."""
    if not store_exists(destination):
        return None
    with Ledger(destination, encryption_keys=encryption_keys, copying=True) as target:
        kinds = {check.kind for check in _checks(target).key_checks()}
    return next((mark for mark in (COPY_FINISHED, COPY_STARTED) if mark in kinds), None)


def _store_now(ledger: Ledger, clock: Callable[[], float]) -> float:
    """The clock the servers' format declarations are written by (`check_event_format`)."""
    at = ledger.loaded_policies().now()
    return clock() if at is None else at


def _started_since(ledger: Ledger, since: float) -> list[str]:
    """Each server that declared its event format at `since` or later: one starting on
    the store, which may not have announced its policies yet (`running_on` misses it)."""
    found = format_rows_for(ledger.recorder).rows()
    return [
        f"{holder} (started at {iso(row.at)})"
        for holder, row in sorted(found.items())
        if holder != STORE_HOLDER and row.at >= since
    ]


def _checks(ledger: Ledger) -> KeyChecks:
    # Each backend's recorder keeps the key checks (`ledger/stores/keycheck.py`).
    recorder: Any = ledger.recorder
    return recorder  # type: ignore[no-any-return]


def _refuse_unless_empty(target: Ledger, source_checks: list[KeyCheck], clock: Any) -> None:
    name = where(target.store)
    found = _checks(target).key_checks()
    refuse_unfinished_copy(found, where=name)  # as every open does: bad input
    # A URL can name the source otherwise than `same_store` sees (a host's two names):
    # its rows are the source's, to their creation times. A copy made by this command
    # is not: it holds its own copy-started and copy-finished rows besides.
    own = next((c for c in source_checks if c.check_id == STORE_CHECK), None)
    if own is not None and set(found) == set(source_checks):
        raise StoreUrlError(
            f"--to names the configured store itself, or a copy of its bytes ({name} holds "
            f"its key checks, created {iso(own.created_at)})"
        )
    events = int(target.recorder.max_notification_id() or 0)
    if events:
        raise CopyRefused(
            f"{name} holds events (its last notification id is {events}): a copy goes into "
            "an empty store only"
        )
    busy = running_on(target, clock)
    if busy:
        raise CopyRefused(f"{name} is in use by {'; '.join(busy)}: stop it first")
    ours = {(c.check_id, c.kind, c.value) for c in source_checks}
    foreign = [c.check_id for c in found if (c.check_id, c.kind, c.value) not in ours]
    if foreign:
        raise CopyRefused(
            f"{name} has key checks of another store ({', '.join(sorted(foreign))}): a copy "
            "goes into an empty store only"
        )


def _pages(ledger: Ledger, page: int) -> Iterator[list[Any]]:
    """The whole event log, a page at a time, in notification order."""
    position = 0
    while True:
        batch = ledger.log_after(position, _END, page, ())
        if not batch:
            return
        yield batch
        position = batch[-1].id


def _events(ledger: Ledger, page: int) -> Iterator[Any]:
    for batch in _pages(ledger, page):
        yield from batch


def _uuid(value: UUID | str) -> UUID:
    return value if isinstance(value, UUID) else UUID(str(value))


def _as_stored(notification: Any) -> StoredEvent:
    return StoredEvent(
        originator_id=_uuid(notification.originator_id),
        originator_version=notification.originator_version,
        topic=notification.topic,
        state=bytes(notification.state),
    )


class _Stopped(SendledgerError):
    """`stop()` asked during the index's rebuild or the walk: the copy ends unfinished."""


def _stop_if(stop: Callable[[], bool]) -> None:
    if stop():
        raise _Stopped


def _verify(
    source: Ledger,
    target: Ledger,
    page: int,
    positions: Sequence[int],
    stop: Callable[[], bool] = lambda: False,
) -> tuple[int, dict[int, int]]:
    """Walk both logs side by side: every event the same (originator, version, topic,
    stored bytes) in the same order, and each aggregate's event count and last version
    the same on both sides. The number of aggregates, and for each of the source's
    webhook `positions` the destination's id of the last event at or before it (0: none)."""
    tallies: tuple[dict[UUID, list[int]], dict[UUID, list[int]]] = ({}, {})
    moved = dict.fromkeys(positions, 0)
    for place, (ours, theirs) in enumerate(
        zip_longest(_events(source, page), _events(target, page)), start=1
    ):
        if place % page == 0:
            _stop_if(stop)
        if ours is None or theirs is None:
            longer = "source" if theirs is None else "destination"
            raise CopyMismatch(
                f"the {longer} holds more events than the other from event {place} on: the "
                "source changed while it was copied (nothing may write to it meanwhile)"
            )
        if _as_stored(ours) != _as_stored(theirs):
            raise CopyMismatch(
                f"event {place} differs: {ours.originator_id} v{ours.originator_version} in "
                f"the source, {theirs.originator_id} v{theirs.originator_version} copied"
            )
        for side, event in zip(tallies, (ours, theirs), strict=True):
            count = side.setdefault(_uuid(event.originator_id), [0, 0])
            count[0] += 1
            count[1] = max(count[1], event.originator_version)
        for position in moved:  # a webhook or two: a loop, not a search
            if ours.id <= position:
                moved[position] = theirs.id
    if tallies[0] != tallies[1]:  # cannot differ when every event is equal: said, not assumed
        raise CopyMismatch("the aggregates' event counts or last versions differ")
    return len(tallies[0]), moved


__all__ = [
    "PAGE",
    "CopyFailed",
    "CopyMismatch",
    "CopyRefused",
    "CopyResult",
    "copy_store",
    "left_at",
    "running_on",
    "same_store",
    "where",
]
