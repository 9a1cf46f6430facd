"""Claims this process saved without knowing whether the save landed, and never called.

A claim's save that raised with its commit not known is read back at once
(`Dispatch.save_claim_or_read_back`). When that read fails too (the store still down),
the claim may be stored with no call behind it, and only this process knows there is
none. Left alone it waits for its deadline and is recovered as an unknown outcome:
searched, or with `on_unknown = "review"` a person's look, for a send never made
(docs/architecture.md "Ambiguous commits"). `UnsentClaims` keeps such a claim's job (its
claim still pending on it) and reads the store back again at each tick until it answers,
before the deadline's recovery: the claim stored, this process's own and the job's last
event, it is released on the version read, as the read-back at once would have done;
anything else (not stored, another writer's event after it, a conflict at the release:
another daemon recovered it meanwhile) is left to the store's own course.

While the store does not answer, a tick reads back only the oldest claim kept: each
read waits for the store (`[store] connect_timeout`), and one per kept claim held
every check worker for that wait, tick after tick, for the same answer (docs/operations.md
"What a store outage costs"). Once it answers, the next tick reads back the rest; a
read-back that fails for a reason of its claim's own says nothing of the store and holds
back no other.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from eventsourcing.persistence import IntegrityError, PersistenceError

from daemon.engine.clock import Clock
from ledger.application import ConcurrentUpdate, Ledger
from ledger.decision_types import AfterRejection
from ledger.job import CLAIM_READ_BACK, SendJob
from ledger.vocabulary import JobState
from policies import decisions
from policies.model import ChannelPolicy

log = logging.getLogger("sendledger.engine")

#: Claims remembered at most; past that the oldest is left to its deadline's recovery.
REMEMBERED = 1_000


def release_decision(policy: ChannelPolicy, now: datetime, wait: float) -> AfterRejection:
    """When a claim released with no call made is due again: after `wait` (the circuit's
    probe time), with no give-up wait counted from it (it waited for no provider)."""
    return decisions.after_unavailable(
        policy, waiting_since=now, now=now, wait=wait, retry_after=None
    )


@dataclass
class _Unsent:
    job: SendJob  # its claim pending on it: saved unsure, its read-back failed, not called
    policy: ChannelPolicy


def _store_down(exc: BaseException) -> bool:
    """Whether `exc` is the store's not answering (a lost or refused connection, a pool
    wait run out, `StoreUnavailable`), not a conflict or an error of the claim's own."""
    return isinstance(exc, PersistenceError) and not isinstance(exc, IntegrityError)


class UnsentClaims:
    """Per job key, a claim of this process whose save and read-back both failed."""

    def __init__(
        self, ledger: Ledger, clock: Clock, wait: float, save: Callable[[SendJob], None]
    ) -> None:
        """`wait`: a release's wait before the job is due again (the circuit's probe
        time, as `Dispatch`'s); `save`: the engine's group commit (`commit.py`), whose
        saves keep a stop's window."""
        self._save = save
        self._ledger = ledger
        self._clock = clock
        self._wait = wait
        self._lock = threading.Lock()
        self._claims: dict[str, _Unsent] = {}
        #: The store's last read-back failed (a claim remembered, or its settle): only
        #: the oldest claim is read back until one succeeds.
        self._down = False

    def remember(self, job: SendJob, policy: ChannelPolicy) -> None:
        """Keep `job`'s claim, whose read-back has just failed (the store down)."""
        with self._lock:
            self._claims.pop(job.key, None)
            self._claims[job.key] = _Unsent(job, policy)
            while len(self._claims) > REMEMBERED:
                del self._claims[next(iter(self._claims))]
            self._down = True

    def kept(self) -> list[str]:
        """The keys of the claims kept, oldest first."""
        with self._lock:
            return list(self._claims)

    def due(self) -> list[str]:
        """The keys to read back now: every claim kept, or while the store's last
        read-back failed, only the oldest (its answer is every claim's)."""
        with self._lock:
            keys = list(self._claims)
            return keys[:1] if self._down else keys

    def settle(self, key: str) -> None:
        """Read the claim of `key` back; stored and the job's last event, released with
        no call made (a `Rejected`, `CLAIM_READ_BACK`). Raises, and keeps the claim for
        the next tick, while the store does not answer; a claim but the oldest is not
        read back once another's read-back found the store down."""
        with self._lock:
            unsent = self._claims.get(key)
            if unsent is None or (self._down and key != next(iter(self._claims))):
                return
        try:
            self._settle(key, unsent)
        except Exception as exc:
            with self._lock:
                # Only the store's not answering is every claim's answer: an error of
                # this claim's own holds back no other (the next tick reads back all).
                self._down = _store_down(exc)
            raise
        with self._lock:
            self._down = False

    def _settle(self, key: str, unsent: _Unsent) -> None:
        job = unsent.job
        if job.state is JobState.ATTEMPTED:  # not released yet (else its save failed)
            # Exactly this process's own claim stored past the version it was made on,
            # nothing after it: adopted, the job at the claim's version.
            if job.pending_events and not self._ledger.stored_after_unsure(job):
                self._forget(key, unsent)  # not stored, or moved on by another writer
                return
            now = self._clock()
            job.record_rejection(
                transient=True,
                reason=CLAIM_READ_BACK,
                status=None,
                decision=release_decision(unsent.policy, now, self._wait),
                at=now,
                unavailable=True,
            )
        try:
            # On the version read: another daemon's recovery written since conflicts. A
            # release whose own save failed unsure is met as this process's own write.
            self._save(job)
        except ConcurrentUpdate:
            log.info("job %s: its unsent claim was taken by another writer", key)
        else:
            log.warning("job %s: %s (read back late)", key, CLAIM_READ_BACK)
        self._forget(key, unsent)

    def _forget(self, key: str, unsent: _Unsent) -> None:
        with self._lock:
            if self._claims.get(key) is unsent:
                del self._claims[key]
