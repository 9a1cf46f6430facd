"""Dispatch: send one due job, with the claim written before the provider is called.

Invariant 1 (``docs/architecture.md``): the Attempted event is durable before the call
starts, and only the writer whose claim was stored makes the call; a conflict on the claim
means another daemon sends it, and this one does not. `Dispatch.dispatch` is the whole
sequence for one job, in one send worker; the batching around it is elsewhere: which jobs
a worker takes (`sends.py`: per scope, in turn, quota reserved, circuit closed) and how its
two saves share commits with other workers' (`commit.py`).

The claim is a lease on its one call (`leases.py`): its deadline is counted from the moment
the call starts, after any draft step, and renewed while the call runs, so recovery never
takes a claim whose call is alive in this daemon.
"""

from __future__ import annotations

import functools
import logging
import random
import threading
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import daemon.engine.drafts as drafts_flow
from daemon.crashpoints import crash_point
from daemon.engine.circuit import DRAFT, Circuits
from daemon.engine.clock import Clock
from daemon.engine.commit import LeftToRecovery
from daemon.engine.leases import Lease, Leases
from daemon.engine.policy_holder import PolicyHolder
from daemon.engine.readback import ProviderHealth
from daemon.engine.unknown import unknown_to_events
from daemon.engine.unsent import UnsentClaims, release_decision
from daemon.engine.work import Work, count_failure
from daemon.providers.base import (
    Provider,
    ProviderError,
    SendKind,
    SendOutcome,
    calls_end_in,
    calls_while,
)
from daemon.providers.draft_handle import (
    Draft,
    DraftCheck,
    DraftFirst,
    DraftRefused,
    DraftsProvider,
)
from ledger.application import ConcurrentUpdate
from ledger.decision_types import AfterRejection, Review
from ledger.display import quoted
from ledger.exceptions import known
from ledger.job import (
    CLAIM_READ_BACK,
    DRAFTS_CLAIM_LOST,
    NOT_OURS,
    RELEASED_UNSENT,
    STOPPED,
    WITHHELD,
    SendJob,
    TransitionError,
    waits_for_provider,
)
from ledger.message import render_checked
from ledger.stores.index import Withdrawn
from ledger.stores.unchanged import Changed, Unchanged
from ledger.vocabulary import EscalationReason, JobState
from ledger.wire_check import RenderMismatch
from policies import decisions
from policies.model import ChannelPolicy

log = logging.getLogger("sendledger.engine")


#: Reads of the winner a claim that lost its race makes, to record its draft's deletion.
LOST_DRAFT_TRIES = 3


@dataclass(eq=False)  # compared by identity
class Claimed:
    """A job claimed in memory, between its claim and its recorded outcome."""

    work: Work
    policy: ChannelPolicy
    provider: Provider
    raw: bytes
    lease: float  # seconds: the provider's timeout plus the daemon's grace
    deadline: datetime  # the claim's deadline as saved (its lease's end, by our clock)
    outcome: SendOutcome | None = None
    draft: Draft | None = None  # send_via = "drafts": the recorded draft the call sends
    drafts: DraftsProvider | None = None  # the provider's drafts calls, with `draft`
    created: bool = False  # `draft` was created by this claim's draft step (not reused)
    check: DraftCheck | None = None  # the draft's answer right after an unknown outcome
    # Graph (`Provider.draft_first`): the draft made before the claim, its id recorded
    # with it, or the create's refusal, the call's outcome with no send made.
    made: str | SendOutcome | None = None
    first: DraftFirst | None = None  # the provider's two steps, with `made`
    probe: bool = False  # the one job its scope's open circuit let through
    held: Lease | None = None  # the claim's lease while its worker holds it (`leases.py`)


def _moved_since_loaded(work: Work) -> bool:
    """Whether the job was written since this worker loaded it, so that its claim would
    conflict (a worker loads 8 or more at a time: the last can be seconds old, and another
    daemon may have claimed, sent and tidied it meanwhile). Asked before a draft step: a
    draft made for such a job is deleted only by this claim's loss (`save_claim`), so a
    lost create answer, or this daemon killed before that, would leave it in the mailbox
    after the job's tidy (docs/architecture.md "Drafts never outlive their job")."""
    row = work.ledger.row(work.job.key)
    return row is None or row.version != work.job.version


def _why_not_sent(review: Review, job: SendJob) -> str:
    if review.reason is EscalationReason.SENDER_NOT_ALLOWED:
        return f"the channel's policy no longer allows sending as {job.from_addr!r}"
    return f"{job.round_attempts} provider calls made"


def _unknown_reason(outcome: SendOutcome) -> str:
    if outcome.kind is SendKind.CONFIRMED:
        return "2xx without a readable message id"
    return outcome.reason or "outcome unknown"


