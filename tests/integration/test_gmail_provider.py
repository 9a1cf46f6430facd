"""GmailProvider on the real client stack -> FaultRelay -> GmailEmulator.

Effects are counted where they happen: in the emulator's acceptance log (the JSON-lines
file, and `emulator.copies`). Requests that reached the relay are counted in `relay.log`,
so a re-send by any layer of the client stack shows up even when the relay answers itself
without forwarding. These are emulator results, not a Gmail guarantee.

What every provider must do is the provider contract (tests/provider_contract.py), which
`TestGmailContract` runs here; the rest of this file is what is Gmail's own.
"""

from __future__ import annotations

import base64
import concurrent.futures
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httplib2
import pytest
from tests.integration.conftest import GmailSubject, logged_copies, sends_at_relay
from tests.provider_contract import (
    THROTTLED,
    Expect,
    ReadBackContract,
    SearchFaultContract,
    SendContract,
)

from daemon.providers.base import ProviderError, SendKind
from daemon.providers.gmail import SCOPES, GmailProvider
from daemon.providers.outcomes import SEARCH_STOPS_AT
from ledger.copies import COPIES_KEPT
from testkit.credentials import write_service_account
from testkit.gmail_emulator import GmailEmulator
from testkit.relay import FaultPlan, FaultRelay
from testkit.tls import make_loopback_tls

GmailProviderFactory = Callable[..., GmailProvider]
RawFactory = Callable[..., bytes]

# The service account's delegation subject, as in conftest.py's `gmail_provider`.
MAILBOX = "support@example.com"
MID = "<job-0123456789abcdef0123456789abcdef@mail.example.com>"
# What Gmail is asked for MID: the rfc822msgid: operator, the id without angle brackets.
QUERY = "rfc822msgid:job-0123456789abcdef0123456789abcdef@mail.example.com"


def queries_at_relay(relay: FaultRelay) -> list[str]:
    """The `q` of every messages.list request that reached the relay, in order."""
    return [
        parse_qs(urlsplit(entry["path"]).query)["q"][-1]
        for entry in relay.log
        if entry["kind"] == "search" and urlsplit(entry["path"]).path.endswith("/messages")
    ]


# -- the provider contract -------------------------------------------------------------------


class TestGmailContract(SendContract, ReadBackContract, SearchFaultContract):
    # Per docs/how-it-works.md "Outcome classification of a Gmail send": a 5xx is Unknown
    # even when nothing was forwarded (503 here); the client cannot know.
    EXTRA_FAULTS = {
        "hang-before-forward": Expect(SendKind.UNKNOWN, 0, timed_out=True),
        "500-after-forward": Expect(SendKind.UNKNOWN, 1, status=500),
        "503": Expect(SendKind.UNKNOWN, 0, status=503),
        "429": THROTTLED,
        "403-rate-limit": Expect(**{**vars(THROTTLED), "status": 403}),
    }
    SEARCH_FAULTS = {
        "503": (True, 1.0),
        "500-after-forward": (False, None),
        "drop-response": (False, None),
        "hang": (True, None),  # a hang: unavailable, and timed out
        "429": (True, 1.0),
        "403-rate-limit": (True, 1.0),
    }
    QUERY = "rfc822msgid:{bare}"
    subject: GmailSubject

    @pytest.fixture(name="subject")
    def gmail_contract_subject(self, gmail_subject: Callable[..., GmailSubject]) -> GmailSubject:
        return gmail_subject()


# -- what is Gmail's own -----------------------------------------------------------------------


def test_a_reset_instead_of_a_close_is_still_unknown_with_exactly_one_copy(
    gmail_provider: GmailProviderFactory,
    emulator: GmailEmulator,
    acceptance_log: Path,
    make_raw: RawFactory,
) -> None:
    with FaultRelay(
        emulator.url, plan=FaultPlan(send="drop-response"), hang_seconds=1.5, reset=True
    ) as relay:
        outcome = gmail_provider(relay.url).send_raw(make_raw(MID))
        assert outcome.kind is SendKind.UNKNOWN, outcome
        assert "sent" in outcome.reason
        assert logged_copies(acceptance_log, MID) == 1  # not success, not a second copy
        assert emulator.copies(MID) == 1
        assert sends_at_relay(relay) == 1


