"""The engine's side of `send_via = "drafts"` (docs/providers.md "Gmail setup"; "The life
of one job" in docs/architecture.md): the job's draft before the claim, and the draft's
answer after an unknown outcome.

Before the claim: the job's recorded draft, when it is still unsent; else a draft an earlier
run made and never recorded (a crash between create and save), found by its Message-ID and
reused; else a new one. DraftCreated goes into the same save as the claim, so the claim's
one call sends that draft. Only a recorded draft is ever sent, and a draft makes at most
one message, so no draft is ever sent twice.

After an unknown outcome the draft is asked at once, in the worker, with no index wait:
still there -> that attempt sent nothing (DraftPending: the policy's `pending_draft`
sends it again or reviews); gone and its message SENT -> Confirmed via draft; gone and no
SENT message -> DraftGone: the Message-ID search after `search_after` when the handle is
reliable, else review. A check that fails is no information: the job stays unknown with
the check due, and the sweep asks again.

Called by `dispatch.py` (before the claim, and in the send worker right after an unknown
outcome) and by `search.py`'s sweep (a recovered claim of a job with a recorded draft).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING

from daemon.engine.circuit import Circuits
from daemon.providers.base import ProviderError
from daemon.providers.draft_handle import Draft, DraftCheck, DraftsProvider, DraftStatus
from ledger.exceptions import SendledgerError
from ledger.job import SendJob
from policies import decisions
from policies.model import ChannelPolicy

if TYPE_CHECKING:
    from daemon.engine.runner import Work

log = logging.getLogger("sendledger.engine")


def recorded_draft(job: SendJob) -> Draft | None:
    if job.draft_id is None or job.draft_message_id is None:
        return None
    return Draft(job.draft_id, job.draft_message_id)


def prepare_draft(
    job: SendJob,
    drafts: DraftsProvider,
    raw: bytes,
    now: datetime,
    *,
    may_create: Callable[[], bool] | None = None,
) -> tuple[Draft, bool]:
    """The draft the claim will send, recorded on the job in memory (DraftCreated, saved
    with the claim), and whether this call created it (a claim that loses its race
    deletes a draft it created: `Dispatch.save_claim`). Raises ProviderError when the
    provider cannot say or store one: the job is not claimed and stays due.

    `may_create()`: asked right before drafts.create, whether this daemon may still call
    for the job's quota scope (`Dispatch`); the calls before it may each take up to the
    provider's timeout, and the scope may have gone to another daemon meanwhile. False
    raises NotOurs: nothing created, the job stays due for the scope's owner."""
    recorded = recorded_draft(job)
    if recorded is not None:
        status = drafts.check_draft(recorded).status
        if status is DraftStatus.PENDING:
            return recorded, False  # unsent: the same draft again
        if status is DraftStatus.SENT:
            raise DraftAlreadySent(recorded)
    # A draft an earlier run made but never recorded is reused, never left to be sent
    # later by someone else; it has the same Message-ID and content.
    found = sorted(drafts.find_drafts(job.message_id), key=lambda d: d.draft_id)
    if not found and may_create is not None and not may_create():
        raise NotOurs(job.key)
    draft = found[0] if found else drafts.create_draft(raw)
    job.record_draft(draft_id=draft.draft_id, provider_message_id=draft.provider_message_id, at=now)
    return draft, not found


def no_draft(work: Work, exc: ProviderError, circuits: Circuits, now: datetime) -> None:
    """The draft step before the claim failed (not a definite refusal): no draft, no
    claim, so nothing can have been sent, `max_attempts` is untouched and the job stays
    due. The failure counts toward the scope's circuit as a send's would, so an outage
    during the draft step is waited out behind it (docs/operations.md "Outages and
    quotas")."""
    scope = work.provider.scope() if work.provider is not None else ""
    circuits.called(scope, now, unavailable=exc.unavailable, retry_after=exc.retry_after)
    log.warning("job %s: no draft (%s)", work.job.key, exc.reason)
    work.count("unavailable" if exc.unavailable else "errors")


class DraftAlreadySent(SendledgerError):
    """The job's recorded draft is already consumed and SENT (a claim whose outcome this
    daemon never recorded): the job is confirmed by it, not sent again."""

    def __init__(self, draft: Draft) -> None:
        super().__init__(f"draft {draft.draft_id} is already sent")
        self.draft = draft


class NotOurs(SendledgerError):
    """The job's quota scope went to another daemon during its draft step, before its
    draft was created: no draft, no claim; the job stays due for the scope's owner."""

    def __init__(self, key: str) -> None:
        super().__init__(f"job {key}: its quota scope went to another daemon")


def ask_draft(job: SendJob, drafts: DraftsProvider) -> DraftCheck | None:
    """The job's recorded draft's answer; None when the provider could not say."""
    draft = recorded_draft(job)
    assert draft is not None, "ask_draft needs a recorded draft"
    try:
        return drafts.check_draft(draft)
    except ProviderError as exc:
        log.warning("job %s: draft check failed (%s)", job.key, exc.reason)
        return None


def record_draft_check(
    job: SendJob,
    check: DraftCheck,
    policy: ChannelPolicy,
    *,
    now: datetime,
    unknown_at: datetime,
    handle_reliable: bool,
    tidy_at: datetime | None,
) -> None:
    """What the draft answered, as events on the job in memory (the caller saves);
    `tidy_at`: when the job's unsent drafts are deleted, should this settle it."""
    draft = recorded_draft(job)
    assert draft is not None, "record_draft_check needs a recorded draft"
    if check.status is DraftStatus.SENT:
        confirm_recorded(job, policy, draft, now, tidy_at)
    elif check.status is DraftStatus.PENDING:
        job.record_draft_pending(
            decision=decisions.after_draft_pending(
                policy, attempts_made=job.round_attempts, now=now
            ),
            at=now,
        )
    else:
        # The search waits out the index lag counted from the unknown outcome.
        job.record_draft_gone(
            decision=decisions.after_unknown(
                policy, now=unknown_at, handle_reliable=handle_reliable
            ),
            at=now,
        )


def settle_by_draft(
    job: SendJob,
    drafts: DraftsProvider,
    policy: ChannelPolicy,
    *,
    now: datetime,
    unknown_at: datetime,
    handle_reliable: bool,
    tidy_at: datetime | None = None,
) -> bool:
    """Ask the job's draft and record what it answers (in memory; the caller saves).
    False when the check failed: nothing recorded, the job stays as it was."""
    check = ask_draft(job, drafts)
    if check is None:
        return False
    record_draft_check(
        job,
        check,
        policy,
        now=now,
        unknown_at=unknown_at,
        handle_reliable=handle_reliable,
        tidy_at=tidy_at,
    )
    return True


def confirm_recorded(
    job: SendJob, policy: ChannelPolicy, draft: Draft, now: datetime, tidy_at: datetime | None
) -> None:
    """A recorded draft found SENT: the job is confirmed by it."""
    job.record_draft_sent(
        provider_message_id=draft.provider_message_id,
        decision=decisions.after_response(policy, resent=job.resent, now=now),
        at=now,
        tidy_at=tidy_at,
    )
