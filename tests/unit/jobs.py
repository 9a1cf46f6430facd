"""A SendJob to test, and the checks both SendJob test modules make on it.

A job built here keeps its whole history as pending events (nothing collects them), so a
test can read what a command appended (``job.pending_events[n:]``) and reload the job from
everything it ever recorded.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from eventsourcing.persistence import (
    DatetimeAsISO,
    DecimalAsStr,
    JSONTranscoder,
    Mapper,
    UUIDAsHex,
)

from daemon.doubles.fake_time import FakeClock
from ledger.content import JobContent
from ledger.job import SendJob
from ledger.vocabulary import PolicyRef

KEY = "order-42"
CHANNEL = "receipts"
POLICY = PolicyRef(CHANNEL, "sha256:0123456789abcdef")
PROVIDER = "support"
FROM = "Support <support@example.com>"
MESSAGE_ID = "<job-abc@mail.example.com>"
QUERY = f"rfc822msgid:{MESSAGE_ID}"
DEADLINE = timedelta(seconds=30)
SEARCH_AFTER = timedelta(minutes=5)

CONTENT = JobContent(
    channel=CHANNEL,
    key=KEY,
    to=("Bob <bob@example.com>",),
    subject="Your receipt",
    body="Thanks!",
    html="<p>Thanks!</p>",
    cc=("carol@example.com",),
    reply_to="help@example.com",
)


def requested_job(
    clock: FakeClock, content: JobContent = CONTENT, policy: PolicyRef = POLICY
) -> SendJob:
    """A new job, due now, with its Requested event pending."""
    return SendJob.request(
        content, from_addr=FROM, message_id=MESSAGE_ID, policy=policy, at=clock.now
    )


def fields_of(job: SendJob) -> dict[str, Any]:
    """Everything the events set on the aggregate (id, version and times included), with
    its lists copied: every other value it holds is immutable."""
    return {
        k: list(v) if isinstance(v, list) else v
        for k, v in vars(job).items()
        if k != "_pending_events"
    }


def unchanged(job: SendJob, before: dict[str, Any]) -> bool:
    """`fields_of(job) == before` (`before` taken with `fields_of`), without copying the
    job's fields: one comparison of dicts, its pending events standing in on both sides."""
    fields = vars(job)
    if "_pending_events" not in fields:
        return fields == before
    return fields == {**before, "_pending_events": fields["_pending_events"]}


def twins(job: SendJob) -> Callable[[], SendJob]:
    """A maker of copies of `job` that a command can change without touching it or each
    other: its lists copied (every other value it holds is immutable, as `fields_of`
    says), no pending events. Cheaper than replaying the events for each copy."""
    state = dict(vars(job))
    lists = [name for name, value in state.items() if isinstance(value, list)]

    def twin() -> SendJob:
        made = object.__new__(type(job))
        fields = vars(made)
        fields.update(state)
        for name in lists:
            fields[name] = list(state[name])
        fields["_pending_events"] = []
        return made

    return twin


def replay(events: Sequence[Any]) -> SendJob:
    """A fresh aggregate from the events, applied in order (none of them pending on it)."""
    job: Any = None
    for event in events:
        job = event.mutate(job)
    assert isinstance(job, SendJob)
    return job


def _mapper() -> Mapper[uuid.UUID]:
    transcoder = JSONTranscoder()
    for transcoding in (UUIDAsHex(), DatetimeAsISO(), DecimalAsStr()):
        transcoder.register(transcoding)
    return Mapper(transcoder=transcoder)


MAPPER = _mapper()


def reload(events: Sequence[Any]) -> SendJob:
    """A fresh aggregate from the events as a store would give them back: each one mapped
    to its stored form (topic and JSON state) and back, then applied in order."""
    job: Any = None
    for event in events:
        restored = MAPPER.to_domain_event(MAPPER.to_stored_event(event))
        assert restored == event, f"{type(event).__name__} does not survive the store"
        job = restored.mutate(job)  # type: ignore[attr-defined]
    assert isinstance(job, SendJob)
    return job


class Reloader:
    """`reload` of a history that only grows, each event mapped to its stored form and back
    once, when it is new (a step's reload then costs its new events, not the whole
    history): the events reloaded before must still equal their restored copies, so
    applying them again would give the job it holds."""

    def __init__(self) -> None:
        self.job: Any = None
        self.restored: list[Any] = []

    def reload(self, events: Sequence[Any]) -> SendJob:
        done = len(self.restored)
        assert len(events) >= done, "an event was taken out of the history"
        assert list(events[:done]) == self.restored, "an event changed after it was recorded"
        for event in events[done:]:
            restored = MAPPER.to_domain_event(MAPPER.to_stored_event(event))
            assert restored == event, f"{type(event).__name__} does not survive the store"
            self.job = restored.mutate(self.job)  # type: ignore[attr-defined]
            self.restored.append(restored)
        assert isinstance(self.job, SendJob)
        return self.job


def assert_reloads(job: SendJob) -> None:
    """The job's whole history reloads to exactly the live aggregate."""
    assert fields_of(reload(job.pending_events)) == fields_of(job), "replay differs from live"