def test_stock_httplib2_would_send_twice(
    emulator: GmailEmulator, monkeypatch: pytest.MonkeyPatch, make_raw: RawFactory
) -> None:
    """The canary for the contract's drop-response case: the hazard is real, and
    RETRIES = 1 is not enough.

    httplib2's `_conn_request` retries once "regardless of the number of RETRIES set" when
    the first read raises BadStatusLine, and RemoteDisconnected is a BadStatusLine.
    """
    emulator.require_auth = False
    monkeypatch.setattr(httplib2, "RETRIES", 1)
    body = json.dumps({"raw": base64.urlsafe_b64encode(make_raw(MID)).decode()})
    with FaultRelay(emulator.url, plan=FaultPlan(send="drop-response")) as relay:
        with pytest.raises(Exception):  # noqa: B017 - whatever the second failure is
            httplib2.Http(timeout=2).request(
                relay.url + "/gmail/v1/users/me/messages/send",
                "POST",
                body=body,
                headers={"content-type": "application/json"},
            )
        assert emulator.copies(MID) == 2
        assert sends_at_relay(relay) == 2


def test_connect_timeout_is_a_transient_rejection(
    gmail_provider: GmailProviderFactory,
    emulator: GmailEmulator,
    unanswered_url: str,
    make_raw: RawFactory,
) -> None:
    # A connect timeout and a read timeout are both socket timeouts; SingleShotHttp
    # connects as a separate step, so only this one may say "not sent".
    outcome = gmail_provider(unanswered_url).send_raw(make_raw(MID))
    assert outcome.kind is SendKind.REJECTED
    assert outcome.transient
    assert "timed out" in outcome.reason
    assert emulator.accepted() == []


def test_tls_handshake_failure_is_a_transient_rejection(
    gmail_provider: GmailProviderFactory, emulator: GmailEmulator, make_raw: RawFactory
) -> None:
    # https to a plain-http port: the handshake fails before any request byte is sent.
    https_url = emulator.url.replace("http://", "https://")
    outcome = gmail_provider(https_url).send_raw(make_raw(MID))
    assert outcome.kind is SendKind.REJECTED
    assert outcome.transient
    assert outcome.reason.startswith("not sent")
    assert emulator.accepted() == []


def test_token_endpoint_unreachable_is_a_transient_rejection(
    gmail_provider: GmailProviderFactory,
    relay: FaultRelay,
    emulator: GmailEmulator,
    dead_url: str,
    make_raw: RawFactory,
) -> None:
    outcome = gmail_provider(token_uri=dead_url + "/token").send_raw(make_raw(MID))
    assert outcome.kind is SendKind.REJECTED
    assert outcome.transient
    assert "token" in outcome.reason
    assert emulator.accepted() == []
    assert sends_at_relay(relay) == 0


def test_token_response_lost_is_still_not_sent(
    gmail_provider: GmailProviderFactory,
    relay: FaultRelay,
    emulator: GmailEmulator,
    make_raw: RawFactory,
) -> None:
    # Losing the token exchange loses a token, not a message: the send never started.
    relay.set_plan(FaultPlan(token="drop-response"))
    provider = gmail_provider(token_uri=relay.url + "/token")
    outcome = provider.send_raw(make_raw(MID))
    assert outcome.kind is SendKind.REJECTED
    assert outcome.transient
    assert emulator.accepted() == []
    assert sends_at_relay(relay) == 0


