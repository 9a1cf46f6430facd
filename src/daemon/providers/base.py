"""The provider port: the three things the daemon asks of a mail provider.

A provider never touches the store. It returns values; the daemon turns them into events.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol


class SendKind(StrEnum):
    CONFIRMED = "confirmed"  # 2xx with the provider's message id
    UNKNOWN = "unknown"  # the request may have been accepted; nobody can tell from here
    REJECTED = "rejected"  # the provider definitely did not accept it


@dataclass(frozen=True)
class SendOutcome:
    kind: SendKind
    reason: str
    provider_message_id: str | None = None
    transient: bool = False  # only for REJECTED: may be retried after a backoff
    retry_after: float | None = None  # seconds, from Retry-After when the provider gave one
    status: int | None = None  # HTTP status when there was one


@dataclass(frozen=True)
class SearchHit:
    provider_message_id: str
    message_id_header: str
    labels: tuple[str, ...] = field(default_factory=tuple)
    # What a human checking the copy wants to see (as the provider stored them; "" when
    # the provider did not say): README "Review".
    date: str = ""
    to: str = ""
    subject: str = ""


@dataclass(frozen=True)
class SearchResult:
    """The copies a search found, and the query exactly as the provider was sent it
    (that is what the ledger records for an audit)."""

    query: str
    hits: tuple[SearchHit, ...] = ()

    @property
    def copies(self) -> list[str]:
        """The provider's ids of the copies, in the order found."""
        return [hit.provider_message_id for hit in self.hits]


class ProviderError(Exception):
    """A search or read could not be completed (network, 5xx, quota).

    The caller must treat it as "no information", never as "no hits".
    """

    def __init__(self, reason: str, *, retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after


class Provider(Protocol):
    name: str
    #: Whether the id a confirmed send returns names a stored copy that `read_message_id`
    #: can read (Gmail's message id does; an SMTP 250 names only a queue entry).
    response_ids_readable: bool

    def send_raw(self, raw: bytes) -> SendOutcome:
        """Send one complete RFC 5322 message exactly once. Never raises for
        outcomes of the call itself: every failure is classified into the outcome."""
        ...

    def search(self, message_id: str) -> SearchResult:
        """Every SENT copy (spam and trash included) whose Message-ID header is
        exactly `message_id`, with the query sent. Raises ProviderError when the answer
        is not known."""
        ...

    def read_message_id(self, provider_message_id: str) -> str | None:
        """The Message-ID header of a stored copy (None if it has none).
        Raises ProviderError when the answer is not known."""
        ...

    def close(self) -> None: ...


def for_job(provider: Provider, from_addr: str, thread_id: str | None) -> Provider:
    """The provider as one job sees it. A provider that acts per mailbox or per thread
    (Gmail with `user = "{from}"`, or a job's `thread_id`) offers `for_job`; any other is
    the same for every job."""
    scope: Callable[[str, str | None], Provider] | None = getattr(provider, "for_job", None)
    return provider if scope is None else scope(from_addr, thread_id)


def send_gate(provider: Provider) -> AbstractContextManager[bool]:
    """Whether a send may start now: False when the provider's mailbox is out of quota and
    another worker already waits for it (the job then stays due and the worker serves
    other mailboxes). Providers without `send_gate` always say True."""
    gate: Callable[[], AbstractContextManager[bool]] | None = getattr(provider, "send_gate", None)
    return nullcontext(True) if gate is None else gate()
