"""The job index: one row per job beside the events, written in the same transaction.

Ticks, `status`, `review list` and audits read this table instead of replaying history,
so their cost grows with the jobs that match, not with everything ever stored. The row
is a pure function of the aggregate (`index_row`), which is what lets
`admin rebuild-index` recreate it from the events and tests compare the two.

This module is backend-neutral: the row, the queries every backend answers (`JobIndex`),
and the SQL shared by the SQLite and PostgreSQL recorders (`SqlJobIndex`). The memory
backend answers the same queries from a dict.
"""

from __future__ import annotations

import hashlib
import json
import math
import operator
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol
from uuid import UUID

from eventsourcing.persistence import StoredEvent

from ledger.addresses import mailbox_key
from ledger.exceptions import SendledgerError
from ledger.stores.purge import RewriteFailed, rewrites_from
from ledger.vocabulary import JobState

if TYPE_CHECKING:
    from ledger.job import SendJob

INDEX_TABLE = "sendledger_jobs"
#: The keyword argument of `Application.save` (and so of the recorder's insert) that
#: carries the index rows to write with the events.
INDEX_ROWS_KWARG = "sendledger_index_rows"
#: ... and the one that carries the writer's clock (the Ledger's): what a row's
#: `written_at` is stamped from, inside the transaction (`SqlJobIndex._stamp`).
INDEX_CLOCK_KWARG = "sendledger_index_clock"
#: ... and an optional guard: asked in the transaction once the rows are held, right
#: before the commit; False rolls the write back (`Withdrawn`). A write that waited long
#: for a row (a renewal of a stopping daemon) is so withdrawn by its writer meanwhile.
INDEX_GUARD_KWARG = "sendledger_index_guard"
#: ... and an optional `connect_while()`: asked while the write waits for a pooled
#: connection (PostgreSQL); False gives the wait up (`Withdrawn`), nothing begun.
INDEX_CONNECT_KWARG = "sendledger_index_connect_while"
#: How far a transaction's stamp is put past the last one stored when the clock says no
#: later (a batch saved in the same instant, a clock stepped back): a microsecond, which
#: a float of epoch seconds still tells apart (its step is a quarter of one).
STAMP_STEP = 1e-6
COLUMNS = (
    "key",
    "job_id",
    "channel",
    "state",
    "message_id",
    "due_at",
    "created_at",
    "updated_at",
    "version",
    "attempts",
    "reason",
    "purged_at",
    "watch_until",
    "watch_mailbox",
    "mailbox",
    "review_since",
    "attempt_provider",
    "other_due_at",
    "written_at",
)
#: Columns added after the first release: (name, SQL type template). Opening a store
#: that lacks one adds it (each backend's `prepare`), so old stores keep working. A row
#: written before `mailbox` existed has none (NULL) until the daemon fills it
#: (`Ledger.fill_mailboxes`, for the jobs with something due) or a rebuild does. A row
#: written before `review_since` existed has none: the review queue reads its `updated_at`
#: instead (`IndexRow.in_review_since`) until the job is written again or a rebuild fills it.
#: When `written_at` is added, every row gets its `updated_at` (the best it knows), so the
#: listing, which pages by it, keeps every job of the store. When `attempt_provider` is
#: added, every requested job gets "" (its next call is its channel's, whatever it was
#: attempted on before: `ATTEMPT_PROVIDER_BACKFILL`); the other rows, whose attempt's
#: provider only their events say, have none (NULL) until the daemon fills those with
#: something due (`Ledger.fill_mailboxes`) or a rebuild does.
#: A watched row written before `other_due_at` existed has none until the daemon fills it
#: at start-up (`Ledger.fill_other_dues`) or a rebuild does; until then its job is loaded
#: once to learn it (`BounceWatch.read_through`).
ADDED_COLUMNS = (
    ("purged_at", "{real}"),
    ("watch_until", "{real}"),
    ("watch_mailbox", "TEXT"),
    ("mailbox", "TEXT"),
    ("review_since", "{real}"),
    ("written_at", "{real}"),
    ("attempt_provider", "TEXT"),
    ("other_due_at", "{real}"),
)
#: The upgrade's fill of `attempt_provider` (templates as in CREATE_STATEMENTS): what the
#: index alone can say.
ATTEMPT_PROVIDER_BACKFILL = (
    "UPDATE {t} SET attempt_provider = '' WHERE attempt_provider IS NULL AND state = 'requested'"
)
#: A watched job's `other_due_at` when nothing but the end of its watch is due.
NOTHING_ELSE = math.inf


#: A row's values in COLUMNS order (one C call: each save writes a row per job).
_COLUMN_VALUES = operator.attrgetter(*COLUMNS)


