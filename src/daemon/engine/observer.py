"""A hook for whoever watches the engine (the metrics of `daemon/api/metrics.py`).

The engine calls an observer where it already counts: after each save of a step's events
(`work.Work.save`), after each tick, and around each provider call. It imports nothing
of the watcher; an observer must be fast and must not raise (a failure is logged and
ignored, so watching never changes what the engine does).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Sequence
from datetime import datetime
from typing import ParamSpec, Protocol, TypeVar

from daemon.engine.report import TickReport
from daemon.providers.base import (
    Provider,
    ProviderBase,
    ReportRead,
    SearchResult,
    SendOutcome,
)
from daemon.providers.draft_handle import BeforeDeleting, DraftFirst, DraftsProvider
from daemon.providers.history_handle import HistoryProvider
from daemon.providers.outcomes import Fenced
from ledger.job import SendJob

log = logging.getLogger("sendledger.engine")
T = TypeVar("T")
P = ParamSpec("P")


class EngineObserver(Protocol):
    def saved(self, job: SendJob, events: Sequence[object]) -> None:
        """`events` of `job` were just made durable."""

    def tick_done(self, seconds: float, report: TickReport) -> None:
        """A tick ended after `seconds`."""

    def provider_call(self, provider: str, operation: str, seconds: float) -> None:
        """One provider call (`send`, `search`, `read_message_id`) took `seconds`."""

    def bounce_report(self, outcome: str) -> None:
        """A delivery report was read: `recorded` on its job, or why not (a
        `ledger.delivery_reports.ReportRefusal`)."""


class NullObserver:
    def saved(self, job: SendJob, events: Sequence[object]) -> None:
        pass

    def tick_done(self, seconds: float, report: TickReport) -> None:
        pass

    def provider_call(self, provider: str, operation: str, seconds: float) -> None:
        pass

    def bounce_report(self, outcome: str) -> None:
        pass


def notify(call: Callable[P, None], *args: P.args, **kwargs: P.kwargs) -> None:
    """`call(*args)`, one observer method; a broken observer is logged, never the engine's
    problem. Called with the method and its arguments, not a closure, so the observer
    never calls back into the engine's own code."""
    try:
        call(*args, **kwargs)
    except Exception:
        log.exception("engine observer failed")


class ObservedProvider(ProviderBase):
    """A provider whose calls are timed for the observer; every capability is the inner
    provider's."""

    def __init__(self, inner: Provider, observer: EngineObserver) -> None:
        self.inner = inner
        self.name = inner.name
        self.response_ids_readable = inner.response_ids_readable
        self.timeout = inner.timeout
        self.readback_first = inner.readback_first
        self.readback_rate = inner.readback_rate
        self.leaves_drafts = inner.leaves_drafts
        self.reads_reports = inner.reads_reports
        self.keeps_date = inner.keeps_date
        self._observer = observer

    def timed(self, operation: str, call: Callable[[], T]) -> T:
        started = time.perf_counter()
        try:
            return call()
        finally:
            elapsed = time.perf_counter() - started
            notify(self._observer.provider_call, self.name, operation, elapsed)

    def send_raw(self, raw: bytes) -> SendOutcome:
        return self.timed("send", lambda: self.inner.send_raw(raw))

    def search(self, message_id: str) -> SearchResult:
        return self.timed("search", lambda: self.inner.search(message_id))

    def read_message_id(self, provider_message_id: str) -> str | None:
        return self.timed(
            "read_message_id", lambda: self.inner.read_message_id(provider_message_id)
        )

    def drafts(self) -> DraftsProvider | None:
        # Not timed: the draft calls are the inner provider's own.
        return self.inner.drafts()

    def draft_first(self) -> DraftFirst | None:
        # Its send and deletions timed as `send` and `delete_drafts` are: they are this
        # provider's sends and fences, taken apart (a Graph send went through `send_raw`).
        first = self.inner.draft_first()
        return None if first is None else _ObservedDraftFirst(first, self)

    def history(self) -> HistoryProvider | None:
        # Not timed either: the history calls are the inner provider's own.
        return self.inner.history()

    def delete_drafts(
        self, message_id: str, before_deleting: BeforeDeleting | None = None
    ) -> list[str]:
        return self.timed(
            "delete_drafts", lambda: self.inner.delete_drafts(message_id, before_deleting)
        )

    def ping(self) -> None:
        self.timed("ping", self.inner.ping)

    def read_reports(
        self,
        since: datetime,
        *,
        known: Collection[str],
        max_bytes: int,
        limit: int,
        may_go_on: Callable[[], bool] | None = None,
    ) -> ReportRead:
        return self.timed(
            "read_reports",
            lambda: self.inner.read_reports(
                since, known=known, max_bytes=max_bytes, limit=limit, may_go_on=may_go_on
            ),
        )

    def forget_report_reads(self) -> None:
        self.inner.forget_report_reads()

    def for_job(self, from_addr: str, thread_id: str | None) -> Provider:
        # The job's view of the provider (its mailbox), timed like the provider itself.
        scoped = self.inner.for_job(from_addr, thread_id)
        return self if scoped is self.inner else ObservedProvider(scoped, self._observer)

    def scope(self) -> str:
        return self.inner.scope()

    def scope_of(self, mailbox: str) -> str:
        return self.inner.scope_of(mailbox)

    def reserve_send(self) -> float:
        return self.inner.reserve_send()

    def quota_available(self) -> float | None:
        return self.inner.quota_available()

    def forget_idle(self) -> int:
        return self.inner.forget_idle()

    def close(self) -> None:
        self.inner.close()


__all__ = ["EngineObserver", "NullObserver", "ObservedProvider", "notify"]


class _ObservedDraftFirst:
    """A provider's two steps (`DraftFirst`), its send and its deletions timed by the
    provider that wraps it; the create before the claim is not, as a drafts-mode draft
    step is not."""

    def __init__(self, inner: DraftFirst, observed: ObservedProvider) -> None:
        self.inner = inner
        self.observed = observed

    def make_draft(self, raw: bytes) -> str | SendOutcome:
        return self.inner.make_draft(raw)

    def send_made(self, raw: bytes, draft_id: str, earlier: Collection[str]) -> SendOutcome:
        return self.observed.timed("send", lambda: self.inner.send_made(raw, draft_id, earlier))

    def delete_made(
        self,
        message_id: str,
        draft_ids: Collection[str],
        *,
        filtered: bool = True,
        before_deleting: BeforeDeleting | None = None,
    ) -> Fenced:
        return self.observed.timed(
            "delete_drafts",
            lambda: self.inner.delete_made(
                message_id, draft_ids, filtered=filtered, before_deleting=before_deleting
            ),
        )

    def search_made(
        self, message_id: str, draft_ids: Collection[str], fenced: Fenced | None = None
    ) -> SearchResult:
        return self.observed.timed(
            "search", lambda: self.inner.search_made(message_id, draft_ids, fenced)
        )