def test_expired_token_is_refreshed_and_the_send_lands_once(
    gmail_provider: GmailProviderFactory,
    relay: FaultRelay,
    emulator: GmailEmulator,
    make_raw: RawFactory,
) -> None:
    provider = gmail_provider()
    first = provider.send_raw(make_raw(MID))
    assert first.kind is SendKind.CONFIRMED
    assert len(emulator.token_requests) == 1
    emulator.expire_tokens()
    second_mid = "<job-second@mail.example.com>"
    second = provider.send_raw(make_raw(second_mid))
    assert second.kind is SendKind.CONFIRMED
    assert len(emulator.token_requests) == 2
    # The 401'd request was replayed after the refresh: two attempts, one effect.
    assert sends_at_relay(relay) == 3
    assert [e["upstream_status"] for e in relay.log if e["kind"] == "send"] == [200, 401, 200]
    assert emulator.copies(second_mid) == 1
    assert emulator.copies(MID) == 1


def test_no_requests_or_urllib3_transport_is_used(
    gmail_provider: GmailProviderFactory,
    monkeypatch: pytest.MonkeyPatch,
    make_raw: RawFactory,
) -> None:
    # So no urllib3 Retry adapter can be in play: make that stack explode if touched.
    import requests.adapters
    import urllib3.connectionpool

    def boom(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("requests/urllib3 used")

    monkeypatch.setattr(requests.adapters.HTTPAdapter, "send", boom)
    monkeypatch.setattr(urllib3.connectionpool.HTTPConnectionPool, "urlopen", boom)
    provider = gmail_provider()
    assert provider.send_raw(make_raw(MID)).kind is SendKind.CONFIRMED
    assert len(provider.search(MID).hits) == 1


# -- credentials and token flows --------------------------------------------------------------


def test_service_account_uses_a_jwt_grant_for_the_mailbox(
    gmail_provider: GmailProviderFactory, emulator: GmailEmulator, make_raw: RawFactory
) -> None:
    assert gmail_provider().send_raw(make_raw(MID)).kind is SendKind.CONFIRMED
    [grant] = emulator.token_requests
    assert grant["grant_type"] == "urn:ietf:params:oauth:grant-type:jwt-bearer"
    assert grant["sub"] == MAILBOX
    assert set(grant["scope"].split()) == set(SCOPES)
    assert grant["status"] == 200


def test_authorized_user_uses_a_refresh_token_grant(
    gmail_provider: GmailProviderFactory,
    emulator: GmailEmulator,
    authorized_user_file: Path,
    make_raw: RawFactory,
) -> None:
    # google-auth ignores the file's token_uri for authorized users: the config sets it.
    provider = gmail_provider(
        credentials_file=authorized_user_file, user="me", token_uri=emulator.token_uri
    )
    outcome = provider.send_raw(make_raw(MID))
    assert outcome.kind is SendKind.CONFIRMED
    [grant] = emulator.token_requests
    assert grant["grant_type"] == "refresh_token"
    assert set(grant["scope"].split()) == set(SCOPES)
    assert emulator.accepted()[0]["user"] == "me"
    assert provider.search(MID).copies == [outcome.provider_message_id]


def test_token_uri_override_replaces_the_files(
    gmail_provider: GmailProviderFactory,
    emulator: GmailEmulator,
    tmp_path: Path,
    make_raw: RawFactory,
) -> None:
    from testkit.credentials import write_service_account

    elsewhere = write_service_account(
        tmp_path / "google.json", token_uri="https://oauth2.googleapis.com/token"
    )
    provider = gmail_provider(credentials_file=elsewhere, token_uri=emulator.token_uri)
    assert provider.send_raw(make_raw(MID)).kind is SendKind.CONFIRMED
    assert len(emulator.token_requests) == 1


# -- search ----------------------------------------------------------------------------------


def test_search_sees_a_message_only_after_the_index_lag(
    gmail_provider: GmailProviderFactory,
    relay: FaultRelay,
    emulator: GmailEmulator,
    make_raw: RawFactory,
) -> None:
    emulator.set_lag(0.4)
    provider = gmail_provider()
    sent = provider.send_raw(make_raw(MID))
    assert sent.kind is SendKind.CONFIRMED
    miss = provider.search(MID)
    assert miss.hits == () and miss.copies == []  # a miss inside the lag proves nothing
    assert miss.query == QUERY  # a miss still says what was asked
    time.sleep(0.5)
    found = provider.search(MID)
    [hit] = found.hits
    assert hit.provider_message_id == sent.provider_message_id
    assert hit.message_id_header == MID
    assert "SENT" in hit.labels
    # What a human checking the copy sees, from the same metadata read (docs/review.md "Review").
    assert (hit.to, hit.subject) == ("customer@example.net", "Your receipt")
    assert found.copies == [sent.provider_message_id]
    assert found.query == QUERY
    assert queries_at_relay(relay) == [QUERY, QUERY]  # exactly what Gmail was sent


@pytest.mark.parametrize(
    "message_id",
    [MID, MID.strip("<>"), f"  {MID} "],
    ids=["brackets", "bare", "padded"],
)
def test_search_result_carries_the_query_sent(
    gmail_provider: GmailProviderFactory,
    relay: FaultRelay,
    emulator: GmailEmulator,
    make_raw: RawFactory,
    message_id: str,
) -> None:
    """The query recorded for an audit is the one the provider was sent: `rfc822msgid:`
    and the Message-ID without angle brackets, however the id was given."""
    sent = gmail_provider().send_raw(make_raw(MID))
    result = gmail_provider().search(message_id)
    assert result.query == QUERY
    assert queries_at_relay(relay) == [result.query]
    assert result.copies == [sent.provider_message_id]


def test_search_reads_every_page(
    gmail_provider: GmailProviderFactory,
    relay: FaultRelay,
    emulator: GmailEmulator,
    make_raw: RawFactory,
) -> None:
    injected = {emulator.inject(make_raw(MID), user=MAILBOX) for _ in range(7)}
    provider = gmail_provider(page_size=3)
    result = provider.search(MID)
    assert set(result.copies) == injected and len(result.copies) == 7
    lists = [e for e in relay.log if e["kind"] == "search" and "/messages?" in e["path"]]
    assert len(lists) == 3  # 3 + 3 + 1
    assert queries_at_relay(relay) == [result.query] * 3  # the same query on every page
    assert result.query == QUERY


def test_a_search_of_a_mailbox_holding_many_copies_stops_reading_once_it_has_decided(
    gmail_provider: GmailProviderFactory,
    relay: FaultRelay,
    emulator: GmailEmulator,
    make_raw: RawFactory,
) -> None:
    """60 SENT messages with the Message-ID (a provider may list 100,000): the search
    reads SEARCH_STOPS_AT of them, lists only the pages those are on, and answers a
    duplicate of at least that many, keeping COPIES_KEPT (before: 6 lists, 60 gets and
    60 copies kept; a search of 100,000 read every one, at 5 quota units a read)."""
    for _ in range(60):
        emulator.inject(make_raw(MID), user=MAILBOX)
    result = gmail_provider(page_size=10).search(MID)
    assert result.count == SEARCH_STOPS_AT and not result.complete
    assert len(result.copies) == COPIES_KEPT
    paths = [urlsplit(e["path"]).path for e in relay.log if e["kind"] == "search"]
    lists = [p for p in paths if p.endswith("/messages")]
    assert len(lists) == 3  # 10 + 10 + 1 of the third page
    assert len(paths) - len(lists) == SEARCH_STOPS_AT  # one metadata get per copy read


def test_search_keeps_sent_copies_only_spam_and_trash_included(
    gmail_provider: GmailProviderFactory, emulator: GmailEmulator, make_raw: RawFactory
) -> None:
    emulator.inject(make_raw(MID), labels=("INBOX",), user=MAILBOX)
    emulator.inject(make_raw(MID), labels=("DRAFT",), user=MAILBOX)
    trashed = emulator.inject(make_raw(MID), labels=("SENT", "TRASH"), user=MAILBOX)
    sent = emulator.inject(make_raw(MID), labels=("SENT",), user=MAILBOX)
    result = gmail_provider().search(MID)
    assert set(result.copies) == {trashed, sent} and len(result.copies) == 2


@pytest.mark.parametrize(
    ("stored", "counted"),
    [
        ("<job-0123456789abcdef0123456789abcdef@MAIL.Example.COM>", True),  # domain case
        ("job-0123456789abcdef0123456789abcdef@mail.example.com", True),  # no brackets
        ("<JOB-0123456789abcdef0123456789abcdef@mail.example.com>", False),  # local part case
        ("<job-0123456789ABCDEF0123456789abcdef@mail.example.com>", False),
    ],
)
def test_search_compares_the_header_exactly(
    gmail_provider: GmailProviderFactory,
    emulator: GmailEmulator,
    make_raw: RawFactory,
    stored: str,
    counted: bool,
) -> None:
    # The emulator's rfc822msgid: match ignores case (as Gmail's may); our check must not.
    emulator.inject(make_raw(stored), user=MAILBOX)
    hits = gmail_provider().search(MID).hits
    assert len(hits) == (1 if counted else 0)
    if counted:
        assert hits[0].message_id_header.strip() == stored


def test_search_ignores_other_mailboxes(
    gmail_provider: GmailProviderFactory, emulator: GmailEmulator, make_raw: RawFactory
) -> None:
    emulator.inject(make_raw(MID), user="someone-else@example.com")
    assert gmail_provider().search(MID).hits == ()


@pytest.mark.parametrize(
    ("plan", "unavailable"),
    [
        (FaultPlan(search=["pass", "503"]), True),  # the list answers, the header read fails
        (FaultPlan(search=["pass", "pass", "drop-response"]), False),  # page 2 of 3 is lost
    ],
    ids=["get-503", "page2-drop"],
)
def test_a_search_failing_after_its_first_request_is_an_error_never_some_hits(
    gmail_provider: GmailProviderFactory,
    relay: FaultRelay,
    emulator: GmailEmulator,
    make_raw: RawFactory,
    plan: FaultPlan,
    unavailable: bool,
) -> None:
    """The contract's search faults hit the first request; a search of several requests
    (a list, a page, each header) fails as a whole when a later one fails."""
    for _ in range(4):
        emulator.inject(make_raw(MID), user=MAILBOX)
    relay.set_plan(plan)
    with pytest.raises(ProviderError) as caught:
        gmail_provider(page_size=3).search(MID)
    assert caught.value.unavailable is unavailable


def test_search_with_the_token_endpoint_down_is_an_unavailable_error(
    gmail_provider: GmailProviderFactory, dead_url: str
) -> None:
    with pytest.raises(ProviderError) as caught:
        gmail_provider(token_uri=dead_url + "/token").search(MID)
    assert caught.value.unavailable


# -- read_message_id ---------------------------------------------------------------------------


def test_read_message_id_without_a_header_is_none(
    gmail_provider: GmailProviderFactory, emulator: GmailEmulator, make_raw: RawFactory
) -> None:
    provider_id = emulator.inject(make_raw(None), user=MAILBOX)
    assert gmail_provider().read_message_id(provider_id) is None


# -- quota and configuration -------------------------------------------------------------------


def test_quota_paces_calls_before_they_are_made(
    gmail_provider: GmailProviderFactory, emulator: GmailEmulator, make_raw: RawFactory
) -> None:
    now = [100.0]
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        now[0] += seconds

    provider = gmail_provider(quota_units_per_second=250.0, clock=lambda: now[0], sleep=sleep)
    for _ in range(3):  # 300 units against a full bucket of 250
        assert provider.send_raw(make_raw(MID)).kind is SendKind.CONFIRMED
    assert sleeps == [pytest.approx(0.2)]
    provider.search(MID)  # list 5 + 3 gets x 5 = 20 units at 250/s
    assert sum(sleeps) == pytest.approx(0.2 + 20 / 250)
    # What the metrics gauge reads: the bucket spent down to nothing, refilled by time.
    assert provider.quota_available() == pytest.approx(0.0, abs=1e-6)
    now[0] += 0.5
    assert provider.quota_available() == pytest.approx(125.0)


def test_default_endpoint_is_googles(service_account_file: Path) -> None:
    provider = GmailProvider("google", credentials_file=service_account_file, user=MAILBOX)
    try:
        uri = provider._messages.list(userId=MAILBOX, q="x").uri
        assert uri.startswith("https://gmail.googleapis.com/gmail/v1/users/")
        send = provider._messages.send(userId=MAILBOX, body={"raw": "eA"}).uri
        assert send.startswith("https://gmail.googleapis.com/gmail/v1/users/")
    finally:
        provider.close()


@pytest.mark.parametrize("suffix", ["", "/"])
def test_endpoint_override_with_or_without_slash(
    gmail_provider: GmailProviderFactory,
    emulator: GmailEmulator,
    make_raw: RawFactory,
    suffix: str,
) -> None:
    provider = gmail_provider(emulator.url + suffix)
    assert provider.send_raw(make_raw(MID)).kind is SendKind.CONFIRMED


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (None, "cannot read"),
        ("not json", "not valid JSON"),
        ("[]", "not a JSON object"),
        ('{"type": "external_account"}', "unsupported credentials type"),
        ('{"type": "authorized_user"}', "authorized-user.json"),
    ],
)
def test_bad_credentials_files_name_the_file(
    tmp_path: Path, content: str | None, match: str
) -> None:
    path = tmp_path / "authorized-user.json"
    if content is not None:
        path.write_text(content, encoding="utf-8")
    with pytest.raises(ValueError, match=match) as caught:
        GmailProvider("x", credentials_file=path, user="me")
    assert str(path) in str(caught.value)


