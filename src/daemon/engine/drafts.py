"""The engine's side of `send_via = "drafts"` (docs/providers.md "Gmail setup"; "The life
of one job" in docs/architecture.md): the job's draft before the claim, and the draft's
answer after an unknown outcome.

Before the claim: the job's recorded draft, when it is still unsent; else a draft an earlier
run made and never recorded (a crash between create and save), found by its Message-ID and
reused; else a new one. DraftCreated goes into the same save as the claim, so the claim's
one call sends that draft. Only a recorded draft is ever sent, and a draft makes at most
one message, so no draft is ever sent twice. A recorded draft gone and not SENT is no
proof of anything (a person may have sent it from the mailbox): review, not a new draft,
unless a person resent the job since (DraftVanished).

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

import hashlib
import logging
from collections.abc import Callable
from datetime import datetime
from email import policy as email_policy
from email.message import EmailMessage
from email.parser import BytesParser
from email.utils import getaddresses
from typing import TYPE_CHECKING

from daemon.providers.base import ProviderError, ScopeLost, calls_while
from daemon.providers.draft_handle import Draft, DraftCheck, DraftsProvider, DraftStatus
from ledger.display import quoted
from ledger.exceptions import SendledgerError, known
from ledger.job import SendJob, resolved_reason
from ledger.vocabulary import Resolution
from policies import decisions
from policies.model import ChannelPolicy

if TYPE_CHECKING:
    from daemon.engine.work import Work

log = logging.getLogger("sendledger.engine")


def recorded_draft(job: SendJob) -> Draft | None:
    if job.draft_id is None or job.draft_message_id is None:
        return None
    return Draft(job.draft_id, job.draft_message_id)


def asked_draft(job: SendJob) -> Draft | None:
    """The draft whose answer settles the job's attempt: the recorded one, or the one a
    sweep's fence recorded as deleted before deleting it (`SendJob.fenced_draft`)."""
    asked = job.asked_draft
    return None if asked is None else Draft(*asked)


def _unrecorded_draft(job: SendJob, drafts: DraftsProvider, raw: bytes) -> Draft | None:
    """A draft an earlier run made but never recorded, unsent, its content found to be the
    job's (`raw`): reused, never left to be sent later by someone else."""
    for draft in sorted(drafts.find_drafts(job.message_id), key=lambda d: d.draft_id):
        if draft.draft_id in job.deleted_drafts:
            # Recorded deleted, perhaps before its deletion was made (a fence, a claim
            # that lost its race): reused, it could be deleted under this claim's send.
            continue
        current = drafts.draft_raw(draft)
        if current is not None:  # else sent or deleted since it was listed
            _held_to(draft, current, raw)
            return draft
    return None


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
    raises NotOurs: nothing created, the job stays due for the scope's owner.

    A draft made earlier (recorded, or found) is read back first and held to `raw`, the
    proven render: one a person edited in the mailbox raises DraftChanged, and nothing
    is sent (docs/providers.md "Gmail setup"). A recorded draft found gone and not SENT
    raises DraftVanished, unless a person resent the job since (`_resent_by_a_person`).

    The look-up of a draft made earlier is many calls (`drafts.list` pages, a `drafts.get`
    of each draft listed): each further one asks `may_create()` too (`calls_while`), and
    stopped there (ScopeLost) it raises NotOurs, as before the create."""
    try:
        with calls_while(may_create):
            return _prepared(job, drafts, raw, now, may_create)
    except ScopeLost:
        raise NotOurs(job.key) from None


def _prepared(
    job: SendJob,
    drafts: DraftsProvider,
    raw: bytes,
    now: datetime,
    may_create: Callable[[], bool] | None,
) -> tuple[Draft, bool]:
    recorded = recorded_draft(job)
    if recorded is not None:
        # Its read-back answers what `check_draft` would when it is still unsent.
        current = drafts.draft_raw(recorded)
        if current is not None:
            _held_to(recorded, current, raw)
            return recorded, False  # unsent: the same draft again
        status = drafts.check_draft(recorded).status
        if status is DraftStatus.SENT:
            raise DraftAlreadySent(recorded)
        if status is DraftStatus.PENDING:  # gone, then there again: no answer to act on
            raise ProviderError(f"draft {recorded.draft_id}: answered gone, then unsent")
        if not _resent_by_a_person(job):
            raise DraftVanished(recorded)
    reused = _unrecorded_draft(job, drafts, raw)
    if reused is None and may_create is not None and not may_create():
        raise NotOurs(job.key)
    draft = reused or drafts.create_draft(raw)
    job.record_draft(draft_id=draft.draft_id, provider_message_id=draft.provider_message_id, at=now)
    return draft, reused is None


def _resent_by_a_person(job: SendJob) -> bool:
    """Whether the job's latest state is a person's resend (`Resolved`, resend), with no
    claim since: that person decided on their own search, made with the draft found gone
    (`Services._fenced_search`), so a new draft is theirs to send. A resend its searches
    decided (`Requeued`) forgot the draft already (`DraftGone`). A claim since that sent
    nothing (refused as unavailable, a stop's, a read-back's) counts no attempt but made
    the draft recorded now, and its refusal replaced the resend's reason."""
    return (
        job.resent
        and not job.requeued
        and job.round_attempts == 0
        and job.reason == resolved_reason(Resolution.RESEND)
    )


def _held_to(draft: Draft, current: bytes, proven: bytes) -> None:
    difference = draft_difference(current, proven)
    if difference is not None:
        raise DraftChanged(draft, difference)


#: The headers whose values a draft must keep: who it goes to, as whom, what it is called,
#: and the Message-ID every check of the job counts by.
_HELD_HEADERS = ("message-id", "from", "to", "cc", "bcc", "subject", "reply-to")


