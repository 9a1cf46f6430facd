"""Whether a provider keeps our Message-ID: the reconciliation handle's health.

If a provider ever replaces the Message-ID we set, every later search misses and every
resend duplicates. One mismatch observed on a read-back is enough to stop trusting the
handle for that provider, in every daemon sharing the store, until an operator says so.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from eventsourcing.domain import Aggregate

HANDLE_NAMESPACE = uuid.UUID("0d7c2d8e-2f4b-5b8e-8a43-3f6f1c7c9a10")


def handle_id_for(provider: str) -> uuid.UUID:
    return uuid.uuid5(HANDLE_NAMESPACE, provider)


class ProviderHandle(Aggregate):
    TOPIC = "sendledger:ProviderHandle"

    provider: str
    reliable: bool
    detail: str

    def __init__(self) -> None:
        pass

    class Event(Aggregate.Event):
        TOPIC = "sendledger:ProviderHandle.Event"

    class Created(Event, Aggregate.Created):
        TOPIC = "sendledger:ProviderHandle.Created"

    class Registered(Aggregate.Created):
        TOPIC = "sendledger:ProviderHandle.Registered"
        provider: str

        def apply(self, handle: Any) -> None:
            handle.provider = self.provider
            handle.reliable = True
            handle.detail = ""

    class MarkedUnreliable(Event):
        TOPIC = "sendledger:ProviderHandle.MarkedUnreliable"
        expected: str
        observed: str
        provider_message_id: str
        job_key: str

        def apply(self, handle: Any) -> None:
            handle.reliable = False
            handle.detail = (
                f"sent {self.expected}, provider stored {self.observed or 'no Message-ID'} "
                f"(job {self.job_key}, message {self.provider_message_id})"
            )

    class MarkedReliable(Event):
        TOPIC = "sendledger:ProviderHandle.MarkedReliable"
        by: str
        note: str

        def apply(self, handle: Any) -> None:
            handle.reliable = True
            handle.detail = f"trusted again by {self.by}: {self.note}"

    @classmethod
    def register(cls, provider: str, *, at: datetime) -> ProviderHandle:
        return cls._create(
            cls.Registered, id=handle_id_for(provider), timestamp=at, provider=provider
        )

    def mark_unreliable(
        self, *, expected: str, observed: str, provider_message_id: str, job_key: str, at: datetime
    ) -> None:
        self.trigger_event(
            self.MarkedUnreliable,
            timestamp=at,
            expected=expected,
            observed=observed,
            provider_message_id=provider_message_id,
            job_key=job_key,
        )

    def mark_reliable(self, *, by: str, note: str, at: datetime) -> None:
        self.trigger_event(self.MarkedReliable, timestamp=at, by=by, note=note)
