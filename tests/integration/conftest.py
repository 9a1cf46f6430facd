"""Fixtures for integration tests: the Gmail emulator, the fault relay in front of it,
credential files pointing at the emulator's /token, and providers built on the real client
stack (google-api-python-client + google-auth + httplib2).

Everything listens on 127.0.0.1 on ports the OS picks. Timeouts are short (client 0.5 s,
relay hang 1.5 s) so fault tests take about a second each.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import pytest

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
def dead_url() -> str:
    """An http URL on which nothing listens (connection refused)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.fixture
def unanswered_url(full_backlog_port: int) -> str:
    """An http URL whose connect() times out (`full_backlog_port`, tests/conftest.py)."""
    return f"http://127.0.0.1:{full_backlog_port}"


GmailProviderFactory = Callable[..., GmailProvider]


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
