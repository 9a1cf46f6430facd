"""What to do next with a job, decided by its channel's policy. Pure: no I/O, no clock.

The caller passes the time (``now``, timezone-aware) and, for jitter, a random source; the
functions only read the policy and the facts given. Each returns one of the closed set of
typed decisions in :mod:`ledger.decision_types`, carrying the policy's name and fingerprint; the
job aggregate turns it into events.

Why the rules are what they are:

* An unknown outcome is never answered by a resend. The provider may have sent the mail
  and then failed to say so (a dropped response, a 500 after the send), so the daemon first
  asks the sender's mailbox, by Message-ID.
* It asks only after ``search_after``: the provider's search index lags behind sends by
  seconds to minutes, and a search made too early finds nothing for a mail that was sent.
* For the same reason one empty search is not evidence. A miss is believed only after
  ``confirm_misses`` empty searches, ``search_interval`` apart.
* One hit proves the send; two or more prove a duplicate, which goes to a human and is
  never followed by another send (invariant 4 in ``docs/architecture.md``).
* Only channels with ``on_unknown = "retry"`` ever resend on their own, and never an
  ``irreversible`` one (invariant 5 in ``docs/architecture.md``), even if such a policy
  were built around validation.
"""

from __future__ import annotations

import math
import random
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from ledger.decision_types import (
    AfterBounce,
    AfterDraftPending,
    AfterHistory,
    AfterRejection,
    AfterSearch,
    AfterUnknown,
    AfterVerification,
    Confirm,
    Decision,
    Duplicate,
    HistoryMiss,
    RecordBounce,
    ResendAt,
    RetryAt,
    Review,
    SearchAgainAt,
    SearchAt,
    Send,
    StopVerifying,
)
from ledger.vocabulary import EscalationReason, PolicyRef

if TYPE_CHECKING:  # the policy is read, never built, here: its model is a type only
    from policies.model import ChannelPolicy

__all__ = [
    "MAX_RETRY_AFTER",
    "Decision",
    "after_bounce",
    "after_history",
    "after_permanent_rejection",
    "after_response",
    "after_search",
    "after_transient_rejection",
    "after_unavailable",
    "after_unknown",
    "after_verification",
    "backoff_ceiling",
    "before_attempt",
    "before_search",
    "cannot_build",
    "give_up_time",
    "no_policy",
    "refused_before_attempt",
    "retry_after_wait",
    "tidy_at",
    "waited_too_long",
]

#: A provider's Retry-After longer than this is capped: a week is long enough for any quota
#: window, and a job does not disappear into a far future because of one odd header.
MAX_RETRY_AFTER = 7 * 86400.0


def retry_after_wait(retry_after: float | None) -> float:
    """The provider's Retry-After as a wait in seconds: 0 when absent, negative or not a
    number, at most `MAX_RETRY_AFTER`. Every wait taken from one goes through here (a
    job's retry, the scope's circuit, a report read's next read): "1e12" said by a server
    would otherwise be a moment past the calendar's end, or hold a mailbox for years."""
    if retry_after is None or not math.isfinite(retry_after) or retry_after <= 0:
        return 0.0
    return min(float(retry_after), MAX_RETRY_AFTER)


def _utc(now: datetime) -> datetime:
    if now.tzinfo is None or now.utcoffset() is None:
        raise ValueError("now must be a timezone-aware datetime (UTC)")
    return now.astimezone(UTC)


def _non_negative(name: str, value: int) -> None:
    if isinstance(value, bool) or value < 0:
        raise ValueError(f"{name} must be an int >= 0, got {value!r}")


def _may_resend(policy: ChannelPolicy) -> bool:
    """Whether the policy lets the daemon resend after believed misses, without a human.

    Checked here as well as at load time: invariant 5 must hold even for a policy that was
    built with ``model_construct`` or otherwise around validation."""
    return policy.on_unknown == "retry" and policy.irreversible is not True


def no_policy(channel: str) -> Review:
    """A job whose channel has no policy (removed, or never loaded): a human decides."""
    return Review(PolicyRef.missing(channel), EscalationReason.NO_POLICY)


def cannot_build(policy: ChannelPolicy) -> Review:
    """A message that cannot be built is never claimed or sent: a human decides."""
    return Review(policy.ref, EscalationReason.REJECTED)


def before_attempt(policy: ChannelPolicy, *, attempts_made: int, from_addr: str) -> Send | Review:
    """Before a provider call: send, unless the policy in force no longer lets the job
    send as its From (`from_addr`), or ``max_attempts`` calls were already made.

    The From was allowed when the job was accepted, by the policy of that moment; a reload
    since may have withdrawn the sender (`from` changed, `allowed_from` narrowed), and the
    call sends as it now. Every call counts, whatever its outcome, because any of them may
    have sent the mail.
    """
    refused = refused_before_attempt(policy, attempts_made=attempts_made, from_addr=from_addr)
    return Send(policy.ref) if refused is None else refused


