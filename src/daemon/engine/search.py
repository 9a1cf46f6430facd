"""Sweep and verify: search the sender's mailbox for a job's Message-ID and count copies.

Sweep: a job whose send outcome is unknown, once the index lag (``search_after``) has
passed. Verify: a job that was sent again without proof that the earlier attempt failed,
``verify_after`` its confirmation, when an earlier copy hidden by a long index lag would
have surfaced. Both hand the search result and the policy's decision to the aggregate's
``record_search``, the one place where a search result becomes events.

A search that fails (provider down, quota) is no information, never "no copies": nothing
is recorded, and the job's searches wait a little instead of hammering the provider. A
failure that proves the provider unavailable counts toward its scope's circuit, as a
send's does, and while that circuit is open the scope's due searches wait, except its one
probe (docs/operations.md "Outages and quotas").

With a provider that may leave unsent drafts (`Provider.leaves_drafts`: Graph, Gmail's
drafts mode), a sweep first deletes the job's unsent drafts (the fence: the lapsed claim's
draft can never be sent late, so the count that follows stays true), recorded as
DraftsDeleted; a person's search never deletes anything. `Tidy` deletes them once a job is
settled, `search_after` later (docs/architecture.md "Drafts never outlive their job").

With a provider that reads the mailbox's history (`Provider.history()`: Gmail's
messages.send path), a sweep whose job's claim recorded a historyId first reads the SENT
messages added since it, at once after the unknown outcome: a copy of ours there confirms
(via history), two are a duplicate; none proves nothing and the search decides as always,
unless the policy's `history_after` makes a later miss believed. A read that fails is no
information, like a failed search; a historyId that expired falls back to the search,
recorded (docs/architecture.md "The history handle").
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TypeVar

from daemon.crashpoints import crash_point
from daemon.engine.circuit import CHECK, Admit, Circuits
from daemon.engine.clock import Clock
from daemon.engine.drafts import asked_draft, record_draft_check, recorded_draft
from daemon.engine.readback import ProviderHealth
from daemon.engine.report import Count
from daemon.engine.work import Step, Work, due
from daemon.providers.base import (
    Provider,
    ProviderError,
    ScopeLost,
    SearchResult,
    calls_while,
    fence_job,
    search_job,
)
from daemon.providers.draft_handle import (
    BeforeDeleting,
    Draft,
    DraftCheck,
    DraftsProvider,
    DraftStatus,
)
from daemon.providers.history_handle import HistoryProvider, HistoryTooOld
from daemon.providers.outcomes import DRAFT_OUT_OF_REACH, DeleteRefused, Fenced
from ledger.application import ConcurrentUpdate
from ledger.copies import copies_found
from ledger.decision_types import (
    AfterHistory,
    AfterSearch,
    AfterVerification,
    Review,
    StopVerifying,
)
from ledger.display import quoted
from ledger.exceptions import known
from ledger.job import DRAFTS_FENCE, DRAFTS_TIDY, SendJob, TransitionError
from ledger.stores.unchanged import Changed
from ledger.vocabulary import JobState, PolicyRef
from policies import decisions
from policies.model import ChannelPolicy

log = logging.getLogger("sendledger.engine")
T = TypeVar("T")
#: Saves of a sweep's answer tried while other writers keep appending facts beside it.
FACT_TRIES = 3
#: Why a sweep's answer is not taken (`Sweep._handle_refused`), its provider's name.
_MARKED_WHILE_OUT = (
    "provider {} replaces Message-IDs (found by a read-back while this job's search was"
    " out): its answer is no evidence"
)


class SearchBackoff:
    """When each job's search may be made: after its last failed search's wait, and while
    its scope's circuit is open only as the probe (`circuit.py`). In memory: nothing about
    the job changed, so nothing is recorded."""

    def __init__(
        self, circuits: Circuits, clock: Clock, may_call: Callable[[Work], bool] | None = None
    ) -> None:
        """`may_call(work)`: whether this daemon may still call for the job's quota scope
        now (`owners.py`), asked right before each call; None: it works for every scope."""
        self._circuits = circuits
        self._clock = clock
        self._may_call = may_call
        self._lock = threading.Lock()
        self._not_before: dict[str, datetime] = {}
        self._scope_of: dict[str, str] = {}  # jobs held by their scope's open circuit

    def held(self, key: str, now: datetime) -> bool:
        with self._lock:
            not_before = self._not_before.get(key)
            if not_before is not None and now >= not_before:
                del self._not_before[key]
                not_before = None
            scope = self._scope_of.get(key)
        if not_before is not None:
            return True
        if scope is None:
            return False
        if self._circuits.holds(scope, now):
            return True
        with self._lock:
            self._scope_of.pop(key, None)  # closed, or its probe is due: try again
        return False

    def waiting(self, now: datetime) -> int:
        """How many jobs are held now: the tick reads that many more due rows, so held
        jobs at the head of the index never starve the others. Forgets the jobs no longer
        held (one settled meanwhile by another daemon or a human is never asked again)."""
        with self._lock:
            self._not_before = {k: t for k, t in self._not_before.items() if now < t}
            holding = {s for s in set(self._scope_of.values()) if self._circuits.holds(s, now)}
            self._scope_of = {k: s for k, s in self._scope_of.items() if s in holding}
            return len(self._not_before.keys() | self._scope_of.keys())

    def ask(self, work: Work, drafts: DraftsProvider, provider: Provider) -> DraftCheck | None:
        """The job's draft's answer, under the same circuit and backoff as a search."""
        draft = known(asked_draft(work.job), "ask needs a recorded draft")
        return self._call(
            work, provider, "draft check", lambda: drafts.check_draft(draft), "searched"
        )

    def search(
        self, work: Work, provider: Provider, fenced: Fenced | None = None
    ) -> SearchResult | None:
        """The job's copies, those its claims' recorded drafts became included, every one
        (a fence records what it is about to delete, so one recorded deleted may be the
        copy a late send made of it): `search_job`, as a person's check searches. After
        the sweep's fence (`fenced`), a draft it read by id is not read again."""
        job = work.job
        return self._call(
            work,
            provider,
            "search",
            lambda: search_job(provider, job.message_id, job.made_drafts, fenced),
            "searched",
        )

    def history(
        self, work: Work, history: HistoryProvider, provider: Provider
    ) -> SearchResult | HistoryTooOld | None:
        """The copies of ours the mailbox's history lists since the job's claim, under the
        same circuit and backoff as a search (an expired start is an answer, not a failure)."""
        job = work.job
        start = known(job.history_id, "a history read needs the claim's historyId")

        def read() -> SearchResult | HistoryTooOld:
            try:
                return history.sent_since(start, job.message_id)
            except HistoryTooOld as expired:
                return expired

        return self._call(work, provider, "history read", read, "searched")

    def delete_draft(
        self, work: Work, drafts: DraftsProvider, provider: Provider, draft_id: str
    ) -> bool | None:
        """One draft deleted (False: it was gone already), under the circuit and backoff."""
        return self._call(work, provider, "draft fence", lambda: drafts.delete_draft(draft_id))

    def delete_drafts(
        self,
        work: Work,
        provider: Provider,
        what: str,
        before_deleting: BeforeDeleting | None = None,
    ) -> Fenced | None:
        """The job's unsent drafts deleted, under the same circuit and backoff: those its
        claims recorded by id too (Graph: another daemon's, the index may not list them),
        every one, those a fence recorded deleted included: recorded before its deletion,
        a fence whose deletion then failed left its drafts in the mailbox.
        `before_deleting`: as `Provider.delete_drafts` takes it (what it raises, a save
        refused, is raised on: no answer of the provider's, nothing deleted)."""
        job = work.job
        return self._call(
            work,
            provider,
            what,
            lambda: fence_job(provider, job.message_id, job.made_drafts, before_deleting),
        )

    def wait(self, key: str, seconds: float) -> None:
        """The job's checks wait `seconds` (nothing can be done for it now)."""
        with self._lock:
            self._not_before[key] = self._clock() + timedelta(seconds=seconds)

    def _call(
        self,
        work: Work,
        provider: Provider,
        what: str,
        call: Callable[[], T],
        counted: Count | None = None,
    ) -> T | None:
        """`call()`, one provider call of a sweep, a verification or a tidy; None when its
        circuit holds it, it failed (no information: never a miss), or the job's quota
        scope is no longer this daemon's."""
        key, scope = work.job.key, provider.scope()
        if self._may_call is not None and not self._may_call(work):
            # Asked before each call, not only when the job was loaded: the calls before
            # this one (a fence, a draft check) may each take the provider's timeout, and
            # the scope may have gone to another daemon meanwhile (two daemons calling for
            # one mailbox, over its quota). Nothing is recorded: its owner does the step.
            log.info("job %s: no %s: its quota scope went to another daemon", key, what)
            return None
        admit = self._circuits.admit(scope, work.now, CHECK)
        if admit is Admit.HOLD:
            with self._lock:
                self._scope_of[key] = scope
            return None
        with self._lock:
            self._scope_of.pop(key, None)
        check = self._may_call
        may_go_on = None if check is None else (lambda: check(work))
        try:
            with self._circuits.call(scope, self._clock), calls_while(may_go_on):
                result = call()
        except DeleteRefused:
            raise  # an answer, and the same at every try: the caller decides on it
        except ScopeLost:
            # Stopped between two of its calls (Graph's search and draft deletion make
            # several): no answer, no failure of the provider's; its new owner does it.
            if admit is Admit.PROBE:
                self._circuits.probe_returned(scope)
            log.info("job %s: %s stopped: its quota scope went to another daemon", key, what)
            return None
        except ProviderError as exc:
            now = self._clock()
            wait = max(decisions.retry_after_wait(exc.retry_after), 1.0)
            with self._lock:
                self._not_before[key] = now + timedelta(seconds=wait)
            log.warning(
                "job %s: %s failed (%s), again in %.1fs", key, what, quoted(exc.reason), wait
            )
            work.count("errors")
            return None
        except BaseException:
            if admit is Admit.PROBE:
                self._circuits.probe_returned(scope)  # no answer either way: not the probe
            raise
        if counted is not None:
            # A search's or a draft check's answer, not a deletion's: the crash matrix
            # means the point between an answer that decides and its record.
            crash_point("after-search")
        with self._lock:
            self._not_before.pop(key, None)
        if counted is not None:
            work.count(counted)
        return result