def draft_difference(current: bytes, proven: bytes) -> str | None:
    """What differs between a draft as the mailbox has it now and the job's proven
    render, in the parts a recipient sees or the checks count by: the headers above
    (addresses compared as addresses, text as decoded) and each body part's type and
    decoded bytes (a provider may re-encode a part, not change it). None: the same."""
    found, expected = _message(current), _message(proven)
    for name in _HELD_HEADERS:
        if _header(found, name) != _header(expected, name):
            return f"{name} differs"
    if _parts(found) != _parts(expected):
        return "the body differs"
    return None


def _message(raw: bytes) -> EmailMessage:
    parsed = BytesParser(policy=email_policy.default).parsebytes(raw)
    assert isinstance(parsed, EmailMessage)
    return parsed


def _header(message: EmailMessage, name: str) -> tuple[str, ...]:
    values = [str(v) for v in message.get_all(name) or ()]
    if name in ("from", "to", "cc", "bcc", "reply-to"):
        return tuple(sorted(addr.lower() for _, addr in getaddresses(values) if addr))
    return tuple(" ".join(v.split()) for v in values)


def _parts(message: EmailMessage) -> list[tuple[str, str]]:
    """Each leaf part's type and a digest of its decoded bytes, in order."""
    parts = []
    for part in message.walk():
        if part.is_multipart():
            continue
        payload = part.get_payload(decode=True)
        data = payload if isinstance(payload, bytes) else b""
        if part.get_content_maintype() == "text":
            data = data.replace(b"\r\n", b"\n").rstrip(b"\n")  # line ends as stored
        parts.append((part.get_content_type(), hashlib.sha256(data).hexdigest()))
    return parts


def no_draft(work: Work, exc: ProviderError) -> None:
    """The draft step before the claim failed (not a definite refusal): no draft, no
    claim, so nothing can have been sent, `max_attempts` is untouched and the job stays
    due. The failure has counted toward the scope's circuit (`Circuits.call`, around the
    step), so an outage during the draft step is waited out behind it
    (docs/operations.md "Outages and quotas")."""
    log.warning("job %s: no draft (%s)", work.job.key, quoted(exc.reason))
    work.count("unavailable" if exc.unavailable else "errors")


class DraftAlreadySent(SendledgerError):
    """The job's recorded draft is already consumed and SENT (a claim whose outcome this
    daemon never recorded): the job is confirmed by it, not sent again."""

    def __init__(self, draft: Draft) -> None:
        super().__init__(f"draft {draft.draft_id} is already sent")
        self.draft = draft


class DraftChanged(SendledgerError):
    """A draft made earlier for the job no longer says what the job says: a person edited
    it in the mailbox. Not sent; the job goes to review (`draft-changed`)."""

    def __init__(self, draft: Draft, difference: str) -> None:
        super().__init__(f"draft {draft.draft_id} was changed in the mailbox: {difference}")
        self.draft = draft
        self.difference = difference


class DraftVanished(SendledgerError):
    """The job's recorded draft, never sent by a claim of this job's that answered, is
    gone and no SENT message has its message id: deleted by a person, or sent by one
    from the mailbox, whose client sends a draft under a message id of its own. Nothing
    the daemon can read now tells which (the search's index lags), so nothing is sent:
    the job goes to review (docs/architecture.md "The life of one job on a drafts
    provider")."""

    def __init__(self, draft: Draft) -> None:
        super().__init__(
            f"draft {draft.draft_id} is gone from the mailbox and no sent copy has its"
            " message id: deleted there, or sent from there under another"
        )
        self.draft = draft


class NotOurs(SendledgerError):
    """The job's quota scope went to another daemon during its draft step, before its
    draft was created: no draft, no claim; the job stays due for the scope's owner."""

    def __init__(self, key: str) -> None:
        super().__init__(f"job {key}: its quota scope went to another daemon")


def ask_draft(job: SendJob, drafts: DraftsProvider) -> DraftCheck | None:
    """The job's recorded draft's answer; None when the provider could not say, or the
    check stopped between its calls once the job's quota scope went to another daemon
    (`calls_while`): that daemon's sweep asks the draft."""
    draft = known(recorded_draft(job), "ask_draft needs a recorded draft")
    try:
        return drafts.check_draft(draft)
    except ScopeLost as lost:
        log.info("job %s: draft check stopped (%s)", job.key, lost)
        return None
    except ProviderError as exc:
        log.warning("job %s: draft check failed (%s)", job.key, quoted(exc.reason))
        return None


def record_draft_check(
    job: SendJob,
    check: DraftCheck,
    policy: ChannelPolicy,
    *,
    now: datetime,
    handle_reliable: bool,
    tidy_at: datetime | None,
) -> None:
    """What the draft answered at `now`, as events on the job in memory (the caller
    saves); `tidy_at`: when the job's unsent drafts are deleted, should this settle it. A
    draft gone whose message is not SENT is `DraftGone` also under a recorded fence:
    unless the asker's own deletion succeeded (then it answered PENDING), a person may
    have sent it from the mailbox under another message id (docs/architecture.md "The
    life of one job on a drafts provider")."""
    draft = known(asked_draft(job), "record_draft_check needs a recorded draft")
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
        # The search waits out the index lag counted from the moment the draft was found
        # gone (`draft_gone_at`), as a person's resend does: a person may have pressed
        # Send on it a moment before, and the index shows that copy `search_after` later.
        job.record_draft_gone(
            decision=decisions.after_unknown(policy, now=now, handle_reliable=handle_reliable),
            at=now,
        )


def settle_by_draft(
    job: SendJob,
    drafts: DraftsProvider,
    policy: ChannelPolicy,
    *,
    now: datetime,
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
