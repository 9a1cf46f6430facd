"""The Gmail provider's history handle (daemon/providers/gmail_history.py; docs/providers.md
"What each handle proves") on the real client stack -> FaultRelay -> GmailEmulator: the
mark fetched once and shared, paid by the send's reservation, moved on by answers the
provider has anyway; a dropped send found among the SENT messages added since, its header
compared exactly; each header read once; an expired start, or too much to read, is
HistoryTooOld; a read that fails is a ProviderError (unavailable on a 503), never "none".
Counted at the emulator, not in the provider."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from daemon.providers import gmail_history
from daemon.providers.base import ProviderError, SendKind
from daemon.providers.gmail import GmailProvider
from daemon.providers.history_handle import HistoryProvider, HistoryTooOld
from testkit.gmail_emulator import GmailEmulator
from testkit.relay import FaultPlan, FaultRelay

GmailProviderFactory = Callable[..., GmailProvider]
RawFactory = Callable[..., bytes]
MID = "<job-0123456789abcdef0123456789abcdef@mail.example.com>"
MAILBOX = "support@example.com"


class Clock:
    """The provider's monotonic clock, moved by the test."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def history_of(provider: GmailProvider) -> HistoryProvider:
    history = provider.history()
    assert history is not None
    return history


def marked(provider: GmailProvider) -> tuple[HistoryProvider, str]:
    """The provider's history handle and the mark a claim would record now."""
    history = history_of(provider)
    mark = history.history_mark()
    assert mark is not None
    return history, mark


def test_the_mark_is_fetched_once_shared_and_fetched_again_when_old(
    gmail_provider: GmailProviderFactory, emulator: GmailEmulator, make_raw: RawFactory
) -> None:
    clock = Clock()
    provider = gmail_provider(clock=clock)
    history = history_of(provider)
    first = history.history_mark()
    assert first is not None and history.history_mark() == first
    assert emulator.route_counts["profile"] == 1
    provider.send_raw(make_raw("<other@mail.example.com>"))
    assert history.history_mark() == first  # still recent: shared, no call
    clock.now += gmail_history.MARK_MAX_AGE + 1
    again = history.history_mark()
    assert again is not None and int(again) > int(first)
    assert emulator.route_counts["profile"] == 2


def test_the_callers_before_call_runs_before_a_fetch_and_only_then(
    gmail_provider: GmailProviderFactory, emulator: GmailEmulator
) -> None:
    """The engine saves what waits for its next commit there (the claims of outcomes no
    longer renewed): before a getProfile that may take the timeout, never for a shared
    mark."""
    clock = Clock()
    provider = gmail_provider(clock=clock)
    history = history_of(provider)
    profiles: list[int] = []

    def before() -> None:
        profiles.append(emulator.route_counts["profile"])

    first = history.history_mark(before_call=before)
    assert first is not None and profiles == [0]  # before the fetch
    assert history.history_mark(before_call=before) == first and profiles == [0]
    clock.now += gmail_history.MARK_MAX_AGE + 1
    assert history.history_mark(before_call=before) is not None
    assert profiles == [0, 1] and emulator.route_counts["profile"] == 2


def test_a_dropped_send_is_found_since_the_mark_and_only_an_exact_header_counts(
    gmail_provider: GmailProviderFactory,
    relay: FaultRelay,
    emulator: GmailEmulator,
    make_raw: RawFactory,
) -> None:
    provider = gmail_provider()
    before = provider.send_raw(make_raw(MID))  # before the mark: not this attempt's
    history, mark = marked(provider)
    relay.set_plan(FaultPlan(send="drop-response"))
    assert provider.send_raw(make_raw(MID)).kind is SendKind.UNKNOWN
    # rfc822msgid: would match these loosely; the header read back must be exactly ours.
    emulator.inject(make_raw(MID.upper()), user=MAILBOX)
    emulator.inject(make_raw(MID.strip("<>").replace("job-", "job--")), user=MAILBOX)
    found = history.sent_since(mark, MID)
    [hit] = found.hits
    assert hit.message_id_header == MID and hit.provider_message_id != before.provider_message_id
    assert found.query == (
        f"history.list startHistoryId={mark} labelId=SENT historyTypes=messageAdded"
    )
    assert emulator.searches == []  # no Message-ID search was made
    # Each added message's header is read once: a second read asks only the log.
    gets = emulator.route_counts["get"]
    assert gets == 3
    assert len(history.sent_since(mark, MID).hits) == 1
    assert emulator.route_counts["get"] == gets
    # The read's own historyId is where the mailbox is now: the next claims' mark.
    assert history.history_mark() == str(_profile(provider))