@dataclass(frozen=True)
class IndexRow:
    key: str
    job_id: str
    channel: str
    state: str
    message_id: str
    due_at: float | None  # epoch seconds, UTC
    created_at: float
    updated_at: float
    version: int
    attempts: int
    reason: str | None
    purged_at: float | None = None  # epoch seconds: its content was purged then
    # A confirmed job whose bounces are watched: until when, and a digest of its mailbox
    # (`mailbox_digest`: the index keeps no address); both None otherwise
    # (docs/how-it-works.md "Bounces").
    watch_until: float | None = None
    watch_mailbox: str | None = None
    # The From's mailbox, lower case (`ledger.addresses.mailbox_key`): with the channel,
    # what a daemon needs to know whose quota scope a job spends before it loads it
    # (docs/performance.md "Several daemons"). None: a row of an earlier release.
    mailbox: str | None = None
    # A job in review: when it went there (its latest Escalated event), which a check or
    # a triage writing to it leaves as it was; None otherwise, and on a row of an
    # earlier release (`in_review_since`).
    review_since: float | None = None
    # The provider the job's last attempt was made on, where its searches, draft checks,
    # tidies and verifications are made (`provider_for` in daemon/engine/work.py), so
    # that a daemon knows whose quota scope they spend before it loads the job, even when
    # a reload moved its channel to another provider since (docs/performance.md
    # "Several daemons"). "" when its next call is its channel's provider's (no attempt
    # yet, or requested again); None: a row of an earlier release, not filled yet
    # (`Ledger.fill_mailboxes`).
    attempt_provider: str | None = None
    # A watched confirmed job: when anything of it other than its watch's end is due (its
    # verification, its tidy; `NOTHING_ELSE`: nothing), which `due_at`, the earliest of
    # the three, hides once the watch's end has passed: what lets a tick pass over a watch
    # that waits for a read of its mailbox without loading its job (docs/architecture.md
    # "Bounces on the job"). None otherwise, and on a row of an earlier release not yet
    # filled in (`Ledger.fill_other_dues`).
    other_due_at: float | None = None
    # When the row was stored, in the store's order of writes: stamped inside the
    # writing transaction, after the writers before it committed, never earlier than one
    # of them (`SqlJobIndex._stamp`). What `GET /v1/jobs` pages by: a job's own times are
    # taken before it is written (a batch's when its messages were proved, seconds
    # earlier), so a walk that paged by them would pass a batch before it committed. Not
    # a function of the events: left out of comparisons (a row read back equals its
    # projection) and kept by a rebuild.
    written_at: float | None = field(default=None, compare=False)

    def as_tuple(self) -> tuple[Any, ...]:
        values: tuple[Any, ...] = _COLUMN_VALUES(self)
        return values

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def due(self) -> datetime | None:
        return None if self.due_at is None else datetime.fromtimestamp(self.due_at, UTC)

    @property
    def in_review_since(self) -> float:
        """How long the review queue says a job has waited, from when: when it went to
        review; its last change for a row written before that was recorded (the best
        the row knows until the job is written again or `admin rebuild-index`)."""
        return self.updated_at if self.review_since is None else self.review_since


@dataclass(frozen=True)
class JobFilter:
    """Which index rows a listing wants (None: any); `updated_from` inclusive,
    `updated_to` exclusive, `written_from` inclusive, all epoch seconds."""

    state: str | None = None
    channel: str | None = None
    updated_from: float | None = None
    updated_to: float | None = None
    written_from: float | None = None

    def matches(self, row: IndexRow) -> bool:
        return (
            (self.state is None or row.state == self.state)
            and (self.channel is None or row.channel == self.channel)
            and (self.updated_from is None or row.updated_at >= self.updated_from)
            and (self.updated_to is None or row.updated_at < self.updated_to)
            and (
                self.written_from is None
                or (row.written_at is not None and row.written_at >= self.written_from)
            )
        )


ALL_JOBS = JobFilter()


@dataclass(frozen=True)
class WatchedMailbox:
    """A mailbox some confirmed jobs of a channel have their bounces watched in: its
    digest, how many jobs, and one of them (whose From and last provider name the
    mailbox)."""

    channel: str
    mailbox: str  # `mailbox_digest` of the jobs' From and the provider they were sent on
    jobs: int
    example_key: str
    # The soonest `watch_until` of them, epoch seconds: a read reaches back to that
    # watch's start, whose end may be long past (its mailbox not read since).
    first_until: float | None = None


#: One due (channel, From mailbox, attempt provider) of the index (`IndexRow`): the
#: mailbox None on a row of an earlier release not filled yet; the provider "" where the
#: job's next call is its channel's, None where the row does not say.
DueScope = tuple[str, str | None, str | None]


@dataclass(frozen=True)
class ScopeGroup:
    """The rows of `channels` whose mailbox is one of `mailboxes` (None: any mailbox) and,
    with `attempted_on`, whose attempt was made on that provider or that do not say (a
    channel moved to another provider: the rows of its old provider's scope)."""

    channels: tuple[str, ...]
    mailboxes: tuple[str, ...] | None = None
    attempted_on: str | None = None

    def matches(self, row: IndexRow) -> bool:
        return (
            row.channel in self.channels
            and (self.mailboxes is None or row.mailbox in self.mailboxes)
            and (
                self.attempted_on is None
                or row.attempt_provider is None
                or row.attempt_provider == self.attempted_on
            )
        )


@dataclass(frozen=True)
class ScopeFilter:
    """The due rows one daemon works on when several share a store (docs/performance.md
    "Several daemons"): those of its groups (the quota scopes it owns), and those of every
    channel not in `known` (a channel without a policy: its jobs go to review, and no
    scope is spent on that)."""

    groups: tuple[ScopeGroup, ...] = ()
    known: tuple[str, ...] = ()

    def matches(self, row: IndexRow) -> bool:
        return row.channel not in self.known or any(g.matches(row) for g in self.groups)


@dataclass(frozen=True)
class WatchHold:
    """The watches of `channel` in `mailboxes` (digests) that wait for a read through
    their mailbox (docs/architecture.md "Bounces on the job"): past their end, ending
    after `after` (epoch seconds; None: any), nothing else of their job due by `now`.
    A tick's due rows leave them out (`jobs_due`), so however many wait, the rows behind
    them are found; a row without `other_due_at` is not held here."""

    channel: str
    mailboxes: tuple[str, ...]
    after: float | None = None

    def holds(self, row: IndexRow, now: float) -> bool:
        return (
            row.channel == self.channel
            and row.watch_mailbox in self.mailboxes
            and row.watch_until is not None
            and row.due_at is not None
            and row.due_at >= row.watch_until
            and (self.after is None or row.watch_until > self.after)
            and row.other_due_at is not None
            and row.other_due_at > now
        )


