"""A daemon with metrics (its API) times the provider's calls through ObservedProvider
(daemon/engine/observer.py): a Graph send, taken apart into its draft before the claim
and the send of that draft (`Provider.draft_first`, docs/architecture.md "Microsoft
Graph"), is still timed as `send`, and its fences as `delete_drafts`, in
`sendledger_provider_call_duration_seconds`."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from daemon.engine.observer import NullObserver, ObservedProvider
from daemon.providers.base import (
    ProviderBase,
    SearchResult,
    SendKind,
    SendOutcome,
    fence_job,
)
from daemon.providers.draft_handle import BeforeDeleting, DraftFirst
from daemon.providers.outcomes import Fenced
from ledger.job import SendJob


class _TwoSteps(ProviderBase):
    """A provider whose sends make a draft first, answering at once."""

    name = "two-steps"
    leaves_drafts = True

    def send_raw(self, raw: bytes) -> SendOutcome:
        raise AssertionError("the engine sends the draft it made")

    def search(self, message_id: str) -> SearchResult:
        return SearchResult(query="", hits=())

    def read_message_id(self, provider_message_id: str) -> str | None:
        return None

    def close(self) -> None:
        pass

    def draft_first(self) -> DraftFirst:
        return self

    def make_draft(self, raw: bytes) -> str | SendOutcome:
        return "d1"

    def send_made(self, raw: bytes, draft_id: str, earlier: Collection[str]) -> SendOutcome:
        return SendOutcome(SendKind.CONFIRMED, "202", provider_message_id=draft_id)

    def delete_made(
        self,
        message_id: str,
        draft_ids: Collection[str],
        *,
        filtered: bool = True,
        before_deleting: BeforeDeleting | None = None,
    ) -> Fenced:
        return Fenced(list(draft_ids))

    def search_made(
        self, message_id: str, draft_ids: Collection[str], fenced: Fenced | None = None
    ) -> SearchResult:
        return self.search(message_id)


class _Calls(NullObserver):
    def __init__(self) -> None:
        self.calls: list[str] = []

    def saved(self, job: SendJob, events: Sequence[object]) -> None:
        pass

    def provider_call(self, provider: str, operation: str, seconds: float) -> None:
        self.calls.append(operation)


def test_a_send_of_a_draft_made_before_its_claim_is_timed_as_a_send() -> None:
    watched = _Calls()
    observed = ObservedProvider(_TwoSteps(), watched)
    first = observed.draft_first()
    assert first is not None
    assert first.make_draft(b"raw") == "d1"
    assert first.send_made(b"raw", "d1", []).kind is SendKind.CONFIRMED
    assert fence_job(observed, "<m@x>", ["d1"]).deleted == ["d1"]
    assert watched.calls == ["send", "delete_drafts"]
