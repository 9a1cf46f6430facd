"""The Ledger application: send jobs stored as events, with the job index beside them.

`Ledger` is the store port the daemon uses. It holds no SQL and no driver: the backend
of its store URL (`ledger.stores`: SQLite, PostgreSQL or memory) supplies the recorder
that writes each job's index row with its events, and says which errors are transient.
Reads of many jobs or events are iterators that page internally.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import hmac
import os
import random
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast
from uuid import UUID

from eventsourcing.application import (
    AggregateNotFoundError,
    Application,
    ProcessingEvent,
    project_aggregate,
)
from eventsourcing.persistence import IntegrityError, PersistenceError
from eventsourcing.utils import Environment, EnvType

from ledger.addresses import mailbox_key
from ledger.content import JobContent
from ledger.exceptions import Refusal, SendledgerError, of_type
from ledger.job import SendJob, TransitionError, created_at, job_id_for
from ledger.message_id import message_id_for
from ledger.own_writes import OwnWrites
from ledger.redaction import ENCRYPTED, quoted_texts, redact_events, scrub_text, scrubber
from ledger.stores import IdentityLock, IdentityTaken, StoreBackend, backend_for
from ledger.stores.causes import (
    StoreUnavailable,
    UnsureConflict,
    access_denied,
    read_only,
    store_problem,
)
from ledger.stores.cipher import cipher_env
from ledger.stores.format_rows import FormatRow
from ledger.stores.index import (
    INDEX_CLOCK_KWARG,
    INDEX_CONNECT_KWARG,
    INDEX_GUARD_KWARG,
    INDEX_ROWS_KWARG,
    DueScope,
    IndexRow,
    JobFilter,
    JobIndex,
    ScopeFilter,
    WatchedMailbox,
    WatchHold,
    attempt_provider_of,
    index_row,
    other_due,
)
from ledger.stores.keycheck import (
    SETTING,
    KeyCheck,
    KeyChecks,
    StoreKeyRefused,
    digest_check,
    digest_secret,
    judge_store_key,
    refuse_unfinished_copy,
)
from ledger.stores.library_env import refuse_library_variables
from ledger.stores.private_api import UNNUMBERED_KWARG, notify, pass_to_recorder, record
from ledger.stores.purge import REWRITES_KWARG
from ledger.stores.unchanged import TAKES_TURN_KWARG, UNCHANGED_KWARG, Unchanged
from ledger.stores.url import StoreSpec, parse_store_url
from ledger.vocabulary import OPEN_STATES, EscalationReason, JobState, Sender

if TYPE_CHECKING:
    from ledger.provider_handle import ProviderHandle
    from ledger.stores.key_ring import KeyRingCipher
    from ledger.stores.loaded_policies import LoadedPolicyStore
    from ledger.stores.positions import PositionStore
    from ledger.stores.scopes import ScopeLeaseStore

Clock = Callable[[], datetime]
T = TypeVar("T")


#: The wall clock (UTC), the Ledger's unless given another. The standard library's own
#: callable: the store reads the clock inside its write (`INDEX_CLOCK_KWARG`), and a
#: function here would have the store call back into the Ledger.
utcnow: Clock = functools.partial(datetime.now, UTC)


class KeyConflict(SendledgerError):
    """The key is known with other content; the stored job was left as it was. `field`
    is the first field that differs, when the stored content is still there (not
    purged)."""

    kind = Refusal.CONFLICT

    def __init__(
        self,
        key: str,
        stored_hash: str,
        submitted_hash: str,
        field: str | None = None,
        *,
        places: tuple[int, int] | None = None,
    ) -> None:
        differs = f": its {field} differs" if field else ""
        if places is not None:
            # Two jobs of one list, nothing stored under the key: "already exists" would
            # send the operator to a job that `status` says is not there.
            first, second = places
            message = (
                f"key {key!r} is given twice in the list with other content{differs} "
                f"(job[{first}] {stored_hash[:19]}, job[{second}] {submitted_hash[:19]}); "
                "nothing was written: a new message needs a new key"
            )
        else:
            message = (
                f"key {key!r} already exists with other content{differs} "
                f"(stored {stored_hash[:19]}, submitted {submitted_hash[:19]}); "
                "a new message needs a new key"
            )
        super().__init__(message)
        self.key = key
        self.field = field


class UnknownJob(SendledgerError):
    kind = Refusal.NOT_FOUND

    def __init__(self, key: str) -> None:
        super().__init__(f"no job with key {key!r}")
        self.key = key


class ConcurrentUpdate(SendledgerError):
    """Another writer appended to the job first (optimistic concurrency)."""


@dataclass(frozen=True)
class PurgeResult:
    purged: int
    skipped: int  # changed while the purge ran: left for the next one
    scrubbed: bool  # the backend's files were scrubbed (False: at the next purge)


@dataclass(frozen=True)
class Proved:
    """The intake's proof of the messages of a submission: the time it rendered them at,
    from which each new job's creation comes (`ledger/job.py: created_at`, and so its
    Date), and the writer that proved them (`ledger/message.py: writer_fingerprint`),
    recorded as the job's `proved_by`."""

    at: datetime
    writer: str


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
class WriteFailure:
    """The last write of events that the store refused for a reason of its own
    (`StoreUnavailable`: read-only, disk full, locked), and when: `/healthz` reports the
    store failing while it stands, since its read-only check still passes."""

    at: datetime
    error: str