def test_service_account_needs_a_mailbox(service_account_file: Path) -> None:
    with pytest.raises(ValueError, match="domain-wide delegation"):
        GmailProvider("x", credentials_file=service_account_file, user="me")


def test_threads_share_one_provider(
    gmail_provider: GmailProviderFactory, emulator: GmailEmulator, make_raw: RawFactory
) -> None:
    # No fault here hangs: a 10 s timeout only keeps a loaded machine from making a slow
    # answer an unknown outcome (the 0.5 s default did, in a CI run at a load of 2).
    provider = gmail_provider(timeout=10.0)
    ids = [f"<job-thread-{i}@mail.example.com>" for i in range(12)]
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        outcomes = list(pool.map(lambda mid: provider.send_raw(make_raw(mid)), ids))
        results = list(pool.map(provider.search, ids))
    assert all(o.kind is SendKind.CONFIRMED for o in outcomes)
    # Each thread's result is its own: its query, its one copy.
    assert [r.query for r in results] == [f"rfc822msgid:{mid.strip('<>')}" for mid in ids]
    assert [r.copies for r in results] == [[o.provider_message_id] for o in outcomes]
    assert all(emulator.copies(mid) == 1 for mid in ids)


def test_a_closed_provider_refuses_before_any_request(
    gmail_provider: GmailProviderFactory,
    relay: FaultRelay,
    emulator: GmailEmulator,
    make_raw: RawFactory,
) -> None:
    provider = gmail_provider()
    provider.close()
    with pytest.raises(RuntimeError, match="closed"):
        provider.send_raw(make_raw(MID))
    with pytest.raises(RuntimeError, match="closed"):
        provider.search(MID)
    assert relay.log == []
    assert emulator.token_requests == []