class Sweep:
    state = JobState.UNKNOWN

    def __init__(self, health: ProviderHealth, backoff: SearchBackoff, clock: Clock) -> None:
        self._health = health
        self._backoff = backoff
        self._clock = clock

    def is_due(self, job: SendJob, now: datetime) -> bool:
        return due(job, now) and not self._backoff.held(job.key, now)

    def run(self, work: Work) -> None:
        found = work.policy_and_provider()
        if found is None:
            return
        policy, provider = found
        drafts = provider.drafts()
        # An attempt made without a draft (a provider not in drafts mode) has nothing
        # for the drafts flow (`drafts.py`) to answer; one whose draft a fence recorded
        # as deleted is answered by that draft.
        draft = None if work.job.asked_draft is None else asked_draft(work.job)
        if draft is not None:
            # The attempt sent its draft: its answer settles the job, asked where the
            # attempt was made. A provider that left drafts mode since (a restart with
            # `send_via` changed) can neither ask nor fence it: never searched instead.
            if drafts is None:
                work.to_review(
                    decisions.draft_out_of_reach(policy),
                    f"draft {draft.draft_id} not checked: provider {work.provider_name} "
                    "no longer sends through drafts (send_via); check its mailbox",
                )
                return
            self._ask_draft(work, drafts, provider, policy)
            return
        refused = self._handle_refused(work, policy)
        if refused is not None:
            work.to_review(refused, f"provider {work.provider_name} replaces Message-IDs")
            return
        if _history_due(work.job, work.now):
            self._read_history(work, provider, policy)
            return
        self._fence_and_search(work, provider, policy)

    def _handle_refused(
        self, work: Work, policy: ChannelPolicy, *, answer: SearchResult | None = None
    ) -> Review | None:
        """`decisions.before_search` for the provider the job's attempt was made on, as
        this daemon knows its handle now. Asked before a search or a history read, and
        again once a search's `answer` is in: a read-back may have found the provider
        replacing Message-IDs while the search was out, and a miss read then is no
        evidence that nothing was sent; believed, a `retry` channel would send the job a
        second time. This daemon's own read-back marks the handle in memory at once
        (`readback.py`); another daemon's is read from the store once a tick, so after a
        miss the store is read again now, and the save of what the miss decides holds to
        the handle as read (`Work.unchanged`): another daemon's mark written before that
        save's commit withdraws it (`Changed`), and the sweep asks again. (A history
        read's miss decides no resend: the search it makes due asks first.)"""
        if answer is not None and answer.count == 0:
            work.unchanged = self._health.unmarked_in_store(work.provider_name)
            reliable = work.unchanged is not None
        else:
            reliable = self._health.reliable(work.provider_name)
        return decisions.before_search(policy, handle_reliable=reliable)

    def _fence_and_search(self, work: Work, provider: Provider, policy: ChannelPolicy) -> None:
        """The search of an Unknown job, its unsent drafts deleted first where the
        provider may leave some (the fence: no claim of it is live, so a lapsed claim's
        draft can never be sent after the count). The fence is recorded before its first
        deletion (`_fence_first`), the search's answer after it; each on the version
        loaded, or beside a person's check made meanwhile (`_save_beside_facts`)."""
        fenced = None
        if provider.leaves_drafts:
            fenced = self._fence_drafts(work, provider, policy)
            if fenced is None:
                return  # no answer (the fence, if recorded, stays: its drafts were listed)
        result = self._backoff.search(work, provider, fenced)
        if result is None:
            return
        work.now = self._clock()
        decided: list[AfterSearch] = []
        refused = self._handle_refused(work, policy, answer=result)

        def record(on: SendJob) -> None:
            if refused is not None:
                on.escalate(refused, detail=_MARKED_WHILE_OUT.format(work.provider_name),
                            at=work.now)  # fmt: skip
                return
            decided[:] = [
                decisions.after_search(
                    policy,
                    hits=result.count,
                    misses_before=on.misses,
                    resent=on.resent,
                    now=work.now,
                    only_in_trash=result.only_in_trash,
                )
            ]
            tidy_at = decisions.tidy_at(policy, leaves_drafts=provider.leaves_drafts, now=work.now)
            _record(on.record_search, result, decided[0], work.now, tidy_at)

        def marked_meanwhile() -> None:
            # The handle changed between the read and the commit (another daemon's
            # read-back): nothing was stored; decided again on the handle read now.
            nonlocal refused
            refused = self._handle_refused(work, policy, answer=result)
            decided.clear()

        _save_beside_facts(work, record, changed=marked_meanwhile)
        if decided:
            log.info(
                "job %s: search: %s: %s",
                work.job.key,
                copies_found(result.count, result.complete),
                type(decided[0]).__name__,
            )

    def _fence_drafts(self, work: Work, provider: Provider, policy: ChannelPolicy) -> Fenced | None:
        """The job's unsent drafts deleted before its copies are counted; None when there
        is no answer, or when the provider refuses to delete one for good (a hold, a
        retention label: `DeleteRefused`): that draft may still be sent by a late call,
        which the search would miss, and every sweep would meet the same refusal, so the
        job goes to review, saying which draft to delete (docs/providers.md "Deleting a
        draft: Deleted Items, and the late send")."""
        try:
            return self._backoff.delete_drafts(
                work, provider, "fence", _fence_first(work, self._clock)
            )
        except DeleteRefused as refused:
            work.now = self._clock()
            work.to_review(
                decisions.draft_out_of_reach(policy),
                f"{refused.reason}; {DRAFT_OUT_OF_REACH}",
            )
            log.warning("job %s: to review: %s", work.job.key, quoted(refused.reason))
            return None

    def _read_history(self, work: Work, provider: Provider, policy: ChannelPolicy) -> None:
        """The mailbox's history since the claim, as events: Confirmed via history (one
        copy of ours), Duplicate (two or more), HistoryMissed (none), HistoryUnusable (the
        start expired, or the provider reads no history now: the search decides)."""
        job = work.job
        history = provider.history()
        if history is None:
            job.record_history_unusable(
                reason=f"provider {work.provider_name} reads no history", at=work.now
            )
            work.save()
            return
        answer = self._backoff.history(work, history, provider)
        if answer is None:
            return  # no information: read again after the backoff, or the search decides
        work.now = self._clock()
        if isinstance(answer, HistoryTooOld):
            job.record_history_unusable(reason=answer.reason, at=work.now)
            work.save()
            log.info("job %s: %s: the search decides", job.key, quoted(answer.reason))
            return
        decision = decisions.after_history(
            policy,
            hits=answer.count,
            unknown_at=job.unknown_at or work.now,
            resent=job.resent,
            now=work.now,
        )
        tidy_at = decisions.tidy_at(policy, leaves_drafts=provider.leaves_drafts, now=work.now)
        _record(job.record_history, answer, decision, work.now, tidy_at)
        work.save()
        log.info(
            "job %s: history: %s: %s",
            job.key,
            copies_found(answer.count, answer.complete),
            type(decision).__name__,
        )

    def _ask_draft(
        self, work: Work, drafts: DraftsProvider, provider: Provider, policy: ChannelPolicy
    ) -> None:
        """A job whose draft is recorded is settled by the draft, not by a search. A draft
        still unsent is deleted before the job is recorded as not sent by it (the fence):
        the sweep runs for a claim whose lease lapsed or whose call timed out, and that
        call may still land; once deleted, nothing can send it.

        The fence is recorded (`DraftsDeleted`, why `fence`) before its deletion, on the
        version the check answered for, as a claim is before its call: the draft stays
        the one asked (`SendJob.fenced_draft`), and its SENT message still confirms the
        job. "Not sent" rests only on a deletion this sweep saw succeed: a draft found
        gone under a fence recorded earlier (a daemon killed or paused around its
        deletion, a deletion that failed) may as well have been sent by a person in the
        mailbox, whose client sends a draft under a message id of its own, so it is
        `DraftGone` and the search decides (docs/architecture.md "The life of one job on
        a drafts provider")."""
        job = work.job
        draft = known(asked_draft(job), "a fence needs a recorded draft")
        check = self._backoff.ask(work, drafts, provider)
        if check is None:
            return
        if check.status is DraftStatus.PENDING:
            # One fencer per fence: a second sweep's record of it conflicts and is
            # refused; a sweep that finds it recorded (a daemon killed, or still at it)
            # deletes the draft again.
            if recorded_draft(work.job) == draft:
                _save_beside_facts(work, _fence(draft, self._clock()))
            deleted = self._backoff.delete_draft(work, drafts, provider, draft.draft_id)
            if deleted is None:
                return  # no answer: asked again later, the fence recorded
            if not deleted:
                # Gone since the check: sent by that call or by a person, or deleted by
                # a person or another fence. Only its message can say: SENT, or nothing.
                check = self._backoff.ask(work, drafts, provider)
                if check is None:
                    return
        work.now = self._clock()
        # A person's check while the draft was asked and fenced must not lose the answer:
        # the draft this sweep deleted would be read next time as gone, which proves
        # nothing, and the job searched or sent to review though it is known unsent.
        _save_beside_facts(work, self._draft_answer(work, draft, check, policy, provider))
        log.info("job %s: its draft is %s", job.key, check.status.value)

    def _draft_answer(
        self,
        work: Work,
        draft: Draft,
        check: DraftCheck,
        policy: ChannelPolicy,
        provider: Provider,
    ) -> Callable[[SendJob], None]:
        """What `draft` answered, as the events a job records; refused on a job whose
        draft to ask is no longer the one asked."""
        now = work.now
        reliable = self._health.reliable(work.provider_name)
        tidy_at = decisions.tidy_at(policy, leaves_drafts=provider.leaves_drafts, now=now)

        def record(on: SendJob) -> None:
            if asked_draft(on) != draft:
                why = "another draft is recorded since it was asked"
                raise TransitionError(on.key, on.state.value, "record its draft's answer", why)
            record_draft_check(
                on,
                check,
                policy,
                now=now,
                handle_reliable=reliable,
                tidy_at=tidy_at,
            )

        return record


