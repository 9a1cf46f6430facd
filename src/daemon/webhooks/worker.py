"""One webhook's deliveries, from its position in the event log (docs/http-api.md "Webhooks",
docs/architecture.md "Webhooks").

A pass takes the webhook's lease, reads the events after its position up to the log's
horizon (`ledger.stores.positions`), and POSTs them one at a time in log order. Each 2xx
moves the position past its event in the store before the next is sent; the first
failure (any other status, a timeout, no connection) records the error and a retry time
and ends the pass. So:

- at least once: the position passes an event only after its 2xx; a daemon killed
  between the 2xx and the write sends that one event again;
- in order: nothing after a failed event is sent before it (per job, and for the whole
  webhook: a receiver that refuses one event holds back the rest until it takes it);
- the same `webhook-id` on every attempt: it is the event's own id (`events.event_id_for`);
- one daemon at a time per webhook: the lease, and a compare-and-set on the position.

Time comes from `clock` (epoch seconds) and randomness from `rng`, so tests drive both.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar

from daemon.webhooks.delivery import Outcome, Poster, post
from daemon.webhooks.events import event_id_for, payload, topics_for, type_of
from daemon.webhooks.signing import signed_headers
from ledger.application import Ledger
from ledger.characters import recorded
from ledger.display import printable, quoted

log = logging.getLogger("sendledger.webhooks")

#: Events read from the log per query.
PAGE = 100

T = TypeVar("T")


@dataclass(frozen=True)
class Hook:
    """One `[webhooks.NAME]`, resolved (its secret read)."""

    name: str
    url: str
    secret: str
    types: frozenset[str]
    timeout: float = 10.0
    retry_backoff: float = 1.0
    retry_backoff_max: float = 300.0

    @property
    def topics(self) -> list[str]:
        return topics_for(self.types)

    @property
    def lease(self) -> float:
        # Long enough for a slow attempt and its write; a daemon killed -9 hands the
        # webhook to another after this (its own restart takes it back at once).
        return max(60.0, 3 * self.timeout)

    def backoff(self, failures: int, rng: random.Random) -> float:
        """Seconds before the next attempt after `failures` failed ones: doubling from
        `retry_backoff` up to `retry_backoff_max`, less up to a quarter at random so
        that daemons and webhooks do not retry in step."""
        doublings = min(max(failures - 1, 0), 60)
        base = min(self.retry_backoff * float(2**doublings), self.retry_backoff_max)
        return float(base * (1.0 - 0.25 * rng.random()))


class DeliveryObserver(Protocol):
    def webhook_delivered(self, name: str) -> None: ...

    def webhook_failed(self, name: str) -> None: ...


class Deliverer:
    """The deliveries of one webhook by one daemon (`owner`)."""

    def __init__(
        self,
        ledger: Ledger,
        hook: Hook,
        *,
        owner: str,
        poster: Poster = post,
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
        observer: DeliveryObserver | None = None,
        page: int = PAGE,
        stopping: threading.Event | None = None,
    ) -> None:
        self.ledger = ledger
        self.hook = hook
        self.owner = owner
        self.positions = ledger.positions()
        self.poster = poster
        self.clock = clock
        self.rng = rng or random.Random()
        self.observer = observer
        self.page = page
        # Set when the daemon stops: a pass then starts no POST, so that what a stop waits
        # for is the attempt in flight and its write, not the rest of a page.
        self.stopping = stopping or threading.Event()
        # A stopping daemon releases the lease from its own thread while an attempt may
        # still be in flight here (`release`): the lock keeps the two from writing the
        # row at once, and a pass begun before a release writes nothing after it (a
        # write after the POST would renew the lease given up). A later pass claims anew.
        self._writing = threading.Lock()
        self._releases = 0
        # This daemon's name went to another process (`disown`): the row's lease under
        # the name is that process's, neither written nor given up from here any more.
        self._disowned = False
        self.positions.ensure()

    def pass_once(self) -> bool:
        """One pass; True when more events may be waiting right now, False when the
        webhook is caught up, waiting to retry, or another daemon's."""
        hook, positions = self.hook, self.positions
        released = self._releases  # a release from now on ends this pass's writes
        now = self.clock()
        row = self._write(released, positions.claim, hook.name, self.owner, now, hook.lease)
        if row is None or (row.next_at is not None and row.next_at > now):
            return False
        horizon = positions.horizon(row.position)
        notes = self.ledger.log_after(row.position, horizon, self.page, hook.topics)
        current, failures = row.position, row.failures
        for note in notes:
            if self.stopping.is_set():
                return False  # the position stays before this event: sent by the next pass
            sent: Any = None  # the event as the POST carried it
            try:
                event: Any = self.ledger.mapper.to_domain_event(note)
                kind = type_of(event, hook.types)
                if kind is None:
                    continue  # e.g. a Resolved that is not an abandon
                outcome, sent = self._send(kind, note, event)
            except Exception as exc:
                # An event that cannot be read or sent (a store key since removed, say)
                # is a failed attempt like any other: retried, and shown by
                # `webhooks status`, where an operator can skip it.
                error = printable(f"cannot deliver: {type(exc).__name__}: {exc}")[:300]
                outcome = Outcome(False, None, error)
            now = self.clock()
            if not outcome.ok:
                failures += 1
                retry_at = now + hook.backoff(failures, self.rng)
                failed = self._write(
                    released,
                    positions.fail,
                    hook.name,
                    self.owner,
                    current,
                    outcome.error,
                    retry_at,
                    now,
                    hook.lease,
                )
                if failed and sent is not None and outcome.status is not None:
                    self._forget_answer_if_purged(note, sent, outcome)
                self._failed(outcome, note.id, failures, retry_at)
                return False
            if not self._write(
                released,
                positions.advance,
                *(hook.name, self.owner, current, note.id, 1, now, hook.lease),
            ):
                return False  # the lease went to another daemon: it carries on from here
            current, failures = note.id, 0
            if self.observer is not None:
                self.observer.webhook_delivered(hook.name)
        end = notes[-1].id if len(notes) >= self.page else horizon
        if end > current and not self._write(
            released,
            positions.advance,
            *(hook.name, self.owner, current, end, 0, self.clock(), hook.lease),
        ):
            return False
        # More at once when this pass got somewhere and the log goes on (a full page,
        # or a horizon that stopped at the end of one scan); none while stuck at a gap.
        log_end = int(self.ledger.recorder.max_notification_id() or 0)
        return end > row.position and end < log_end

    def release(self, wait: float = -1) -> None:
        """Give the lease up; a pass in flight on another thread writes nothing more, so
        its attempt ends without taking the lease back (its event is sent again by
        whoever takes the lease: at least once). `wait`: seconds to wait for a write of
        that thread to end (TimeoutError then; -1: as long as it takes)."""
        if not self._writing.acquire(timeout=wait):
            raise TimeoutError("a write of its position did not end in time")
        try:
            self._releases += 1
            if not self._disowned:
                self.positions.release(self.hook.name, self.owner)
        finally:
            self._writing.release()

    def disown(self) -> None:
        """This daemon's name was taken by another process (`Ledger.hold_identity`): the
        lease under the name is that process's now. From now on no write of the row, nor
        a release when this daemon stops, which would end that process's lease while its
        pass runs (another daemon would take the webhook and send beside it). Not
        waiting for a write in flight: the tick that found the name lost calls this."""
        self._disowned = True

    def _write(self, released: int, action: Callable[..., T], *args: Any) -> T | None:
        """`action(*args)` (a write of the row), unless the lease was released since the
        pass began (`released`: the count then): None then."""
        with self._writing:
            if self._releases != released or self._disowned:
                return None
            return action(*args)

    def _forget_answer_if_purged(self, note: Any, sent: Any, outcome: Outcome) -> None:
        """A purge that committed while the POST was out scrubbed the webhooks' errors
        before this one was written, and the receiver's answer may echo the unpurged
        payload: the status alone is kept. Read after the error is written, so a purge
        that commits after this read scrubs it itself (`Ledger.purge`)."""
        try:
            # The payload's only text from the job's content is its event's (`payload`):
            # a purge that rewrote it changed what was sent.
            _job, now = self.ledger.job_and_event_at(note.originator_id, note.originator_version)
        except Exception:  # the failure is recorded; unread, its answer stays as before
            return
        if now != sent:
            kept = f"HTTP {outcome.status} (answer not kept: the job was purged meanwhile)"
            self.positions.scrub_error(self.hook.name, outcome.error, kept)

    def _send(self, kind: str, note: Any, event: Any) -> tuple[Outcome, Any]:
        # The event and the job read again now, not the page's copy of the event: a
        # purge that committed since the page was read (this pass POSTs for up to a
        # timeout per event) has rewritten it, and what it erased is not sent.
        job, event = self.ledger.job_and_event_at(note.originator_id, note.originator_version)
        event_id = event_id_for(note.originator_id, note.originator_version)
        body = json.dumps(
            payload(kind, job, event, event_id), ensure_ascii=False, separators=(",", ":")
        )
        at = datetime.fromtimestamp(self.clock(), UTC)
        headers = signed_headers(self.hook.secret, event_id, at, body)
        outcome = self.poster(self.hook.url, body.encode("utf-8"), headers, self.hook.timeout)
        # Stored as the position's `last_error`, served by `webhooks status` and the API:
        # `post` keeps 200 bytes of an answer, another poster (a test's) might keep it all.
        return replace(outcome, error=recorded(outcome.error)), event

    def _failed(self, outcome: Outcome, notification_id: int, failures: int, at: float) -> None:
        if self.observer is not None:
            self.observer.webhook_failed(self.hook.name)
        when = datetime.fromtimestamp(at, UTC).isoformat(timespec="milliseconds")
        log.warning(
            "webhook %s: event %d not delivered (attempt %d): %s; next attempt at %s",
            self.hook.name,
            notification_id,
            failures,
            quoted(outcome.error),
            when,
        )


__all__ = ["Deliverer", "DeliveryObserver", "Hook"]