def refused_before_attempt(
    policy: ChannelPolicy, *, attempts_made: int, from_addr: str
) -> Review | None:
    """`before_attempt`'s Review, or None where it sends: what a claim asks, at every
    claim, so it builds no Send it would drop (its policy's `ref`, the canonical JSON's
    fingerprint looked up by the model's hash, is about 2 us: docs/performance.md
    "Performance and scaling")."""
    _non_negative("attempts_made", attempts_made)
    if not policy.sends_as(from_addr):
        return Review(policy.ref, EscalationReason.SENDER_NOT_ALLOWED)
    if attempts_made >= policy.max_attempts:
        return Review(policy.ref, EscalationReason.MAX_ATTEMPTS)
    return None


def after_response(policy: ChannelPolicy, *, resent: bool, now: datetime) -> Confirm:
    """The provider answered with its id for the message: one copy exists. On a channel
    with ``watch_bounces`` its mailbox is watched for reports about it that long."""
    return Confirm(
        policy.ref,
        verify_at=_verify_at(policy, resent=resent, now=now),
        watch_until=_watch_until(policy, now=now),
    )


def after_bounce(policy: ChannelPolicy, *, permanent: bool) -> AfterBounce:
    """A delivery report about a watched job: recorded; and with ``on_bounce = "review"``
    a permanent one sends the job to a human (its message was sent: a bounce never makes
    it unsent, and nothing is ever sent again on its own because of one)."""
    if permanent and policy.on_bounce == "review":
        return Review(policy.ref, EscalationReason.BOUNCED)
    return RecordBounce(policy.ref)


def _watch_until(policy: ChannelPolicy, *, now: datetime) -> datetime | None:
    if policy.watch_bounces is None:
        return None
    return _utc(now) + timedelta(seconds=policy.watch_bounces)


def after_unknown(
    policy: ChannelPolicy, *, now: datetime, handle_reliable: bool = True, history: bool = False
) -> AfterUnknown:
    """After a call whose outcome cannot be known (timeout, reset, 5xx, missing id).

    ``on_unknown = "review"`` sends it straight to a human. If the provider is known to
    replace our Message-ID (``handle_reliable`` false), a search would miss every sent copy
    and a resend would then duplicate, so it goes to a human too; the history counts copies
    by the same header, so it is not read either. Otherwise: search, but only after
    ``search_after``, when the search index has had time to catch up; and with ``history``
    (the claim recorded the mailbox's historyId and the provider reads its history) read
    the history since the claim at once: no index lies in between, so a copy found there
    confirms without waiting.
    """
    now = _utc(now)
    if policy.on_unknown == "review":
        return Review(policy.ref, EscalationReason.UNKNOWN_OUTCOME)
    return before_search(policy, handle_reliable=handle_reliable) or SearchAt(
        policy.ref, now + timedelta(seconds=policy.search_after), now if history else None
    )


def after_history(
    policy: ChannelPolicy, *, hits: int, unknown_at: datetime, resent: bool, now: datetime
) -> AfterHistory:
    """After a read of the mailbox's history since the claim (``after_unknown``).

    * one copy of ours: sent once: confirm (and count again ``verify_after`` later for a
      job sent again without proof, as after a search).
    * two or more: a duplicate, for a human.
    * none: absence proves nothing while the history may lag. Without ``history_after`` it
      is not read again: the search decides after ``search_after``, as without history.
      With it, read again once ``history_after`` has passed since the unknown outcome; a
      miss then is believed, and the search is due at once (its index wait replaced by the
      history's measured one), where the misses count as always.
    """
    _non_negative("hits", hits)
    now = _utc(now)
    if hits == 1:
        return after_response(policy, resent=resent, now=now)
    if hits >= 2:
        return Duplicate(policy.ref)
    if policy.history_after is None:
        return HistoryMiss(policy.ref)
    believed_at = _utc(unknown_at) + timedelta(seconds=policy.history_after)
    if now < believed_at:
        return HistoryMiss(policy.ref, next_at=believed_at)
    return HistoryMiss(policy.ref, search_at=now)


def before_search(policy: ChannelPolicy, *, handle_reliable: bool) -> Review | None:
    """A search is worth making only if the provider keeps our Message-ID."""
    if not handle_reliable:
        return Review(policy.ref, EscalationReason.HANDLE_UNRELIABLE)
    return None