def _fence_first(work: Work, clock: Clock) -> BeforeDeleting:
    """A sweep's fence of the drafts listed, recorded on the version the sweep loaded (or
    beside the facts written since: `_save_beside_facts`) between the provider's listing
    and its first deletion, as a person's resend records its fence
    (`Services._begin_fence`) and a claim is recorded before its call. Anything else
    written meanwhile (another daemon's sweep and its next attempt, after the mailbox's
    scope moved to it) refuses the record (`ConcurrentUpdate`) and nothing is deleted:
    the job is left to whoever moved it. Deleted first and recorded after, a stalled
    sweep's listing could show that next attempt's draft, about to be sent, and its
    deletion would make that send find it gone (Unknown, for a job nobody sent twice).
    A draft made after the listing needs a write after the record, so a fence whose
    record was saved deletes only drafts of attempts before it, however late its
    deletions land (docs/architecture.md "Drafts never outlive their job")."""

    def record(listed: list[str]) -> None:
        if not set(listed) - work.job.deleted_drafts:
            # Nothing to delete (the search's answer is saved on the version read), or
            # only drafts a fence recorded already, a deletion that failed tried again:
            # no later attempt's draft has such an id (each is new, and one recorded
            # deleted is never reused), so a record would hold nothing back, and one per
            # try of a deletion that keeps failing would grow the trail without end.
            return
        at = clock()
        _save_beside_facts(
            work, lambda on: on.record_drafts_deleted(draft_ids=listed, why=DRAFTS_FENCE, at=at)
        )

    return record


