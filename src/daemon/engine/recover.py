"""Recover: an attempt with no outcome by its deadline is an unknown outcome.

A daemon killed between its claim and the outcome (kill -9, power cut) leaves an Attempted
event and nothing after it. Whether the provider got the message cannot be known, so it is
treated exactly like a timeout (invariant 6 in ``docs/architecture.md``): searched later, or
sent to review, by the channel's policy.

Another daemon's claim may still be in flight, so it waits for its deadline (`Recover`),
which that daemon renews while the call runs (`leases.py`): only a lease that lapsed is
taken. A claim that one of this daemon's own workers holds is never taken, whatever its
deadline says. A daemon's own claims found at its start-up have no call in flight: the
store's identity lock lets one live daemon hold a name (`Ledger.hold_identity`), so
whoever claimed them is dead, and `RecoverOwnClaims` treats them as Unknown at once.
"""

from __future__ import annotations

import logging
from datetime import datetime

from daemon.engine.leases import Leases
from daemon.engine.readback import ProviderHealth
from daemon.engine.unknown import save_unknown_outcome
from daemon.engine.work import Work, due
from ledger.display import quoted
from ledger.job import SendJob
from ledger.vocabulary import JobState
from policies import decisions

log = logging.getLogger("sendledger.engine")

REASON = "no outcome recorded by the attempt's deadline (crash or kill?)"
OWN_REASON = "no outcome recorded before this daemon restarted (crash or kill?)"


class Recover:
    state = JobState.ATTEMPTED

    def __init__(self, health: ProviderHealth, leases: Leases) -> None:
        self._health = health
        self._leases = leases

    reason = REASON

    def is_due(self, job: SendJob, now: datetime) -> bool:
        return due(job, now) and not self._leases.holds(job.key)

    def run(self, work: Work) -> None:
        job = work.job
        if work.policy is None:
            job.record_unknown(
                reason=self.reason, decision=decisions.no_policy(job.channel), at=work.now
            )
            work.save()
        else:
            save_unknown_outcome(work, work.policy, self._health, self.reason)
        work.count("recovered")
        log.warning("job %s: attempt %d: %s", job.key, job.attempts, quoted(self.reason))


class RecoverOwnClaims(Recover):
    """At start-up: this daemon's own claims, whatever their deadline."""

    reason = OWN_REASON

    def __init__(self, health: ProviderHealth, leases: Leases, daemon: str) -> None:
        super().__init__(health, leases)
        self._daemon = daemon

    def is_due(self, job: SendJob, now: datetime) -> bool:
        return (
            bool(self._daemon)
            and job.claimed_by == self._daemon
            and not self._leases.holds(job.key)
        )