#: The watches a tick's due rows leave out (`jobs_due`).
Held = Sequence[WatchHold]


def index_row(job: SendJob, mailbox: str | None = None) -> IndexRow:
    """The job's row; `mailbox` is the From's mailbox column, as the store writes it
    (`Ledger.mailbox_of`, a digest when the store is encrypted), `mailbox_key` of the
    From without one. A value, not a function to call back: the row is made from what
    its caller hands it."""
    watching = job.state is JobState.CONFIRMED and job.watch_until is not None
    return IndexRow(
        key=job.key,
        job_id=job.id.hex,
        channel=job.channel,
        state=job.state.value,
        message_id=job.message_id,
        due_at=None if job.due_at is None else job.due_at.timestamp(),
        created_at=job.created_on.timestamp(),
        updated_at=job.modified_on.timestamp(),
        version=job.version,
        attempts=job.attempts,
        reason=job.reason,
        purged_at=None if job.purged_at is None else job.purged_at.timestamp(),
        watch_until=job.watch_until.timestamp() if watching and job.watch_until else None,
        watch_mailbox=mailbox_digest(job.from_addr, job.last_provider) if watching else None,
        mailbox=mailbox_key(job.from_addr) if mailbox is None else mailbox,
        review_since=(
            job.escalated_at.timestamp()
            if job.state is JobState.REVIEW and job.escalated_at is not None
            else None
        ),
        attempt_provider=attempt_provider_of(job),
        other_due_at=other_due(job) if watching else None,
    )


def attempt_provider_of(job: SendJob) -> str:
    """The row's `attempt_provider`: as `provider_for` (daemon/engine/work.py) chooses,
    without the policy ("" for the channel's provider)."""
    if job.state is JobState.REQUESTED or job.last_provider is None:
        return ""
    return job.last_provider


def other_due(job: SendJob) -> float:
    """A watched job's `other_due_at`: when its verification or its tidy is due, the
    earlier; `NOTHING_ELSE` when neither is."""
    other = job.due_besides_watch
    return NOTHING_ELSE if other is None else other.timestamp()


def mailbox_digest(from_addr: str, provider: str | None = None) -> str:
    """What the index keeps of a watched job's mailbox: the first 32 hex digits of the
    SHA-256 of its lower-cased addr-spec and the provider its copy was sent on
    (`last_provider`), so jobs of one mailbox sent on one provider group together (a
    channel moved to another provider has its earlier jobs' reports read where they were
    sent) and no address is stored beside encrypted events (docs/configuration.md
    "Encryption at rest"). Without a provider, the addr-spec's alone (rows of earlier
    releases)."""
    from ledger.addresses import parse_mailbox  # only for watched jobs (its imports cost)

    bare = parse_mailbox(from_addr).address.addr_spec.lower()
    if provider is not None:
        bare += "\n" + provider  # no addr-spec holds a line break
    return hashlib.sha256(bare.encode("utf-8")).hexdigest()[:32]


def rows_from(kwargs: Mapping[str, Any]) -> list[IndexRow]:
    """The index rows passed to the recorder's insert beside the events."""
    rows = kwargs.get(INDEX_ROWS_KWARG) or []
    return list(rows)


class Withdrawn(SendledgerError):
    """The writer withdrew the write while it waited (`INDEX_GUARD_KWARG`, or
    `INDEX_CONNECT_KWARG` before it had a connection): nothing of it was stored."""


def check_guard(kwargs: Mapping[str, Any]) -> None:
    """Raise `Withdrawn` (the transaction rolls back) when the writer's guard says no."""
    guard: Callable[[], bool] | None = kwargs.get(INDEX_GUARD_KWARG)
    if guard is not None and not guard():
        raise Withdrawn("the writer withdrew the write")


def clock_from(kwargs: Mapping[str, Any]) -> Callable[[], float]:
    """The writer's clock passed beside the rows, in epoch seconds; the host's without
    one."""
    clock: Callable[[], datetime] | None = kwargs.get(INDEX_CLOCK_KWARG)
    if clock is None:
        return time.time
    return lambda: clock().timestamp()


def next_stamp(clock: Callable[[], float], last: float | None) -> float:
    """A transaction's `written_at`: the writer's time, but past the last one stored, so
    that stamps follow the order of the writes whatever the writers' clocks say."""
    now = clock()
    return now if last is None or now > last else last + STAMP_STEP


def stamped(rows: Sequence[IndexRow], stamp: float | None) -> list[tuple[Any, ...]]:
    """The rows' values (COLUMNS order) with `written_at` the transaction's stamp (None:
    stamped later in the transaction, `SqlJobIndex.rebuild`)."""
    return [(*row.as_tuple()[:-1], stamp) for row in rows]


