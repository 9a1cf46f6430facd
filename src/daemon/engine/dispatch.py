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
from contextlib import ExitStack
from dataclasses import dataclass
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


@dataclass(eq=False)  # compared by identity
class Claimed:
    """A job claimed in memory, between its claim and its recorded outcome."""

    work: Work
    policy: ChannelPolicy
    provider: Provider
    raw: bytes
    gate: ExitStack  # the provider's send gate, held until the call returns
    outcome: SendOutcome | None = None


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
        """One job on its own: claim, save, send, record, save (`DispatchWave` runs the
        same phases for several jobs with one save per phase)."""
        claimed = self.claim(work)
        if claimed is None:
            return
        with claimed.gate:
            work.save()  # a conflict here means no call is made
            self.send(claimed)
        self.record(claimed)
        work.save()
        self.recorded(claimed)

    def claim(self, work: Work) -> Claimed | None:
        """Decide and render, then record the claim on the job in memory (not saved), with
        the provider's send gate entered; None when the job is not to be sent now (to
        review, saved; or left due)."""
        found = work.policy_and_provider()
        if found is None:
            return None
        policy, provider = found
        job = work.job
        decision = decisions.before_attempt(policy, attempts_made=job.round_attempts)
        if isinstance(decision, Review):
            work.to_review(decision, f"{job.round_attempts} provider calls made")
            return None
        try:
            # Rendered before the claim: a message that cannot be built is never claimed.
            raw = render(job)
        except ValueError as exc:
            work.to_review(decisions.cannot_build(policy), f"cannot build the message: {exc}")
            return None
        if self._stopping.is_set():
            return None
        gate = ExitStack()
        if provider.reserve_send() > 0.0:
            # Its mailbox is out of quota: left due, so this worker serves other
            # mailboxes (README, "Providers").
            work.count("skipped")
            return None
        try:
            timeout = self._timeouts.get(policy.provider, 30.0)
            job.claim(
                provider=policy.provider,
                deadline=work.now + timedelta(seconds=timeout + self._grace),
                at=work.now,
                daemon=self._daemon,
            )
        except BaseException:
            gate.close()
            raise
        return Claimed(work, policy, provider, raw, gate)

    def send(self, claimed: Claimed) -> None:
        """The one provider call of a saved claim (invariant 1: only after the save), then
        the sampled read-back of a confirmed send, in the same worker."""
        work = claimed.work
        crash_point("after-claim")
        work.count("sent")
        claimed.outcome = claimed.provider.send_raw(claimed.raw)
        crash_point("after-send")
        work.now = self._clock()
        self._read_back_sample(claimed)

    def _read_back_sample(self, claimed: Claimed) -> None:
        # In the calling worker, like the send: a read-back is a provider call, and the
        # thread that saves and refills must never wait for one (`wave.py`).
        outcome, policy = claimed.outcome, claimed.policy
        if outcome is None or outcome.kind is not SendKind.CONFIRMED:
            return
        if outcome.provider_message_id and self._health.should_read_back(
            policy.provider, claimed.provider
        ):
            self._health.read_back(
                claimed.work.job, policy.provider, claimed.provider, outcome.provider_message_id
            )

    def record(self, claimed: Claimed) -> None:
        """The call's outcome as events on the job in memory (saved by the caller)."""
        work, policy, outcome = claimed.work, claimed.policy, claimed.outcome
        assert outcome is not None, "record() follows send()"
        job, now = work.job, work.now
        if outcome.kind is SendKind.CONFIRMED and outcome.provider_message_id:
            job.record_response(
                provider_message_id=outcome.provider_message_id,
                decision=decisions.after_response(policy, resent=job.resent, now=now),
                at=now,
            )
        elif outcome.kind is SendKind.REJECTED:
            job.record_rejection(
                transient=outcome.transient,
                reason=outcome.reason,
                status=outcome.status,
                decision=self._after_rejection(policy, job, outcome, now),
                at=now,
            )
        else:
            _unknown(work, policy, self._health, _unknown_reason(outcome))

    def recorded(self, claimed: Claimed) -> None:
        """What follows a saved outcome: counts and logs."""
        work, outcome = claimed.work, claimed.outcome
        assert outcome is not None, "recorded() follows record()"
        job = work.job
        if outcome.kind is SendKind.REJECTED:
            work.count("rejected")
            log.info("job %s rejected (%s)", job.key, outcome.reason)
        elif outcome.kind is not SendKind.CONFIRMED:  # confirmed: counted with its save
            work.count("unknown")
            log.info("job %s outcome unknown (%s)", job.key, _unknown_reason(outcome))

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
    _unknown(work, policy, health, reason)
    work.save()
    log.info("job %s outcome unknown (%s)", work.job.key, reason)


def _unknown(work: Work, policy: ChannelPolicy, health: ProviderHealth, reason: str) -> None:
    decision = decisions.after_unknown(
        policy, now=work.now, handle_reliable=health.reliable(policy.provider)
    )
    work.job.record_unknown(reason=reason, decision=decision, at=work.now)
