"""Recover: an attempt with no outcome by its deadline is an unknown outcome.

A daemon killed between its claim and the outcome (kill -9, power cut) leaves an Attempted
event and nothing after it. Whether the provider got the message cannot be known, so it is
treated exactly like a timeout (invariant 6 in ``docs/architecture.md``): searched later, or
sent to review, by the channel's policy.
"""

from __future__ import annotations

import logging
from datetime import datetime

from daemon.engine.dispatch import record_unknown
from daemon.engine.health import ProviderHealth
from daemon.engine.runner import Work, due
from ledger.job import SendJob
from ledger.vocabulary import JobState
from policies import decisions

log = logging.getLogger("sendledger.engine")

REASON = "no outcome recorded by the attempt's deadline (crash or kill?)"


class Recover:
    state = JobState.ATTEMPTED

    def __init__(self, health: ProviderHealth) -> None:
        self._health = health

    def is_due(self, job: SendJob, now: datetime) -> bool:
        return due(job, now)

    def run(self, work: Work) -> None:
        job = work.job
        if work.policy is None:
            job.record_unknown(
                reason=REASON, decision=decisions.no_policy(job.channel), at=work.now
            )
            work.save()
        else:
            record_unknown(work, work.policy, self._health, REASON)
        work.count("recovered")
        log.warning("job %s: attempt %d had no outcome by its deadline", job.key, job.attempts)