# -- connection reuse ------------------------------------------------------------------------

MID2 = "<job-fedcba9876543210fedcba9876543210@mail.example.com>"


@pytest.mark.parametrize("reset", [False, True], ids=["fin", "rst"])
def test_dropped_response_on_a_reused_connection_is_unknown_with_exactly_one_copy(
    gmail_provider: GmailProviderFactory,
    emulator: GmailEmulator,
    acceptance_log: Path,
    make_raw: RawFactory,
    reset: bool,
) -> None:
    plan = FaultPlan(send=["pass", "drop-response"])
    with FaultRelay(emulator.url, plan=plan, hang_seconds=1.5, reset=reset) as relay:
        provider = gmail_provider(relay.url)
        first = provider.send_raw(make_raw(MID))
        assert first.kind is SendKind.CONFIRMED
        second = provider.send_raw(make_raw(MID2))
        # Written on the kept connection, answered by nothing: Unknown, reconciled by
        # search, and never written again by any layer below send_raw.
        assert second.kind is SendKind.UNKNOWN, second
        stats = provider.transport_stats.snapshot()
        assert stats["reused"] >= 1  # the second send went out on a reused connection
        assert stats["reused_lost"] == 1
        assert logged_copies(acceptance_log, MID2) == 1
        assert emulator.copies(MID2) == 1
        assert sends_at_relay(relay) == 2
        assert relay.forwarded("send") == 2
        # The search that reconciles it finds exactly that copy.
        assert [hit.message_id_header for hit in provider.search(MID2).hits] == [MID2]


