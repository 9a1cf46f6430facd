"""The provider contract (tests/provider_contract.py) run by the in-memory providers that
stand for every provider in the unit tier: the plain fake, the drafts fake (Gmail's
`send_via = "drafts"`) and the Graph-like fake (a send that may leave a draft). Their
scripted fates are named after the relay's modes, so the fakes are held to the outcomes
the real providers give through the relay (`TestGmailContract`, `TestGraphContract`,
`TestSmtpImapContract` in tests/integration/test_gmail_provider.py, test_graph_provider.py,
test_smtp_imap_provider.py)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from tests.provider_contract import (
    THROTTLED,
    DraftsContract,
    DraftsSubject,
    Expect,
    LeavesDraftsContract,
    ReadBackContract,
    RelayedSubject,
    RewritingSubject,
    SearchFaultContract,
    SendContract,
)

from daemon.doubles.fake_drafts import FakeDraftsProvider, FakeGraphProvider
from daemon.doubles.fake_provider import FakeProvider, Scripted
from daemon.doubles.fake_time import FakeClock
from daemon.providers.base import Provider, SendKind

#: The relay's modes as the fake scripts them.
FATES: dict[str, Callable[[], Scripted]] = {
    "pass": Scripted.confirmed,
    "fail-before-forward": Scripted.lost_request,
    "drop-response": Scripted.dropped_response,
    "hang": lambda: Scripted.timed_out(stored=True),
    "500-after-forward": Scripted.server_error_after_send,
    "429": lambda: Scripted.unavailable(retry_after=1.0),
}


class FakeSubject(RelayedSubject, RewritingSubject, DraftsSubject):
    """The fake is its own server: copies are counted in its mailbox, by the Message-ID
    the job gave."""

    sender = "support@example.com"
    recipient = "customer@example.net"
    hang_seconds = 1.0
    missing_id = "fake-999999"
    provider: FakeProvider

    def restarted(self) -> Provider:
        return self.provider

    def unreachable(self) -> Provider:
        down = type(self.provider)(clock=self.provider.clock)
        down.script(Scripted.unavailable())
        down.fail_searches(1, unavailable=True)
        down.fail_pings(1)
        return down

    def fault(self, mode: str) -> None:
        self.provider.script(FATES[mode]())

    def search_fault(self, mode: str) -> None:
        self.provider.fail_searches(1, unavailable=mode == "503")

    def sends_seen(self) -> int:
        # Send requests, as the relay counts them: not a send stopped before any call.
        return self.provider.sends - self.provider.sends_stopped

    def copies(self, message_id: str, expected: int) -> int:
        return self.provider.copies_of(message_id)

    def refused_for_good(self, message_id: str) -> bytes:
        self.provider.script(Scripted.rejected(transient=False))
        return self.raw(message_id)

    def rewrite_message_ids(self) -> None:
        self.provider.replaces_message_id = True

    def drafts_left(self, message_id: str) -> int:
        assert isinstance(self.provider, FakeDraftsProvider)
        return self.provider.unsent_drafts(message_id)

    def leave_draft(self, message_id: str) -> None:
        self.provider.script(Scripted.lost_request())
        assert self.provider.send_raw(self.raw(message_id)).kind is SendKind.UNKNOWN


class FakeContract(SendContract, ReadBackContract, SearchFaultContract):
    EXTRA_FAULTS = {"500-after-forward": Expect(SendKind.UNKNOWN, 1), "429": THROTTLED}
    SEARCH_FAULTS = {"503": (True, None), "500-after-forward": (False, 1.0)}
    QUERY = "rfc822msgid:{bare}"
    PROVIDER: type[FakeProvider]
    subject: FakeSubject

    @pytest.fixture(name="subject")
    def fake_subject(self, clock: FakeClock) -> FakeSubject:
        return FakeSubject(self.PROVIDER(clock=clock))


class TestFakeProvider(FakeContract):
    PROVIDER = FakeProvider


class TestFakeDraftsProvider(FakeContract, DraftsContract, LeavesDraftsContract):
    PROVIDER = FakeDraftsProvider
    subject: FakeSubject


class TestFakeGraphProvider(FakeContract, LeavesDraftsContract):
    PROVIDER = FakeGraphProvider
    subject: FakeSubject