def _count_copies(
    policy: ChannelPolicy, *, hits: int, searches_before: int, now: datetime
) -> Confirm | Duplicate | SearchAgainAt | None:
    """What one search's hit count decides, shared by the sweep and the verification:
    one copy confirms, two or more are a duplicate, none means search again while fewer
    than ``confirm_misses`` searches came back empty. None: the misses are believed."""
    _non_negative("hits", hits)
    if hits == 1:
        return Confirm(policy.ref)
    if hits >= 2:
        return Duplicate(policy.ref)
    if searches_before + 1 < policy.confirm_misses:
        return SearchAgainAt(policy.ref, now + timedelta(seconds=policy.effective_search_interval))
    return None


def after_search(
    policy: ChannelPolicy,
    *,
    hits: int,
    misses_before: int,
    resent: bool,
    now: datetime,
    only_in_trash: bool = False,
) -> AfterSearch:
    """After a search of the sender's mailbox for the job's Message-ID.

    * copies only in the trash (``only_in_trash``: none in the sent folder): review
      (``only-in-trash``), on every channel and whatever their count. A copy sent and
      then deleted by its sender is there, and so is a message received with the job's
      Message-ID and deleted, which anyone who knows the job's key can send: taken for a
      confirmation it would settle a job never sent, taken for a miss it could send one
      twice.
    * one hit: the mail was sent once: confirm (and, for a job sent again without proof
      that the earlier attempt failed, count its copies once more ``verify_after`` later).
    * two or more: it was sent more than once: a duplicate; a human looks at it and
      nothing is ever sent again automatically.
    * none: the first empty searches are not evidence, because the index lags: search
      again after ``search_interval``. Once ``confirm_misses`` searches in a row came back
      empty, the miss is believed: resend (due now) on a channel whose policy is ``retry``
      and which is not irreversible, otherwise review (``unknown-outcome``).

    ``misses_before`` counts the empty searches already recorded since the Unknown.
    """
    _non_negative("misses_before", misses_before)
    now = _utc(now)
    if only_in_trash:
        _non_negative("hits", hits)
        if hits == 0:
            raise ValueError("copies only in the trash, and none found")
        return Review(policy.ref, EscalationReason.ONLY_IN_TRASH)
    counted = _count_copies(policy, hits=hits, searches_before=misses_before, now=now)
    if isinstance(counted, Confirm):
        return after_response(policy, resent=resent, now=now)
    if counted is not None:
        return counted
    if _may_resend(policy):
        return ResendAt(policy.ref, now, misses_required=policy.confirm_misses)
    return Review(policy.ref, EscalationReason.UNKNOWN_OUTCOME)


def after_verification(
    policy: ChannelPolicy, *, hits: int, verifications_before: int, now: datetime
) -> AfterVerification:
    """After a verification search of a confirmed job.

    * one hit: verified, nothing more to do (confirm).
    * two or more: a duplicate, for review.
    * none: our confirmed copy is not indexed yet; look again after ``search_interval``, up
      to ``confirm_misses`` times, then stop: the copy was confirmed by the provider, a
      missing index entry is not a second copy.
    """
    _non_negative("verifications_before", verifications_before)
    now = _utc(now)
    counted = _count_copies(policy, hits=hits, searches_before=verifications_before, now=now)
    return counted if counted is not None else StopVerifying(policy.ref)


def after_unknown_draft(policy: ChannelPolicy, *, now: datetime) -> SearchAt:
    """After an unknown outcome on a job whose draft is recorded (send_via = "drafts"):
    ask the draft at once. No index lies between a draft and its answer, so there is no
    `search_after` to wait, and on every channel, `review` too: the answer is a fact, not a
    guess (docs/providers.md "Gmail setup")."""
    return SearchAt(policy.ref, _utc(now))


def draft_out_of_reach(policy: ChannelPolicy) -> Review:
    """After an unknown outcome on a job whose attempt sent its recorded draft, when the
    provider no longer sends through drafts (`send_via` changed since): the draft can be
    neither asked nor deleted before the copies are counted, and a search made at once
    (the draft's rule) or missing a call still out would be believed, and the job sent
    twice: a human decides, on every channel. So too when the provider refuses for good
    to delete a draft of the job's (Graph under a hold: `DeleteRefused`)."""
    return Review(policy.ref, EscalationReason.UNKNOWN_OUTCOME)


def after_draft_pending(
    policy: ChannelPolicy, *, attempts_made: int, now: datetime
) -> AfterDraftPending:
    """The job's draft is still unsent after an attempt: that attempt sent nothing, and the
    provider makes at most one message of the draft, so sending it again cannot duplicate.
    The policy's `pending_draft` chooses; `max_attempts` still bounds the calls."""
    _non_negative("attempts_made", attempts_made)
    if policy.pending_draft == "review":
        return Review(policy.ref, EscalationReason.UNKNOWN_OUTCOME)
    if attempts_made >= policy.max_attempts:
        return Review(policy.ref, EscalationReason.MAX_ATTEMPTS)
    return RetryAt(policy.ref, _utc(now))


