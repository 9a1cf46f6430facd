"""The real-server helpers of the SMTP + IMAP tests: `testkit.mailservers` (one copy of the
code that starts Postfix + Dovecot), plus the skip rule every real-server test shares.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from tests.conftest import IN_CI

from testkit.mailservers import (
    DEFER_RECIPIENT,
    DOMAIN,
    GONE_RECIPIENT,
    PASSWORD,
    RECIPIENT,
    REJECT_RECIPIENT,
    SENDER,
    UNKNOWN_RECIPIENT,
    MailServers,
    free_port,
    missing_reason,
)
from testkit.mailservers import mail_servers as _start_mail_servers

__all__ = [
    "DEFER_RECIPIENT",
    "DOMAIN",
    "GONE_RECIPIENT",
    "PASSWORD",
    "RECIPIENT",
    "REJECT_RECIPIENT",
    "SENDER",
    "UNKNOWN_RECIPIENT",
    "MailServers",
    "free_port",
    "mail_servers",
    "missing_reason",
    "require_mailservers",
]


def require_mailservers() -> None:
    """Skip without Postfix/Dovecot, with the reason; under CI a skip is a failure."""
    reason = missing_reason()
    if reason is None:
        return
    if IN_CI:
        pytest.fail(f"CI is set, the real-server tests must run: {reason}")
    pytest.skip(reason)


@contextmanager
def mail_servers() -> Iterator[MailServers]:
    """`testkit.mailservers.mail_servers`, skipping (or failing under CI) when missing."""
    require_mailservers()
    with _start_mail_servers() as servers:
        yield servers