def test_sends_share_one_kept_connection(
    gmail_provider: GmailProviderFactory, emulator: GmailEmulator, make_raw: RawFactory
) -> None:
    provider = gmail_provider(emulator.url)
    for i in range(5):
        mid = f"<job-{i:032x}@mail.example.com>"
        assert provider.send_raw(make_raw(mid)).kind is SendKind.CONFIRMED
    stats = provider.transport_stats.snapshot()
    # One connection: the token request opened it, six requests in all.
    assert stats == {"fresh": 1, "reused": 5, "fresh_lost": 0, "reused_lost": 0, "retired": 0}


def test_https_emulator_with_a_trusted_ca(
    tmp_path: Path, service_account_file: Path, make_raw: RawFactory
) -> None:
    tls = make_loopback_tls(tmp_path / "tls")
    with GmailEmulator(tls=tls) as secure:
        assert secure.url.startswith("https://")
        sa = write_service_account(tmp_path / "sa-tls.json", token_uri=secure.token_uri)
        trusted = GmailProvider(
            "tls",
            credentials_file=sa,
            user=MAILBOX,
            api_endpoint=secure.url,
            timeout=2.0,
            ca_certs=str(tls.ca_file),
        )
        untrusted = GmailProvider(
            "tls2", credentials_file=sa, user=MAILBOX, api_endpoint=secure.url, timeout=2.0
        )
        try:
            for i in range(3):
                mid = f"<job-{i:032x}@mail.example.com>"
                assert trusted.send_raw(make_raw(mid)).kind is SendKind.CONFIRMED
            assert trusted.transport_stats.snapshot()["fresh"] == 1  # one handshake
            # A certificate the client does not trust fails the handshake: not sent.
            refused = untrusted.send_raw(make_raw(MID))
            assert refused.kind is SendKind.REJECTED
            assert refused.transient
            assert secure.copies(MID) == 0
        finally:
            trusted.close()
            untrusted.close()


