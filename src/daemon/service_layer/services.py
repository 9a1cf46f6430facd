"""The one service layer under every door: submit, resolve, check, triage, cancel, the
review queue and the job view (docs/architecture.md "One service layer").

The CLI (`cli/job_commands.py`, `cli/service.py`), the HTTP API (`api/jobs.py`,
`api/review.py`) and the review page (`api/ui.py`) parse their input into these calls and
format the answers; every rule lives here once. A refusal is a `ServiceError` whose
`kind` each door maps to its own code (exit 2/3/4/1, HTTP 422/409/404/503) and whose
message is a sentence a human can act on.

A human's decision (resolve, cancel, triage's "sent") holds only for the version of the
job it was made on: the job is read once, the state check, the "index caught up" rule and
the search refer to that version, and the decision is appended with that version
expected (the store's optimistic concurrency). A job that moved meanwhile (an attempt,
another person's decision) refuses with a conflict naming what changed, and nothing is
sent; of two doors racing, exactly one wins (docs/review.md "Two people, one job").
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from daemon.providers.base import (
    Provider,
    ProviderError,
    SearchHit,
    SearchResult,
    fence_job,
    for_job,
    search_job,
)
from daemon.providers.draft_handle import Draft, DraftStatus
from daemon.providers.outcomes import DRAFT_OUT_OF_REACH, DeleteRefused, Fenced
from daemon.service_layer.guidance import (
    RESEND_NEEDS_NOTE,
    SENT_NEEDS_NOTE,
    SENT_NEEDS_NOTE_IN_TRASH,
    Guidance,
    copies_known,
    guidance_for,
    resend_needs_note,
)
from daemon.service_layer.intake import (
    IntakeError,
    check_messages,
    parse_jobs,
    senders_for,
    submit_jobs,
)
from daemon.service_layer.listing import ParamProblem, encode_cursor, parse_query
from daemon.service_layer.problems import FieldProblem, NotAtVersion, ServiceError
from daemon.service_layer.read_models import (
    CONTENT_PAGE,
    attachments_of,
    event_record,
    job_status,
    listed_job,
    review_index,
    review_rows,
    with_content,
)
from ledger import characters
from ledger.application import (
    ConcurrentUpdate,
    KeyConflict,
    Ledger,
    Proved,
    SubmitResult,
    UnknownJob,
    project_events,
)
from ledger.content import JobContent, JobInputError
from ledger.copies import copies_found, found_only_in_trash
from ledger.display import command_line, iso, quoted
from ledger.exceptions import Refusal, known, of_type
from ledger.job import DRAFTS_FENCE, FACTS, SendJob, TransitionError, check_name
from ledger.keys import note_problem
from ledger.stores.unchanged import Changed, Unchanged
from ledger.vocabulary import (
    FINAL_STATES,
    EscalationReason,
    JobState,
    PolicyRef,
    Resolution,
    Sender,
)

if TYPE_CHECKING:
    from ledger.mime import MessageLimits
    from ledger.stores.index import IndexRow
    from policies.loader import PolicySet

log = logging.getLogger("sendledger.services")

#: A provider by its configured name, for one search: the daemon lends its own (shared,
#: not closed), a command builds one and closes it after.
ProviderSource = Callable[[str], AbstractContextManager[Provider]]
TRIAGE_NOTE = "triage: one copy found"
_WRITE_TRIES = 5
T = TypeVar("T")


@dataclass(frozen=True)
class ChannelPolicies:
    """The policies intake uses, and the channels whose policy file is broken now (each
    with its first problem): those refuse new jobs in every door, the others accept."""

    policies: PolicySet
    broken: Mapping[str, str] = field(default_factory=dict)
    #: Channels with a sound file in the folder and no policy in force: added since the
    #: last reload. Refused as any unknown channel, but saying so: "no policy file for
    #: channel" would send the operator to a folder that plainly has it.
    unloaded: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Copy:
    provider_id: str
    date: str
    to: str
    subject: str
    in_trash: bool = False  # found in the sender's trash, not its sent folder

    def as_dict(self) -> dict[str, Any]:
        return {"provider_id": self.provider_id, "date": self.date, "to": self.to,
                "subject": self.subject, "in_trash": self.in_trash}  # fmt: skip


@dataclass(frozen=True)
class CheckAnswer:
    """What a search found now: `POST /v1/review/{key}/check`, `review check --json`."""

    key: str
    state: str
    message_id: str
    query: str
    copies: list[Copy]
    recorded: bool  # written to the job's history (not while a send is in flight)
    # The search's hits in the shape `review check --json` had before `copies`.
    hits: list[dict[str, Any]] = field(default_factory=list)
    purged: bool = False  # the job's content was purged: its history ends with Purged
    # Not recorded because the job moved on while the search was out (`check`): what
    # changed, as a conflict names it ("resolved as abandon by bob"); "" it did not.
    moved: str = ""
    # All the copies found (`copies` are the first COPIES_KEPT; None: as many as those),
    # and False when the search stopped reading with more left (then at least `found`).
    found: int | None = None
    complete: bool = True
    # The job's version the answer is about: the recorded check's own, else the version
    # read (or, moved on, seen): a resolve it advises holds for that version only.
    version: int | None = None
    # The provider searched was found replacing Message-IDs (its handle is marked, read
    # from the store when the search came back empty): no copy found proves nothing.
    replaced_ids: bool = False

    @property
    def count(self) -> int:
        return len(self.copies) if self.found is None else self.found

    @property
    def overtaken(self) -> bool:
        return bool(self.moved)

    @property
    def only_in_trash(self) -> bool:
        """Every copy found is in the sender's trash (`SearchResult.only_in_trash`)."""
        return bool(self.copies) and all(copy.in_trash for copy in self.copies)

    @property
    def why_unrecorded(self) -> str:
        """Why the check is not in the job's history (when `recorded` is False)."""
        if self.overtaken:
            # An attempt among the changes may have filed its copy after the search read
            # the mailbox; a decision or an escalation left the state it was made for.
            return (
                f"the job changed while it searched ({self.moved}): its answer is not the "
                "evidence of what the job is now, check again"
            )
        if self.state == JobState.ATTEMPTED.value:
            return "a send is in flight"
        if self.purged:
            return "its content was purged: its history ends there"
        return "it repeats the job's last check"

    def as_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "state": self.state,
            "message_id": self.message_id,
            "count": self.count,
            "complete": self.complete,
            "query": self.query,
            "copies": [c.as_dict() for c in self.copies],
            "only_in_trash": self.only_in_trash,
            "recorded": self.recorded,
            "version": self.version,
            "advice": self.advice,
            "hits": self.hits,
        }

    @property
    def advice(self) -> str:
        """What to do next: never a decision on a state the search was not made for."""
        if self.overtaken:
            check = command_line("sendledger", "review", "check", self.key)
            return f"the job changed while it searched: check again ({check})"
        return check_advice(
            self.key,
            self.state,
            self.count,
            self.complete,
            self.version,
            only_in_trash=self.only_in_trash,
            replaced_ids=self.replaced_ids,
        )


