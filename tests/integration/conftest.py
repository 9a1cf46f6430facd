"""Fixtures for integration tests: the Gmail emulator, the fault relay in front of it,
credential files pointing at the emulator's /token, and providers built on the real client
stack (google-api-python-client + google-auth + httplib2).

Everything listens on 127.0.0.1 on ports the OS picks. Timeouts are short (client 0.5 s,
relay hang 1.5 s) so fault tests take about a second each. `gmail_subject` is the provider
contract's subject (tests/provider_contract.py) built on them.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable, Iterator
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import pytest
from tests.provider_contract import DraftsSubject, HttpRelaySubject, RewritingSubject
from tests.thread_guard import (  # noqa: F401  (hooks: no test leaves a thread running)
    pytest_configure,
    pytest_fixture_post_finalizer,
    pytest_fixture_setup,
    pytest_runtest_setup,
    pytest_runtest_teardown,
)

from daemon.providers.base import Provider
from daemon.providers.gmail import GmailProvider
from testkit.credentials import write_authorized_user, write_service_account
from testkit.gmail_emulator import GmailEmulator
from testkit.relay import FaultPlan, FaultRelay

# The mailbox a service account acts for (domain-wide delegation subject).
MAILBOX = "support@example.com"
CLIENT_TIMEOUT = 0.5
HANG_SECONDS = 1.5


@pytest.fixture
def acceptance_log(tmp_path: Path) -> Path:
    """Where the emulator appends one JSON line per accepted message: count effects here."""
    return tmp_path / "acceptance.jsonl"


@pytest.fixture
def emulator(acceptance_log: Path) -> Iterator[GmailEmulator]:
    """A fresh emulator per test, index lag 0 (use `set_lag` to add one)."""
    with GmailEmulator(lag=0.0, acceptance_log=acceptance_log) as emu:
        yield emu


@pytest.fixture
def relay(emulator: GmailEmulator) -> Iterator[FaultRelay]:
    """A fault relay in front of `emulator`, passing everything until `set_plan`."""
    with FaultRelay(
        emulator.url, plan=FaultPlan(), hang_seconds=HANG_SECONDS, retry_after=1.0
    ) as rel:
        yield rel


@pytest.fixture
def service_account_file(tmp_path: Path, emulator: GmailEmulator) -> Path:
    return write_service_account(tmp_path / "service-account.json", token_uri=emulator.token_uri)


@pytest.fixture
def authorized_user_file(tmp_path: Path, emulator: GmailEmulator) -> Path:
    return write_authorized_user(tmp_path / "authorized-user.json", token_uri=emulator.token_uri)


@pytest.fixture
def dead_url() -> Iterator[str]:
    """An http URL on which nothing listens (connection refused). Its port stays bound,
    never listening, for the test's length: a port let go at once was taken by another
    test's emulator (pytest -n 2), whose token endpoint then answered (failed in CI)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))  # no SO_REUSEADDR: no other socket may bind it
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


@pytest.fixture
def unanswered_url(full_backlog_port: int) -> str:
    """An http URL whose connect() times out (`full_backlog_port`, tests/conftest.py)."""
    return f"http://127.0.0.1:{full_backlog_port}"


GmailProviderFactory = Callable[..., GmailProvider]


def logged_copies(acceptance_log: Path, message_id: str) -> int:
    """Copies in the acceptance log file (what the seed says to assert on)."""
    if not acceptance_log.exists():
        return 0
    lines = acceptance_log.read_text(encoding="utf-8").splitlines()
    return sum(1 for line in lines if json.loads(line)["message_id"] == message_id)


def sends_at_relay(relay: FaultRelay) -> int:
    """Send requests that reached the relay, forwarded or not: one per attempt."""
    return sum(1 for entry in relay.log if entry["kind"] == "send")