def _fence(draft: Draft, at: datetime) -> Callable[[SendJob], None]:
    """The fence of `draft` as the job records it, before the deletion; refused on a job
    whose recorded draft is no longer `draft`."""

    def record(on: SendJob) -> None:
        if recorded_draft(on) != draft:
            why = "another draft is recorded since it was asked"
            raise TransitionError(on.key, on.state.value, "fence its draft", why)
        on.record_drafts_deleted(draft_ids=[draft.draft_id], why=DRAFTS_FENCE, at=at)

    return record


def _record(
    command: Callable[..., None],
    result: SearchResult,
    decision: AfterSearch | AfterVerification | AfterHistory,
    at: datetime,
    tidy_at: datetime | None = None,
) -> None:
    """A search's or a history read's answer as the job's events (`command`: the job's
    `record_search` or `record_history`): its kept copies and the count of all."""
    command(
        query=result.query,
        copies=result.copies,
        count=result.count,
        complete=result.complete,
        decision=decision,
        at=at,
        tidy_at=tidy_at,
    )


def _save_beside_facts(
    work: Work, record: Callable[[SendJob], None], *, changed: Callable[[], None] | None = None
) -> None:
    """`record(job)` the sweep's answer and save it; when only facts were appended
    meanwhile (a person's check: `Work.beside_facts`), again on the job they left. A
    fence's deletion is the sweep's own doing: dropped, the next sweep would read the
    draft it deleted as gone, sent or deleted by someone. A save withdrawn because what
    it was decided on changed (`Work.unchanged`) is recorded again after `changed()`,
    which decides again (and says what the next save holds to)."""
    record(work.job)
    unchanged = work.unchanged  # each try's save holds to it (`Work.save` takes it)
    for attempt in range(FACT_TRIES):
        seen = work.job.version - len(work.job.pending_events)
        work.unchanged = unchanged
        try:
            work.save()
            return
        except ConcurrentUpdate:
            if attempt == FACT_TRIES - 1 or not work.beside_facts(seen):
                raise
        except Changed:
            if changed is None or attempt == FACT_TRIES - 1 or not work.beside_facts(seen):
                raise
            changed()
            unchanged = work.unchanged
        record(work.job)