class JobIndex(Protocol):
    """The index queries every backend's recorder answers (states as plain strings,
    times as epoch seconds). `Ledger` is their only caller."""

    def job_by_key(self, key: str) -> IndexRow | None: ...

    def job_by_message_id(self, message_id: str) -> IndexRow | None: ...

    def jobs_due(
        self, state: str, now: float, limit: int, scopes: ScopeFilter | None = None, held: Held = ()
    ) -> list[IndexRow]:
        """Rows in `state` with due_at <= now, soonest first, at most `limit`; with
        `scopes`, only the rows it matches; none that one of `held` holds."""
        ...

    def scopes_due(self, states: Sequence[str], before: float) -> list[DueScope]:
        """The distinct (channel, mailbox, attempt provider) of the rows in `states` due
        at or before `before`: whose quota scopes have work (docs/performance.md "Several
        daemons")."""
        ...

    def without_mailbox(self, states: Sequence[str], limit: int) -> list[tuple[str, int]]:
        """(key, version) of rows in `states` with something due and no mailbox or no
        attempt provider (written by an earlier release), at most `limit`."""
        ...

    def set_mailboxes(self, mailboxes: Sequence[tuple[str, int, str, str]]) -> None:
        """Fill the mailbox and the attempt provider of each (key, version, mailbox,
        provider) where its row has none and is still of that version."""
        ...

    def without_other_due(self, after_key: str, limit: int) -> list[str]:
        """Keys, in order after `after_key`, of watched rows without `other_due_at`
        (written by an earlier release), at most `limit`."""
        ...

    def set_other_dues(self, dues: Sequence[tuple[str, int, float]]) -> None:
        """Fill the `other_due_at` of each (key, version, value) whose row has none and
        is still of that version."""
        ...

    def find(
        self, where: JobFilter = ..., *, after_key: str | None = None, limit: int = 1000
    ) -> list[IndexRow]:
        """One page of rows matching `where`, in key order; page on with `after_key` =
        the last key."""
        ...

    def changed(
        self, where: JobFilter = ..., *, after: tuple[float, str] | None = None, limit: int = 100
    ) -> list[IndexRow]:
        """One page of rows matching `where` in (written_at, key) order, after the
        position `after` (the last row's (written_at, key)): `GET /v1/jobs`."""
        ...

    def next_due(self, states: Sequence[str]) -> float | None: ...

    def purgeable(self, before: float, *, after_key: str | None, limit: int) -> list[IndexRow]:
        """One page, in key order, of the jobs a purge may take: settled for good
        (confirmed, abandoned or cancelled), nothing due, not purged, last changed before
        `before`. Paged on the primary key: a whole pass reads the index once."""
        ...

    def count_in_states(self, states: Sequence[str]) -> dict[str, int]: ...

    def watched(self) -> list[WatchedMailbox]:
        """The (channel, mailbox) pairs with confirmed jobs whose bounces are watched,
        and how many: a range of the partial index on `watch_until`, so it costs the
        watched jobs, not the history."""
        ...

    def count_by_state(self) -> dict[str, int]: ...

    def replace_all(self, rows: Iterable[IndexRow]) -> None:
        """Clear, then write every row: for tests that set up an index by hand. (A
        rebuild uses `rebuild`, which never clears.)"""
        ...

    def rebuild(self, rows: Sequence[IndexRow]) -> None:
        """In one transaction: write each projected row unless the stored row is of a
        newer version (a live daemon wrote it after the projection was read), and delete
        the rows of keys not projected whose job has no events (a job created after the
        projection was read keeps its row).
        Readers see the old index or the new one, never an empty or partial one."""
        ...


#: The states a purge may take a job from: settled for good.
PURGEABLE_STATES = tuple(
    state.value for state in (JobState.CONFIRMED, JobState.ABANDONED, JobState.CANCELLED)
)


def _row(values: Sequence[Any]) -> IndexRow:
    return IndexRow(*values)


#: Secondary indexes added after the first release, (name, statement): opening a store
#: that lacks one creates it (`missing_indexes`). (state, updated_at) serves "in state S,
#: changed since T" (`audit --state confirmed --since 1h`), which the (state, due_at)
#: index could only answer by reading every job ever settled in that state.
ADDED_INDEXES = (
    # (written_at, key) serves the listing `GET /v1/jobs` pages in its own order: a page
    # of any state is a range of it read up to the page's size, never a sort of all; and
    # a transaction's stamp is the one after its MAX. (Stores of earlier releases keep
    # the (updated_at, key) index the listing read before; nothing reads it now.)
    (
        INDEX_TABLE + "_written_key",
        "CREATE INDEX IF NOT EXISTS {n}_written_key ON {t} (written_at, key)",
    ),
    # ... and (state, written_at) a page of one state: a range, sorting only equal stamps
    # (one transaction's rows) by key.
    (
        INDEX_TABLE + "_state_written",
        "CREATE INDEX IF NOT EXISTS {n}_state_written ON {t} (state, written_at)",
    ),
    (
        INDEX_TABLE + "_state_updated",
        "CREATE INDEX IF NOT EXISTS {n}_state_updated ON {t} (state, updated_at)",
    ),
    # The watched jobs only (docs/how-it-works.md "Bounces"): partial, so it holds what is
    # watched now and costs nothing for the other writes' rows.
    (
        INDEX_TABLE + "_watch",
        "CREATE INDEX IF NOT EXISTS {n}_watch ON {t} (watch_until, channel, watch_mailbox) "
        "WHERE watch_until IS NOT NULL",
    ),
)

