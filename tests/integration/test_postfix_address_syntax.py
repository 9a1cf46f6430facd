"""Intake and real Postfix agree on which local parts are addresses (issue 28): every
local part the address validator accepts, Postfix takes at RCPT without a syntax error
(501), and every one Postfix refuses as bad syntax, intake refuses first (naming the
field), so such a job never reaches review through a 501 at send time
(docs/cli.md "Message fields and validation").

`Rcpt <-@example.com>` passed intake on 127b519 and Postfix answered 501 (its
`allow_min_user` is off by default). The candidates are every RFC 5322 atext character
alone, first, inside and last, with dots, each asked at RCPT in a session of its own
(Postfix ends a session after a few errors); an unknown user is 550, not a syntax error."""

from __future__ import annotations

import smtplib
import string
from collections.abc import Iterator

import pytest
from tests.integration.mailservers import DOMAIN, PASSWORD, SENDER, MailServers, mail_servers

from ledger.addresses import AddressError, parse_mailbox

pytestmark = pytest.mark.xdist_group("mailservers")

ATEXT = string.ascii_letters[:3] + string.digits[:2] + "!#$%&'*+/=?^_`{|}~-"


def candidates() -> list[str]:
    found = ["a.b", "a..b", ".a", "a.", "a" * 64]
    for char in ATEXT:
        found += [char, f"{char}x", f"x{char}", f"x{char}y", f"x.{char}", f"{char}.x"]
    return sorted(set(found))


@pytest.fixture(scope="module")
def servers() -> Iterator[MailServers]:
    with mail_servers() as running:
        yield running


def rcpt_code(servers: MailServers, local: str) -> int:
    with smtplib.SMTP("127.0.0.1", servers.smtp_port, timeout=10) as client:
        client.login(SENDER, PASSWORD)
        code, answer = client.mail(SENDER)
        assert code == 250, answer
        code, _ = client.rcpt(f"<{local}@{DOMAIN}>")
        return code


def intake_accepts(local: str) -> bool:
    try:
        parse_mailbox(f"Rcpt <{local}@{DOMAIN}>")
    except AddressError:
        return False
    return True


def test_postfix_refuses_as_syntax_only_what_intake_refuses(servers: MailServers) -> None:
    answers = {local: rcpt_code(servers, local) for local in candidates()}
    syntax_errors = {local for local, code in answers.items() if code == 501}
    accepted = {local for local in answers if intake_accepts(local)}
    assert "-" in syntax_errors and "-x" in syntax_errors  # the quoted case: 501 at RCPT
    assert not accepted & syntax_errors, {local: answers[local] for local in accepted}
    # Intake is the stricter: what it refuses besides (leading or doubled dots) is legal
    # for Postfix, never the other way round.
    assert syntax_errors <= set(answers) - accepted
    assert len(accepted) > 100
