"""The drafts handle: a provider-side key for one message (docs/providers.md "Gmail setup", the
drafts rows of "Outcome classification" in docs/architecture.md).

A draft is created before anything is sent and names exactly one message; sending it
consumes it, so the provider itself refuses to send the same draft twice, and asking for
the draft answers at once whether it was consumed, with no search index in between.
A provider never touches the store: these are values the engine turns into events.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol, runtime_checkable

from daemon.providers.outcomes import Fenced, ProviderError, SearchResult, SendOutcome

#: `Provider.delete_drafts`'s step between its listing and its first deletion: given the
#: ids listed, it may stop the deletion by raising.
BeforeDeleting = Callable[[list[str]], None]


@dataclass(frozen=True)
class Draft:
    """A draft as the provider named it when it was created."""

    draft_id: str
    #: The provider's id of the draft's message (Gmail: the `message.id` of drafts.create).
    provider_message_id: str


class DraftStatus(StrEnum):
    PENDING = "pending"  # the draft still exists: it was not sent
    SENT = "sent"  # the draft is gone and its message is in the sent mail
    GONE = "gone"  # the draft is gone and no sent message has its id (deleted by a person?)


@dataclass(frozen=True)
class DraftCheck:
    status: DraftStatus
    #: The sent copy's provider id and Message-ID header (SENT only).
    provider_message_id: str | None = None
    message_id_header: str | None = None


class DraftRefused(ProviderError):
    """The provider definitely refused to create the draft (a 4xx other than a rate
    limit): nothing exists, and asking again the same way will not help."""


@runtime_checkable
class DraftsProvider(Protocol):
    """What `send_via = "drafts"` asks of a provider, besides the provider port."""

    def create_draft(self, raw: bytes) -> Draft:
        """Store the complete RFC 5322 message as a draft. Sends nothing. Raises
        DraftRefused (permanent) or ProviderError (no answer: a draft may exist, which
        `find_drafts` finds)."""
        ...

    def send_draft(self, draft: Draft) -> SendOutcome:
        """Send the draft exactly once (one request, never repeated below). Never raises for
        the call's outcome. A draft that is already gone is UNKNOWN: `check_draft` says
        whether it was sent."""
        ...

    def check_draft(self, draft: Draft) -> DraftCheck:
        """Whether the draft was sent, from the draft and its message (no search).
        Raises ProviderError when the answer is not known."""
        ...

    def draft_raw(self, draft: Draft) -> bytes | None:
        """The unsent draft's message as it is now (a person may have edited it in the
        mailbox), or None when it is no unsent draft any more (sent or deleted:
        `check_draft` tells which). Raises ProviderError when the answer is not known."""
        ...

    def find_drafts(self, message_id: str) -> list[Draft]:
        """Every draft whose Message-ID header is exactly `message_id` (the drafts a
        crash left behind). Raises ProviderError when the answer is not known."""
        ...

    def delete_draft(self, draft_id: str) -> bool:
        """Delete an unsent draft; False when it was already gone."""
        ...


def drafts_of(provider: object) -> DraftsProvider | None:
    """The provider's drafts calls when it has them (Gmail), else None."""
    return provider if isinstance(provider, DraftsProvider) else None


class DraftFirst(Protocol):
    """A provider whose every send makes a draft and then sends it (Graph), in two steps
    the engine takes apart: the draft is made before the claim and its id recorded with
    it (`Attempted.made_draft`), so whichever daemon later fences or tidies the job
    deletes it by that id; a listing by Message-ID may not show a draft for a while
    (docs/architecture.md "Microsoft Graph")."""

    def make_draft(self, raw: bytes) -> str | SendOutcome:
        """Store the complete message as a draft; sends nothing. The draft's id, or the
        create's refusal as the send's outcome (Rejected: nothing was made that could be
        sent), which the claim records as its call's. Never raises for the outcome."""
        ...

    def send_made(self, raw: bytes, draft_id: str, earlier: Collection[str]) -> SendOutcome:
        """Send the draft `make_draft` made of `raw`, once, after deleting the unsent
        drafts of earlier attempts (`earlier`: those the job recorded; and those this
        process made). Never raises for the call's outcome."""
        ...

    def delete_made(
        self,
        message_id: str,
        draft_ids: Collection[str],
        *,
        filtered: bool = True,
        before_deleting: BeforeDeleting | None = None,
    ) -> Fenced:
        """`Provider.delete_drafts`, the drafts `draft_ids` (read by id) included; not
        `filtered`: those alone. The ids deleted, and what was read of them. Raises
        ProviderError when the answer is not known. `before_deleting` as
        `Provider.delete_drafts` takes it."""
        ...

    def search_made(
        self, message_id: str, draft_ids: Collection[str], fenced: Fenced | None = None
    ) -> SearchResult:
        """`Provider.search`, the drafts `draft_ids` (those the job's claims made, read
        by id) counted as copies once they are no drafts any more: a listing by
        Message-ID may not show such a copy for a while. Reads only; a draft `fenced`
        (the fence made just before, in the same sweep) read already is not read again."""
        ...