def _history_due(job: SendJob, now: datetime) -> bool:
    """Whether the job's history read is due now: not while its search is due as well
    (the search decides once its time has come, whatever the history does)."""
    if job.history_due_at is None or now < job.history_due_at:
        return False
    return job.search_due_at is None or now < job.search_due_at


class Verify:
    state = JobState.CONFIRMED

    def __init__(self, backoff: SearchBackoff, clock: Clock) -> None:
        self._backoff = backoff
        self._clock = clock

    def is_due(self, job: SendJob, now: datetime) -> bool:
        return (
            job.verifying
            and job.verify_at is not None
            and job.verify_at <= now
            and not self._backoff.held(job.key, now)
        )

    def run(self, work: Work) -> None:
        job = work.job
        if work.policy is None or work.provider is None:
            # No way to search: the job stays confirmed; a human can `review check` it.
            job.stop_verifying(StopVerifying(PolicyRef.missing(job.channel)), at=work.now)
            work.save()
            return
        result = self._backoff.search(work, work.provider)
        if result is None:
            return
        work.now = self._clock()
        decision = decisions.after_verification(
            work.policy,
            hits=result.count,
            verifications_before=job.verifications,
            now=work.now,
        )
        _record(job.record_search, result, decision, work.now)
        work.save()
        log.info("job %s: verification: %s", job.key, copies_found(result.count, result.complete))