@dataclass(frozen=True)
class CheckWrite:
    """What became of a search's record (`Services._record_check`): `recorded`, or
    `moved` naming what changed since the job was read for it; `job` the job it was
    recorded on, or seen moved on (None: neither)."""

    recorded: bool
    moved: str = ""
    job: SendJob | None = None


@dataclass(frozen=True)
class TriageItem:
    key: str
    channel: str
    reason: str | None
    count: int | None  # None: the search failed, or none was made (a bounce)
    copies: list[str]
    action: str  # "resolved-sent", "would-resolve-sent", "left", "search-failed"
    detail: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "channel": self.channel,
            "reason": self.reason,
            "count": self.count,
            "copies": self.copies,
            "action": self.action,
            "detail": self.detail,
        }


@dataclass(frozen=True)
class Submitted:
    results: list[SubmitResult]
    batch: bool  # the jobs came as a list: the answer is a list too
    #: One line per channel whose policy file differs from what a running daemon loaded:
    #: accepted, sent under the loaded policy (`daemon/service_layer/loaded.py`).
    warnings: list[str] = field(default_factory=list)

    @property
    def created(self) -> bool:
        return any(r.created for r in self.results)

    def body(self) -> Any:
        answers = [r.as_dict() for r in self.results]
        return answers if self.batch else answers[0]


@dataclass(frozen=True)
class JobView:
    """A job as the page and `review show` present it."""

    job: SendJob
    status: dict[str, Any]
    history: list[dict[str, Any]]
    attachments: list[dict[str, Any]]
    decisions: list[Resolution]  # the decisions safe for this job now (none: not in review)
    cancellable: bool
    last_check: dict[str, Any] | None  # the latest Checked event's record
    # What its reason means, what to do next, what each decision does (None: not in review).
    guidance: Guidance | None = None