class Dispatch:
    state = JobState.REQUESTED

    def __init__(
        self,
        health: ProviderHealth,
        clock: Clock,
        circuits: Circuits,
        leases: Leases,
        *,
        provider_timeouts: Mapping[str, float],
        deadline_grace: float,
        rng: random.Random,
        stopping: threading.Event,
        daemon: str = "",
        may_call: Callable[[ChannelPolicy | None, str, datetime], bool] | None = None,
        policies: PolicyHolder | None = None,
        unsent: UnsentClaims | None = None,
    ) -> None:
        """`may_call(policy, from_addr, now)`: whether this daemon may call for that
        From's quota scope now (`OurScopes.may_call`); None: it works for every scope.
        `policies`: the policies in force now. `unsent`: where a claim whose save and
        read-back both failed is kept, to be read back again (`unsent.py`)."""
        self._unsent = unsent
        self._may_call = may_call
        self._policies = policies
        self._daemon = daemon  # recorded on each claim (recover.py: RecoverOwnClaims)
        self._health = health
        self._clock = clock
        self._circuits = circuits
        self._leases = leases
        self._timeouts = provider_timeouts
        self._grace = deadline_grace
        self._rng = rng
        self._stopping = stopping

    def is_due(self, job: SendJob, now: datetime) -> bool:
        return job.due_at is None or job.due_at <= now

    def run(self, work: Work) -> None:
        self.dispatch(work)
        work.flush()  # outside the send workers nobody else would commit the outcome

    def dispatch(self, work: Work, *, probe: bool = False) -> bool:
        """Invariant 1 for one job: claim, save, send, record, save. Whether the provider
        was called. `probe`: the one job an open circuit lets through. The claim's save
        is waited for; the outcome's is not (it shares the next commit). From the claim's
        save until its outcome is durable the worker holds the claim's lease
        (`leases.py`): renewed while the call runs, never recovered by this daemon."""
        work.now = self._clock()
        called = False
        try:  # the claim too: a probe whose draft step raised must be handed back
            claimed = self.claim(work)
            if claimed is None:
                return False
            claimed.probe = probe
            try:
                # Durable; a conflict here means no call is made.
                saved = self.save_claim_or_read_back(claimed)
            except Changed:
                self._claim_withdrawn(claimed)
                return False
            except Exception:
                self._unsaved_made_draft(claimed)
                raise
            if saved:
                with self._leases.holding(work.job, claimed.lease, work.now, self._grace) as lease:
                    claimed.held = lease
                    self.send(claimed)
                called = True
        finally:
            if probe and not called:
                self._circuits.probe_returned(_scope(work))
        if claimed.held is not None:
            self._leases.stop_renewing(claimed.held)
        self.outcome_to_events(claimed)
        # The outcome, durable with the next commit (this worker's next claim, or its
        # flush before it sleeps: `commit.py`); if it fails, recovered at the deadline.
        work.save_soon(
            functools.partial(self.outcome_saved, claimed, list(work.job.pending_events))
        )
        return True

    def outcome_saved(
        self, claimed: Claimed, events: list[Any], error: BaseException | None
    ) -> None:
        """Told by the commit, on its thread, that the outcome's `events` are durable
        (`error` None: reported and counted) or failed (counted as the step's guard
        would); the claim's lease is released either way."""
        work = claimed.work
        try:
            if error is not None:
                count_failure(work.job.key, error, work.counter, "the outcome's save")
            else:
                work.report_saved(events)
                self.count_outcome(claimed)
        finally:
            if claimed.held is not None:
                self._leases.release(claimed.held)

    def save_claim_or_read_back(self, claimed: Claimed) -> bool:
        """`save_claim`; True: the claim is durable, the call may go. A save that raised
        with its commit not known (the COMMIT's answer lost and the store's tries given
        up) is settled by reading the store back, not left to the claim's deadline and a
        search (or a person's look) for a send never made: this process's own Attempted
        stored, the claim is released with nothing sent (False, the outcome set: due
        again); not stored, the save's failure as before; the read failing too, the
        save's failure, the claim kept to be read back again (`unsent.py`)."""
        try:
            self.save_claim(claimed)
            return True
        except (ConcurrentUpdate, Withdrawn, LeftToRecovery):
            # Known not stored (another writer's, the handle changed, or a stopping
            # daemon's save not begun): nothing to read back, and at a stop no read of
            # the store past the window its save kept (`commit.py`).
            raise
        except Exception:
            if self._stopping.is_set():
                # A stop: no read past the window the save kept, which a store down would
                # wait out again (docs/operations.md "What a store outage costs"); the
                # claim is left to the next start, as a kept one is.
                raise
            work = claimed.work
            try:
                stored = work.ledger.stored_after_unsure(work.job)
            except Exception as exc:
                # Still unsure: read back again once the store answers (`unsent.py`).
                log.info("job %s: the claim's save not read back: %s", work.job.key, exc)
                if self._unsent is not None:
                    self._unsent.remember(work.job, claimed.policy)
                stored = False
            if not stored:
                raise
        log.warning("job %s: %s", work.job.key, CLAIM_READ_BACK)
        claimed.outcome = claim_read_back()
        work.now = self._clock()
        return False

    def save_claim(self, claimed: Claimed) -> None:
        """The claim, durable. When another writer got there first (a person cancelled
        the job during its draft step, another daemon claimed it), the draft this claim's
        draft step created is deleted (unless the winner's claim sends that very draft),
        so no copy of a job that is not ours to send waits in the mailbox."""
        try:
            claimed.work.save()
        except ConcurrentUpdate:
            if claimed.created and claimed.draft is not None and claimed.drafts is not None:
                self._delete_lost_draft(claimed, claimed.drafts, claimed.draft)
            raise

    def _unsaved_made_draft(self, claimed: Claimed) -> None:
        """A claim whose save failed (lost to another writer, withdrawn, its commit not
        known): the draft made for it, if any, deleted. This claim makes no call, so
        nobody sends that draft; stored after all, its recovery fences nothing and the
        search decides."""
        if isinstance(claimed.made, str) and claimed.first is not None:
            self._delete_made_draft(claimed.work, claimed.policy, claimed.first, claimed.made)

    def _delete_lost_draft(self, claimed: Claimed, drafts: DraftsProvider, draft: Draft) -> None:
        """The draft of a claim that lost its race, deleted, its deletion recorded first
        on the version read, where the winner's draft was found not to be it: another
        daemon's draft step may find it by its Message-ID and reuse it, and a deletion
        decided on an older version would land under that claim's send (a 404, the draft
        gone: `DraftGone`). A draft recorded deleted is never reused (`prepare_draft`).
        While another claim of the job is in flight its history is its own (nothing is
        recorded): the draft is deleted at once while the job's quota scope is still
        this daemon's, as a later attempt could reuse it only once that claim's own
        draft is gone, after its outcome. A scope gone to another daemon (the one whose
        claim won), the draft is left to it: this daemon, stalled, could delete it under
        that daemon's next claim, which found it by its Message-ID and reused it."""
        work = claimed.work
        key = work.job.key

        def record(winner: SendJob) -> bool:
            if winner.draft_id == draft.draft_id:
                return False  # the winner's claim found our draft and sends it
            winner.record_drafts_deleted(
                draft_ids=[draft.draft_id], why=DRAFTS_CLAIM_LOST, at=self._clock()
            )
            return True

        for _ in range(LOST_DRAFT_TRIES):
            try:
                _job, recorded = work.ledger.update(key, record)
            except ConcurrentUpdate:
                continue  # another writer again: read the winner once more
            except TransitionError:
                # Another claim in flight: deleted, not recorded, while the scope is ours.
                if self._may_call_now(claimed):
                    break
                log.info("job %s: draft %s left to its scope's new owner", key, draft.draft_id)
                return
            if not recorded:
                return
            break
        else:
            log.info("job %s: draft %s left: the job kept changing", key, draft.draft_id)
            return
        try:
            if not drafts.delete_draft(draft.draft_id):
                return
        except ProviderError as exc:
            # Recorded deleted (so never reused) or not, the job's tidy deletes it.
            log.info("job %s: draft %s not deleted (%s)", key, draft.draft_id, quoted(exc.reason))
            return
        log.info("job %s: draft %s deleted: its claim lost to another writer", key, draft.draft_id)

    def claim(self, work: Work) -> Claimed | None:
        """Decide and render, then record the claim on the job in memory (not saved);
        None when the job is not to be sent now (to review, saved; or left due)."""
        if self._reloaded(work):
            return None
        found = work.policy_and_provider()
        if found is None:
            return None
        policy, provider = found
        job = work.job
        try:
            # Rendered and proved before the claim: a message that cannot be built, or
            # does not say what the job says, is never claimed.
            raw = render_checked(job)
        except RenderMismatch as exc:
            work.to_review(
                Review(policy.ref, EscalationReason.RENDER_MISMATCH), f"render mismatch: {exc}"
            )
            return None
        except ValueError as exc:
            work.to_review(decisions.cannot_build(policy), f"cannot build the message: {exc}")
            return None
        # After the render: a From that cannot be written is a message that cannot be
        # built, not a sender the policy withdrew.
        refused = decisions.refused_before_attempt(
            policy, attempts_made=job.round_attempts, from_addr=job.from_addr
        )
        if refused is not None:
            work.to_review(refused, _why_not_sent(refused, job))
            return None
        unchanged = None
        if job.requeued:
            unchanged = self._resend_unmarked(work, policy)
            if unchanged is None:
                return None
        if self._stopping.is_set():
            return None
        draft, created = None, False
        drafts = provider.drafts()
        if drafts is not None:
            if _moved_since_loaded(work):
                work.count("skipped")
                return None
            # The draft step is a provider call that may take its whole timeout: an
            # outcome left for the next commit (`commit.py`) must not wait behind it.
            work.flush()
            try:
                # Its failures feed the circuit as a read's (`Circuits.call`), its answers
                # nothing: a draft made or found proves nothing about sends (DRAFT).
                with self._circuits.call(provider.scope(), self._clock, DRAFT):
                    draft, created = drafts_flow.prepare_draft(
                        job, drafts, raw, work.now, may_create=self._may_create(work, policy)
                    )
            except drafts_flow.DraftAlreadySent as sent:
                tidy_at = _tidy_at(policy, provider, work.now)
                drafts_flow.confirm_recorded(job, policy, sent.draft, work.now, tidy_at)
                work.save()
                return None
            except drafts_flow.DraftChanged as changed:
                # A person edited the job's draft in the mailbox: sending it would send
                # what they wrote under the job's name, never what the job proved.
                work.to_review(
                    Review(policy.ref, EscalationReason.DRAFT_CHANGED),
                    f"{changed}; not sent",
                )
                return None
            except drafts_flow.DraftVanished as vanished:
                # Sent from the mailbox by a person, or deleted there: a new draft sent
                # now would be a second copy in the first case. Its moment is kept: a
                # person's resend waits the index out from it (`draft_gone_at`).
                work.now = self._clock()  # found gone by now: the latest it can have gone
                job.record_draft_found_gone(policy=policy.ref, at=work.now)
                work.to_review(
                    Review(policy.ref, EscalationReason.UNKNOWN_OUTCOME),
                    f"{vanished}; not sent: look for it in the Sent folder",
                )
                return None
            except drafts_flow.NotOurs:
                self._no_draft(work)
                return None
            except DraftRefused as exc:
                # Refused for good (the port's contract): nothing exists, and asking again
                # every tick would only be refused again, so a human decides, as after a
                # permanent refusal of a send.
                work.to_review(
                    decisions.after_permanent_rejection(policy),
                    f"draft refused, not sent: {exc.reason}",
                )
                return None
            except ProviderError as exc:
                # No draft, no claim: nothing can have been sent; the job stays due.
                drafts_flow.no_draft(work, exc)
                return None
            # The lease is counted from the call, not from before the draft step.
            work.now = self._clock()
        first = provider.draft_first() if drafts is None else None
        made: str | SendOutcome | None = None
        if first is not None:
            made = self._make_draft(work, policy, provider, first, raw)
            if made is None:
                return None
            work.now = self._clock()
        made_draft = made if isinstance(made, str) else None
        history = provider.history()
        mark = None
        if history is not None:
            # The mailbox's historyId, before the send: its history holds this attempt's
            # copy if the send makes one. Shared by the mailbox's claims; None (no wait,
            # no refusal) when none can be had now: the search alone answers then.
            # When it has to be fetched (a call that may take the provider's timeout),
            # the outcomes left for the next commit are saved first, as before a draft
            # step: their claims are no longer renewed and would lapse meanwhile.
            mark = history.history_mark(before_call=work.flush)
            work.now = self._clock()
        if self._stopping.is_set() and (drafts is not None or history is not None):
            # The draft step and the history mark are calls that may each take the
            # provider's whole timeout: a stop asked meanwhile starts no send either
            # (docs/operations.md "Stopping"). The draft the step recorded is saved, for
            # the next run to find and send.
            if job.pending_events:
                self.save_claim(Claimed(work, policy, provider, raw, 0.0, work.now,
                                        draft=draft, drafts=drafts, created=created))  # fmt: skip
            return None
        lease = self._timeouts.get(policy.provider, provider.timeout) + self._grace
        deadline = work.now + timedelta(seconds=lease)
        # The claim's save holds to the handle as read above: a mark another daemon's
        # read-back writes before its commit withdraws it (`Changed`), nothing sent.
        work.unchanged = unchanged
        job.claim(
            provider=policy.provider,
            deadline=deadline,
            at=work.now,
            daemon=self._daemon,
            history_id=mark,
            made_draft=made_draft,
        )
        return Claimed(work, policy, provider, raw, lease, deadline, draft=draft,
                       drafts=drafts, created=created, made=made, first=first)  # fmt: skip

    def _may_create(self, work: Work, policy: ChannelPolicy) -> Callable[[], bool]:
        """Asked right before a draft is made: whether this daemon may still call for the
        job's quota scope (a draft step's earlier calls, or the wait for its worker, may
        each take the provider's timeout), and is not stopping: the flush before the
        draft step may wait behind a held row, and no call starts after the stop signal
        (docs/operations.md "Stopping")."""

        def may_create() -> bool:
            if self._stopping.is_set():
                return False
            return self._may_call is None or self._may_call(
                policy, work.job.from_addr, self._clock()
            )

        return may_create

    def _no_draft(self, work: Work) -> None:
        """No draft made and no claim, `_may_create` having said no: the job stays due."""
        stopping = self._stopping.is_set()
        why = "the daemon is stopping" if stopping else "its quota scope went to another daemon"
        log.info("job %s: no draft made: %s", work.job.key, why)
        work.count("skipped")

    def _make_draft(
        self,
        work: Work,
        policy: ChannelPolicy,
        provider: Provider,
        first: DraftFirst,
        raw: bytes,
    ) -> str | SendOutcome | None:
        """The draft of a provider whose sends make one first (Graph), made before the
        claim so its id is recorded with it: whichever daemon fences or tidies the job
        later deletes it by that id, where a listing by Message-ID may not show it yet
        (docs/architecture.md "Microsoft Graph"). The create's refusal is the claim's
        outcome, as when it was the call's first step. None: no draft made, no claim (the
        job changed since it was loaded, or its scope went to another daemon)."""
        if _moved_since_loaded(work):
            work.count("skipped")
            return None
        work.flush()  # as before a drafts-mode draft step: a call of its timeout
        if not self._may_create(work, policy)():
            self._no_draft(work)
            return None
        with self._circuits.calling(provider.scope()):
            return first.make_draft(raw)

    def _delete_made_draft(
        self, work: Work, policy: ChannelPolicy, first: DraftFirst, draft_id: str
    ) -> None:
        """The draft `_make_draft` made for a claim that was not saved: nobody else knows
        its id, so it is deleted at once while the job's quota scope is still this
        daemon's and no stop was asked (no call starts after it: docs/operations.md
        "Stopping"); else, or when the deletion fails, the job's tidy finds it by its
        Message-ID once settled. A stop asked during the create itself saves the claim
        with its draft recorded, and the call is not made (`stopped`): the next run's
        attempt tidies the draft by its id."""
        key = work.job.key
        if not self._may_create(work, policy)():
            log.info("job %s: draft %s left to its scope's new owner", key, draft_id)
            return
        try:
            first.delete_made(work.job.message_id, [draft_id], filtered=False)
        except ProviderError as exc:
            log.info("job %s: draft %s not deleted (%s)", key, draft_id, quoted(exc.reason))

    def _resend_unmarked(self, work: Work, policy: ChannelPolicy) -> Unchanged | None:
        """For a job its searches requeued: the handle of the provider they searched, read
        from the store, as read (`ProviderHealth.unmarked_in_store`); marked, the job to
        review and None. Sent again because its searches found no copy, on a handle
        marked since (a read-back, this daemon's or another's): searches of a provider
        that replaces Message-IDs never find one, so the misses are no evidence."""
        unchanged = self._health.unmarked_in_store(work.job.last_provider or policy.provider)
        if unchanged is None:
            refused = known(
                decisions.before_search(policy, handle_reliable=False),
                "an unreliable handle sends a job to review before its search",
            )
            work.to_review(refused, _MARKED_SINCE_REQUEUED)
        return unchanged

    def _claim_withdrawn(self, claimed: Claimed) -> None:
        """The claim of a requeued job withdrawn by its save (`Changed`: the handle it was
        decided on changed before the commit): nothing stored, nothing sent. Its draft,
        if the draft step made one, is deleted as a lost claim's; the job read again goes
        to review at once if the handle is marked now, else stays due."""
        work = claimed.work
        if claimed.created and claimed.draft is not None and claimed.drafts is not None:
            self._delete_lost_draft(claimed, claimed.drafts, claimed.draft)
        self._unsaved_made_draft(claimed)
        work.job = work.ledger.get_job(work.job.key)
        if work.job.state is JobState.REQUESTED and work.job.requeued:
            self._resend_unmarked(work, claimed.policy)
        log.info("job %s: not sent: its provider's handle changed while it was claimed",
                 work.job.key)  # fmt: skip

    def send(self, claimed: Claimed) -> None:
        """The one provider call of a saved claim (invariant 1: only after the save), then
        the sampled read-back of a confirmed send, in the same worker."""
        work = claimed.work
        crash_point("after-claim")
        drafts = claimed.drafts
        scope = claimed.provider.scope()
        stopping = self._stopping.is_set()
        if stopping or not self._still_ours(claimed):
            # Nothing sent: due again (as `withheld`), for this daemon or the scope's owner.
            # A stop asked while the claim was saved (a slow commit) starts no new call
            # either (docs/operations.md "Stopping"): the next run sends the job.
            claimed.outcome = stopped() if stopping else not_ours()
            if claimed.probe:
                self._circuits.probe_returned(scope)
            work.now = self._clock()
            return
        with self._circuits.sending(scope, self._clock(), probe=claimed.probe) as ticket:
            if ticket is None:
                # The scope hung or failed while the claim was saved: refused here, as the
                # provider refuses when unavailable (nothing sent, due after the probe).
                claimed.outcome = withheld()
                work.now = self._clock()
                return
            work.count("sent")
            # A send of several calls (Graph's tidy, send, copy read-back) asks
            # between them whether the scope is still ours, where stopping is safe.
            may_go_on = None if self._may_call is None else lambda: self._may_call_now(claimed)
            with calls_while(may_go_on), self._within_lease(claimed):
                outcome = claimed.outcome = self._call(claimed)
            crash_point("after-send")
            work.now = self._clock()
            if (
                outcome.kind is SendKind.UNKNOWN
                # A call that timed out may still reach the provider: its draft is asked
                # by the sweep, which deletes it first if it is still unsent (the fence).
                and not outcome.timed_out
                and claimed.draft is not None
                and drafts is not None
            ):
                # Asked at once, in this worker: no index lies between a draft and its answer;
                # unless the scope went to another daemon during the send (a call of its
                # own): then the sweep of the scope's owner asks; or the daemon is
                # stopping: then the next run's sweep does; or the claim's lease ended:
                # then the work on the recorded Unknown does (`_after_send_call`).
                if self._after_send_call(claimed):
                    # A check of two calls (drafts.get, then messages.get of a draft
                    # found gone) asks again before its second, as the send's calls did.
                    with calls_while(may_go_on), self._within_lease(claimed):
                        claimed.check = drafts_flow.ask_draft(work.job, drafts)
                    crash_point("after-search")
                work.now = self._clock()
            self._circuits.sent(
                scope,
                work.now,
                outcome,
                ticket=ticket,
                pause_after=claimed.policy.pause_after_unanswered,
            )
        self._read_back_sample(claimed)

    def _within_lease(self, claimed: Claimed) -> AbstractContextManager[None]:
        """The calls made inside, in this thread, end within the claim's lease as last
        written (`Leases.time_left`), each wait for an answer within `timeout` too: every
        call made under the claim, the send, the draft's check after an unknown send and
        the read-back after a confirmed one, their connections' opening included
        (docs/architecture.md "Leases"). The worker holds the lease through them all, so
        renewals that land move the bound on; once they stop landing (the store lost),
        the call ends before another daemon's recovery may take the claim."""
        held = claimed.held
        return calls_end_in(None if held is None else lambda: self._leases.time_left(held))

    def _call(self, claimed: Claimed) -> SendOutcome:
        """The claim's one call: its recorded draft sent (drafts mode), the draft made
        before it sent (Graph; its create's refusal is the outcome, no send made), or the
        message."""
        made, first = claimed.made, claimed.first
        if claimed.draft is not None and claimed.drafts is not None:
            return claimed.drafts.send_draft(claimed.draft)
        if isinstance(made, SendOutcome):
            return made
        if made is not None and first is not None:
            # Deleted before this send without a record of their own: the claim, saved on
            # the version read, is it; while it is live no other attempt of the job is,
            # and these are the drafts of attempts before it (docs/architecture.md
            # "Microsoft Graph"). Every one: a fence records its drafts before deleting
            # them, and one whose deletion failed, or that a late send took, is still a
            # draft, or a copy this attempt must not be sent beside.
            earlier = [d for d in claimed.work.job.made_drafts if d != made]
            return first.send_made(claimed.raw, made, earlier)
        return claimed.provider.send_raw(claimed.raw)

    def _still_ours(self, claimed: Claimed) -> bool:
        """Whether the call of a saved claim may still start, asked right before it: what
        came between the job's taking and now (the draft step's calls, the history mark,
        the claim's save, each of which may take a while and be healthy) can outlast
        either lease. The claim's: more than the grace must be left of it, as another
        daemon recovers it once it has ended by its own clock. The scope's: this daemon
        must still be the one that may call for it (`owners.py`), or the mailbox would
        be sent from two daemons at once, over its quota."""
        now = self._clock()
        if now >= claimed.deadline - timedelta(seconds=self._grace):
            log.warning(
                "job %s: not sent: too little of its claim's lease left", claimed.work.job.key
            )
            return False
        if self._may_call is not None and not self._may_call(
            claimed.policy, claimed.work.job.from_addr, now
        ):
            log.info(
                "job %s: not sent: its quota scope went to another daemon", claimed.work.job.key
            )
            return False
        return True

    def _may_call_now(self, claimed: Claimed) -> bool:
        """Whether a call after the send (the draft's check, the read-back) may start now:
        the scope is still this daemon's (`owners.py`)."""
        return self._may_call is None or self._may_call(
            claimed.policy, claimed.work.job.from_addr, self._clock()
        )

    def _after_send_call(self, claimed: Claimed) -> bool:
        """Whether a call of this worker's own after the send (the draft's check, the
        read-back) may start: not once the daemon is stopping. The outcome is recorded
        after it, and it may take the provider's whole timeout: begun behind a send that
        took most of `daemon.stop_timeout`, it outlasted the stop, which then ended
        without the outcome (docs/operations.md "Stopping"). Nor once the claim's lease
        has ended (`_within_lease`): another daemon may be recovering the claim, and the
        call, cut at once, would count a hang for the circuit the provider never showed."""
        held = claimed.held
        if held is not None and self._leases.time_left(held) <= 0:
            log.info(
                "job %s: no call after the send: its claim's lease ended", claimed.work.job.key
            )
            return False
        return not self._stopping.is_set() and self._may_call_now(claimed)

    def _read_back_sample(self, claimed: Claimed) -> None:
        outcome, policy = claimed.outcome, claimed.policy
        if outcome is None or outcome.kind is not SendKind.CONFIRMED:
            return
        if (
            outcome.provider_message_id
            # A call of its own after the send, which may have taken the provider's whole
            # timeout: not made once the scope went to another daemon (over its quota),
            # nor counted as a sample made.
            and self._after_send_call(claimed)
            and self._health.should_read_back(policy.provider, claimed.provider)
        ):
            # Bound only when made: a sample is a share of the sends, and the bound a
            # context every confirmed send would enter for nothing (issue 30 (a)).
            with self._within_lease(claimed):
                self._health.read_back(
                    claimed.work.job,
                    policy.provider,
                    claimed.provider,
                    outcome.provider_message_id,
                    raw=claimed.raw,
                )

    def outcome_to_events(self, claimed: Claimed) -> None:
        """The call's outcome as events on the job in memory (saved by the caller)."""
        work, policy = claimed.work, claimed.policy
        outcome = known(claimed.outcome, "outcome_to_events() follows send()")
        job, now = work.job, work.now
        tidy_at = _tidy_at(policy, claimed.provider, now)
        if outcome.kind is SendKind.CONFIRMED and outcome.provider_message_id:
            job.record_response(
                provider_message_id=outcome.provider_message_id,
                decision=decisions.after_response(policy, resent=job.resent, now=now),
                at=now,
                tidy_at=tidy_at,
            )
        elif outcome.kind is SendKind.REJECTED:
            # A send stopped before any call that could send it (its scope moved during
            # Graph's tidy) is no attempt, as `not_ours` is none: not counted against
            # `max_attempts`, due again for the scope's owner; recorded as `not_ours`, a
            # release (`SendJob.Rejected.released`), not the provider's refusal.
            unavailable = outcome.transient and (outcome.unavailable or outcome.not_attempted)
            reason = NOT_OURS if outcome.not_attempted else outcome.reason
            job.record_rejection(
                transient=outcome.transient,
                reason=reason,
                status=outcome.status,
                decision=self._after_rejection(claimed, unavailable, reason),
                at=now,
                unavailable=unavailable,
            )
        else:
            unknown_to_events(work, policy, self._health, _unknown_reason(outcome))
            if claimed.check is not None:
                drafts_flow.record_draft_check(
                    job,
                    claimed.check,
                    policy,
                    now=now,
                    handle_reliable=self._health.reliable(policy.provider),
                    tidy_at=tidy_at,
                )

    def count_outcome(self, claimed: Claimed) -> None:
        """What follows a saved outcome: counts and logs (a confirmation is counted by
        the save that made it durable)."""
        work = claimed.work
        outcome = known(claimed.outcome, "count_outcome() follows outcome_to_events()")
        job = work.job
        if outcome.reason == CLAIM_READ_BACK:
            pass  # no call, no refusal: said when the claim was released
        elif _released(outcome):
            # No refusal by the provider: not counted as one (the circuit counts a
            # withheld send itself, `Circuits.sending`).
            log.info("job %s: %s", job.key, quoted(outcome.reason))
        elif outcome.kind is SendKind.REJECTED:
            work.count("rejected")
            if outcome.unavailable:
                work.count("unavailable")
            log.info("job %s rejected (%s)", job.key, quoted(outcome.reason))
        elif outcome.kind is not SendKind.CONFIRMED:
            work.count("unknown")
            log.info("job %s outcome unknown (%s)", job.key, quoted(_unknown_reason(outcome)))

    def give_up(self, work: Work) -> None:
        """A job held by its provider's open circuit for longer than its channel's
        `give_up_after`: to review (`provider-unavailable`), never claimed."""
        work.now = self._clock()
        if self._reloaded(work):
            return
        policy, job = work.policy, work.job
        if policy is None:
            return
        since = job.unavailable_since or job.due_at or work.now
        decision = decisions.waited_too_long(policy, waiting_since=since, now=work.now)
        if decision is not None:
            work.to_review(decision, f"provider {_scope(work)} unavailable since {since:%c} UTC")

    def _reloaded(self, work: Work) -> bool:
        """Whether the job's policy was reloaded (SIGHUP) since the job was loaded. A send
        worker's queue holds loaded jobs for as long as their scope is held (an open
        circuit, a quota wait: minutes, hours), and a job judged by the policy it was
        loaded under would go out as a sender the reload withdrew, or through the provider
        the channel left (docs/policies.md "Broken policy files and reloads"). Such a job
        is not taken: it stays due, and the next offer loads it under the policy in force."""
        if self._policies is None:
            return False
        current = self._policies.current
        # The same set as at the load (no reload since): its policy is the one in force.
        if current is work.policies or current.get(work.job.channel) == work.policy:
            return False
        log.info("job %s: its policy was reloaded since it was loaded: loaded again", work.job.key)
        work.count("skipped")
        return True

    def _after_rejection(self, claimed: Claimed, unavailable: bool, reason: str) -> AfterRejection:
        """`reason` as recorded: the rule of which releases wait for the provider is the
        job's (`waits_for_provider`), read by its replay too."""
        policy, job = claimed.policy, claimed.work.job
        now = claimed.work.now
        outcome = known(claimed.outcome, "a rejection follows the call's outcome")
        if not outcome.transient:
            return decisions.after_permanent_rejection(policy)
        wait = self._circuits.settings.probe_after
        if unavailable and not waits_for_provider(reason):
            # A claim released unsent waited for no provider: no give-up is due on it.
            # One its circuit withheld did (`SendJob.Rejected.waits_for_provider`): its
            # give-up counts as a refusal's, or a flapping circuit would put it off for ever.
            return release_decision(policy, now, wait)
        if unavailable:
            return decisions.after_unavailable(
                policy,
                waiting_since=job.unavailable_since or now,
                now=now,
                # Due again soon: while the circuit is open the job waits in memory,
                # where `give_up_after` is checked, not in the store.
                wait=wait,
                retry_after=outcome.retry_after,
            )
        return decisions.after_transient_rejection(
            policy,
            attempts_made=job.round_attempts,
            now=now,
            retry_after=outcome.retry_after,
            rng=self._rng,
        )