def test_a_connection_the_server_closed_while_idle_is_replaced_before_the_send(
    tmp_path: Path, make_raw: RawFactory
) -> None:
    with GmailEmulator(idle_timeout=0.05) as closing:
        sa = write_service_account(tmp_path / "sa-idle.json", token_uri=closing.token_uri)
        provider = GmailProvider(
            "idle", credentials_file=sa, user=MAILBOX, api_endpoint=closing.url, timeout=2.0
        )
        try:
            assert provider.send_raw(make_raw(MID)).kind is SendKind.CONFIRMED
            time.sleep(0.3)  # the server drops the idle connection (real time, 0.3 s)
            assert provider.send_raw(make_raw(MID2)).kind is SendKind.CONFIRMED
            stats = provider.transport_stats.snapshot()
            assert stats["retired"] == 1
            assert stats["reused_lost"] == 0
            assert closing.copies(MID) == closing.copies(MID2) == 1
        finally:
            provider.close()


def test_emulator_latency_delays_each_api_call(
    gmail_provider: GmailProviderFactory, emulator: GmailEmulator, make_raw: RawFactory
) -> None:
    provider = gmail_provider(emulator.url)
    provider.send_raw(make_raw(MID))  # token fetched, connection open
    emulator.set_latency(0.2)
    started = time.monotonic()
    assert provider.send_raw(make_raw(MID2)).kind is SendKind.CONFIRMED
    assert time.monotonic() - started >= 0.2
    with pytest.raises(ValueError, match="latency"):
        emulator.set_latency(-1)
