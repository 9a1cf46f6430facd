"""Recover: an attempt with no outcome by its deadline is an unknown outcome.

A daemon killed between its claim and the outcome (kill -9, power cut) leaves an Attempted
event and nothing after it. Whether the provider got the message cannot be known, so it is
treated exactly like a timeout (invariant 6 in ``docs/architecture.md``): searched later, or
sent to review, by the channel's policy.

Another daemon's claim may still be in flight, so it waits for its deadline (`Recover`),
which that daemon renews while the call runs (`leases.py`): only a lease that lapsed is
taken. A claim that one of this daemon's own workers holds is never taken, whatever its
deadline says. A daemon's own claims found at its start-up have no call in flight when
the store's identity lock ends only with its holder (SQLite, memory: one live daemon per
name, `Ledger.hold_identity`): whoever claimed them is dead, and `RecoverOwnClaims` treats
them as Unknown at once. A PostgreSQL lock can end under a live daemon (a database
restart), and the process that takes the name meanwhile may find that daemon still
finishing a call: there it takes at once only the claims whose deadline passed, and
leaves the others to `Recover` at their deadline. Taken at once, the Unknown's search
(`search_after`) could end before that call filed its copy, and a channel that resends
would send the job twice.
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
    """At start-up: this daemon's own claims, whatever their deadline; with
    `wait_for_deadlines` (a name lock that can end under a live holder), only those whose
    deadline passed."""

    reason = OWN_REASON

    def __init__(
        self, health: ProviderHealth, leases: Leases, daemon: str, *, wait_for_deadlines: bool
    ) -> None:
        super().__init__(health, leases)
        self._daemon = daemon
        self._wait = wait_for_deadlines

    def is_due(self, job: SendJob, now: datetime) -> bool:
        return (
            bool(self._daemon)
            and job.claimed_by == self._daemon
            and not self._leases.holds(job.key)
            and (not self._wait or due(job, now))
        )