def backoff_ceiling(policy: ChannelPolicy, attempts_made: int) -> float:
    """``retry_backoff * 2**(attempts_made - 1)``, capped at ``retry_backoff_max``."""
    exponent = min(max(attempts_made - 1, 0), 1000)  # 2.0**1000 is still a finite float
    return min(policy.retry_backoff * 2.0**exponent, policy.retry_backoff_max)


def after_transient_rejection(
    policy: ChannelPolicy,
    *,
    attempts_made: int,
    now: datetime,
    retry_after: float | None,
    rng: random.Random,
) -> AfterRejection:
    """After the provider definitely refused a call for now (no connection, 429, quota).

    Nothing was sent, so trying again is safe; it waits an exponential backoff, jittered
    into ``[backoff / 2, backoff]`` so that many jobs refused together do not return
    together, and never less than the provider's ``Retry-After``. After ``max_attempts``
    calls a human decides.
    """
    _non_negative("attempts_made", attempts_made)
    now = _utc(now)
    if attempts_made >= policy.max_attempts:
        return Review(policy.ref, EscalationReason.MAX_ATTEMPTS)
    ceiling = backoff_ceiling(policy, attempts_made)
    delay = rng.uniform(ceiling / 2, ceiling)
    floor = retry_after_wait(retry_after)
    return RetryAt(policy.ref, now + timedelta(seconds=max(floor, delay)))


def waited_too_long(
    policy: ChannelPolicy, *, waiting_since: datetime, now: datetime
) -> Review | None:
    """A job that has waited for an unavailable provider longer than ``give_up_after``
    goes to a human (``provider-unavailable``); without ``give_up_after`` it never does."""
    if policy.give_up_after is None:
        return None
    if (_utc(now) - _utc(waiting_since)).total_seconds() <= policy.give_up_after:
        return None
    return Review(policy.ref, EscalationReason.PROVIDER_UNAVAILABLE)


def give_up_time(policy: ChannelPolicy, *, waiting_since: datetime) -> datetime | None:
    """When a job waiting since `waiting_since` will have waited too long
    (`waited_too_long` says so right after it); None without ``give_up_after``."""
    if policy.give_up_after is None:
        return None
    return _utc(waiting_since) + timedelta(seconds=policy.give_up_after)


def after_unavailable(
    policy: ChannelPolicy,
    *,
    waiting_since: datetime,
    now: datetime,
    wait: float,
    retry_after: float | None,
) -> AfterRejection:
    """After a call that provably sent nothing because the provider is unavailable
    (refused connection, DNS, connect timeout, TLS handshake, 429 or quota, SMTP 421
    before DATA): waited out, so it does not count against ``max_attempts``. Due again
    after ``wait`` or the provider's ``Retry-After``, whichever is longer (but not after
    its give-up time); review only once ``give_up_after`` has passed."""
    now = _utc(now)
    late = waited_too_long(policy, waiting_since=waiting_since, now=now)
    if late is not None:
        return late
    floor = retry_after_wait(retry_after)
    at = now + timedelta(seconds=max(floor, wait))  # floor >= 0: a negative wait is none
    if policy.give_up_after is not None:
        # Never due after its give-up time, so a long Retry-After cannot hide it past it.
        at = max(now, min(at, _utc(waiting_since) + timedelta(seconds=policy.give_up_after)))
    return RetryAt(policy.ref, at)


def after_permanent_rejection(policy: ChannelPolicy) -> Review:
    """After the provider refused the mail for good (400 and other 4xx): not sent, and
    sending it again would be refused again, so a human decides."""
    return Review(policy.ref, EscalationReason.REJECTED)


def _verify_at(policy: ChannelPolicy, *, resent: bool, now: datetime) -> datetime | None:
    """When to count the copies of a just-confirmed job once more, or None.

    Only a job that was sent again without proof that the earlier attempt failed (a miss
    believed after ``confirm_misses`` searches, or a human's resend) can have a second copy;
    if the provider's index lagged longer than the search windows, the earlier copy was
    invisible then. ``verify_after`` later the index has caught up, and a search counts.
    """
    now = _utc(now)
    if not resent:
        return None
    return now + timedelta(seconds=policy.verify_after)


def tidy_at(policy: ChannelPolicy | None, *, leaves_drafts: bool, now: datetime) -> datetime | None:
    """When a just-settled job's unsent drafts are deleted, or None: never for a provider
    that leaves no drafts. Not at once: a draft whose create answer was lost shows in the
    provider's lists only once its index has caught up, which ``search_after`` waits out
    as it does for a search (docs/architecture.md "Drafts never outlive their job")."""
    if not leaves_drafts:
        return None
    lag = policy.search_after if policy is not None else 0.0
    return _utc(now) + timedelta(seconds=lag)
