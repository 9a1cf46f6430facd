"""A Gmail search, history read or draft check is several calls: a listing's pages, then a
`messages.get` of each message listed (docs/architecture.md "Scope leases"). Each further
call asks whether the mailbox's quota scope is still the daemon's (`calls_while`, set by
the engine; `next_call`), as Graph's search does; once it is not, the operation stops
there with no answer (ScopeLost, never the hits of what was read so far: a miss), and its
calls do not go on beside the new owner's, over the mailbox's quota. The real Google
client -> FaultRelay -> GmailEmulator; calls counted at the emulator."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from tests.integration.conftest import asked_at_most

from daemon.providers.base import ScopeLost, SendKind, calls_while
from daemon.providers.draft_handle import DraftStatus
from daemon.providers.gmail import GmailProvider
from testkit.gmail_emulator import GmailEmulator
from testkit.relay import FaultPlan, FaultRelay

GmailProviderFactory = Callable[..., GmailProvider]
RawFactory = Callable[..., bytes]
MID = "<job-0123456789abcdef0123456789abcdef@mail.example.com>"


def calls(emulator: GmailEmulator) -> dict[str, int]:
    return {name: emulator.route_counts[name] for name in ("list", "get", "history")}


def test_a_search_whose_scope_moved_lists_no_further_page_and_reads_no_message(
    gmail_provider: GmailProviderFactory, emulator: GmailEmulator, make_raw: RawFactory
) -> None:
    """Three copies, one a page: the search made its first page's call, then every page
    and every copy's read without asking (up to `MAX_PAGES` pages)."""
    provider = gmail_provider(page_size=1)
    for _ in range(3):
        assert provider.send_raw(make_raw(MID)).kind is SendKind.CONFIRMED
    before = calls(emulator)
    with calls_while(asked_at_most(0)), pytest.raises(ScopeLost):
        provider.search(MID)
    made = {name: count - before[name] for name, count in calls(emulator).items()}
    assert made == {"list": 1, "get": 0, "history": 0}, made
    # Stopped after the first page and its copy's read: no further page.
    before = calls(emulator)
    with calls_while(asked_at_most(1)), pytest.raises(ScopeLost):
        provider.search(MID)
    made = {name: count - before[name] for name, count in calls(emulator).items()}
    assert made == {"list": 1, "get": 1, "history": 0}, made
    assert len(provider.search(MID).hits) == 3  # whole, for the new owner


def test_a_history_read_whose_scope_moved_reads_no_further_message(
    gmail_provider: GmailProviderFactory,
    relay: FaultRelay,
    emulator: GmailEmulator,
    make_raw: RawFactory,
) -> None:
    """The SENT messages added since the claim's mark, each read (`messages.get`) after
    the listing: stopped, the read is no answer (no HistoryMissed), and the owner's read
    finds the copy."""
    provider = gmail_provider()
    history = provider.history()
    assert history is not None
    mark = history.history_mark()
    assert mark is not None
    provider.send_raw(make_raw("<other@mail.example.com>"))
    relay.set_plan(FaultPlan(send="drop-response"))
    assert provider.send_raw(make_raw(MID)).kind is SendKind.UNKNOWN
    relay.set_plan(FaultPlan())
    before = calls(emulator)
    with calls_while(asked_at_most(1)), pytest.raises(ScopeLost):
        history.sent_since(mark, MID)
    made = {name: count - before[name] for name, count in calls(emulator).items()}
    assert made == {"list": 0, "get": 1, "history": 1}, made
    assert len(history.sent_since(mark, MID).hits) == 1  # the owner's


def test_a_draft_check_whose_scope_moved_reads_no_message(
    gmail_provider: GmailProviderFactory, emulator: GmailEmulator, make_raw: RawFactory
) -> None:
    """A draft gone (drafts.get 404) is then read as a message (sent, or gone): a second
    call, not made once the scope moved; the owner's check answers."""
    provider = gmail_provider(send_via="drafts")
    draft = provider.create_draft(make_raw(MID))
    assert provider.send_draft(draft).kind is SendKind.CONFIRMED
    before = calls(emulator)
    with calls_while(asked_at_most(0)), pytest.raises(ScopeLost):
        provider.check_draft(draft)
    made = {name: count - before[name] for name, count in calls(emulator).items()}
    assert made == {"list": 0, "get": 0, "history": 0}, made
    assert emulator.route_counts["drafts.get"] == 1
    assert provider.check_draft(draft).status is DraftStatus.SENT  # the owner's
