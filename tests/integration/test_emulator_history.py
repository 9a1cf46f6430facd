"""The Gmail emulator's change history (`users.history.list`, testkit/history_log.py) through
the real google-api-python-client: records after a start, filtered by label and type, in
pages; a lag that hides a record and keeps the `historyId` answers (and getProfile's) before
it; an expired start answered 404; `rewrite_message_id` applying to it; its quota cost; the
relay breaking it as its own kind of request; the metadata scope allowed."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from daemon.providers.gmail import GmailProvider
from testkit.gmail_emulator import GmailEmulator
from testkit.relay import FaultPlan, FaultRelay, classify

GmailProviderFactory = Callable[..., GmailProvider]
RawFactory = Callable[..., bytes]
MAILBOX = "support@example.com"


def history_status(provider: GmailProvider, **params: Any) -> tuple[int, dict[str, Any]]:
    """One users.history.list through the provider's own client stack: status and body."""
    request = provider.service.users().history().list(userId=MAILBOX, **params)
    status, _, body = provider.answer("history.list", request, 0.0, provider.mailbox(MAILBOX))
    answer: dict[str, Any] = json.loads(body)
    return status, answer


def history_list(provider: GmailProvider, **params: Any) -> dict[str, Any]:
    status, answer = history_status(provider, **params)
    assert status == 200, answer
    return answer


def profile_history_id(provider: GmailProvider) -> int:
    request = provider.service.users().getProfile(userId=MAILBOX)
    return int(provider.read_json("profile", request, 0.0, provider.mailbox(MAILBOX))["historyId"])


def added(answer: dict[str, Any]) -> list[str]:
    return [
        entry["message"]["id"] for record in answer.get("history", []) for entry in
        record.get("messagesAdded", [])
    ]  # fmt: skip


def test_sent_messages_are_listed_after_the_start_by_label_and_type_in_pages(
    gmail_provider: GmailProviderFactory, emulator: GmailEmulator, make_raw: RawFactory
) -> None:
    provider = gmail_provider(url=emulator.url)
    start = profile_history_id(provider)
    sent = [
        provider.send_raw(make_raw(f"<m{n}@mail.example.com>")).provider_message_id
        for n in range(3)
    ]
    emulator.inject(make_raw("<draft@x>"), labels=["DRAFT"], user=MAILBOX)
    everything = history_list(provider, startHistoryId=str(start))
    assert len(everything["history"]) == 4
    only_sent = history_list(
        provider, startHistoryId=str(start), labelId="SENT", historyTypes=["messageAdded"]
    )
    assert added(only_sent) == sent
    assert int(only_sent["historyId"]) == profile_history_id(provider) > start
    first = history_list(provider, startHistoryId=str(start), labelId="SENT", maxResults=2)
    assert added(first) == sent[:2] and first["nextPageToken"]
    rest = history_list(
        provider, startHistoryId=str(start), labelId="SENT", pageToken=first["nextPageToken"]
    )
    assert added(rest) == sent[2:] and "nextPageToken" not in rest
    assert "history" not in history_list(provider, startHistoryId=only_sent["historyId"])
    assert emulator.route_counts["history"] == 5 and emulator.searches == []


def test_a_lagging_record_is_hidden_and_no_answer_passes_it(
    gmail_provider: GmailProviderFactory, emulator: GmailEmulator, make_raw: RawFactory
) -> None:
    clock = [1000.0]
    emulator._clock = lambda: clock[0]  # the emulator's own time, moved by the test
    provider = gmail_provider(url=emulator.url)
    start = profile_history_id(provider)
    provider.send_raw(make_raw("<early@mail.example.com>"))
    emulator.set_history_lag(5.0)
    provider.send_raw(make_raw("<late@mail.example.com>"))
    answer = history_list(provider, startHistoryId=str(start), labelId="SENT")
    assert len(added(answer)) == 1  # the late one is hidden, and so is what follows it
    horizon = int(answer["historyId"])
    assert horizon == profile_history_id(provider)
    clock[0] += 5.0
    later = history_list(provider, startHistoryId=str(horizon), labelId="SENT")
    assert len(added(later)) == 1  # a client that moved on to the horizon misses nothing


def test_an_expired_start_is_answered_404(
    gmail_provider: GmailProviderFactory, emulator: GmailEmulator, make_raw: RawFactory
) -> None:
    provider = gmail_provider(url=emulator.url)
    start = profile_history_id(provider)
    emulator.expire_history(MAILBOX)
    assert history_status(provider, startHistoryId=str(start))[0] == 404
    fresh = profile_history_id(provider)  # a fresh start works again
    provider.send_raw(make_raw("<after@mail.example.com>"))
    assert len(added(history_list(provider, startHistoryId=str(fresh)))) == 1


def test_a_bad_start_is_refused_400(
    gmail_provider: GmailProviderFactory, emulator: GmailEmulator
) -> None:
    provider = gmail_provider(url=emulator.url)
    assert history_status(provider, startHistoryId="x")[0] == 400


def test_rewrite_message_id_applies_to_the_history_and_reads_cost_quota(
    gmail_provider: GmailProviderFactory, emulator: GmailEmulator, make_raw: RawFactory
) -> None:
    emulator.rewrite_message_id = True
    emulator.user_quota = 250.0
    provider = gmail_provider(url=emulator.url)
    start = profile_history_id(provider)
    provider.send_raw(make_raw("<ours@mail.example.com>"))
    [message] = added(history_list(provider, startHistoryId=str(start), labelId="SENT"))
    got = provider.read_message_id(message)
    assert got is not None and got != "<ours@mail.example.com>"
    assert got.endswith("@mail.gmail.com>")
    # getProfile 1, send 100, history.list 2, get 5.
    assert emulator.usage()[MAILBOX].units == 1 + 100 + 2 + 5


def test_the_relay_breaks_history_reads_as_their_own_kind(
    gmail_provider: GmailProviderFactory, relay: FaultRelay, emulator: GmailEmulator
) -> None:
    assert classify("GET", "/gmail/v1/users/me/history?startHistoryId=1") == "history"
    assert classify("GET", "/gmail/v1/users/me/profile") == "other"
    relay.set_plan(FaultPlan(history="503"))
    provider = gmail_provider()
    start = profile_history_id(provider)  # other: passes
    assert history_status(provider, startHistoryId=str(start))[0] == 503
    assert [e["kind"] for e in relay.log] == ["other", "history"]
    assert emulator.route_counts["history"] == 0  # answered by the relay, never forwarded