class FirstDue:
    """Steps on the jobs of one state, handed out as one step: each job runs the first of
    them that is due for it. Verify and the confirmed jobs' Tidy read the same due rows (a
    confirmed job's due time is the earlier of `verify_at` and `tidy_at`). Handed out
    apart, in a daemon's tick, which waits for nothing, the first took the rows at the
    head of that queue, the ones due for the second, and its loads, which then did
    nothing, still held the check workers when the second was handed the same rows: a
    confirmed job's drafts were never tidied (nor a verification behind those rows ever
    made)."""

    def __init__(self, *steps: Step) -> None:
        if len({step.state for step in steps}) != 1:
            raise ValueError("FirstDue takes steps of one state")
        self.steps = steps
        self.state = steps[0].state

    def is_due(self, job: SendJob, now: datetime) -> bool:
        return any(step.is_due(job, now) for step in self.steps)

    def run(self, work: Work) -> None:
        for step in self.steps:
            if step.is_due(work.job, work.now):
                step.run(work)
                return


class Tidy:
    """A settled job's unsent drafts deleted at the provider, once `tidy_at` has come
    (the settling command set it: `decisions.tidy_at`). One per final state, since the
    index is read per state.

    Deleted first and recorded after, unlike a fence (`_fence_first`), and still decided
    on what it read: its job is final, and no final job is ever sent again. Abandoned and
    cancelled have no way out; a confirmed job reaches review only for a bounce or for a
    recount that found two copies, and `SendJob.resolve` refuses a resend of either. So
    no attempt of the job follows this listing, and a stalled tidy deletes only drafts
    no attempt will send. Recorded first, its record (which ends the job's tidy) would
    leave the drafts of a deletion that then failed in the mailbox for good. A resend's
    fence would not make this order safe for a final job that could be resent: a tidy
    stalled between its load and its listing could list the draft of the attempt made
    after that resend and delete it under its send."""

    def __init__(self, state: JobState, backoff: SearchBackoff, clock: Clock) -> None:
        self.state = state
        self._backoff = backoff
        self._clock = clock

    def is_due(self, job: SendJob, now: datetime) -> bool:
        return (
            job.tidy_at is not None and job.tidy_at <= now and not self._backoff.held(job.key, now)
        )

    def run(self, work: Work) -> None:
        job, provider = work.job, work.provider
        if provider is None:
            # No provider to ask (its channel's policy is gone): the drafts wait in the
            # mailbox until one is configured; looked at again a minute later.
            self._backoff.wait(job.key, 60.0)
            log.error("job %s: its unsent drafts cannot be deleted: no provider", job.key)
            work.count("errors")
            return
        try:
            tidied = self._backoff.delete_drafts(work, provider, "drafts tidy")
        except DeleteRefused as refused:
            # No attempt of a final job follows: the tidy ends, the drafts it could not
            # delete named once, not tried at every return for ever.
            log.error("job %s: unsent draft left in the mailbox: %s", job.key, refused.reason)
            work.count("errors")
            tidied = Fenced(refused.deleted)
        if tidied is None:
            return
        deleted = tidied.deleted
        at = self._clock()
        # Beside a person's check of the settled job: the next tidy would find nothing to
        # delete, and the trail would say no draft of it was ever left.
        _save_beside_facts(
            work, lambda on: on.record_drafts_deleted(draft_ids=deleted, why=DRAFTS_TIDY, at=at)
        )
        work.count("tidied")
        if deleted:
            log.info("job %s: %d unsent drafts deleted: %s", job.key, len(deleted), deleted)