def _profile(provider: GmailProvider) -> int:
    request = provider.service.users().getProfile(userId=MAILBOX)
    return int(provider.read_json("profile", request, 0.0, provider.mailbox(MAILBOX))["historyId"])


def test_a_read_back_moves_the_mark_on(
    gmail_provider: GmailProviderFactory, emulator: GmailEmulator, make_raw: RawFactory
) -> None:
    provider = gmail_provider()
    history = history_of(provider)
    first = history.history_mark()
    sent = provider.send_raw(make_raw(MID))
    assert sent.provider_message_id is not None
    assert provider.read_message_id(sent.provider_message_id) == MID
    assert first is not None and int(history.history_mark() or 0) > int(first)
    assert emulator.route_counts["profile"] == 1


def test_an_expired_start_or_too_much_to_read_is_too_old(
    gmail_provider: GmailProviderFactory,
    emulator: GmailEmulator,
    make_raw: RawFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    provider = gmail_provider()
    history, mark = marked(provider)
    for n in range(3):
        provider.send_raw(make_raw(f"<m{n}@mail.example.com>"))
    monkeypatch.setattr(gmail_history, "MAX_MESSAGES", 2)
    with pytest.raises(HistoryTooOld, match="more than 2 messages sent since"):
        history.sent_since(mark, MID)
    assert emulator.route_counts["get"] == 0  # given up before reading a header
    monkeypatch.undo()
    emulator.expire_history(MAILBOX)
    with pytest.raises(HistoryTooOld, match="expired") as expired:
        history.sent_since(mark, MID)
    assert expired.value.history_id == mark


@pytest.mark.parametrize(("mode", "unavailable"), [("500-after-forward", False), ("503", True)])
def test_a_failed_read_is_no_information(
    gmail_provider: GmailProviderFactory,
    relay: FaultRelay,
    mode: str,
    unavailable: bool,
) -> None:
    provider = gmail_provider()
    history, mark = marked(provider)
    relay.set_plan(FaultPlan(history=mode))  # type: ignore[arg-type]
    with pytest.raises(ProviderError) as failed:
        history.sent_since(mark, MID)
    assert failed.value.unavailable is unavailable


def test_a_mark_that_cannot_be_had_is_none_and_not_asked_again_at_once(
    gmail_provider: GmailProviderFactory, relay: FaultRelay, emulator: GmailEmulator
) -> None:
    relay.set_plan(FaultPlan(other="503"))
    provider = gmail_provider()
    history = history_of(provider)
    assert history.history_mark() is None
    assert history.history_mark() is None  # within the backoff: no second call
    assert [entry["kind"] for entry in relay.log] == ["other"]


def test_the_send_reservation_takes_the_marks_unit_once(
    gmail_provider: GmailProviderFactory, emulator: GmailEmulator
) -> None:
    clock = Clock()
    provider = gmail_provider(clock=clock, quota_units_per_second=250.0)
    full = provider.quota_available()
    assert provider.reserve_send() == 0.0
    assert provider.quota_available() == pytest.approx(full - 101)  # the send and a mark
    history = provider.history()
    assert history is not None and history.history_mark() is not None
    assert provider.quota_available() == pytest.approx(full - 101)  # paid already
    assert provider.reserve_send() == 0.0
    assert provider.quota_available() == pytest.approx(full - 201)  # a send alone: it is fresh


def test_drafts_mode_reads_no_history(gmail_provider: GmailProviderFactory) -> None:
    assert gmail_provider(send_via="drafts").history() is None
    assert gmail_provider().history() is not None
