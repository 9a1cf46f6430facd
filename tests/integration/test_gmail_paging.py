"""A Gmail listing that names page after page (docs/how-it-works.md "Counting copies"): a
search or a draft lookup follows at most `MAX_PAGES` pages, as Graph's do. The real Google
client against an emulator whose list answers always name a new next page and hold
nothing: the repeat check (a token seen before) never fired, and the search listed for as
long as the answers came, each page paid from the mailbox's quota."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from daemon.providers.base import ProviderError, ScopeLost, calls_while
from daemon.providers.gmail import GmailProvider
from daemon.providers.gmail_mailbox import MAX_PAGES
from daemon.providers.history_handle import HistoryTooOld
from testkit.credentials import write_service_account
from testkit.gmail_emulator import GmailEmulator, _json_response

#: Where the emulator stops naming a next page: past any bound, so that a listing
#: without one ends too (the test fails, it does not hang).
LAST_PAGE = 300


class EndlessPages(GmailEmulator):
    """Every list answer: nothing on it, and a next page never named before."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pages_served = 0
        self._count = threading.Lock()

    def _endless(self) -> Any:
        with self._count:
            self.pages_served += 1
            served = self.pages_served
        more = {"nextPageToken": f"page-{served}"} if served < LAST_PAGE else {}
        return _json_response(200, {**more, "resultSizeEstimate": 0})

    def _list(self, user: str, token: Any, params: dict[str, list[str]]) -> Any:
        return self._endless()

    def _draft_list(self, user: str, params: dict[str, list[str]]) -> Any:
        return self._endless()

    def _history_list(self, user: str, token: Any, params: dict[str, list[str]]) -> Any:
        return self._endless()


@pytest.fixture
def endless(tmp_path: Path) -> Any:
    with EndlessPages(lag=0.0) as emulator:
        yield emulator


def provider(emulator: EndlessPages, tmp_path: Path, **options: Any) -> GmailProvider:
    credentials = write_service_account(tmp_path / "sa.json", token_uri=emulator.token_uri)
    return GmailProvider(
        "endless",
        credentials_file=credentials,
        user="sender@example.com",
        api_endpoint=emulator.url,
        timeout=5.0,
        quota_units_per_second=1_000_000.0,
        **options,
    )


MESSAGE_ID = "<job-0123456789abcdef0123456789abcdef@mail.example.com>"


@pytest.mark.parametrize(
    ("send_via", "lists"),
    [("messages", lambda gmail: gmail.search(MESSAGE_ID)),
     ("drafts", lambda gmail: gmail.find_drafts(MESSAGE_ID))],
    ids=["search", "draft-lookup"],
)  # fmt: skip
def test_a_search_or_a_draft_lookup_lists_at_most_max_pages(
    endless: EndlessPages, tmp_path: Path, send_via: str, lists: Callable[[GmailProvider], Any]
) -> None:
    gmail = provider(endless, tmp_path, send_via=send_via)
    try:
        with pytest.raises(ProviderError, match=f"more than {MAX_PAGES} pages"):
            lists(gmail)
    finally:
        gmail.close()
    assert endless.pages_served == MAX_PAGES


def test_a_report_read_lists_at_most_max_pages_and_the_next_goes_on(
    endless: EndlessPages, tmp_path: Path
) -> None:
    gmail = provider(endless, tmp_path)
    since = datetime.now(UTC) - timedelta(days=1)
    try:
        first = gmail.read_reports(since, known=(), max_bytes=1_000_000, limit=100)
        assert not first.complete and endless.pages_served == MAX_PAGES
        gmail.read_reports(since, known=(), max_bytes=1_000_000, limit=100)
    finally:
        gmail.close()
    assert endless.pages_served == 2 * MAX_PAGES


def test_a_history_read_lists_at_most_max_pages_and_the_search_decides(
    endless: EndlessPages, tmp_path: Path
) -> None:
    """history.list too: its pages followed new tokens without end, a worker held and 2
    quota units a page. Past `MAX_PAGES` it is a read too long to make (HistoryTooOld),
    as more than `MAX_MESSAGES` added is: the search decides, never a miss."""
    gmail = provider(endless, tmp_path)
    try:
        with pytest.raises(HistoryTooOld, match=f"more than {MAX_PAGES} pages"):
            gmail.sent_since("1000", MESSAGE_ID)
    finally:
        gmail.close()
    assert endless.pages_served == MAX_PAGES


@pytest.mark.parametrize(
    ("send_via", "lists"),
    [("messages", lambda gmail: gmail.search(MESSAGE_ID)),
     ("drafts", lambda gmail: gmail.find_drafts(MESSAGE_ID)),
     ("messages", lambda gmail: gmail.sent_since("1000", MESSAGE_ID))],
    ids=["search", "draft-lookup", "history-read"],
)  # fmt: skip
def test_a_listing_whose_scope_moved_asks_for_no_further_page(
    endless: EndlessPages, tmp_path: Path, send_via: str, lists: Callable[[GmailProvider], Any]
) -> None:
    """The scope went to another daemon after the first page (`calls_while`, set by the
    engine): the listing stops there with no answer (ScopeLost), where it listed its
    `MAX_PAGES` pages under the new owner's quota; the owner lists again."""
    gmail = provider(endless, tmp_path, send_via=send_via)
    try:
        with calls_while(lambda: False), pytest.raises(ScopeLost):
            lists(gmail)
    finally:
        gmail.close()
    assert endless.pages_served == 1