#: Why a job its searches requeued is not sent (`Dispatch.claim`).
_MARKED_SINCE_REQUEUED = (
    "not sent again: its provider was found replacing Message-IDs after its searches'"
    " misses were believed, so they are no evidence that nothing was sent"
)


def withheld() -> SendOutcome:
    """The outcome of a send its circuit stopped after its claim was saved (`WITHHELD`):
    the scope's failure, counted by its circuit; for the job a release, not the
    provider's refusal of its send (`SendJob.Rejected.released`)."""
    return SendOutcome(SendKind.REJECTED, WITHHELD, transient=True, unavailable=True)


def _released(outcome: SendOutcome) -> bool:
    """Whether an outcome releases its claim with no call that could send it, by this
    daemon's doing (recorded as `SendJob.Rejected.released`): nothing of the provider's."""
    return outcome.kind is SendKind.REJECTED and (
        outcome.reason in RELEASED_UNSENT or outcome.not_attempted
    )


def claim_read_back() -> SendOutcome:
    """The outcome of a claim found stored after its save failed: nothing sent
    (`Dispatch.save_claim_or_read_back`). Recorded as a Rejected that spends no attempt,
    but no sign of the provider's (`SendJob.Rejected.released`, as every release with no
    call made): the job's wait for an unavailable provider is left as it was, and no
    `rejected` webhook is sent."""
    return SendOutcome(SendKind.REJECTED, CLAIM_READ_BACK, transient=True, unavailable=True)


def stopped() -> SendOutcome:
    """The outcome of a send a stop came before: nothing sent, due again."""
    return SendOutcome(SendKind.REJECTED, STOPPED, transient=True, unavailable=True)


def not_ours() -> SendOutcome:
    """The outcome of a send stopped because it was no longer this daemon's to make."""
    return SendOutcome(SendKind.REJECTED, NOT_OURS, transient=True, unavailable=True)


def _tidy_at(policy: ChannelPolicy, provider: Provider, now: datetime) -> datetime | None:
    return decisions.tidy_at(policy, leaves_drafts=provider.leaves_drafts, now=now)


def _scope(work: Work) -> str:
    """The scope (circuit, queue) of a job's provider; "" for a job without one."""
    return "" if work.provider is None else work.provider.scope()