# Each secondary index costs every write: only the lookups a tick or a command makes.
# (state, due_at) serves "due now" and "in state S"; message_id serves reconciliation.
CREATE_STATEMENTS = [
    "CREATE TABLE IF NOT EXISTS {t} ("
    "key TEXT PRIMARY KEY, job_id TEXT NOT NULL, channel TEXT NOT NULL, "
    "state TEXT NOT NULL, message_id TEXT NOT NULL, due_at {real}, "
    "created_at {real} NOT NULL, updated_at {real} NOT NULL, version INTEGER NOT NULL, "
    "attempts INTEGER NOT NULL, reason TEXT, purged_at {real}, watch_until {real}, "
    "watch_mailbox TEXT, mailbox TEXT, review_since {real}, attempt_provider TEXT, "
    "other_due_at {real}, "
    "written_at {real}){options}",
    "CREATE INDEX IF NOT EXISTS {n}_state_due ON {t} (state, due_at)",
    "CREATE INDEX IF NOT EXISTS {n}_message_id ON {t} (message_id)",
    *(statement for _name, statement in ADDED_INDEXES),
]


def missing_indexes(present: Iterable[str]) -> list[str]:
    """The statements (templates, as in CREATE_STATEMENTS) of the `ADDED_INDEXES` not in
    `present` (the index names a store has)."""
    have = set(present)
    return [statement for name, statement in ADDED_INDEXES if name not in have]


#: The columns a job's first event fixes for good (its key, its id derived from the key,
#: its channel, Message-ID and creation time: `SendJob.Requested`): a row's later writes
#: leave them as they are. SQLite rewrites the entry of every index on a column an
#: UPDATE assigns, equal value or not, so assigning `message_id` again at each save wrote
#: a page of its index (a random one: the ids are digests) into every commit, about a
#: fifth of the pages a job's saves wrote (docs/performance.md "Commits per job").
FIXED_COLUMNS = ("key", "job_id", "channel", "message_id", "created_at")


def _upsert(assigned: Iterable[str], newer: str) -> str:
    return (
        "INSERT INTO {t} ("
        + ", ".join(COLUMNS)
        + ") VALUES ("
        + ", ".join(["{p}"] * len(COLUMNS))
        + ") ON CONFLICT (key) DO UPDATE SET "
        + ", ".join(assigned)
        + " WHERE excluded.version "
        + newer
        + " {t}.version"
    )


# Only a newer version may overwrite a row: the event insert's optimistic concurrency
# already refuses a stale writer, this keeps a rebuild from racing a live daemon.
UPSERT = _upsert((f"{c} = excluded.{c}" for c in COLUMNS if c not in FIXED_COLUMNS), ">")
# A rebuild's row replaces one of the same version too (the events are the truth, the row
# may be damaged: every column is written again) but never a newer one written by a live
# daemon meanwhile. It keeps the row's `written_at` (when the job's last change was
# stored, which the events do not say): a rebuild would otherwise move every job to the
# end of the listing.
REBUILD_UPSERT = _upsert(
    (
        "written_at = COALESCE({t}.written_at, excluded.written_at)"
        if c == "written_at"
        else f"{c} = excluded.{c}"
        for c in COLUMNS
        if c != "key"
    ),
    ">=",
)
_SELECT = "SELECT " + ", ".join(COLUMNS) + " FROM {t} "
#: The last stamp stored, and whether a row has none (`SqlJobIndex._stamp`): each its own
#: subquery, so that each is a search of the (written_at, key) index.
_LAST_STAMP = (
    "SELECT (SELECT MAX(written_at) FROM {t}) AS last_stamp, "
    "EXISTS (SELECT 1 FROM {t} WHERE written_at IS NULL) AS unstamped"
)


