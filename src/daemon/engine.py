"""One tick of the daemon: dispatch due jobs, recover crashed attempts, sweep unknowns.

Every step reads the job index for the jobs that are due, loads only those aggregates,
appends the next events and saves them with optimistic concurrency. A version conflict
means another daemon (or an operator) got there first: the step is skipped, never
retried blindly. In particular the Attempted event (the claim) is durable before the
provider is called, and only the writer whose claim was stored makes the call.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from daemon.crashpoints import crash_point
from daemon.providers.base import Provider, ProviderError, SearchHit, SendKind, SendOutcome
from ledger.application import ConcurrentUpdate, Ledger, UnknownJob
from ledger.job import JobState, SendJob, TransitionError
from ledger.message_id import same_message_id
from ledger.mime import build_message
from policies import decisions
from policies.decisions import Decision
from policies.loader import PolicySet
from policies.model import ChannelPolicy

log = logging.getLogger("sendledger.engine")

Clock = Callable[[], datetime]


@dataclass
class TickReport:
    sent: int = 0
    confirmed: int = 0
    unknown: int = 0
    rejected: int = 0
    searched: int = 0
    escalated: int = 0
    recovered: int = 0
    skipped: int = 0
    errors: int = 0

    def add(self, other: TickReport) -> None:
        for name in vars(self):
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def busy(self) -> bool:
        return any(vars(self).values())


@dataclass
class _Counter:
    report: TickReport = field(default_factory=TickReport)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def bump(self, name: str, by: int = 1) -> None:
        with self.lock:
            setattr(self.report, name, getattr(self.report, name) + by)


class PolicyHolder:
    """The policies in force. A reload that fails keeps the last good set running."""

    def __init__(self, loader: Callable[[], PolicySet], initial: PolicySet | None = None) -> None:
        self._loader = loader
        self._lock = threading.Lock()
        self._policies = initial if initial is not None else loader()
        self.last_error: str | None = None

    @property
    def current(self) -> PolicySet:
        with self._lock:
            return self._policies

    def reload(self) -> bool:
        try:
            policies = self._loader()
        except Exception as exc:
            self.last_error = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            log.error("policy reload failed, keeping the last good policies: %s", exc)
            return False
        with self._lock:
            self._policies = policies
        self.last_error = None
        log.info("policies reloaded: %s", ", ".join(sorted(policies)) or "none")
        return True


class Engine:
    def __init__(
        self,
        ledger: Ledger,
        policies: PolicyHolder,
        providers: Mapping[str, Provider],
        *,
        provider_timeouts: Mapping[str, float],
        clock: Clock | None = None,
        concurrency: int = 4,
        batch_size: int = 200,
        deadline_grace: float = 30.0,
        rng: random.Random | None = None,
    ) -> None:
        self.ledger = ledger
        self.policies = policies
        self.providers = providers
        self.provider_timeouts = provider_timeouts
        self.clock = clock or ledger.clock
        self.batch_size = batch_size
        self.deadline_grace = deadline_grace
        self.rng = rng or random.Random()
        self._pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="send")
        # Searches that failed (provider down, quota) wait here instead of hammering the
        # provider every tick; nothing about the job changes, so nothing is recorded.
        self._search_not_before: dict[str, datetime] = {}
        self._stopping = threading.Event()
        # Whether each provider keeps our Message-ID: read once per tick, not per job.
        self._reliable: dict[str, bool] = {}

    def stop(self) -> None:
        """Start no new provider call; the ones in flight finish and are recorded."""
        self._stopping.set()

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    # -- the tick ---------------------------------------------------------------------

    def unreliable_providers(self) -> list[str]:
        return sorted(name for name, reliable in self._reliable.items() if not reliable)

    def _handle_reliable(self, provider: str) -> bool:
        return self._reliable.get(provider, True)

    def tick(self) -> TickReport:
        counter = _Counter()
        self._reliable = {name: self.ledger.handle_reliable(name) for name in self.providers}
        self._run_due(JobState.REQUESTED, self._dispatch_one, counter)
        self._run_due(JobState.ATTEMPTED, self._recover_one, counter)
        self._run_due(JobState.UNKNOWN, self._sweep_one, counter)
        self._run_due(JobState.CONFIRMED, self._verify_one, counter)
        return counter.report

    def _run_due(
        self, state: JobState, step: Callable[[str, _Counter], None], counter: _Counter
    ) -> None:
        now = self.clock().timestamp()
        rows = self.ledger.index.jobs_due(state.value, now, self.batch_size)
        if not rows:
            return
        futures = [self._pool.submit(self._guarded, step, row.key, counter) for row in rows]
        for future in futures:
            future.result()

    def _guarded(self, step: Callable[[str, _Counter], None], key: str, counter: _Counter) -> None:
        if self._stopping.is_set():
            return
        try:
            step(key, counter)
        except (ConcurrentUpdate, TransitionError) as exc:
            # Another daemon or an operator moved the job first; its next due step
            # will be found by a later tick.
            log.debug("job %s skipped: %s", key, exc)
            counter.bump("skipped")
        except UnknownJob:
            counter.bump("skipped")
        except Exception:
            log.exception("job %s: unexpected failure in %s", key, step.__name__)
            counter.bump("errors")

    # -- dispatch -----------------------------------------------------------------------

    def _dispatch_one(self, key: str, counter: _Counter) -> None:
        job = self.ledger.get_job(key)
        now = self.clock()
        if job.state is not JobState.REQUESTED or (job.due_at and job.due_at > now):
            return
        found = self._policy_and_provider(job, counter)
        if found is None:
            return
        policy, provider = found
        decision = decisions.before_attempt(policy, attempts_made=job.round_attempts)
        if decision.action == "review":
            self._escalate(job, decision, f"{job.round_attempts} provider calls made")
            counter.bump("escalated")
            return
        try:
            # Rendered before the claim: a message that cannot be built is never claimed.
            raw = render(job)
        except ValueError as exc:
            review = Decision("review", policy.name, policy.fingerprint, reason="rejected")
            self._escalate(job, review, f"cannot build the message: {exc}")
            counter.bump("escalated")
            return
        if self._stopping.is_set():
            return
        timeout = self.provider_timeouts.get(policy.provider, 30.0)
        deadline = now + timedelta(seconds=timeout + self.deadline_grace)
        job.attempt(provider=policy.provider, deadline=deadline, at=now)
        # The claim is durable before the call; a conflict here means no call is made.
        self.ledger.save_job(job)
        crash_point("after-claim")
        counter.bump("sent")
        outcome = provider.send_raw(raw)
        crash_point("after-send")
        self._record_outcome(job, policy, provider, outcome, counter)

    def _record_outcome(
        self,
        job: SendJob,
        policy: ChannelPolicy,
        provider: Provider,
        outcome: SendOutcome,
        counter: _Counter,
    ) -> None:
        now = self.clock()
        if outcome.kind is SendKind.CONFIRMED and outcome.provider_message_id:
            job.confirm(
                via="response",
                provider_message_ids=[outcome.provider_message_id],
                policy=policy.name,
                fingerprint=policy.fingerprint,
                at=now,
                verify_at=decisions.after_confirmation(policy, resent=job.resent, now=now),
            )
            self.ledger.save_job(job)
            counter.bump("confirmed")
            log.info("job %s confirmed by response (%s)", job.key, outcome.provider_message_id)
            self._read_back(job, policy.provider, provider, outcome.provider_message_id)
        elif outcome.kind is SendKind.REJECTED:
            counter.bump("rejected")
            self._record_rejection(job, policy, outcome, now)
        else:
            counter.bump("unknown")
            reason = outcome.reason or "outcome unknown"
            if outcome.kind is SendKind.CONFIRMED:
                reason = "2xx without a readable message id"
            self._record_unknown(job, policy, reason, now)

    def _record_rejection(
        self, job: SendJob, policy: ChannelPolicy, outcome: SendOutcome, now: datetime
    ) -> None:
        if outcome.transient:
            decision = decisions.after_transient_rejection(
                policy,
                attempts_made=job.round_attempts,
                now=now,
                retry_after=outcome.retry_after,
                rng=self.rng,
            )
        else:
            decision = decisions.after_permanent_rejection(policy)
        retry_at = decision.due_at if decision.action == "retry" else None
        job.reject(
            transient=outcome.transient,
            reason=outcome.reason,
            status=outcome.status,
            retry_at=retry_at,
            policy=policy.name,
            fingerprint=policy.fingerprint,
            at=now,
        )
        if retry_at is None:
            self._escalate(job, decision, outcome.reason, save=False)
        self.ledger.save_job(job)
        log.info(
            "job %s rejected (%s): %s",
            job.key,
            "transient" if outcome.transient else "permanent",
            f"retry at {retry_at.isoformat()}" if retry_at else "to review",
        )

    def _record_unknown(
        self, job: SendJob, policy: ChannelPolicy, reason: str, now: datetime
    ) -> None:
        reliable = self._handle_reliable(policy.provider)
        decision = decisions.after_unknown(policy, now=now, handle_reliable=reliable)
        search_due = decision.due_at if decision.action == "search" else None
        job.record_unknown(
            reason=reason,
            search_due_at=search_due,
            policy=policy.name,
            fingerprint=policy.fingerprint,
            at=now,
        )
        if search_due is None:
            self._escalate(job, decision, reason, save=False)
        self.ledger.save_job(job)
        log.info(
            "job %s outcome unknown (%s): %s",
            job.key,
            reason,
            f"search at {search_due.isoformat()}" if search_due else "to review",
        )

    def _read_back(
        self, job: SendJob, provider_name: str, provider: Provider, provider_message_id: str
    ) -> None:
        """The design's guard against a provider that replaces our Message-ID."""
        try:
            stored = provider.read_message_id(provider_message_id)
        except ProviderError as exc:
            log.warning("job %s: Message-ID read-back failed: %s", job.key, exc.reason)
            return
        if stored is not None and same_message_id(stored, job.message_id):
            return
        log.critical(
            "PROVIDER %s REPLACED OUR MESSAGE-ID: sent %s, stored %s. Searches cannot find "
            "this provider's copies; unknown outcomes now go to review.",
            provider_name,
            job.message_id,
            stored,
        )
        self._reliable[provider_name] = False
        self.ledger.mark_handle(
            provider_name,
            lambda handle: handle.mark_unreliable(
                expected=job.message_id,
                observed=stored or "",
                provider_message_id=provider_message_id,
                job_key=job.key,
                at=self.clock(),
            ),
        )

    # -- recover ------------------------------------------------------------------------

    def _recover_one(self, key: str, counter: _Counter) -> None:
        job = self.ledger.get_job(key)
        now = self.clock()
        if job.state is not JobState.ATTEMPTED or job.due_at is None or job.due_at > now:
            return
        policy = self.policies.current.get(job.channel)
        reason = "no outcome recorded by the attempt's deadline (crash or kill?)"
        if policy is None:
            job.record_unknown(reason=reason, search_due_at=None, policy="", fingerprint="", at=now)
            self._escalate(job, decisions.no_policy(job.channel), reason, save=False)
            self.ledger.save_job(job)
        else:
            self._record_unknown(job, policy, reason, now)
        counter.bump("recovered")
        log.warning("job %s: attempt %d had no outcome by its deadline", key, job.attempts)

    # -- sweep --------------------------------------------------------------------------

    def _search(
        self, job: SendJob, provider: Provider, counter: _Counter, now: datetime
    ) -> list[SearchHit] | None:
        """The mailbox's copies of the job, or None when the search failed: a failed
        search is no information, never "no copies"."""
        try:
            hits = provider.search(job.message_id)
        except ProviderError as exc:
            wait = max(exc.retry_after or 0.0, 1.0)
            self._search_not_before[job.key] = now + timedelta(seconds=wait)
            log.warning("job %s: search failed (%s), again in %.1fs", job.key, exc.reason, wait)
            counter.bump("errors")
            return None
        crash_point("after-search")
        self._search_not_before.pop(job.key, None)
        counter.bump("searched")
        return hits

    def _search_held_back(self, key: str, now: datetime) -> bool:
        not_before = self._search_not_before.get(key)
        return not_before is not None and now < not_before

    def _sweep_one(self, key: str, counter: _Counter) -> None:
        now = self.clock()
        if self._search_held_back(key, now):
            return
        job = self.ledger.get_job(key)
        if job.state is not JobState.UNKNOWN or job.due_at is None or job.due_at > now:
            return
        found = self._policy_and_provider(job, counter)
        if found is None:
            return
        policy, provider = found
        if not self._handle_reliable(policy.provider):
            decision = Decision(
                "review", policy.name, policy.fingerprint, reason="handle-unreliable"
            )
            self._escalate(job, decision, f"provider {policy.provider} replaces Message-IDs")
            counter.bump("escalated")
            return
        hits = self._search(job, provider, counter, now)
        if hits is None:
            return
        now = self.clock()
        decision = decisions.after_search(policy, hits=len(hits), misses_before=job.misses, now=now)
        ids = [hit.provider_message_id for hit in hits]
        query = f"rfc822msgid:{job.message_id}"
        name, fingerprint = policy.name, policy.fingerprint
        if decision.action == "confirm":
            job.confirm(
                via="search",
                provider_message_ids=ids,
                policy=name,
                fingerprint=fingerprint,
                at=now,
                verify_at=decisions.after_confirmation(policy, resent=job.resent, now=now),
            )
            counter.bump("confirmed")
            log.info("job %s confirmed by search: one copy (%s)", key, ids[0])
        elif decision.action == "duplicate":
            job.record_duplicate(
                provider_message_ids=ids, policy=name, fingerprint=fingerprint, at=now
            )
            self._escalate(job, decision, f"{len(ids)} copies: {', '.join(ids)}", save=False)
            counter.bump("escalated")
            log.error("job %s: DUPLICATE, %d copies found; flagged for review", key, len(ids))
        elif decision.action == "miss":
            job.record_miss(
                query=query,
                next_search_at=decision.due_at,
                policy=name,
                fingerprint=fingerprint,
                at=now,
            )
            log.info("job %s: search %d found nothing", key, job.searches)
        else:
            job.record_miss(
                query=query, next_search_at=None, policy=name, fingerprint=fingerprint, at=now
            )
            if decision.action == "retry":
                misses = job.misses
                job.requeue(
                    reason=f"{job.misses} empty searches: not sent",
                    due_at=decision.due_at or now,
                    misses_required=policy.confirm_misses,
                    policy=name,
                    fingerprint=fingerprint,
                    at=now,
                )
                log.info("job %s: %d empty searches, resending", key, misses)
            else:
                self._escalate(job, decision, f"{job.misses} empty searches", save=False)
                counter.bump("escalated")
        self.ledger.save_job(job)

    # -- verify -------------------------------------------------------------------------

    def _verify_one(self, key: str, counter: _Counter) -> None:
        """Count a resent job's copies once the index has caught up (policy verify_after)."""
        now = self.clock()
        if self._search_held_back(key, now):
            return
        job = self.ledger.get_job(key)
        if not job.verifying or job.due_at is None or job.due_at > now:
            return
        policy = self.policies.current.get(job.channel)
        provider = self.providers.get(policy.provider) if policy else None
        if policy is None or provider is None:
            # No way to search: the job stays confirmed; a human can `review check` it.
            job.record_verification(hits=0, next_verify_at=None, policy="", fingerprint="", at=now)
            self.ledger.save_job(job)
            return
        hits = self._search(job, provider, counter, now)
        if hits is None:
            return
        now = self.clock()
        decision = decisions.after_verification(
            policy, hits=len(hits), verifications_before=job.verifications, now=now
        )
        name, fingerprint = policy.name, policy.fingerprint
        if decision.action == "duplicate":
            ids = [hit.provider_message_id for hit in hits]
            job.record_duplicate(
                provider_message_ids=ids, policy=name, fingerprint=fingerprint, at=now
            )
            self._escalate(
                job, decision, f"{len(ids)} copies after a resend: {', '.join(ids)}", save=False
            )
            counter.bump("escalated")
            log.error(
                "job %s: DUPLICATE after a resend, %d copies; flagged for review", key, len(ids)
            )
        else:
            job.record_verification(
                hits=len(hits),
                next_verify_at=decision.due_at,
                policy=name,
                fingerprint=fingerprint,
                at=now,
            )
            if decision.action == "confirm":
                log.info("job %s verified: one copy", key)
        self.ledger.save_job(job)

    # -- helpers ------------------------------------------------------------------------

    def _policy_and_provider(
        self, job: SendJob, counter: _Counter
    ) -> tuple[ChannelPolicy, Provider] | None:
        """The job's policy and provider; a job without a policy goes to review."""
        policy = self.policies.current.get(job.channel)
        if policy is None:
            self._escalate(job, decisions.no_policy(job.channel), "no policy for the channel")
            counter.bump("escalated")
            return None
        provider = self.providers.get(policy.provider)
        if provider is None:
            log.error("job %s: provider %r is not configured", job.key, policy.provider)
            counter.bump("errors")
            return None
        return policy, provider

    def _escalate(
        self, job: SendJob, decision: Decision, detail: str, *, save: bool = True
    ) -> None:
        job.escalate(
            reason=decision.reason or "unknown-outcome",
            detail=detail,
            policy=decision.policy,
            fingerprint=decision.fingerprint,
            at=self.clock(),
        )
        if save:
            self.ledger.save_job(job)
        log.warning("job %s to review: %s (%s)", job.key, decision.reason, detail)


def render(job: SendJob) -> bytes:
    """The job's raw message; identical bytes for every attempt of the job."""
    return build_message(
        from_addr=job.from_addr,
        to=job.to,
        cc=job.cc,
        reply_to=job.reply_to,
        subject=job.subject,
        body=job.body,
        html=job.html,
        message_id=job.message_id,
        date=job.created_on.astimezone(UTC),
    )
