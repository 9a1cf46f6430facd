"""Dispatch: send a due job, with the claim written before the provider is called.

Invariant 1 (``docs/architecture.md``): the Attempted event is durable before the call
starts, and only the writer whose claim was stored makes the call; a conflict on the claim
means another daemon sends it, and this one does not.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta

from daemon.crashpoints import crash_point
from daemon.engine.clock import Clock
from daemon.engine.health import ProviderHealth
from daemon.engine.runner import Work
from daemon.providers.base import Provider, SendKind, SendOutcome
from ledger.decisions import AfterRejection, Review
from ledger.job import SendJob
from ledger.mime import build_message
from ledger.vocabulary import JobState
from policies import decisions
from policies.model import ChannelPolicy

log = logging.getLogger("sendledger.engine")


def render(job: SendJob) -> bytes:
    """The job's raw message; identical bytes for every attempt of the job."""
    content = job.content
    return build_message(
        from_addr=job.from_addr,
        to=content.to,
        cc=content.cc,
        reply_to=content.reply_to,
        subject=content.subject,
        body=content.body,
        html=content.html,
        bcc=content.bcc,
        headers=content.headers,
        in_reply_to=content.in_reply_to,
        references=content.references,
        attachments=content.attachments,
        message_id=job.message_id,
        date=job.created_on.astimezone(UTC),
    )


class Dispatch:
    state = JobState.REQUESTED

    def __init__(
        self,
        health: ProviderHealth,
        clock: Clock,
        *,
        provider_timeouts: Mapping[str, float],
        deadline_grace: float,
        rng: random.Random,
        stopping: threading.Event,
        daemon: str = "",
    ) -> None:
        self._daemon = daemon  # recorded on each claim (recover.py: RecoverOwnClaims)
        self._health = health
        self._clock = clock
        self._timeouts = provider_timeouts
        self._grace = deadline_grace
        self._rng = rng
        self._stopping = stopping

    def is_due(self, job: SendJob, now: datetime) -> bool:
        return job.due_at is None or job.due_at <= now

    def run(self, work: Work) -> None:
        found = work.policy_and_provider()
        if found is None:
            return
        policy, provider = found
        job = work.job
        decision = decisions.before_attempt(policy, attempts_made=job.round_attempts)
        if isinstance(decision, Review):
            work.to_review(decision, f"{job.round_attempts} provider calls made")
            return
        try:
            # Rendered before the claim: a message that cannot be built is never claimed.
            raw = render(job)
        except ValueError as exc:
            work.to_review(decisions.cannot_build(policy), f"cannot build the message: {exc}")
            return
        if self._stopping.is_set():
            return
        timeout = self._timeouts.get(policy.provider, 30.0)
        job.claim(
            provider=policy.provider,
            deadline=work.now + timedelta(seconds=timeout + self._grace),
            at=work.now,
            daemon=self._daemon,
        )
        work.save()  # a conflict here means no call is made
        crash_point("after-claim")
        work.count("sent")
        outcome = provider.send_raw(raw)
        crash_point("after-send")
        work.now = self._clock()
        self._record(work, policy, provider, outcome)

    def _record(
        self, work: Work, policy: ChannelPolicy, provider: Provider, outcome: SendOutcome
    ) -> None:
        job, now = work.job, work.now
        if outcome.kind is SendKind.CONFIRMED and outcome.provider_message_id:
            job.record_response(
                provider_message_id=outcome.provider_message_id,
                decision=decisions.after_response(policy, resent=job.resent, now=now),
                at=now,
            )
            work.save()
            if self._health.should_read_back(policy.provider, provider):
                self._health.read_back(job, policy.provider, provider, outcome.provider_message_id)
        elif outcome.kind is SendKind.REJECTED:
            work.count("rejected")
            job.record_rejection(
                transient=outcome.transient,
                reason=outcome.reason,
                status=outcome.status,
                decision=self._after_rejection(policy, job, outcome, now),
                at=now,
            )
            work.save()
            log.info("job %s rejected (%s)", job.key, outcome.reason)
        else:
            work.count("unknown")
            reason = outcome.reason or "outcome unknown"
            if outcome.kind is SendKind.CONFIRMED:
                reason = "2xx without a readable message id"
            record_unknown(work, policy, self._health, reason)

    def _after_rejection(
        self, policy: ChannelPolicy, job: SendJob, outcome: SendOutcome, now: datetime
    ) -> AfterRejection:
        if not outcome.transient:
            return decisions.after_permanent_rejection(policy)
        return decisions.after_transient_rejection(
            policy,
            attempts_made=job.round_attempts,
            now=now,
            retry_after=outcome.retry_after,
            rng=self._rng,
        )


def record_unknown(work: Work, policy: ChannelPolicy, health: ProviderHealth, reason: str) -> None:
    """An attempt whose outcome cannot be known: search later, or review."""
    decision = decisions.after_unknown(
        policy, now=work.now, handle_reliable=health.reliable(policy.provider)
    )
    work.job.record_unknown(reason=reason, decision=decision, at=work.now)
    work.save()
    log.info("job %s outcome unknown (%s)", work.job.key, reason)