class Ledger(Application[UUID]):
    """The send jobs of one store. A context manager: `with Ledger(url) as ledger:`
    closes it on the way out.

    Times given to and returned by the index reads are aware datetimes (UTC) or, where
    said, epoch seconds; states are `JobState` members or their plain strings.
    """

    name = "sendledger"
    # The ledger must see other daemons' writes: no aggregate cache.
    env = {"AGGREGATE_CACHE_MAXSIZE": "", "IS_SNAPSHOTTING_ENABLED": "n"}
    #: Rows or events read per query by the iterators (`jobs`, `job_events`, `job_ids`).
    page_size = 500
    #: What the index's digests of addresses are keyed with (None: a plain store).
    _digest: bytes | None = None
    #: Seconds a store call keeps trying while the store is locked (each try waits its
    #: own lock wait: SQLite's busy handler, PostgreSQL's `[store] lock_timeout`): no try
    #: begins after this, so a lock never released fails the call in about a minute, not
    #: after 20 tries of 30 s (docs/configuration.md "The store: SQLite or PostgreSQL").
    store_wait = 60.0
    #: The last write of events refused by the store; a write that succeeds clears it.
    write_failure: WriteFailure | None = None
    _loaded_policies: LoadedPolicyStore | None = None

    def __init__(
        self,
        store: str | StoreSpec,
        *,
        base_dir: Path | None = None,
        clock: Clock = utcnow,
        encryption_keys: Sequence[str] = (),
        environ: Mapping[str, str] | None = None,
        copying: bool = False,
    ) -> None:
        """`encryption_keys`: event state is compressed and encrypted with the first,
        read with any of them (`ledger.stores.cipher`); none: stored as plain JSON.
        `copying`: the destination of `admin copy-store`, opened before its key checks
        are there (they are the source's, copied first): nothing is judged or written at
        open, `judge_copied_keys` judges them once copied, and an unfinished copy opens.

        LibraryVariableSet when `environ` (default: the process's) sets one of
        eventsourcing's own variables (`ledger.stores.library_env`)."""
        refuse_library_variables(os.environ if environ is None else environ)
        spec = parse_store_url(store, base_dir=base_dir) if isinstance(store, str) else store
        self.store = spec
        self.clock = clock
        #: The event format row this process declared as a server (an API server at its
        #: open, a daemon once it holds its name: `ledger.event_format.check_event_format`):
        #: its stop removes that row, and not one another server wrote later under the
        #: same name.
        self.format_declaration: FormatRow | None = None
        #: The row of the same holder that declaration replaced (the name's earlier
        #: process's), put back when the start is refused (`give_back_declaration`).
        self.format_replaced: FormatRow | None = None
        self._backend: StoreBackend = backend_for(spec)
        #: This process's saves that failed unsure (`ledger.own_writes`).
        self._own_writes = OwnWrites()
        env = dict(self._backend.env)
        env.update(cipher_env(encryption_keys))
        exists = self._backend.prepare()
        if exists:
            env["CREATE_TABLE"] = "n"  # the tables exist: opening runs no DDL
        # Several processes may create the tables at once; what collides is tried again,
        # no try begun `store_wait` after the first (a lock held for good).
        give_up = time.monotonic() + self.store_wait
        for attempt in range(10):
            try:
                super().__init__(env=env)
                break
            except Exception as exc:
                again = self._backend.is_setup_race(exc) and time.monotonic() < give_up
                if attempt == 9 or not again:
                    problem = self._problem(exc)
                    if problem is not None:
                        raise StoreUnavailable(spec.describe(), problem, exc) from exc
                    raise
                time.sleep(random.uniform(0.05, 0.2) * (attempt + 1))
        try:
            if not copying:
                self._check_store_key()
            if exists:
                self._backend.upgrade()  # only a store whose key fits is changed
        except Exception as exc:
            self.close()
            problem = self._problem(exc)
            if problem is not None:  # an upgrade's lock wait, say: one line as elsewhere
                raise StoreUnavailable(spec.describe(), problem, exc) from exc
            raise
        except BaseException:
            self.close()
            raise

    # -- the store's key (ledger.stores.keycheck) ---------------------------------------

    def _key_ring(self) -> KeyRingCipher | None:
        """The configured key ring; None for a plain store."""
        if self.mapper.cipher is not None:  # a store with keys: the cipher is loaded
            from ledger.stores.key_ring import KeyRingCipher

            if isinstance(self.mapper.cipher, KeyRingCipher):
                return self.mapper.cipher
        return None

    def judge_copied_keys(self) -> None:
        """On a copy's destination (`copying=True`), once the source's key checks are
        in: StoreKeyRefused when the configured keys do not fit them, else the index's
        digests keyed as the source's are. Nothing is written: the rows are the source's."""
        checks = cast(KeyChecks, self.recorder)
        cipher = self._key_ring()
        found = self._retry_locked(checks.key_checks)
        if self._judge(found, cipher) is not None:  # the source's open wrote it: other keys
            raise StoreKeyRefused(
                f"{SETTING}: the keys in the file are not those {self.store.describe()} "
                "was copied with"
            )
        self._digest = digest_secret(found, cipher)

    def _check_store_key(self) -> None:
        """StoreKeyRefused, before anything is written, when the configured keys do not
        fit the store; else the store's key checks are completed (a new store's, an old
        store's first, a new first key's). UnfinishedCopy for a copy never verified."""
        checks = cast(KeyChecks, self.recorder)
        cipher = self._key_ring()
        for _ in range(3):
            found = self._retry_locked(checks.key_checks)
            refuse_unfinished_copy(found, where=self.store.describe())
            add = self._judge(found, cipher)
            if add is None:
                secret = digest_secret(found, cipher)
                keep = digest_check(found, cipher, secret, time.time())
                # The first key keeps the secret past the old keys. Written by the first
                # open that can: a store only read (a read-only file or role) still opens.
                with contextlib.suppress(PersistenceError):  # bookkeeping: never fatal
                    if keep is not None:
                        self._retry_locked(
                            lambda check=keep: checks.add_key_check(check),  # type: ignore[misc]
                            setup=True,
                        )
                self._digest = secret
                return
            try:
                self._retry_locked(
                    lambda check=add: checks.add_key_check(check),  # type: ignore[misc]
                    setup=True,
                )
            except PersistenceError as exc:
                # The keys fit (judged above); what a read-only file or role cannot write
                # is written by the first open that can, and this one writes nothing.
                # Any other failure stands: a creator must be judged against the other.
                if not read_only(exc):
                    raise
                self._digest = digest_secret(found, cipher)
                return
            # Judged again: another process may have written the store's check first.
        raise ConcurrentUpdate("the store's key checks kept changing while it was opened")

    def _judge(self, found: list[KeyCheck], cipher: KeyRingCipher | None) -> KeyCheck | None:
        """`judge_store_key` on this store's rows `found`."""
        return judge_store_key(
            found,
            cipher,
            where=self.store.describe(),
            sample=self._sample_states,
            readable=self._readable,
            now=time.time(),
        )

    def _sample_states(self) -> list[bytes]:
        """Stored states spread over the event log: the first, the last and seven between
        (a store from before key checks proves its configuration on them)."""
        last = self._retry_locked(self.recorder.max_notification_id) or 0
        states: list[bytes] = []
        for start in sorted({1, last, *(1 + (last - 1) * i // 8 for i in range(1, 8))}):
            if start < 1:
                continue
            page = self._retry_locked(
                lambda s=start: self.recorder.select_notifications(start=s, limit=1)  # type: ignore[misc]
            )
            states.extend(n.state for n in page)
        return states

    def _readable(self, state: bytes) -> bool:
        """Whether this ledger's cipher, compressor and transcoder read a stored state."""
        mapper = self.mapper
        try:
            data = mapper.cipher.decrypt(state) if mapper.cipher else state
            data = mapper.compressor.decompress(data) if mapper.compressor else data
            mapper.transcoder.decode(data)
        except Exception:
            return False
        return True

    def construct_env(self, name: str, env: EnvType | None = None) -> Environment:
        """The class's settings and `env`, never the process environment: eventsourcing's
        own would merge `os.environ` under them (`ledger.stores.library_env`)."""
        settings = dict(type(self).env)
        settings.update(env or {})
        return Environment(name, settings)

    @property
    def _index(self) -> JobIndex:
        # Each backend's recorder answers the index queries beside the events.
        return cast(JobIndex, self.recorder)

    # -- reading ----------------------------------------------------------------------

    def get_job(self, key: str) -> SendJob:
        try:
            job: object = self._retry_locked(
                lambda: self.repository.get(job_id_for(key), projector_func=project_events)
            )
        except AggregateNotFoundError:
            raise UnknownJob(key) from None
        return of_type(job, SendJob, f"the aggregate stored for job {key}")

    def get_jobs(self, keys: Sequence[str]) -> dict[str, SendJob]:
        """The jobs of `keys` that exist, by key: read in one query where the backend's
        recorder offers it (`events_of`, the SQL stores), else one by one."""
        events_of: Callable[[list[str]], list[Any]] | None = getattr(
            self.recorder, "events_of", None
        )
        if events_of is None:
            return {key: job for key in keys if (job := self.find_job(key)) is not None}
        by_id = {job_id_for(key): key for key in keys}
        stored = self._retry_locked(lambda: events_of([job_id.hex for job_id in by_id]))
        histories: dict[UUID, list[Any]] = {}
        for event in stored:
            histories.setdefault(event.originator_id, []).append(self.mapper.to_domain_event(event))
        jobs = {}
        for job_id, events in histories.items():
            projected: object = project_events(None, events)
            if isinstance(projected, SendJob):
                jobs[by_id[job_id]] = projected
        return jobs

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

    def save_job(
        self,
        job: SendJob,
        *,
        guard: Callable[[], bool] | None = None,
        keep_trying: Callable[[], bool] | None = None,
        connect_while: Callable[[], bool] | None = None,
        unchanged: Unchanged | None = None,
    ) -> None:
        """Append the job's pending events and its index row in one transaction.

        Raises ConcurrentUpdate when another writer got there first: the caller's
        command did not happen and must not be acted on (e.g. no provider call). Events
        of this process's own that a save of the job which failed (a commit whose answer
        was lost) stored after all are no other writer's: read back, they are adopted as
        stored and the rest is written on them (docs/architecture.md "Ambiguous commits").
        `guard()`: asked in the transaction once the job's row is held, right before the
        commit; False rolls it back and raises `Withdrawn` (nothing stored, the events
        stay pending). `keep_trying()`: asked before a try after a failed one (a lock
        waited for in vain); False ends the save with that failure, the events pending.
        `connect_while()`: asked while the save waits for a pooled connection
        (PostgreSQL); False gives the wait up with `Withdrawn`, nothing begun.
        `unchanged`: the record the decision was made on, as read (`handle_unmarked`);
        read again in the transaction right before the commit, on its own connection,
        and changed since, the save rolls back with `Changed` (ledger/stores/unchanged.py)."""
        while True:  # each adoption leaves fewer events pending
            try:
                self._save_retrying([job], guard, keep_trying, connect_while, unchanged)
                return
            except IntegrityError as exc:
                if not self._adopt_own_write(job):
                    changed = f"job {job.key!r} was changed by another writer"
                    raise ConcurrentUpdate(changed) from exc
            if not job.pending_events:
                self._own_writes.saved(job.key)
                return

    def stored_after_unsure(self, job: SendJob) -> bool:
        """After a save of `job` that raised with its commit not known (the COMMIT's
        answer lost, the store's tries given up), whether its pending events are stored:
        read back past the job's version, this process's own (`ledger.own_writes`) are
        adopted as stored, no longer pending, and True. False when they are not all
        there: nothing stored past the version (the save did not happen; its events stay
        pending), or another writer's events. A read that fails twice raises."""
        pending = job.pending_events
        if not pending:
            return True
        base = pending[0].originator_version - 1
        # Two tries, not `store_wait`'s: the save has waited that long already, and a
        # store still down leaves the claim to its deadline's recovery, as before.
        read = lambda: list(self.events.get(job.id, gt=base))  # noqa: E731
        stored = self._retry_locked(read, attempts=2)
        adopted = self._own_writes.stored_of_ours(job.key, pending, stored)
        if adopted < len(pending):
            return False  # a save stores all of its events or none: not this one's
        del pending[:adopted]
        self._own_writes.saved(job.key)
        return True

    def _adopt_own_write(self, job: SendJob) -> bool:
        """After a conflict: whether the events stored past the job's version are the
        first of its pending ones, written by a save of this process that failed unsure
        (`ledger.own_writes`); if so they are no longer pending (the job's version stays
        where they took it) and True."""
        pending = job.pending_events
        if not pending or not self._own_writes.any_of(job.key):
            return False  # nothing of ours unsure: another writer's, with no read
        base = pending[0].originator_version - 1
        stored = self._retry_locked(lambda: list(self.events.get(job.id, gt=base)))
        adopted = self._own_writes.stored_of_ours(job.key, pending, stored)
        del pending[:adopted]
        return adopted > 0

    def save_jobs(
        self,
        jobs: Sequence[SendJob],
        *,
        keep_trying: Callable[[], bool] | None = None,
        connect_while: Callable[[], bool] | None = None,
    ) -> None:
        """`save_job` for several jobs in one transaction: all their events and index
        rows, or nothing. ConcurrentUpdate when another writer appended to any of them
        first; then none is saved and every job keeps its pending events, so each can be
        saved again alone (`daemon/engine/commit.py`). `keep_trying` and `connect_while`
        as `save_job`'s."""
        try:
            self._save_retrying(jobs, keep_trying=keep_trying, connect_while=connect_while)
        except IntegrityError as exc:
            raise ConcurrentUpdate("one of the jobs was changed by another writer") from exc

    def _save_retrying(
        self,
        jobs: Sequence[SendJob],
        guard: Callable[[], bool] | None = None,
        keep_trying: Callable[[], bool] | None = None,
        connect_while: Callable[[], bool] | None = None,
        unchanged: Unchanged | None = None,
    ) -> None:
        # The events are collected once and only their recording is tried again: a save
        # tried again whole would find them already collected and write nothing (and the
        # caller would go on to send with no claim stored). The events, not the jobs, are
        # collected: a failed save leaves them pending on their jobs.
        processing: ProcessingEvent[UUID] = ProcessingEvent()
        # Our own events, appended as they are: ProcessingEvent.collect_events would ask
        # each whether it is an event or an aggregate with a runtime Protocol check, which
        # costs more than building the event (docs/performance.md "Performance and scaling").
        processing.events.extend(event for job in jobs for event in job.pending_events)
        pass_to_recorder(
            processing,
            **{
                INDEX_ROWS_KWARG: [self.index_row(j) for j in jobs],
                INDEX_CLOCK_KWARG: self.clock,
                INDEX_GUARD_KWARG: guard,
                INDEX_CONNECT_KWARG: connect_while,
                UNCHANGED_KWARG: unchanged,
                # No follower to notify: no notification ids read (private_api.py).
                UNNUMBERED_KWARG: True,
            },
        )

        def unsure() -> None:
            for job in jobs:
                self._own_writes.failed(job.key, job.pending_events)

        self._record_processing(processing, keep_trying, unsure)
        for job in jobs:
            job.collect_events()  # written: no longer pending
            self._own_writes.saved(job.key)

    def _save_collected(self, *objs: Any, **kwargs: Any) -> None:
        processing: ProcessingEvent[UUID] = ProcessingEvent()
        processing.collect_events(*objs, **kwargs)
        self._record_processing(processing)

    def _record_processing(
        self,
        processing: ProcessingEvent[UUID],
        keep_trying: Callable[[], bool] | None = None,
        unsure: Callable[[], None] | None = None,
    ) -> None:
        # Every write of events (a claim, an outcome, an intake) comes here: what the
        # store says of them is what health reports (a read may pass while writes fail).
        def once() -> list[Any]:
            try:
                return record(self, processing)
            except UnsureConflict:
                # Met after a try of the store's own whose commit is not known.
                if unsure is not None:
                    unsure()
                raise
            except IntegrityError:
                raise  # refused: nothing of it stored
            except Exception:
                # A try that failed otherwise may have committed (its answer lost).
                if unsure is not None:
                    unsure()
                raise

        try:
            recordings = self._retry_locked(once, keep_trying=keep_trying)
        except StoreUnavailable as exc:
            self.write_failure = WriteFailure(at=self.clock(), error=str(exc))
            raise
        self.write_failure = None
        notify(self, recordings)

    def submit(
        self, content: JobContent, sender: Sender, *, by: str = "", proved: Proved | None = None
    ) -> SubmitResult:
        """Idempotent on the key: same content is a no-op, other content a conflict.
        `proved`: how the intake proved the job's message (None: not through the intake).

        New keys are the common case, so the Requested event is written without a read
        first; the store's uniqueness on (job id, version 1) tells a known key apart."""
        job = self._request(content, sender, by, proved)
        try:
            self.save_job(job)
        except ConcurrentUpdate:
            # Known key (submitted earlier, or just now by another process).
            return self._same_or_conflict(self.get_job(content.key), content)
        return SubmitResult(job.key, job.message_id, job.state.value, created=True)

    def submit_many(
        self,
        jobs: Sequence[tuple[JobContent, Sender]],
        *,
        by: str = "",
        proved: Proved | None = None,
    ) -> list[SubmitResult]:
        """A batch, all or nothing, one result per item in order: a key given twice with
        other content, or known with other content, raises KeyConflict before anything is
        written; the new jobs are then written in one transaction. A writer that stores
        one of the keys in between fails that transaction whole, and the batch is checked
        again."""
        for _ in range(10):
            firsts: dict[str, tuple[int, JobContent]] = {}
            for place, (content, _sender) in enumerate(jobs):
                at, first = firsts.setdefault(content.key, (place, content))
                if first.content_hash != content.content_hash:
                    raise KeyConflict(
                        content.key,
                        first.content_hash,
                        content.content_hash,
                        first.first_difference(content),
                        places=(at, place),
                    )
            results: dict[str, SubmitResult] = {}
            new: list[SendJob] = []
            for index, (content, sender) in enumerate(jobs):
                if content.key in results:
                    continue
                stored = self.find_job(content.key)
                if stored is not None:
                    results[content.key] = self._same_or_conflict(stored, content)
                    continue
                job = self._request(content, sender, by, proved, index, len(jobs))
                new.append(job)
                results[content.key] = SubmitResult(
                    job.key, job.message_id, job.state.value, created=True
                )
            try:
                if new:
                    self._save_new(new)
            except IntegrityError:
                continue
            # A key given twice with the same content: the second is "already there".
            seen: set[str] = set()
            ordered = []
            for content, _sender in jobs:
                result = results[content.key]
                if content.key in seen:
                    result = dataclasses.replace(result, created=False)
                seen.add(content.key)
                ordered.append(result)
            return ordered
        raise ConcurrentUpdate("the batch kept meeting other writers; nothing was written")

    def _save_new(self, jobs: list[SendJob]) -> None:
        self._save_retrying(jobs)

    def _request(
        self,
        content: JobContent,
        sender: Sender,
        by: str = "",
        proved: Proved | None = None,
        index: int = 0,
        count: int = 1,
    ) -> SendJob:
        # A claim renders the content as the store gives it back: the proof counts for the
        # claim only when that is the very content the intake proved.
        same = proved is not None and JobContent.from_canonical(content.stored()) == content
        return SendJob.request(
            content,
            from_addr=sender.from_addr,
            message_id=message_id_for(content.key, sender.message_id_domain),
            policy=sender.policy,
            at=self.clock() if proved is None else created_at(proved.at, index, count),
            by=by,
            proved_by=proved.writer if proved is not None and same else "",
        )

    def _same_or_conflict(self, job: SendJob, content: JobContent) -> SubmitResult:
        if job.content_hash != content.content_hash:
            # A purged job holds no content to compare: then only the hashes are said.
            field = None if job.purged else job.content.first_difference(content)
            raise KeyConflict(content.key, job.content_hash, content.content_hash, field)
        return SubmitResult(job.key, job.message_id, job.state.value, created=False)

    def update(self, key: str, command: Callable[[SendJob], T]) -> tuple[SendJob, T]:
        """Load, run one command, save. TransitionError and ConcurrentUpdate propagate."""
        job = self.get_job(key)
        result = command(job)
        self.save_job(job)
        return job, result

    # -- retention ----------------------------------------------------------------------

    def purge(
        self, key: str, *, by: str, rule: str, changed_before: datetime | None = None
    ) -> SendJob:
        """Forget a settled job's content and keep its trail (`ledger.redaction`): its
        stored events are rewritten redacted in the transaction that appends Purged and
        updates its index row, so it is purged whole or not at all. `changed_before`: the
        cut-off the job was listed by (`purge_settled`), held against the events read.

        TransitionError when the job is not settled for good (confirmed, abandoned or
        cancelled, nothing due) or was purged already; ConcurrentUpdate when another writer
        changed it meanwhile, or last changed at or after `changed_before` (nothing was
        written)."""
        events = self.history(key)
        original: Any = project_aggregate(None, events)
        if changed_before is not None and original.modified_on >= changed_before:
            # Listed from the index as older, then changed (a person's check, a report):
            # the rule no longer takes it. The save below is on the version read, so
            # this still holds when the purge is written.
            raise ConcurrentUpdate(f"job {key!r} changed after the purge listed it")
        content = original.content
        original.purge(by=by, rule=rule, at=self.clock())  # refused before anything is built
        texts = quoted_texts(content)
        redacted = redact_events(events, content, texts)
        pattern = scrubber(texts)  # for the webhooks' errors: the same pattern
        # Before the events: a crash in between leaves the job to purge again (it is
        # settled), never a purged job whose text a webhook's last error still quotes.
        self._scrub_webhook_errors(pattern, texts)
        job: Any = project_aggregate(None, redacted)
        job.purge(by=by, rule=rule, at=self.clock())
        rewrites = [self.mapper.to_stored_event(event) for event in redacted]
        try:
            self._save_collected(
                *job.pending_events,
                **{
                    INDEX_ROWS_KWARG: [self.index_row(job)],
                    INDEX_CLOCK_KWARG: self.clock,
                    REWRITES_KWARG: rewrites,
                },
            )
        except IntegrityError as exc:
            raise ConcurrentUpdate(f"job {key!r} was changed by another writer") from exc
        job.collect_events()  # written: no longer pending
        # Again after: a delivery that read the event before this commit may have written
        # the receiver's echo of it since (the webhook worker reads after it writes).
        self._scrub_webhook_errors(pattern, texts)
        return of_type(job, SendJob, f"the aggregate stored for job {key}")

    def _scrub_webhook_errors(self, pattern: re.Pattern[str] | None, texts: list[str]) -> None:
        """A purge's scrub of the webhooks' last errors: a receiver's refusal, kept until
        a delivery succeeds, may echo the payload (`detail` quotes the provider's text)."""
        if pattern is None and not texts:
            return
        positions = self.positions()
        for row in positions.read_all():
            error = row.last_error
            for _ in range(3):  # a delivery failing meanwhile wrote another: read again
                if error is None or (scrubbed := scrub_text(error, pattern, texts)) == error:
                    break
                if positions.scrub_error(row.name, error, scrubbed):
                    break
                now = [r for r in positions.read_all() if r.name == row.name]
                error = now[0].last_error if now else None

    def purgeable(self, before: datetime) -> Iterator[IndexRow]:
        """The jobs a purge of what settled before `before` takes, in key order, read a
        page at a time (one pass over the index)."""
        at = _epoch(before)
        return self._key_pages(
            lambda after: self._index.purgeable(at, after_key=after, limit=self.page_size)
        )

    def purge_settled(
        self,
        before: datetime,
        *,
        by: str,
        rule: str,
        progress: Callable[[int], None] | None = None,
        stop: Callable[[], bool] = lambda: False,
    ) -> PurgeResult:
        """Purge every job settled for good before `before`, each in its own transaction
        (a crash leaves each job purged or intact); `progress` hears every 1000 jobs;
        `stop()` ends it early. A job that changed meanwhile is left for the next run
        (`skipped`); one another purger took meanwhile is neither purged nor skipped.
        Afterwards the backend scrubs its files (`StoreBackend.scrub`), also after a run
        that purged nothing: an earlier run's scrub that readers kept busy is finished
        by the next one (no process remembers it was left)."""
        purged = skipped = 0
        try:
            for row in self.purgeable(before):
                if stop():
                    break
                try:
                    self.purge(row.key, by=by, rule=rule, changed_before=before)
                except (ConcurrentUpdate, TransitionError):
                    # Taken meanwhile by another purger (a second daemon, `admin purge`):
                    # nothing is left for the next run. Any other change is.
                    now = self.row(row.key)
                    if now is None or now.purged_at is None:
                        skipped += 1
                    continue
                purged += 1
                if progress is not None and purged % 1000 == 0:
                    progress(purged)
        except BaseException:
            # What was purged before the error is scrubbed all the same; the error is
            # what the caller hears.
            if purged:
                with contextlib.suppress(Exception):
                    self.scrub()
            raise
        return PurgeResult(purged=purged, skipped=skipped, scrubbed=self.scrub())

    def scrub(self) -> bool:
        """After purges: make what they rewrote unreachable in the store's files as far as
        the backend can (`StoreBackend.scrub`). False when it could not finish now."""
        return self._backend.scrub()

    # -- the daemon's identity -----------------------------------------------------------

    def hold_identity(self, name: str) -> IdentityLock:
        """Hold the daemon name `name` on this store until `release()` or the process
        ends (a kill -9 too). IdentityTaken when another live daemon holds it;
        StoreUnavailable when a file's mode keeps the lock from being taken (SQLite's
        locks open the store file for writing)."""
        try:
            return self._backend.identity_lock(name)
        except OSError as exc:
            problem = self._problem(exc)
            if problem is None:
                raise
            raise StoreUnavailable(self.store.describe(), problem, exc) from exc

    # -- provider handles --------------------------------------------------------------

    def handle(self, provider: str) -> ProviderHandle | None:
        # Imported here: a command that reads jobs never reads a provider's handle.
        from ledger.provider_handle import ProviderHandle, handle_id_for

        handle_id = handle_id_for(provider)

        def read() -> object:
            # Inside the try of `_retry_locked`: a handle never written (a provider never
            # marked, read at every tick) is an answer, not an error to judge.
            try:
                return self.repository.get(handle_id)
            except AggregateNotFoundError:
                return None

        handle = self._retry_locked(read)
        if handle is None:
            return None
        return of_type(handle, ProviderHandle, f"the aggregate stored for handle {provider}")

    def handle_reliable(self, provider: str) -> bool:
        return self.handle_unmarked(provider) is not None

    def handle_unmarked(self, provider: str) -> Unchanged | None:
        """The provider's handle read now: None when marked unreliable, else the handle
        as read, which the save of a decision made on it holds to (`save_job`'s
        `unchanged`): a mark written after this read withdraws that save."""
        from ledger.provider_handle import handle_id_for

        handle = self.handle(provider)
        if handle is not None and not handle.reliable:
            return None
        return Unchanged(handle_id_for(provider), 0 if handle is None else handle.version)

    def mark_handle(
        self, provider: str, change: Callable[[ProviderHandle], None], *, attempts: int = 5
    ) -> ProviderHandle:
        """Apply `change` to the provider's handle record (created on first use)."""
        from ledger.provider_handle import ProviderHandle

        for attempt in range(attempts):
            handle = self.handle(provider) or ProviderHandle.register(provider, at=self.clock())
            change(handle)
            try:
                # In turn with the job writes: never between a save's read of the handle
                # (`handle_unmarked`, `save_job`'s `unchanged`) and that save's commit.
                self._save_collected(handle, **{TAKES_TURN_KWARG: True})
                return handle
            except IntegrityError:
                if attempt == attempts - 1:
                    raise
        raise AssertionError("unreachable")

    # -- the job index ------------------------------------------------------------------

    def row(self, key: str) -> IndexRow | None:
        return self._retry_locked(lambda: self._index.job_by_key(key))

    def row_by_message_id(self, message_id: str) -> IndexRow | None:
        return self._retry_locked(lambda: self._index.job_by_message_id(message_id))

    def watched(self) -> list[WatchedMailbox]:
        """The mailboxes, per channel, with confirmed jobs whose bounces are watched."""
        return self._retry_locked(self._index.watched)

    def due(
        self,
        state: JobState | str,
        now: datetime | float,
        limit: int,
        scopes: ScopeFilter | None = None,
        held: Sequence[WatchHold] = (),
    ) -> list[IndexRow]:
        """Up to `limit` jobs in `state` whose due time is at or before `now` (an aware
        datetime or epoch seconds), soonest first: what a tick works on. With `scopes`,
        only those of the quota scopes a daemon owns (docs/performance.md "Several
        daemons"); none of the bounce watches `held` says wait for a read."""
        at = _epoch(now)
        return self._retry_locked(lambda: self._index.jobs_due(str(state), at, limit, scopes, held))

    def scopes_due(self, before: datetime | float) -> list[DueScope]:
        """The distinct (channel, From mailbox, attempt provider) of the jobs with
        something due at or before `before`, in any state: the work a daemon's quota
        scopes have (docs/performance.md "Several daemons"). Mailbox None: a row of an
        earlier release not yet filled (`fill_mailboxes`). The provider is the one the
        job's last attempt was made on where its next calls go there (a channel moved to
        another provider since leaves them on the old one), "" where they go to its
        channel's provider, None where the row does not say (an earlier release's)."""
        at = _epoch(before)
        states = [state.value for state in JobState]
        return self._retry_locked(lambda: self._index.scopes_due(states, at))

    def fill_mailboxes(self, batch: int = 500) -> int:
        """Give every job with something due whose index row has no mailbox or no
        attempt provider (written by an earlier release) both, read from its events; how
        many. The daemon does it at start-up; `admin rebuild-index` fills every row."""
        states = [state.value for state in JobState]
        filled = 0
        before: list[tuple[str, int]] = []
        while True:
            listed = self._retry_locked(lambda: self._index.without_mailbox(states, batch))
            if not listed or listed == before:
                # None left, or only rows no write has moved since the last pass left them
                # (an index behind its events: `admin rebuild-index` fills those).
                return filled
            before = listed
            jobs = self.get_jobs([key for key, _ in listed])
            # Each row filled from the version it is at, and only while it still is: a
            # daemon of an earlier release (a rolling upgrade) may write the job meanwhile,
            # and its row's attempt provider is not the one of the version read. A row
            # whose job was written since it was listed is listed again. A row without
            # events (cannot happen, but must not loop forever) gets "".
            fills = [
                (key, version, self.mailbox_of(job.from_addr), attempt_provider_of(job))
                if (job := jobs.get(key)) is not None
                else (key, version, "", "")
                for key, version in listed
                if key not in jobs or jobs[key].version == version
            ]
            self._retry_locked(lambda f=fills: self._index.set_mailboxes(f))  # type: ignore[misc]
            filled += len(fills)

    def fill_other_dues(self, batch: int = 500) -> int:
        """Give every watched job whose index row does not say when anything else of it
        is due (written by an earlier release) that time (`index.other_due`), read from its
        events a page at a time; how many. The daemon does it at start-up, so a restart
        loads no waiting watch to learn it (docs/architecture.md "Bounces on the job");
        `admin rebuild-index` fills every row."""
        filled, after = 0, ""
        while True:
            keys = self._retry_locked(
                lambda a=after: self._index.without_other_due(a, batch)  # type: ignore[misc]
            )
            if not keys:
                return filled
            jobs = self.get_jobs(keys)
            # A row whose job another writer moved meanwhile is left as that write left it.
            dues = [(key, job.version, other_due(job)) for key, job in jobs.items()]
            self._retry_locked(lambda d=dues: self._index.set_other_dues(d))  # type: ignore[misc]
            filled += len(dues)
            after = keys[-1]

    def next_due(self, states: Iterable[JobState | str]) -> datetime | None:
        """The soonest due time of the jobs in `states`, or None."""
        names = [str(s) for s in states]
        value = self._retry_locked(lambda: self._index.next_due(names))
        return None if value is None else datetime.fromtimestamp(value, UTC)

    def counts(self, states: Iterable[JobState | str] | None = None) -> dict[str, int]:
        """Jobs per state: for each of `states` (0 for none), else for every state
        that has jobs (a scan of the whole index)."""
        if states is None:
            return self._retry_locked(self._index.count_by_state)
        names = [str(s) for s in states]
        return self._retry_locked(lambda: self._index.count_in_states(names))

    def open_counts(self) -> dict[str, int]:
        """Jobs per open state (requested, attempted, unknown, review, in that order):
        what is open, whatever the history holds."""
        return self.counts(OPEN_STATES)

    def jobs(
        self,
        state: JobState | str | None = None,
        channel: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
    ) -> Iterator[IndexRow]:
        """Index rows in key order, read a page at a time: those in `state`, of
        `channel`, last changed at or after `since` and before `until`."""
        where = JobFilter(
            state=None if state is None else str(state),
            channel=channel,
            updated_from=None if since is None else _epoch(since),
            updated_to=None if until is None else _epoch(until),
        )
        return self._key_pages(
            lambda after: self._index.find(where, after_key=after, limit=self.page_size)
        )

    def changed_jobs(
        self,
        *,
        state: JobState | str | None = None,
        channel: str | None = None,
        since: datetime | None = None,
        after: tuple[float, str] | None = None,
        limit: int = 100,
    ) -> list[IndexRow]:
        """One page of index rows in the order they were stored, (written_at, key): those
        in `state`, of `channel`, stored at or after `since`, after the position `after`
        (the last row seen's (written_at, key)). A job inserted or changed meanwhile sorts
        after every row already read, however long before its own times were taken (a
        batch's), so paging on misses no row and repeats none it had not changed."""
        where = JobFilter(
            state=None if state is None else str(state),
            channel=channel,
            written_from=None if since is None else _epoch(since),
        )
        return self._retry_locked(lambda: self._index.changed(where, after=after, limit=limit))

    def _key_pages(self, page_after: Callable[[str | None], list[IndexRow]]) -> Iterator[IndexRow]:
        """Index rows a page at a time in key order: `page_after(last key)` reads the next."""
        after: str | None = None
        while True:
            page = self._retry_locked(lambda a=after: page_after(a))  # type: ignore[misc]
            yield from page
            if len(page) < self.page_size:
                return
            after = page[-1].key

    def job_events(
        self,
        types: Iterable[str] | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        *,
        first: int = 1,
    ) -> Iterator[Any]:
        """The stored events of every job, oldest first, read a page at a time: those
        of the given SendJob event types (class names, e.g. "Escalated"), recorded at or
        after `since` and before `until`.

        `first`: the notification id to start reading at (`recent_start`).

        (Not `events`: that is eventsourcing's event store, `Application.events`.)"""
        topics = [] if types is None else [_event_topic(name) for name in types]
        prefix = SendJob.TOPIC + "."
        for notification in self._notifications(topics, start=first):
            if not notification.topic.startswith(prefix):
                continue  # e.g. a ProviderHandle's events
            event: Any = self.mapper.to_domain_event(notification)
            if (since is None or event.timestamp >= since) and (
                until is None or event.timestamp < until
            ):
                yield event

    def recent_start(self, since: datetime, slack: float = 600.0) -> int:
        """A notification id to read recent events from (`job_events(first=...)`): the
        first one recorded at or after `since` less `slack` seconds, found by bisecting
        the ids (they follow the order of recording; the slack covers writers whose clocks
        differ a little). A window of the last day then reads that day, not all history."""
        max_id = self._retry_locked(self.recorder.max_notification_id)
        low, high = 1, (max_id or 0) + 1
        edge = since.timestamp() - slack
        while low < high:
            middle = (low + high) // 2
            page = self._retry_locked(
                lambda m=middle: self.recorder.select_notifications(start=m, limit=1)  # type: ignore[misc]
            )
            if not page:
                high = middle
                continue
            event: Any = self.mapper.to_domain_event(page[0])
            if event.timestamp.timestamp() < edge:
                low = page[0].id + 1
            else:
                high = middle
        return low

    def job_ids(self) -> Iterator[UUID]:
        """The id of every stored job, each once, in the order they were created."""
        prefix = SendJob.TOPIC + "."
        for notification in self._notifications([]):
            # A job's first event (version 1) names it once, whatever its topic.
            if notification.originator_version == 1 and notification.topic.startswith(prefix):
                originator = notification.originator_id
                yield originator if isinstance(originator, UUID) else UUID(str(originator))

    def rebuild_index(self, progress: Callable[[int], None] | None = None) -> int:
        """Recreate the job index from the events; `progress` hears every 1000 jobs.

        Safe beside live daemons: the rows are written in one transaction, and a row a
        daemon wrote after its job was read here is newer and stays (`JobIndex.rebuild`)."""
        rows = sorted(self._projected_rows(progress), key=lambda r: r.key)
        self._retry_locked(lambda: self._index.rebuild(rows))
        return len(rows)

    def _projected_rows(self, progress: Callable[[int], None] | None) -> Iterator[IndexRow]:
        count = 0
        for aggregate_id in self.job_ids():
            job: object = self._retry_locked(lambda a=aggregate_id: self.repository.get(a))  # type: ignore[misc]
            if not isinstance(job, SendJob):
                continue
            count += 1
            yield self.index_row(job)
            if progress is not None and count % 1000 == 0:
                progress(count)

    # -- the event log, for webhooks (docs/http-api.md "Webhooks") ---------------------------------

    def positions(self) -> PositionStore:
        """Where each webhook has got to in the log (`ledger.stores.positions`)."""
        from ledger.stores.positions import positions_for

        return positions_for(self.recorder)

    def index_row(self, job: SendJob) -> IndexRow:
        """The job's row in this store's index (`ledger.stores.index.index_row`, the
        mailbox as `mailbox_of` writes it). On an encrypted store the reason, kept in the
        clear, has the job's recipients and subject taken out: a provider's refusal
        quotes the recipient ("550 5.1.1 <alice@...>"), and the events alone, encrypted,
        keep it whole (docs/configuration.md "Encryption at rest")."""
        row = index_row(job, self.mailbox_of(job.from_addr))
        # An escalation's reason is one of ours, which the review queue is filtered by:
        # kept as it is, whatever a subject happens to say.
        if row.reason and row.reason not in _OUR_REASONS and self.mapper.cipher is not None:
            pattern = scrubber(quoted_texts(job.content))
            if pattern is not None:
                row = dataclasses.replace(row, reason=pattern.sub(ENCRYPTED, row.reason))
        return row

    def mailbox_of(self, from_addr: str) -> str:
        """The index's `mailbox` of a From: its address, lower case
        (`ledger.addresses.mailbox_key`); on an encrypted store a digest of it keyed by
        the store's key, so that the index holds no address in the clear
        (docs/configuration.md "Encryption at rest"). Every daemon of the store, whatever
        its place in a key rotation, writes the same one for a mailbox."""
        mailbox = mailbox_key(from_addr)
        if self._digest is None or not mailbox:
            return mailbox
        digest = hmac.new(self._digest, mailbox.encode("utf-8"), hashlib.sha256)
        return "~" + digest.hexdigest()[:32]

    def scope_leases(self) -> ScopeLeaseStore:
        """Who owns each quota scope, by a lease (`ledger.stores.scopes`)."""
        from ledger.stores.scopes import scope_leases_for

        return scope_leases_for(self.recorder)

    def loaded_policies(self) -> LoadedPolicyStore:
        """What each running server has loaded of the policies (`ledger.stores.loaded_policies`):
        made once per Ledger (its recorder's backend does not change), since every
        submission reads it."""
        if self._loaded_policies is None:
            from ledger.stores.loaded_policies import loaded_policies_for

            self._loaded_policies = loaded_policies_for(self.recorder, self._backend.names_held)
        return self._loaded_policies

    def log_after(self, position: int, stop: int, limit: int, topics: Sequence[str]) -> list[Any]:
        """Up to `limit` notifications with ids in (position, stop] of these topics, in
        log order."""
        if stop <= position:
            return []
        return list(
            self._retry_locked(
                lambda: self.recorder.select_notifications(
                    start=position + 1, stop=stop, limit=limit, topics=list(topics)
                )
            )
        )

    def job_and_event_at(self, job_id: UUID, version: int) -> tuple[SendJob, Any]:
        """The job right after its event `version`, and that event, from one read of the
        store as it is now (redacted once the job was purged, whatever an earlier read of
        the log returned)."""
        events = self._retry_locked(lambda: list(self.events.get(job_id, lte=version)))
        if not events or events[-1].originator_version != version:
            raise UnknownJob(str(job_id))
        job = of_type(project_aggregate(None, events), SendJob, f"the events of job {job_id}")
        return job, events[-1]

    # -- helpers ----------------------------------------------------------------------

    def _notifications(self, topics: list[str], start: int = 1) -> Iterator[Any]:
        while True:
            page = self._retry_locked(
                lambda s=start: self.recorder.select_notifications(  # type: ignore[misc]
                    start=s, limit=self.page_size, topics=topics
                )
            )
            yield from page
            if not page:
                return
            start = page[-1].id + 1

    def _retry_locked(
        self,
        action: Callable[[], T],
        attempts: int = 20,
        *,
        setup: bool = False,
        keep_trying: Callable[[], bool] | None = None,
    ) -> T:
        """SQLite: the busy handler waits for writers, but a WAL snapshot conflict is
        reported at once. What the backend calls transient is tried again after a
        pause instead of surfacing; with `setup`, so is meeting another process's
        creation of the same table. No try begins `store_wait` seconds after the first,
        nor once `keep_trying()` says no."""
        give_up = time.monotonic() + self.store_wait
        for attempt in range(attempts):
            try:
                return action()
            except Exception as exc:
                transient = self._backend.is_retryable(exc) or (
                    setup and self._backend.is_setup_race(exc)
                )
                stop = not transient or time.monotonic() >= give_up or attempt == attempts - 1
                if stop or (keep_trying is not None and not keep_trying()):
                    # A read-only file or role, a full disk, a lock never released: one
                    # line naming the store and why, not the driver's bare error
                    # (docs/cli.md "Exit codes").
                    problem = self._problem(exc)
                    if problem is not None:
                        raise StoreUnavailable(self.store.describe(), problem, exc) from exc
                    raise
                time.sleep(random.uniform(0.01, 0.05) * (attempt + 1))
        raise AssertionError("unreachable")

    def unavailable(self, exc: BaseException) -> StoreUnavailable | None:
        """`exc`, raised by this store's driver outside the ledger's own calls (the
        format rows' `open_ledger` writes), as the one line every other refusal of the
        store is (`StoreUnavailable`), or None when it is none of those."""
        problem = self._problem(exc)
        return None if problem is None else StoreUnavailable(self.store.describe(), problem, exc)

    def _problem(self, exc: BaseException) -> str | None:
        """What keeps the store from answering, as an operator would say it
        (`store_problem`), and when a file's or folder's mode is the cause, which one
        (`StoreBackend.access_problem`); None for anything else, and for what already
        says so (StoreUnavailable)."""
        if isinstance(exc, StoreUnavailable):
            return None
        if access_denied(exc):
            found = self._backend.access_problem()
            if found is not None:
                return found
        return store_problem(exc)


def project_events(aggregate: Any, events: Iterable[Any]) -> Any:
    """eventsourcing's `project_aggregate` without its per-event runtime Protocol check
    (an assert that costs more than applying a job's event; every event of ours has
    `mutate`): each event applied in turn to the aggregate (None before the first)."""
    for event in events:
        aggregate = event.mutate(aggregate)
    return aggregate


#: The reasons the index keeps as they are on an encrypted store (`Ledger.index_row`).
_OUR_REASONS = frozenset(reason.value for reason in EscalationReason)


def _epoch(moment: datetime | float) -> float:
    if isinstance(moment, datetime):
        if moment.tzinfo is None:
            raise ValueError(f"a naive datetime is ambiguous: {moment!r} (give a time zone)")
        return moment.timestamp()
    return float(moment)


def _event_topic(name: str) -> str:
    event = getattr(SendJob, name, None)
    topic = getattr(event, "TOPIC", None)
    if not isinstance(event, type) or not isinstance(topic, str):
        raise ValueError(f"not a SendJob event type: {name!r}")
    return topic


__all__ = [
    "ConcurrentUpdate",
    "IdentityTaken",
    "KeyConflict",
    "Ledger",
    "Proved",
    "PurgeResult",
    "Sender",
    "SubmitResult",
    "TransitionError",
    "UnknownJob",
    "WriteFailure",
    "utcnow",
]