class SqlJobIndex:
    """`JobIndex` in SQL, shared by the SQLite and PostgreSQL recorders; they supply
    `_transaction` (a cursor in a transaction of the recorder's datastore), `_tuples`, the
    placeholder `_p` and the (schema-qualified) `_table`."""

    _p = "?"
    _table = INDEX_TABLE

    def _sql(self, template: str) -> str:
        return (
            template.replace("{t}", self._table).replace("{n}", INDEX_TABLE).replace("{p}", self._p)
        )

    def _transaction(self, *, commit: bool) -> AbstractContextManager[Any]:
        raise NotImplementedError

    def _tuples(self, cursor: Any) -> list[tuple[Any, ...]]:
        raise NotImplementedError

    def _serialize_writes(self, cursor: Any) -> None:
        """Make the rest of this write transaction wait for the one before it to end,
        so that stamps taken next follow the order of the commits. SQLite has one writer
        at a time already (a transaction that wrote holds the file's write lock)."""

    def _lock_rows(self, cursor: Any, keys: Sequence[str]) -> None:
        """Wait for the rows of `keys` before `_serialize_writes`, so that a row another
        session holds (a long transaction, an open psql) holds up only the writes of its
        own job, not every write of the store behind this one's turn. SQLite has one
        writer at a time already."""

    def _stamp(self, cursor: Any, clock: Callable[[], float]) -> float:
        """This transaction's `written_at`, in it, after its events were written: past
        every stamp committed before it. Every writer before it has committed by now
        (`_serialize_writes`), and none after it stamps until it has, so a reader that
        sees a stamp sees every earlier one: a walk by (written_at, key) never passes a
        row that is still to come."""
        self._serialize_writes(cursor)
        # A row with none was stored by a daemon of an earlier release (its upsert names
        # no such column) during a rolling upgrade, after this store was opened: unlisted
        # (the listing pages by it) until stamped, here, as stored now. Looked for in the
        # statement that reads the last stamp (the index serves both): none is found at
        # almost every write, which then makes no UPDATE, a statement (on PostgreSQL a
        # round trip) fewer a commit. One stored after the look is stamped by the next
        # write, as one stored after the UPDATE always was.
        cursor.execute(self._sql(_LAST_STAMP), [])
        rows = self._tuples(cursor)
        last, unstamped = rows[0] if rows else (None, False)
        stamp = next_stamp(clock, None if last is None else float(last))
        if unstamped:
            cursor.execute(
                self._sql("UPDATE {t} SET written_at = {p} WHERE written_at IS NULL"), [stamp]
            )
        return stamp

    def _write_rows(self, cursor: Any, kwargs: Mapping[str, Any]) -> None:
        """The index rows passed beside the events, stamped, in their transaction."""
        rows = rows_from(kwargs)
        if rows:
            self._lock_rows(cursor, sorted({row.key for row in rows}))
            stamp = self._stamp(cursor, clock_from(kwargs))
            cursor.executemany(self._sql(UPSERT), stamped(rows, stamp))
        check_guard(kwargs)

    def _fetch(self, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        with self._transaction(commit=False) as cursor:
            cursor.execute(sql, list(params))
            return self._tuples(cursor)

    def _execute(self, sql: str, params: Sequence[Sequence[Any]]) -> None:
        with self._transaction(commit=True) as cursor:
            cursor.executemany(sql, [list(p) for p in params])

    def job_by_key(self, key: str) -> IndexRow | None:
        rows = self._fetch(self._sql(_SELECT + "WHERE key = {p}"), [key])
        return _row(rows[0]) if rows else None

    def job_by_message_id(self, message_id: str) -> IndexRow | None:
        rows = self._fetch(self._sql(_SELECT + "WHERE message_id = {p}"), [message_id])
        return _row(rows[0]) if rows else None

    def jobs_due(
        self, state: str, now: float, limit: int, scopes: ScopeFilter | None = None, held: Held = ()
    ) -> list[IndexRow]:
        owned, params = ("", []) if scopes is None else self._scope_sql(scopes)
        waiting, waiting_params = self._held_sql(held, now)
        rows = self._fetch(
            self._sql(
                _SELECT
                + "WHERE state = {p} AND due_at IS NOT NULL AND due_at <= {p} "
                + owned
                + waiting
                + "ORDER BY due_at LIMIT {p}"
            ),
            [state, now, *params, *waiting_params, limit],
        )
        return [_row(r) for r in rows]

    def _held_sql(self, held: Sequence[WatchHold], now: float) -> tuple[str, list[Any]]:
        """`AND NOT (...)`, the rows one of `held` holds (`WatchHold.holds`), and its
        parameters. The database still passes over them in the (state, due_at) range,
        but a tick reads none: a NULL (a row no hold can speak for) holds nothing."""
        if not held:
            return "", []
        clauses: list[str] = []
        params: list[Any] = []
        for hold in held:
            clause = "channel = {p} AND " + self._member("watch_mailbox")
            params += [hold.channel, self._members(hold.mailboxes)]
            if hold.after is not None:
                clause += " AND watch_until > {p}"
                params.append(hold.after)
            clauses.append(f"({clause})")
        return (
            "AND NOT COALESCE(due_at >= watch_until AND other_due_at > {p} AND ("
            + " OR ".join(clauses)
            + "), FALSE) ",
            [now, *params],
        )

    def _member(self, column: str) -> str:
        """`column` is one of a list given as one parameter (`_members`): SQLite reads a
        JSON array, PostgreSQL an array."""
        return f"{column} IN (SELECT value FROM json_each({{p}}))"

    def _members(self, values: Sequence[str]) -> Any:
        return json.dumps(list(values))

    def _scope_sql(self, scopes: ScopeFilter) -> tuple[str, list[Any]]:
        """`AND (...)`, the rows `scopes` matches, and its parameters: one per list,
        however many mailboxes a daemon owns."""
        clauses = [f"NOT {self._member('channel')}"]
        params: list[Any] = [self._members(scopes.known)]
        for group in scopes.groups:
            clause = self._member("channel")
            params.append(self._members(group.channels))
            if group.mailboxes is not None:
                clause += " AND " + self._member("mailbox")
                params.append(self._members(group.mailboxes))
            if group.attempted_on is not None:
                clause += " AND (attempt_provider IS NULL OR attempt_provider = {p})"
                params.append(group.attempted_on)
            clauses.append(f"({clause})")
        return "AND (" + " OR ".join(clauses) + ") ", params

    def scopes_due(self, states: Sequence[str], before: float) -> list[DueScope]:
        if not states:
            return []
        # A range of the (state, due_at) index per state: what is due, not the history.
        placeholders = ", ".join(["{p}"] * len(states))
        rows = self._fetch(
            self._sql(
                "SELECT DISTINCT channel, mailbox, attempt_provider FROM {t} "
                f"WHERE state IN ({placeholders}) AND due_at <= {{p}}"
            ),
            [*states, before],
        )
        return [
            (str(c), None if m is None else str(m), None if p is None else str(p))
            for c, m, p in rows
        ]

    def without_mailbox(self, states: Sequence[str], limit: int) -> list[tuple[str, int]]:
        if not states:
            return []
        placeholders = ", ".join(["{p}"] * len(states))
        rows = self._fetch(
            self._sql(
                f"SELECT key, version FROM {{t}} WHERE state IN ({placeholders}) "
                "AND due_at IS NOT NULL AND (mailbox IS NULL OR attempt_provider IS NULL) "
                "LIMIT {p}"
            ),
            [*states, limit],
        )
        return [(str(key), int(version)) for key, version in rows]

    def set_mailboxes(self, mailboxes: Sequence[tuple[str, int, str, str]]) -> None:
        if mailboxes:
            self._execute(
                self._sql(
                    "UPDATE {t} SET mailbox = COALESCE(mailbox, {p}), "
                    "attempt_provider = COALESCE(attempt_provider, {p}) "
                    "WHERE key = {p} AND version = {p} "
                    "AND (mailbox IS NULL OR attempt_provider IS NULL)"
                ),
                [
                    (mailbox, provider, key, version)
                    for key, version, mailbox, provider in mailboxes
                ],
            )

    def without_other_due(self, after_key: str, limit: int) -> list[str]:
        # A range of the partial index on watch_until: what is watched, not the history.
        rows = self._fetch(
            self._sql(
                "SELECT key FROM {t} WHERE watch_until >= {p} AND other_due_at IS NULL "
                "AND key > {p} ORDER BY key LIMIT {p}"
            ),
            [0.0, after_key, limit],
        )
        return [str(key) for (key,) in rows]

    def set_other_dues(self, dues: Sequence[tuple[str, int, float]]) -> None:
        if dues:
            self._execute(
                self._sql(
                    "UPDATE {t} SET other_due_at = {p} "
                    "WHERE key = {p} AND version = {p} AND other_due_at IS NULL"
                ),
                [(value, key, version) for key, version, value in dues],
            )

    def find(
        self, where: JobFilter = ALL_JOBS, *, after_key: str | None = None, limit: int = 1000
    ) -> list[IndexRow]:
        clauses, params = _filter_sql(where)
        if after_key is not None:
            clauses.append("key > {p}")
            params.append(after_key)
        if where.state is None and where.updated_from is not None:
            # Every state, spelled out: "changed since T" is then a range of the
            # (state, updated_at) index per state, not a scan of every job ever stored.
            states = [state.value for state in JobState]
            clauses.append(f"state IN ({', '.join(['{p}'] * len(states))})")
            params.extend(states)
        sql = ("WHERE " + " AND ".join(clauses) + " ") if clauses else ""
        rows = self._fetch(self._sql(_SELECT + sql + "ORDER BY key LIMIT {p}"), [*params, limit])
        return [_row(r) for r in rows]

    def changed(
        self,
        where: JobFilter = ALL_JOBS,
        *,
        after: tuple[float, str] | None = None,
        limit: int = 100,
    ) -> list[IndexRow]:
        clauses, params = _filter_sql(where)
        if after is not None:
            # Spelled as a range then a tie-break (not a row-value comparison), so that
            # both backends bound the index search by the range.
            clauses.append("written_at >= {p} AND (written_at > {p} OR key > {p})")
            params.extend([after[0], after[0], after[1]])
        sql = ("WHERE " + " AND ".join(clauses) + " ") if clauses else ""
        rows = self._fetch(
            self._sql(_SELECT + sql + "ORDER BY written_at, key LIMIT {p}"), [*params, limit]
        )
        return [_row(r) for r in rows]

    def next_due(self, states: Sequence[str]) -> float | None:
        if not states:
            return None
        placeholders = ", ".join(["{p}"] * len(states))
        rows = self._fetch(
            self._sql(f"SELECT MIN(due_at) FROM {{t}} WHERE state IN ({placeholders})"),
            list(states),
        )
        value = rows[0][0] if rows else None
        return None if value is None else float(value)

    def purgeable(self, before: float, *, after_key: str | None, limit: int) -> list[IndexRow]:
        rows = self._fetch(
            self._sql(
                _SELECT
                + "WHERE key > {p} AND state IN ("
                + ", ".join(["{p}"] * len(PURGEABLE_STATES))
                + ") AND due_at IS NULL "
                "AND purged_at IS NULL AND updated_at < {p} ORDER BY key LIMIT {p}"
            ),
            [after_key or "", *PURGEABLE_STATES, before, limit],
        )
        return [_row(r) for r in rows]

    def watched(self) -> list[WatchedMailbox]:
        rows = self._fetch(
            self._sql(
                # A range of the partial index (a comparison implies NOT NULL): what is
                # watched, never the other rows. Each column named: PostgreSQL's rows come
                # by name, and two unnamed MIN()s would be one.
                "SELECT channel, watch_mailbox, COUNT(*) AS jobs, MIN(key) AS example_key, "
                "MIN(watch_until) AS first_until FROM {t} "
                "WHERE watch_until >= {p} "
                "GROUP BY channel, watch_mailbox ORDER BY channel, watch_mailbox"
            ),
            [0.0],
        )
        return [
            WatchedMailbox(str(c), str(m), int(n), str(k), None if u is None else float(u))
            for c, m, n, k, u in rows
            if m is not None
        ]

    def count_in_states(self, states: Sequence[str]) -> dict[str, int]:
        """Counts for the given states: a range of the (state, due_at) index each, so
        asking for the open states costs what is open, not what was ever stored."""
        if not states:
            return {}
        placeholders = ", ".join(["{p}"] * len(states))
        rows = self._fetch(
            self._sql(
                f"SELECT state, COUNT(*) FROM {{t}} WHERE state IN ({placeholders}) GROUP BY state"
            ),
            list(states),
        )
        counts = dict.fromkeys(states, 0)
        counts.update({str(state): int(count) for state, count in rows})
        return counts

    def count_by_state(self) -> dict[str, int]:
        rows = self._fetch(self._sql("SELECT state, COUNT(*) FROM {t} GROUP BY state"), [])
        return {str(state): int(count) for state, count in rows}

    def replace_all(self, rows: Iterable[IndexRow]) -> None:
        self._execute(self._sql("DELETE FROM {t}"), [[]])
        for batch in _batches(list(rows), 500):
            with self._transaction(commit=True) as cursor:
                cursor.executemany(
                    self._sql(UPSERT), stamped(batch, self._stamp(cursor, time.time))
                )

    def _has_events_sql(self) -> tuple[str, Callable[[str], Any]]:
        """A query `[param] -> a row when the job has events`, and the job_id -> param
        conversion (the events table's originator_id type differs by backend)."""
        raise NotImplementedError

    def _rewrite_sql(self) -> tuple[str, Callable[[Any], Any]]:
        """`UPDATE events SET state WHERE (originator_id, originator_version)` with the
        backend's placeholders, and the originator id -> param conversion."""
        raise NotImplementedError

    def _changed(self, cursor: Any) -> int:
        """Rows the cursor's last statement changed."""
        raise NotImplementedError

    def _events_of_query(self, job_ids: Sequence[str]) -> tuple[str, list[Any]]:
        """`SELECT originator_id, originator_version, topic, state` of the events of
        these jobs (ids as hex), in (job, version) order, with its parameters."""
        raise NotImplementedError

    def events_of(self, job_ids: Sequence[str]) -> list[StoredEvent]:
        """Every stored event of these jobs in one query (a dispatch wave's loads: one
        round trip instead of one per job), in (job, version) order."""
        if not job_ids:
            return []
        sql, params = self._events_of_query(job_ids)
        return [
            StoredEvent(
                originator_id=UUID(str(originator)),
                originator_version=version,
                topic=topic,
                state=bytes(state),
            )
            for originator, version, topic, state in self._fetch(sql, params)
        ]

    def _rewrite_events(self, cursor: Any, kwargs: Mapping[str, Any]) -> None:
        """The purge's rewrites (`ledger.stores.purge`), in the caller's transaction."""
        rewrites = rewrites_from(kwargs)
        if not rewrites:
            return
        sql, param = self._rewrite_sql()
        for event in rewrites:
            cursor.execute(sql, [event.state, param(event.originator_id), event.originator_version])
            if self._changed(cursor) != 1:
                raise RewriteFailed(event.originator_id, event.originator_version)

    def rebuild(self, rows: Sequence[IndexRow]) -> None:
        projected = {row.key for row in rows}
        has_events, param = self._has_events_sql()
        with self._transaction(commit=True) as cursor:
            # A row it replaces keeps when it was stored (REBUILD_UPSERT); one it adds
            # (its job's row was lost) has none until the last step below. Only the rows
            # that differ from their projection (lost, damaged) are written: an upsert
            # locks its row until the commit, and a live daemon's next write of that job
            # (its claim before the send) waited for the whole rebuild.
            for batch in _batches(rows, 500):
                marks = ", ".join(["{p}"] * len(batch))
                cursor.execute(
                    self._sql(_SELECT + f"WHERE key IN ({marks})"), [r.key for r in batch]
                )
                stored = {row.key: row for row in map(_row, self._tuples(cursor))}
                wrong = [row for row in batch if stored.get(row.key) != row]
                if wrong:
                    cursor.executemany(self._sql(REBUILD_UPSERT), stamped(wrong, None))
            cursor.execute(self._sql("SELECT key, job_id FROM {t}"), [])
            orphans: list[str] = []
            for key, job_id in self._tuples(cursor):
                if key not in projected:
                    cursor.execute(has_events, [param(job_id)])
                    if not self._tuples(cursor):
                        orphans.append(key)
            for batch in _batches(orphans, 500):
                cursor.executemany(
                    self._sql("DELETE FROM {t} WHERE key = {p}"), [[k] for k in batch]
                )
            # Stamped last (`_stamp` gives the stamp to every row without one): its lock
            # (PostgreSQL: `_serialize_writes`) is held from the stamp to the commit, and a
            # rebuild of a large store takes minutes; taken first, it held every live
            # daemon's write that long (a claim before its send refused as 'store locked'
            # after Ledger.store_wait).
            self._stamp(cursor, time.time)


def _filter_sql(where: JobFilter) -> tuple[list[str], list[Any]]:
    """The WHERE clauses (placeholders as {p}) and parameters of a filter."""
    clauses: list[str] = []
    params: list[Any] = []
    for clause, value in (
        ("state = {p}", where.state),
        ("channel = {p}", where.channel),
        ("updated_at >= {p}", where.updated_from),
        ("updated_at < {p}", where.updated_to),
        ("written_at >= {p}", where.written_from),
    ):
        if value is not None:
            clauses.append(clause)
            params.append(value)
    return clauses, params


def _batches(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


__all__ = [
    "ADDED_COLUMNS",
    "ADDED_INDEXES",
    "ATTEMPT_PROVIDER_BACKFILL",
    "COLUMNS",
    "CREATE_STATEMENTS",
    "INDEX_CLOCK_KWARG",
    "INDEX_CONNECT_KWARG",
    "INDEX_GUARD_KWARG",
    "INDEX_ROWS_KWARG",
    "INDEX_TABLE",
    "NOTHING_ELSE",
    "PURGEABLE_STATES",
    "REBUILD_UPSERT",
    "UPSERT",
    "DueScope",
    "Held",
    "IndexRow",
    "JobIndex",
    "ScopeFilter",
    "ScopeGroup",
    "SqlJobIndex",
    "WatchHold",
    "WatchedMailbox",
    "Withdrawn",
    "attempt_provider_of",
    "check_guard",
    "clock_from",
    "index_row",
    "mailbox_digest",
    "missing_indexes",
    "next_stamp",
    "other_due",
    "rows_from",
    "stamped",
]