@pytest.fixture
def gmail_provider(relay: FaultRelay, service_account_file: Path) -> Iterator[GmailProviderFactory]:
    """Build GmailProviders; by default through `relay`, as MAILBOX, with the service
    account, a 0.5 s timeout and a quota high enough never to pace a test.

    `gmail_provider(url=emulator.url)` skips the relay; any GmailProvider keyword can be
    overridden. Every provider built is closed at teardown.
    """
    built: list[GmailProvider] = []

    def make(url: str | None = None, **overrides: Any) -> GmailProvider:
        kwargs: dict[str, Any] = {
            "credentials_file": service_account_file,
            "user": MAILBOX,
            "api_endpoint": relay.url if url is None else url,
            "timeout": CLIENT_TIMEOUT,
            "quota_units_per_second": 1_000_000.0,
        }
        kwargs.update(overrides)
        provider = GmailProvider(kwargs.pop("name", "test"), **kwargs)
        built.append(provider)
        return provider

    yield make
    for provider in built:
        provider.close()


RawFactory = Callable[..., bytes]


class GmailSubject(HttpRelaySubject, RewritingSubject, DraftsSubject):
    """A GmailProvider through the relay (conftest.py's `gmail_provider`, with
    `overrides`); copies counted in the acceptance log, drafts in the emulator."""

    sender = MAILBOX
    recipient = "customer@example.net"
    hang_seconds = HANG_SECONDS
    missing_id = "0123456789abcdef"

    def __init__(
        self,
        make: GmailProviderFactory,
        relay: FaultRelay,
        emulator: GmailEmulator,
        acceptance_log: Path,
        dead_url: str,
        **overrides: Any,
    ) -> None:
        self.make, self.relay, self.emulator = make, relay, emulator
        self.log, self.dead_url, self.overrides = acceptance_log, dead_url, overrides
        super().__init__(make(**overrides))

    def restarted(self) -> Provider:
        return self.make(**self.overrides)

    def unreachable(self) -> Provider:
        return self.make(self.dead_url, **self.overrides)

    def refused_for_good(self, message_id: str) -> bytes:
        return self.raw(message_id, to=None)  # no recipient: Gmail's 400

    def rewrite_message_ids(self) -> None:
        self.emulator.rewrite_message_id = True

    def drafts_left(self, message_id: str) -> int:
        return self.emulator.drafts_of(message_id, MAILBOX)

    def leave_draft(self, message_id: str) -> None:
        drafts = self.provider.drafts()
        assert drafts is not None
        drafts.create_draft(self.raw(message_id))  # made; its send never happened


@pytest.fixture
def gmail_subject(
    gmail_provider: GmailProviderFactory,
    relay: FaultRelay,
    emulator: GmailEmulator,
    acceptance_log: Path,
    dead_url: str,
) -> Callable[..., GmailSubject]:
    """`gmail_subject(**overrides)`: the contract's subject on a Gmail provider."""

    def make(**overrides: Any) -> GmailSubject:
        return GmailSubject(gmail_provider, relay, emulator, acceptance_log, dead_url, **overrides)

    return make


def build_raw(
    message_id: str | None = "<job-0123456789abcdef0123456789abcdef@mail.example.com>",
    *,
    to: str | None = "customer@example.net",
    subject: str = "Your receipt",
    body: str = "Thank you.\n",
) -> bytes:
    """A complete RFC 5322 message as the daemon would send it (stdlib `email`, CRLF)."""
    msg = EmailMessage()
    msg["From"] = f"Support <{MAILBOX}>"
    if to is not None:
        msg["To"] = to
    msg["Subject"] = subject
    if message_id is not None:
        msg["Message-ID"] = message_id
    msg.set_content(body)
    return msg.as_bytes(policy=msg.policy.clone(linesep="\r\n"))


@pytest.fixture
def make_raw() -> RawFactory:
    """`make_raw(message_id, to=..., subject=..., body=...)` -> bytes."""
    return build_raw


def asked_at_most(calls: int) -> Callable[[], bool]:
    """A scope that is the daemon's for `calls` asks, then went to another daemon."""
    asked = 0

    def ours() -> bool:
        nonlocal asked
        asked += 1
        return asked <= calls

    return ours