@dataclass(frozen=True)
class QueuePage:
    rows: list[dict[str, Any]]
    total: int
    page: int
    per_page: int
    channels: list[str]
    reasons: list[str]

    @property
    def pages(self) -> int:
        return max(1, -(-self.total // self.per_page))


@dataclass(frozen=True)
class JobPage:
    """One page of `GET /v1/jobs`; `next_cursor` None: nothing after it now."""

    jobs: list[dict[str, Any]]
    next_cursor: str | None

    def body(self) -> dict[str, Any]:
        return {"jobs": self.jobs, "next_cursor": self.next_cursor}


SORTS = ("since", "-since", "channel", "reason", "key")


def check_advice(
    key: str,
    state: str,
    copies: int,
    complete: bool = True,
    version: int | None = None,
    *,
    only_in_trash: bool = False,
    replaced_ids: bool = False,
) -> str:
    """What to do next after a check; a resolve command only for a job in review, with
    its arguments quoted (docs/review.md "Review"). `complete` False: at least `copies`.
    `version`: the job's version the check found that on, which the command then holds
    for (`--expected-version`): run after anyone else wrote to the job, it is refused.
    `only_in_trash`: every copy found is in the sender's trash, which no search takes
    for proof (`decisions.after_search`). `replaced_ids`: the provider searched replaces
    Message-IDs (its handle is marked unreliable), so finding none proves nothing."""
    if state != JobState.REVIEW:
        return f"the job is {state}, not in review: there is nothing to resolve"
    sent = _resolve_command(key, "sent", version)
    if only_in_trash:
        return (
            f"{found_only_in_trash(copies, complete)}: open it; sent from this mailbox,"
            f" `{sent}` with a note saying so; received, delete it for good, then check again"
        )
    if copies == 0 and replaced_ids:
        resend = _resolve_command(key, "resend", version)
        return (
            "none found, which proves nothing: the provider replaces Message-IDs, so no"
            " search finds this job's copies; look for it in the sender's Sent folder by"
            f" hand (To, Subject, time): found, `{sent}` with a note saying where; not"
            f" found, `{resend}` or abandon"
        )
    if copies == 0:
        resend = _resolve_command(key, "resend", version)
        return f"none found: if the search index has caught up, `{resend}` is safe"
    if copies == 1:
        return f"one copy: `{sent}`"
    least = "" if complete else "at least "
    return f"{least}{copies} copies (a duplicate): `{sent}` (or abandon); never resend"


@dataclass(frozen=True)
class ValidJobs:
    jobs: list[JobContent]
    senders: list[Sender]
    batch: bool
    #: How their messages were proved: the new jobs are created at that time, so a claim
    #: renders the very bytes that were proved (`ledger/message.py: render_checked`).
    proved: Proved | None = None


@dataclass(frozen=True)
class Intake:
    """Validation of submitted jobs, before any store is touched: the job JSON, the
    channel's policy (a broken one refuses), the message each job would be."""

    policies: Callable[[], ChannelPolicies]
    limits: Mapping[str, MessageLimits]
    thread_providers: frozenset[str]
    clock: Callable[[], datetime]

    def validate(self, data: object) -> ValidJobs:
        batch = isinstance(data, list)
        try:
            jobs = parse_jobs(data)
            current = self.policies()
            _refuse_broken(current, [job.channel for job in jobs], batch)
            senders = senders_for(
                current.policies, jobs, batch=batch, thread_providers=self.thread_providers
            )
            from ledger.message import writer_fingerprint  # a submission's, not a read's

            proved = Proved(self.clock(), writer_fingerprint())
            check_messages(current.policies, jobs, senders, self.limits, batch=batch, at=proved.at)
        except IntakeError as exc:
            raise ServiceError(Refusal.BAD_INPUT, str(exc), exc.problems, exc.total) from None
        return ValidJobs(jobs, senders, batch, proved)


def _refuse_broken(current: ChannelPolicies, channels: Sequence[str], batch: bool) -> None:
    problems = [
        FieldProblem(
            index if batch else None,
            "channel",
            f"the policy file of channel {channel!r} is broken ({current.broken[channel]});"
            " no job is taken for it until it is fixed",
        )
        for index, channel in enumerate(channels)
        if channel in current.broken
    ]
    problems += [
        FieldProblem(
            index if batch else None,
            "channel",
            f"the policy file of channel {channel!r} was added since the policies were "
            "loaded: reload them (SIGHUP: systemctl reload sendledger) to take its jobs",
        )
        for index, channel in enumerate(channels)
        if channel in current.unloaded and channel not in current.policies
    ]
    if problems:
        raise IntakeError(problems)


class Services:
    """Every door's operations on one ledger."""

    def __init__(
        self,
        ledger: Ledger,
        policies: Callable[[], ChannelPolicies],
        *,
        providers: ProviderSource | None = None,
        limits: Mapping[str, MessageLimits] | None = None,
        thread_providers: frozenset[str] = frozenset(),
        draft_providers: frozenset[str] = frozenset(),
        on_search: Callable[[int], None] | None = None,
    ) -> None:
        self.ledger = ledger
        self.policies = policies
        self.providers = providers
        self.limits = dict(limits or {})
        self.thread_providers = thread_providers
        # The providers that may leave unsent drafts of a job (Graph, Gmail's drafts
        # mode): a human's decision that settles a job schedules their deletion.
        self.draft_providers = draft_providers
        # Told the copies each search made here found (a check, a triage, a resend's):
        # the process's metrics count them beside the engine's (docs/http-api.md "Metrics").
        self.on_search = on_search

    # -- submit -------------------------------------------------------------------------

    @property
    def intake(self) -> Intake:
        return Intake(self.policies, self.limits, self.thread_providers, self.ledger.clock)

    def submit(self, data: object, *, by: str) -> Submitted:
        """Decoded job JSON (one object or a list), all or nothing."""
        return self.record(self.intake.validate(data), by=by)

    def record(self, valid: ValidJobs, *, by: str) -> Submitted:
        """Jobs `Intake.validate` accepted, written all or nothing. Judged first by what
        the running daemons loaded (the policy folder may hold files none of them has
        read): a channel none loaded is refused, nothing written."""
        warnings = self._judge_by_loaded(valid)
        try:
            results = submit_jobs(
                self.ledger, valid.jobs, valid.senders, by=by, proved=valid.proved
            )
        except KeyConflict as exc:
            raise ServiceError(Refusal.CONFLICT, str(exc)) from None
        return Submitted(results, valid.batch, warnings)

    def _judge_by_loaded(self, valid: ValidJobs) -> list[str]:
        from daemon.service_layer.loaded import judge_by_loaded, live_daemons

        daemons = live_daemons(self.ledger.loaded_policies(), self.ledger.clock())
        checked = [
            (job.channel, sender.policy.fingerprint)
            for job, sender in zip(valid.jobs, valid.senders, strict=True)
        ]
        problems, warnings = judge_by_loaded(daemons, checked, batch=valid.batch)
        if problems:
            error = IntakeError(problems)
            raise ServiceError(Refusal.BAD_INPUT, str(error), error.problems, error.total)
        return warnings

    # -- reading ------------------------------------------------------------------------

    def job(self, key: str) -> SendJob:
        try:
            return self.ledger.get_job(key)
        except UnknownJob as exc:
            raise ServiceError(Refusal.NOT_FOUND, str(exc)) from None

    def status(self, key: str) -> dict[str, Any]:
        return job_status(self.job(key))

    def statuses(self, keys: Sequence[str]) -> tuple[list[dict[str, Any]], list[str]]:
        """The status of each of `keys` that is known, in their order, and the keys that
        are not (`status KEY KEY ...`): `CONTENT_PAGE` jobs read a query."""
        found: list[dict[str, Any]] = []
        unknown: list[str] = []
        for start in range(0, len(keys), CONTENT_PAGE):
            page = keys[start : start + CONTENT_PAGE]
            jobs = self.ledger.get_jobs(list(dict.fromkeys(page)))
            for key in page:
                job = jobs.get(key)
                if job is None:
                    unknown.append(key)
                else:
                    found.append(job_status(job))
        return found, unknown

    def history(self, key: str) -> list[dict[str, Any]]:
        try:
            return [event_record(e) for e in self.ledger.history(key)]
        except UnknownJob as exc:
            raise ServiceError(Refusal.NOT_FOUND, str(exc)) from None

    def list_jobs(
        self,
        *,
        state: str | None = None,
        channel: str | None = None,
        since: str | None = None,
        limit: str | int | None = None,
        cursor: str | None = None,
    ) -> JobPage:
        """A page of jobs from the index in (updated, key) order, as a door was asked for
        them (`daemon/service_layer/listing.py`); every bad parameter named in one refusal."""
        query, problems = parse_query(
            state=state, channel=channel, since=since, limit=limit, cursor=cursor,
            now=self.ledger.clock(),
        )  # fmt: skip
        if query is None:
            raise ServiceError(Refusal.BAD_INPUT, str(problems[0]), problems)
        rows = self.ledger.changed_jobs(
            state=query.state, channel=query.channel, since=query.since, after=query.after,
            limit=query.limit + 1,
        )  # fmt: skip
        shown = rows[: query.limit]
        more = len(rows) > query.limit
        next_cursor = None
        if more and shown:
            # The position is where the row was stored (`IndexRow.written_at`), the
            # order of the page; a row an earlier release's daemon wrote has none yet.
            last = shown[-1]
            at = last.written_at if last.written_at is not None else last.updated_at
            next_cursor = encode_cursor(at, last.key)
        return JobPage([listed_job(row) for row in shown], next_cursor)

    def job_view(self, key: str) -> JobView:
        # One read of the events: the status, the timeline and the guidance are of one
        # version (two reads could straddle another writer's append, and the page would
        # show a state its own timeline had left).
        try:
            events = self.ledger.history(key)
        except UnknownJob as exc:
            raise ServiceError(Refusal.NOT_FOUND, str(exc)) from None
        job = of_type(project_events(None, events), SendJob, f"the events of job {key}")
        history = [event_record(e) for e in events]
        checks = [r for r in history if r["type"] == "Checked"]
        last_check = checks[-1] if checks else None
        evidence = check_since_review(history)
        decisions = safe_decisions(job, evidence)
        return JobView(
            job=job,
            status=job_status(job),
            history=history,
            attachments=attachments_of(job) if job.purged_at is None else [],
            decisions=decisions,
            cancellable=job.state is JobState.REQUESTED and job.attempts == 0,
            last_check=last_check,
            guidance=guidance_for(
                job, evidence, decisions, handle_marked=self._resend_marked(job, decisions)
            ),
        )

    def _resend_marked(self, job: SendJob, decisions: list[Resolution]) -> bool:
        """Whether a resend offered for `job` would go to a provider whose handle is
        marked (read only then: the page and `review show` say it needs a note)."""
        if Resolution.RESEND not in decisions:
            return False
        provider = self._copy_on(job)
        return provider is not None and not self.ledger.handle_reliable(provider)

    def _copy_on(self, job: SendJob) -> str | None:
        """The provider an earlier attempt's copy would be on (None: never attempted, so
        no copy a resend could duplicate)."""
        if not job.attempts:
            return None
        return job.last_provider or self._attempted_on(job)

    def review_list(
        self, *, channel: str | None = None, reason: str | None = None
    ) -> list[dict[str, Any]]:
        """Every job in review, in key order (`review list`, `GET /v1/review`)."""
        _require_reason(reason)
        return review_rows(self.ledger, channel=channel, reason=reason)

    def review_queue(
        self,
        *,
        channel: str | None = None,
        reason: str | None = None,
        sort: str = "since",
        page: int = 1,
        per_page: int = 50,
    ) -> QueuePage:
        """One page of the review queue, sorted and filtered from the index rows; only the
        page's jobs are loaded (one query)."""
        if sort not in SORTS:
            raise ServiceError(Refusal.BAD_INPUT, f"sort: one of {', '.join(SORTS)}")
        everything = list(review_index(self.ledger))
        channels = sorted({r.channel for r in everything})
        reasons = sorted({r.reason or "" for r in everything} - {""})
        rows = [
            r
            for r in everything
            if (channel is None or r.channel == channel) and (reason is None or r.reason == reason)
        ]
        name = sort.lstrip("-")
        # `since` is when the job went to review, not its last change: a check or a
        # triage writes to a job without making it any less old in the queue.
        keyed: Callable[[Any], Any] = {
            "since": lambda r: r.in_review_since,
            "channel": lambda r: (r.channel, r.in_review_since),
            "reason": lambda r: (r.reason or "", r.in_review_since),
            "key": lambda r: r.key,
        }[name]
        rows.sort(key=keyed, reverse=sort.startswith("-"))
        per_page = max(1, min(per_page, CONTENT_PAGE * 4))
        page = max(1, page)
        shown = rows[(page - 1) * per_page : page * per_page]
        return QueuePage(
            with_content(self.ledger, shown), len(rows), page, per_page, channels, reasons
        )

    def find_jobs(self, text: str, *, limit: int = 50, scan: int = 5000) -> list[dict[str, Any]]:
        """Jobs by exact key, by Message-ID (with or without <>), else by a recipient
        address containing `text` among the `scan` most recently changed jobs."""
        text = text.strip()
        if not text:
            return []
        row = self.ledger.row(text)
        if row is None:
            wanted = text if text.startswith("<") else f"<{text}>"
            row = self.ledger.row_by_message_id(wanted)
        if row is not None:
            return with_content(self.ledger, [row])
        needle = text.lower()
        recent = sorted(self.ledger.jobs(), key=lambda r: r.updated_at, reverse=True)[:scan]
        found: list[dict[str, Any]] = []
        for start in range(0, len(recent), CONTENT_PAGE):
            for item in with_content(self.ledger, recent[start : start + CONTENT_PAGE]):
                if any(needle in address.lower() for address in item.get("to", [])):
                    found.append(item)
                    if len(found) >= limit:
                        return found
        return found

    # -- searching ----------------------------------------------------------------------

    def search(self, job: SendJob) -> SearchResult:
        """The job's Message-ID searched in its sender's mailbox now (reading only)."""
        return self._with_provider(job, lambda provider: self._searched(provider, job))

    def _searched(
        self, provider: Provider, job: SendJob, fenced: Fenced | None = None
    ) -> SearchResult:
        # The copies the job's recorded drafts became counted as the daemon counts them
        # (`search_job`): a fresh process remembers no draft, and the index may lag. After
        # a resend's fence (`fenced`), the drafts it read by id are not read again.
        found = search_job(provider, job.message_id, job.made_drafts, fenced)
        if self.on_search is not None:
            try:
                self.on_search(found.count)
            except Exception:  # counting never changes what the door answers
                log.exception("search observer failed")
        return found

    def _fenced_search(self, job: SendJob) -> SearchResult | None:
        """Before a resend: the job's unsent drafts deleted first where its provider may
        leave some (Graph; Gmail's drafts), then the search. The job is in review, so no
        claim of it is live; a call of a claim that lapsed may still be on its way, and
        its draft, sent after this search missed, would be a second copy. Deleted first,
        it can never be sent (the sweep's fence, docs/architecture.md "Drafts never
        outlive their job").

        The fence acts only for the version the decision read: what it is about to
        delete, listed, is recorded on `job` before the first deletion (`_begin_fence`),
        so a record refused because the job moved deletes nothing. Another person's
        resend saved since may have made the daemon draft its next attempt, with the
        same Message-ID: deleted, that send would find its draft gone, an Unknown and a
        search or a review for a job nobody sent twice. A draft made after the listing
        is never deleted: it needs a resend saved after the record.

        The job's recorded draft is fenced too, by its id: a person may have edited it
        (`draft-changed`), its Message-ID too, and the listing by Message-ID would miss it,
        so the next attempt would read it back, find it changed and send the job to
        review again. Found already gone, it is asked whether it was sent (a person
        pressed Send in the mailbox): then that copy is the answer, as a search's, and
        the resend is refused (docs/review.md "Resolve"). Gone and not SENT, it may have
        been sent a moment ago under a message id of the mailbox's own, a copy the index
        does not show yet: None, nothing searched (the caller records the moment and
        refuses the resend until `search_after` past it)."""

        def fenced(provider: Provider) -> SearchResult | None:
            fence = None
            if provider.leaves_drafts:
                recorded = _recorded_draft(provider, job)
                fence = fence_job(
                    provider,
                    job.message_id,
                    job.made_drafts,  # all: one recorded deleted may not be (a fence's)
                    lambda listed: self._begin_fence(job, recorded, listed),
                )
                if recorded is not None and recorded.draft_id not in fence.deleted:
                    sent = _fence_recorded_draft(provider, recorded)
                    if sent is not None:
                        return None if sent is DRAFT_GONE else sent
            return self._searched(provider, job, fence)

        return self._with_provider(job, fenced)

    def _begin_fence(self, job: SendJob, recorded: Draft | None, listed: list[str]) -> None:
        """The drafts a resend's fence is about to delete (its recorded one and those
        `listed`) recorded on `job` at the version the decision read, before any is
        deleted; refused (the job moved: a conflict naming what changed) it stops the
        fence there. Recorded first, as the sweep's fence and a claim are: a deletion
        that then fails or lands late is in the trail, and its drafts are never reused
        (`SendJob.deleted_drafts`)."""
        ids = list(dict.fromkeys(([recorded.draft_id] if recorded is not None else []) + listed))
        if not ids:
            return  # nothing to delete: the decision's own save checks its version
        seen = job.version
        job.record_drafts_deleted(draft_ids=ids, why=DRAFTS_FENCE, at=self.ledger.clock())
        try:
            self.ledger.save_job(job)
        except ConcurrentUpdate:
            raise self._moved_on(job.key, seen, "resent") from None
        except Exception as exc:
            # Said as the store's, not taken for the provider's by `_with_provider`.
            raise ServiceError(
                Refusal.UNAVAILABLE,
                f"its fence could not be recorded in the store ({type(exc).__name__}: "
                f"{quoted(exc)}); no draft was deleted",
            ) from None

    def _with_provider(self, job: SendJob, call: Callable[[Provider], T]) -> T:
        """`call` on the provider of the job's sender, its failures "no answer"."""
        name = self._provider_name(job)
        if self.providers is None:
            raise ServiceError(Refusal.UNAVAILABLE, "no provider can be reached from here")
        try:
            with self.providers(name) as provider:
                return call(for_job(provider, job.from_addr, None))
        except ServiceError:
            raise  # the caller's own refusal, made during the call (a fence's record)
        except DeleteRefused as exc:
            # A resend's fence met a draft the provider holds and will not delete (a hold,
            # a retention label): asked again, refused again, so not "try later" but a
            # person's act (docs/review.md "Resolve"), the job left in review.
            raise ServiceError(Refusal.CONFLICT, _draft_out_of_reach(job.key, exc)) from None
        except ProviderError as exc:
            raise ServiceError(
                Refusal.UNAVAILABLE, f"the mailbox could not be searched: {exc.reason}"
            ) from None
        except Exception as exc:
            # Whatever else a provider raises (a credential refused, a socket error) is
            # still "no answer", never a decision and never a crash of the door.
            log.info(
                "search for %s failed: %s: %s", job.message_id, type(exc).__name__, quoted(exc)
            )
            raise ServiceError(
                Refusal.UNAVAILABLE, f"provider {name!r} cannot be used: {exc}"
            ) from None

    def _attempted_on(self, job: SendJob) -> str | None:
        """The provider the last attempt was made on, where its copy would be (the
        channel's policy may name another since a reload, whose mailbox never saw it);
        before any attempt, the policy's; None without either."""
        policy = self.policies().policies.get(job.channel)
        return job.last_provider or (policy.provider if policy is not None else None)

    def _provider_name(self, job: SendJob) -> str:
        name = self._attempted_on(job)
        if name is None:
            raise ServiceError(
                Refusal.UNAVAILABLE,
                f"job {job.key!r}: no provider to search (channel {job.channel!r} has no policy)",
            )
        return name

    def check(self, key: str, *, by: str) -> CheckAnswer:
        """Search now and record what was found on the job (who asked, the query, the
        copies), so its trail shows what the human saw. Reads only: nothing is deleted
        at the provider, whatever the job's state. A settled job whose latest event is a
        check that found the same copies gets no second one (a page reloaded, a script
        polling): the answer says it was not recorded."""
        job = self.job(key)
        found = self.search(job)
        written = self._record_check(key, found, by=by, purpose="check", searched=job)
        # Recorded, the answer is the job it was recorded on; overtaken, the job now (its
        # advice then says to check again); else the job searched (a send in flight).
        answer = _answer(written.job or job, found, written.recorded, written.moved)
        if found.count == 0 and not self.ledger.handle_reliable(self._provider_name(job)):
            # Read once the search came back: a read-back may have marked it meanwhile.
            answer = replace(answer, replaced_ids=True)
        return answer

    def _record_check(
        self, key: str, found: SearchResult, *, by: str, purpose: str, searched: SendJob
    ) -> CheckWrite:
        """Record what a search found, as the evidence of the job it was made for (read
        as `searched`): on a later version only when nothing but other facts (another
        person's check, drafts deleted) was appended since, else not at all (`moved`
        names what was). A check decides nothing, but it is read as evidence: recorded
        after a decision, a confirmation or an escalation made while it searched, it would
        pass for the evidence of a state it never saw (a duplicate's review "0 copies", a
        review after another attempt "no copy found" and a resend offered:
        `check_since_review`). Nor while the call of the job read was in flight
        (attempted): the attempt is counted already, but its copy may be filed after the
        mailbox was read, and the outcome recorded before this check."""
        moved: list[str] = []
        seen: list[SendJob] = []

        def record(job: SendJob) -> bool:
            seen[:] = [job]
            if searched.state is JobState.ATTEMPTED:
                return False
            moved[:] = self._moves(key, searched.version, job.version)
            if moved or _repeats_last_check(job, found):
                return False
            job.record_check(
                by=by, purpose=purpose, query=found.query, copies=found.recorded_copies,
                count=found.count, complete=found.complete, at=self.ledger.clock(),
            )  # fmt: skip
            return True

        try:
            recorded = self._write(key, record)
        except TransitionError:
            recorded = False  # a send in flight, or a purged job: shown, not recorded
        if recorded or moved:
            return CheckWrite(recorded, _changes(moved), seen[0])
        return CheckWrite(False)

    def _moves(self, key: str, seen: int, now: int) -> list[str]:
        """What was appended to the job after version `seen` up to `now` that changes
        what a search of version `seen` is evidence of: everything but facts recorded
        beside it (a check, drafts deleted). Each as a conflict names it."""
        if now == seen:
            return []
        events = self.ledger.history(key)[seen:now]
        return [_change(event) for event in events if not isinstance(event, FACTS)]

    def _write(self, key: str, command: Callable[[SendJob], bool]) -> bool:
        """One command that records a fact, not a decision, tried again when another
        writer got there first (the command then sees the job as that writer left it);
        nothing is saved when it answers False. Whether it was saved."""
        for attempt in range(_WRITE_TRIES):
            try:
                job = self.ledger.get_job(key)
                if not command(job):
                    return False
                self.ledger.save_job(job)
                return True
            except UnknownJob as exc:
                raise ServiceError(Refusal.NOT_FOUND, str(exc)) from None
            except JobInputError as exc:
                raise _bad_field(exc) from None
            except ConcurrentUpdate:
                if attempt == _WRITE_TRIES - 1:
                    raise ServiceError(
                        Refusal.CONFLICT,
                        f"job {key!r} kept changing while it was written; look again",
                    ) from None
        raise AssertionError("unreachable")

    # -- decisions ----------------------------------------------------------------------

    def resolve(
        self,
        key: str,
        decision: Resolution,
        *,
        note: str,
        by: str,
        expected_version: int | None = None,
    ) -> SendJob:
        """A human's decision on a job in review, made on one version of it (the one
        read here, or `expected_version`, the one the person saw) and saved only if the
        job is still at that version. A resend is searched for first, now: one copy or
        more refuses it (recorded, nothing sent)."""
        decision = Resolution(decision)
        _require_name(by)
        _require_note(note)
        job = self._job_at(key, expected_version, "resolved")
        _require_review(job, "resolved")
        handle = None
        if decision is Resolution.RESEND and not note.strip():
            # Judged on this version and on the handle as read here, written only while
            # both still are (`_save_seen`): a job that went to review for another
            # reason before a read-back found its provider replacing Message-IDs is
            # resent on the person's word too.
            handle = self._handle_for_resend(job)
        seen = job.version
        found: SearchResult | None = None
        if decision is Resolution.RESEND:
            if job.duplicate:
                raise ServiceError(
                    Refusal.CONFLICT,
                    f"job {key!r} has two or more copies already: resolve it as sent or "
                    "abandon it, never resend",
                )
            self._require_index_caught_up(job)
            gone = job.draft_id
            try:
                found = self._fenced_search(job)
            except ServiceError as exc:
                if exc.kind is Refusal.CONFLICT:
                    raise  # the fence's record refused: the job moved, nothing deleted
                raise ServiceError(
                    exc.kind, f"job {key!r} was not resent: {exc.message}; nothing was sent"
                ) from None
            seen = job.version  # past the fence's record, when it made one
            if found is None:
                raise self._draft_found_gone(job, gone, by)
            if found.hits:
                written = self._record_check(key, found, by=by, purpose="resend", searched=job)
                if written.moved:
                    # Its copy is no advice for a job that left the state it was read in.
                    raise self._moved_on(key, seen, "resent")
                # "sent" on the version that holds this search (else the one decided on).
                on = written.job.version if written.job is not None else seen
                sent = f"resolve as sent ({_resolve_command(key, 'sent', on)})"
                why = f"{copies_found(found.count, found.complete)}: {sent}"
                if found.only_in_trash:  # perhaps received: "resolve as sent" is no advice
                    why = check_advice(
                        key, JobState.REVIEW, found.count, found.complete, on, only_in_trash=True
                    )
                raise ServiceError(Refusal.CONFLICT, f"job {key!r} was not resent: {why}")
        at = self.ledger.clock()
        with _domain_input():
            if found is not None:
                job.record_check(by=by, purpose="resend", query=found.query,
                                 copies=found.recorded_copies, count=found.count,
                                 complete=found.complete, at=at)  # fmt: skip
            job.resolve(decision, note=note, by=by, at=at,
                        found=None if found is None else found.copies,
                        tidy_at=self._tidy_at(job, at))  # fmt: skip
        self._save_seen(job, seen, "resolved" if found is None else "resent", unchanged=handle)
        return job

    def _handle_for_resend(self, job: SendJob) -> Unchanged | None:
        """For a resend without a note: the handle of the provider its copy would be on,
        as read now (None: no provider to read); refused as bad input naming `note`
        when the job went to review for it or it is marked now (docs/review.md
        "Resolve")."""
        provider = self._copy_on(job)
        handle = None if provider is None else self.ledger.handle_unmarked(provider)
        marked = provider is not None and handle is None
        if resend_needs_note(job.reason, handle_marked=marked):
            problem = FieldProblem(None, "note", RESEND_NEEDS_NOTE)
            raise ServiceError(Refusal.BAD_INPUT, str(problem), [problem])
        return handle

    def _job_at(self, key: str, expected_version: int | None, what: str) -> SendJob:
        """The job as it is now, refused when it is no longer at the version the person
        saw (`expected_version`)."""
        job = self.job(key)
        if expected_version is not None and expected_version > job.version:
            # Never a version of this job, so never what anyone was shown (a typo, another
            # job's status): not "changed after version N ()".
            problem = FieldProblem(
                None,
                "expected_version",
                f"job {key!r} is at version {job.version}: {expected_version} is not a "
                "version it has had (the `version` of its status)",
            )
            raise NotAtVersion(Refusal.BAD_INPUT, str(problem), [problem])
        if expected_version is not None and job.version != expected_version:
            raise self._moved_on(key, expected_version, what)
        return job

    def _save_seen(
        self, job: SendJob, seen: int, what: str, *, unchanged: Unchanged | None = None
    ) -> None:
        """Append the decision recorded on `job`, expecting it still at version `seen`,
        and the record `unchanged` names as read (the provider's handle)."""
        try:
            self.ledger.save_job(job, unchanged=unchanged)
        except ConcurrentUpdate:
            raise self._moved_on(job.key, seen, what) from None
        except Changed:
            # Marked by a read-back between the read and the commit: nothing written.
            self._handle_for_resend(job)
            raise ServiceError(
                Refusal.CONFLICT,
                f"job {job.key!r} was not {what}: its provider's handle changed while the "
                "decision was written; nothing was sent, look again",
            ) from None

    def _tidy_at(self, job: SendJob, at: datetime) -> datetime | None:
        policy = self.policies().policies.get(job.channel)
        provider = self._attempted_on(job)
        # Here, not at the top: the read commands load no policy model (pydantic).
        from policies.decisions import tidy_at

        return tidy_at(policy, leaves_drafts=provider in self.draft_providers, now=at)

    def _require_index_caught_up(self, job: SendJob) -> None:
        """A search sooner than the channel's `search_after` after the last attempt may
        read a lagging index and miss a copy that exists: a resend then waits. The last
        attempt is the job's own, at the version the decision is made on, counted from
        when its outcome was known: a slow call's copy reaches the mailbox after its claim,
        as late as its outcome, and the index shows it `search_after` after that, as the
        engine's own search counts from the Unknown. A recorded draft found gone with no
        SENT message counts as an attempt then (`draft_gone_at`): a person may have sent
        it from the mailbox just before (docs/architecture.md "The life of one job on a
        drafts provider")."""
        attempt = max((t for t in (job.last_attempt_at, job.unknown_at) if t), default=None)
        gone = job.draft_gone_at
        if gone is not None and (attempt is None or gone > attempt):
            refusal = self._index_refusal(job, gone, DRAFT_FOUND_GONE)
        elif attempt is not None:
            refusal = self._index_refusal(job, attempt, "its last attempt ended")
        else:
            refusal = None
        if refusal is not None:
            raise refusal

    def _index_refusal(self, job: SendJob, last: datetime, what: str) -> ServiceError | None:
        """The resend's refusal while `last` (`what`: an attempt's end, a draft found
        gone) is less than the channel's `search_after` ago, with the time to resend
        after; None once the index has had that long."""
        policy = self.policies().policies.get(job.channel)
        if policy is None:
            return None
        ready = last + timedelta(seconds=policy.search_after)
        now = self.ledger.clock()
        if now >= ready:
            return None
        return ServiceError(
            Refusal.CONFLICT,
            f"job {job.key!r} was not resent: {what} "
            f"{int((now - last).total_seconds())} s ago and the mailbox "
            f"index may not show its copy yet (search_after of channel {job.channel!r}); "
            f"check again and resend after {iso(ready)}",
        )

    def _draft_found_gone(self, job: SendJob, gone: str | None, by: str) -> ServiceError:
        """A resend whose fence found the job's recorded draft `gone` and not SENT: the
        moment recorded on the job as it is now (a fact, not the decision: `DraftGone`;
        the fence recorded its drafts before deleting them), and the refusal to say,
        resend `search_after` from now. A copy sent from the mailbox a moment ago shows
        in the index by then."""
        at = self.ledger.clock()

        def record(on: SendJob) -> bool:
            # Another resend may have recorded it, or resent the job, meanwhile.
            asked = on.asked_draft
            if on.state is not JobState.REVIEW or asked is None or asked[0] != gone:
                return False
            on.record_draft_found_gone(policy=PolicyRef.operator(by), at=at)
            return True

        try:
            self._write(job.key, record)
        except TransitionError as exc:
            log.warning("job %s: draft %s found gone by a resend, not recorded: %s",
                        job.key, gone, exc)  # fmt: skip
        refusal = self._index_refusal(job, at, DRAFT_FOUND_GONE)
        return refusal or ServiceError(
            Refusal.CONFLICT, f"job {job.key!r} was not resent: {DRAFT_FOUND_GONE}; look again"
        )

    def cancel(
        self, key: str, *, note: str, by: str, expected_version: int | None = None
    ) -> SendJob:
        """Withdraw a job no provider was called for yet, decided on one version of it
        (as `resolve`); any later state is refused."""
        _require_name(by)
        _require_note(note)
        job = self._job_at(key, expected_version, "cancelled")
        if job.state is not JobState.REQUESTED or job.attempts:
            count = job.attempts
            after = f" after {count} attempt{'s' if count > 1 else ''}" if count else ""
            state = "in review" if job.state is JobState.REVIEW else job.state.value
            # What a person who wanted it stopped can still do: only a job in review waits
            # for a decision, and abandoning it sends nothing more; on the version read here.
            abandon = _resolve_command(key, "abandon", job.version)
            instead = (
                f"; to send nothing more, resolve it: {abandon}" if state == "in review" else ""
            )
            raise ServiceError(
                Refusal.CONFLICT,
                f"job {key!r} is {state}{after}: only a job not yet attempted can be "
                f"cancelled{instead}",
            )
        seen = job.version
        at = self.ledger.clock()
        with _domain_input():
            job.cancel(by=by, note=note, at=at, tidy_at=self._tidy_at(job, at))
        self._save_seen(job, seen, "cancelled")
        return job

    def _moved_on(self, key: str, seen: int, what: str) -> ServiceError:
        """The job is no longer at the version the decision was made on (another writer
        appended meanwhile): a conflict that names what changed, with what to do."""
        try:
            job = self.ledger.get_job(key)
            events = self.ledger.history(key)[seen:]
        except UnknownJob as exc:
            return ServiceError(Refusal.NOT_FOUND, str(exc))
        changed = _changes([_change(event) for event in events])
        show = command_line("sendledger", "review", "show", key)
        return NotAtVersion(
            Refusal.CONFLICT,
            f"job {key!r} changed after version {seen} ({changed}) and is now "
            f"{job.state.value} at version {job.version}; it was not {what}: look again "
            f"({show})",
        )

    def triage(
        self,
        *,
        by: str,
        channel: str | None = None,
        reason: str | None = None,
        dry_run: bool = False,
    ) -> list[TriageItem]:
        """Every matching job in review searched now: exactly one copy -> resolved as sent
        (note "triage: one copy found"); none, or two and more -> left in review with the
        search recorded. A dry run searches and records nothing. A `by` the name rule
        refuses is refused before any job is searched, so a batch is never half-decided."""
        return list(self.triage_each(by, channel, reason, dry_run)[1])

    def triage_each(
        self, by: str, channel: str | None, reason: str | None, dry_run: bool
    ) -> tuple[int, Iterator[TriageItem]]:
        """`triage`, one job at a time: how many jobs are in review to search, and each
        answer once its job is decided, for the CLI to show as it goes (a search can take
        the provider's whole timeout) and to say what was done when it is interrupted."""
        _require_name(by)
        _require_reason(reason)
        rows = list(review_index(self.ledger, channel=channel, reason=reason))
        return len(rows), self._triage(rows, by, dry_run)

    def _triage(self, rows: list[IndexRow], by: str, dry_run: bool) -> Iterator[TriageItem]:
        for row in rows:
            job = self.ledger.find_job(row.key)
            if job is None or job.state is not JobState.REVIEW:
                continue
            if job.reason == EscalationReason.BOUNCED:
                # Confirmed, so its one copy is there by definition: "one copy found" says
                # nothing of the recipient the report names, and is not searched for.
                yield TriageItem(row.key, row.channel, row.reason, None, [], "left",
                                 "in review for a bounce: read the report, then resolve it "
                                 "by hand")  # fmt: skip
                continue
            try:
                found = self.search(job)
            except ServiceError as exc:
                yield TriageItem(row.key, row.channel, row.reason, None, [], "search-failed",
                                 exc.message)  # fmt: skip
                continue
            count, copies = found.count, found.copies
            trashed = found.only_in_trash  # sent and deleted, or received: a person tells
            if trashed:
                said = found_only_in_trash(count, found.complete)
                action, detail = "left", f"{said}: left in review"
            elif count == 1 and dry_run:
                action, detail = "would-resolve-sent", "one copy found: would resolve as sent"
            elif count == 1:
                action, detail = self._triage_sent(job, found, by)
            else:
                what = "none found" if count == 0 else copies_found(count, found.complete)
                what += " (a duplicate)" if count else ""
                action, detail = "left", f"{what}: left in review"
            if (trashed or count != 1) and not dry_run:
                written = self._record_check(row.key, found, by=by, purpose="triage", searched=job)
                if written.moved:
                    detail = (
                        f"{detail.removesuffix(': left in review')}; the job changed while"
                        f" it was searched ({written.moved}): not recorded, look again"
                    )
            yield TriageItem(row.key, row.channel, row.reason, count, copies, action, detail)

    def _triage_sent(self, job: SendJob, found: SearchResult, by: str) -> tuple[str, str]:
        """Resolve as sent the job the search was made on, at the version it was read."""
        seen = job.version
        at = self.ledger.clock()
        try:
            job.record_check(by=by, purpose="triage", query=found.query, copies=found.copies,
                             count=found.count, complete=found.complete, at=at)  # fmt: skip
            job.resolve(Resolution.SENT, note=TRIAGE_NOTE, by=by, at=at, found=found.copies,
                        tidy_at=self._tidy_at(job, at))  # fmt: skip
            self._save_seen(job, seen, "resolved")
        except (ServiceError, TransitionError) as exc:
            return "left", f"one copy found, not resolved: {exc}"
        log.info("triage by %s: %s resolved as sent (one copy found)", by, job.key)
        return "resolved-sent", "one copy found: resolved as sent"


#: The reasons a job waits in review for (docs/review.md): a filter naming another is a
#: typo (`unknown` for `unknown-outcome`), refused rather than answered with no jobs.
REASONS = tuple(reason.value for reason in EscalationReason)


#: What a resend's refusal says of a recorded draft found gone with no SENT message.
DRAFT_FOUND_GONE = "its draft was found gone from the mailbox (perhaps sent from there)"

#: `_fence_recorded_draft`'s answer for a recorded draft gone and not SENT.
DRAFT_GONE = SearchResult("drafts.get: gone, not sent", ())


def _recorded_draft(provider: Provider, job: SendJob) -> Draft | None:
    """The job's recorded draft, where its provider sends through drafts."""
    if provider.drafts() is None or job.draft_id is None or job.draft_message_id is None:
        return None
    return Draft(job.draft_id, job.draft_message_id)


def _fence_recorded_draft(provider: Provider, draft: Draft) -> SearchResult | None:
    """The job's recorded draft deleted, its fence recorded (`_begin_fence`); when it was
    gone already and its message is in the sent mail, that copy as a search's answer (the
    query: the check's call); gone and not SENT, `DRAFT_GONE`. None otherwise. Deleted,
    it was unsent when the delete answered and can never be sent: no check is needed
    then."""
    drafts = known(provider.drafts(), "a recorded draft needs the drafts calls")
    if drafts.delete_draft(draft.draft_id):
        return None
    check = drafts.check_draft(draft)
    if check.status is not DraftStatus.SENT:
        # Deleted by a person, or sent by one a moment ago under another message id.
        return DRAFT_GONE
    copy = SearchHit(check.provider_message_id or draft.provider_message_id,
                     check.message_id_header or "")  # fmt: skip
    return SearchResult(f"drafts.get {draft.draft_id}", (copy,))


def _draft_out_of_reach(key: str, refused: DeleteRefused) -> str:
    """A resend refused for a draft of the job the provider will not delete: what it is
    and what a person does (docs/providers.md "Deleting a draft: Deleted Items, and the
    late send")."""
    return f"job {key!r} was not resent: {refused.reason}; {DRAFT_OUT_OF_REACH}; nothing was sent"


def _require_reason(reason: str | None) -> None:
    if reason is not None and reason not in REASONS:
        problem = ParamProblem(None, "reason", f"one of {', '.join(REASONS)}")
        raise ServiceError(Refusal.BAD_INPUT, str(problem), [problem])


def check_since_review(history: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The latest check made since the job last went to review (event records, oldest
    first), or None. Only such a check speaks for the job in review: an earlier one was
    made before what sent it there (the daemon's search that found a duplicate, the
    attempt a resend made after its own search) and says nothing of it."""
    for record in reversed(history):
        if record["type"] == "Escalated":
            return None
        if record["type"] == "Checked":
            return dict(record)
    return None


def safe_decisions(job: SendJob, last_check: dict[str, Any] | None) -> list[Resolution]:
    """The decisions a page may offer: none out of review; never resend a duplicate, nor
    a job whose latest check found a copy. "sent" without a copy found is offered only
    with a note saying how the person knows (`guidance.py`: `Choice.needs_note`)."""
    if job.state is not JobState.REVIEW or job.purged:
        return []
    found = bool(copies_known(job, last_check))
    if job.duplicate or found:
        return [Resolution.SENT, Resolution.ABANDON]
    return [Resolution.SENT, Resolution.RESEND, Resolution.ABANDON]


def sent_without_evidence(view: JobView, decision: Resolution, note: str) -> str | None:
    """The refusal a door says for "sent" that no check backs and no note explains."""
    if decision is not Resolution.SENT or view.guidance is None or note.strip():
        return None
    if not view.guidance.sent_needs_note:
        return None
    return SENT_NEEDS_NOTE_IN_TRASH if view.guidance.in_trash else SENT_NEEDS_NOTE


def resolve_as_a_person(
    services: Services,
    key: str,
    decision: Resolution,
    *,
    note: str,
    by: str,
    expected_version: int | None = None,
) -> SendJob:
    """`Services.resolve` for a person at the page or `review resolve`: "sent" without a
    copy found needs a note saying how they know (bad input otherwise, nothing recorded;
    docs/review.md "Resolve"). The evidence is judged on one version of the job, and the
    decision is written only if the job is still at it: the version the person saw, or
    else the one read here (a check in between may have found the copy gone)."""
    view = services.job_view(key)
    if expected_version is None or expected_version == view.job.version:
        problem = sent_without_evidence(view, decision, note)
        if problem is not None:
            raise ServiceError(Refusal.BAD_INPUT, problem)
        expected_version = view.job.version
    # Else the job moved after the version the person saw: `resolve` refuses it so.
    return services.resolve(key, decision, note=note, by=by, expected_version=expected_version)


def _resolve_command(key: str, decision: str, version: int | None = None) -> str:
    seen = () if version is None else ("--expected-version", str(version))
    return command_line("sendledger", "review", "resolve", key, "--as", decision, *seen)


def _require_name(by: str) -> None:
    try:
        check_name(by)
    except JobInputError as exc:
        problem = FieldProblem(None, exc.field, exc.reason)
        raise ServiceError(Refusal.BAD_INPUT, str(problem), [problem]) from None


def _bad_field(exc: JobInputError) -> ServiceError:
    """A field of the decision itself refused by the domain (a note, a name)."""
    problem = FieldProblem(None, exc.field, exc.reason)
    return ServiceError(Refusal.BAD_INPUT, str(problem), [problem])


@contextmanager
def _domain_input() -> Iterator[None]:
    try:
        yield
    except JobInputError as exc:
        raise _bad_field(exc) from None


def _require_note(note: str) -> None:
    if reason := note_problem(note):
        problem = FieldProblem(None, "note", reason)
        raise ServiceError(Refusal.BAD_INPUT, str(problem), [problem])


def _repeats_last_check(job: SendJob, found: SearchResult) -> bool:
    """A settled job whose latest event is a check that found these same copies."""
    return (
        job.state in FINAL_STATES
        and job.checked_version == job.version
        and job.checked_copies == tuple(found.recorded_copies)
        and job.checked_count == found.count
    )


#: How many of the events a conflict names (the rest are counted).
_CHANGES_SHOWN = 4


def _changes(changes: Sequence[str]) -> str:
    """The changes another writer made, as a conflict names them: the first few."""
    named = ", ".join(changes[:_CHANGES_SHOWN])
    if len(changes) > _CHANGES_SHOWN:
        named += f" and {len(changes) - _CHANGES_SHOWN} more"
    return named


def _change(event: Any) -> str:
    """One event another writer appended, as a conflict names it."""
    name = type(event).__name__
    if name == "Attempted":
        return f"attempt {event.attempt} by {event.daemon or 'a daemon'}"
    if name in ("Resolved", "Cancelled", "Checked"):
        what = f" as {event.decision}" if name == "Resolved" else ""
        return f"{name.lower()}{what} by {event.by}"
    return name


def _require_review(job: SendJob, what: str) -> None:
    if job.state is not JobState.REVIEW:
        raise ServiceError(
            Refusal.CONFLICT,
            f"job {job.key!r} is {job.state.value}, not in review: only a job in review "
            f"can be {what}",
        )


def _answer(job: SendJob, found: SearchResult, recorded: bool, moved: str = "") -> CheckAnswer:
    # A copy's headers are the mailbox's words, not ours: whoever puts a message with the
    # job's Message-ID there writes them, and every door serves this answer
    # (docs/how-it-works.md "Another's words").
    words = characters.recorded
    copies = [
        Copy(h.provider_message_id, words(h.date), words(h.to), words(h.subject), h.in_trash)
        for h in found.hits
    ]
    hits = [
        {
            "provider_message_id": h.provider_message_id,
            "message_id": words(h.message_id_header),  # ours, but spaces may pad it
            "labels": list(h.labels),
            "in_trash": h.in_trash,
        }
        for h in found.hits
    ]
    return CheckAnswer(
        job.key,
        job.state.value,
        job.message_id,
        found.query,
        copies,
        recorded,
        hits,
        purged=job.purged,
        moved=moved,
        found=found.count,
        complete=found.complete,
        version=job.version,
    )


__all__ = [
    "REASONS",
    "SORTS",
    "TRIAGE_NOTE",
    "ChannelPolicies",
    "CheckAnswer",
    "Copy",
    "Intake",
    "JobPage",
    "JobView",
    "ProviderSource",
    "QueuePage",
    "Refusal",
    "ServiceError",
    "Services",
    "Submitted",
    "TriageItem",
    "ValidJobs",
    "check_advice",
    "check_since_review",
    "resolve_as_a_person",
    "safe_decisions",
    "sent_without_evidence",
]
