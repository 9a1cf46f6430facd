"""An attempt whose outcome cannot be known (invariant 6 in ``docs/architecture.md``):
the one rule for what comes next, which the dispatch applies to a send that timed out or
lost its answer and `recover.py` to a claim left without an outcome."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import daemon.engine.drafts as drafts_flow
from ledger.display import quoted
from policies import decisions

if TYPE_CHECKING:
    from daemon.engine.readback import ProviderHealth
    from daemon.engine.work import Work
    from ledger.decision_types import AfterUnknown
    from policies.model import ChannelPolicy

log = logging.getLogger("sendledger.engine")


def save_unknown_outcome(
    work: Work, policy: ChannelPolicy, health: ProviderHealth, reason: str
) -> None:
    """An attempt whose outcome cannot be known, saved: search later, or review."""
    unknown_to_events(work, policy, health, reason)
    work.save()
    log.info("job %s outcome unknown (%s)", work.job.key, quoted(reason))


def unknown_to_events(
    work: Work, policy: ChannelPolicy, health: ProviderHealth, reason: str
) -> None:
    """An unknown outcome as events on the job in memory (not saved). The rule is chosen
    here, once: with a recorded draft, the draft's check at once (every channel: the
    sweep's, which deletes a draft still unsent before it says so); without one, the
    policy's rule for unknown outcomes, with the mailbox's history read at once when the
    claim recorded a historyId and the provider reads its history."""
    decision: AfterUnknown
    if drafts_flow.recorded_draft(work.job) is not None:
        decision = decisions.after_unknown_draft(policy, now=work.now)
    else:
        decision = decisions.after_unknown(
            policy,
            now=work.now,
            handle_reliable=health.reliable(work.provider_name or policy.provider),
            history=work.job.history_id is not None
            and work.provider is not None
            and work.provider.history() is not None,
        )
    work.job.record_unknown(reason=reason, decision=decision, at=work.now)
