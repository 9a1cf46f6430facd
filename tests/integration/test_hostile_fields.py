"""A job with a hostile subject, header value, file name and body (issue 16), end to end:
through the engine to the Gmail emulator (on SQLite and PostgreSQL), and through real
Postfix + Dovecot. Each arrives once, with exactly the job's recipients, its Message-ID
and its text; a file name a client would show as a path is refused before anything is
sent; no provider handle changes. Copies are counted at the emulator and in the real
Maildir, never through the provider."""

from __future__ import annotations

import base64
import email
import email.policy
from collections.abc import Iterator
from datetime import UTC, datetime
from email.message import Message
from email.utils import getaddresses
from pathlib import Path
from typing import Any

import pytest
from tests.integration.api_kit import Api, running_api, write_config
from tests.integration.api_kit import job as api_job
from tests.integration.mailservers import PASSWORD, RECIPIENT, SENDER, MailServers, mail_servers
from tests.integration.test_engine import (  # noqa: F401  (fixtures used by name)
    BASE_POLICY,
    RigFactory,
    emulator,
    make_rig,
)

import ledger.wire_check as wire_check
from daemon.doubles.fake_time import FakeClock
from daemon.providers.base import SendKind
from daemon.providers.smtp_imap import SmtpImapProvider
from ledger.content import MAX_HEADER_VALUE, MAX_SUBJECT, JobContent, JobInputError, parse_job
from ledger.job import JobState, SendJob
from ledger.message import render
from ledger.message_id import message_id_for
from ledger.mime import MessageFields, boundary, render_message
from ledger.vocabulary import PolicyRef
from testkit.gmail_emulator import GmailEmulator
from testkit.mime_reader import decoded

KEY = "hostile-receipt-1"
CRLF = "\r\n"
PDF = b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\ntrailer << >>\n%%EOF\n" * 20
PDF_NAME = "Rechnung M\u00e4rz \u2013 2026 (1).pdf"


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def hostile_job(channel: str, to: str, domain: str, injected: str) -> dict[str, Any]:
    """Every field a client decodes tries to add `injected` as a recipient or end the
    header block; the body holds the boundaries (computable from the key) and a lone dot."""
    mid = message_id_for(KEY, domain)
    lookalikes = "\n".join(
        f"--{boundary(mid, kind)}{end}" for kind in ("", "mixed") for end in ("", "--")
    )
    return {
        "channel": channel,
        "key": KEY,
        "to": to,
        "subject": (
            f"=?utf-8?q?Your_receipt=0D=0ABcc:_{injected}=0D=0A=0D=0AMessage-ID:_<evil@x.test>?="
        ),
        "headers": {"X-Campaign": f"Grüße =?utf-8?b?{b64(CRLF + 'Bcc: ' + injected)}?="},
        "attachments": [
            {
                "filename": PDF_NAME,
                "content_type": "application/pdf",
                "content_base64": base64.b64encode(PDF).decode(),
            }
        ],
        "body": f"Hello\n{lookalikes}\nBcc: {injected}\n.\nbye\n",
        "html": f"<p>Hello</p>\n{lookalikes}\n",
    }


def lf(data: bytes) -> str:
    # Sent with CR LF; a Maildir file has LF line ends.
    return data.decode().replace("\r\n", "\n")


def assert_is_the_job(raw: bytes, content: JobContent, message_id: str) -> None:
    """What a reader's client (the standard library's parser, header words decoded as
    Gmail shows them) sees is exactly the job."""
    message = email.message_from_bytes(raw, policy=email.policy.compat32)
    assert message.get_all("Message-ID") == [message_id]
    assert decoded(message["Subject"]) == content.subject
    assert decoded(message["X-Campaign"]) == dict(content.headers)["X-Campaign"]
    assert [spec for _, spec in getaddresses(message.get_all("To") or [])] == list(content.to)
    assert message.get_all("Cc") is None and message.get_all("Bcc") is None
    leaves: list[Message] = [part for part in message.walk() if not part.is_multipart()]
    assert [leaf.get_content_type() for leaf in leaves] == [
        "text/plain",
        "text/html",
        "application/pdf",
    ]
    plain, html, pdf = (leaf.get_payload(decode=True) for leaf in leaves)
    assert isinstance(plain, bytes) and isinstance(html, bytes)
    assert lf(plain) == content.body
    assert lf(html) == content.html
    assert pdf == PDF and leaves[2].get_filename() == PDF_NAME


@pytest.mark.parametrize(
    "name", ["=?utf-8?q?=2E=2E=2F=2E=2E=2F.bashrc?=", "invoice\u202efdp.exe", "../../.bashrc"]
)
def test_a_file_name_shown_as_a_path_or_reversed_is_refused_and_nothing_is_sent(
    name: str,
    make_rig: RigFactory,  # noqa: F811
    emulator: GmailEmulator,  # noqa: F811
) -> None:
    job = hostile_job("support", "customer@example.net", "mail.example.com", "evil@x.test")
    job["attachments"][0]["filename"] = name
    with pytest.raises(JobInputError) as info:
        parse_job(job)
    assert info.value.field == "attachments[0].filename"
    make_rig({"support": dict(BASE_POLICY)}).tick()
    assert emulator.accepted() == []


def test_a_hostile_job_reaches_gmail_once_as_exactly_the_job(
    make_rig: RigFactory,  # noqa: F811
    emulator: GmailEmulator,  # noqa: F811
    clock: FakeClock,
) -> None:
    rig = make_rig({"support": dict(BASE_POLICY)})
    content = parse_job(
        hostile_job("support", "customer@example.net", "mail.example.com", "evil@attacker.example")
    )
    result = rig.ledger.submit(content, rig.holder.current["support"].sender)
    rig.tick()
    assert rig.state(KEY) is JobState.CONFIRMED
    assert emulator.copies(result.message_id) == 1
    [entry] = emulator.accepted()
    assert entry["message_id"] == result.message_id
    assert (entry["to"], entry["subject"]) == ("customer@example.net", content.subject)
    raw = render(rig.ledger.get_job(KEY))
    assert b"evil@attacker.example" not in raw.split(b"\r\n\r\n", 1)[0]
    assert_is_the_job(raw, content, result.message_id)
    handle = rig.ledger.handle("gmail")
    assert handle is None or handle.reliable  # the read-back found our Message-ID


@pytest.fixture(scope="module")
def servers() -> Iterator[MailServers]:
    with mail_servers() as running:
        yield running


@pytest.mark.xdist_group("mailservers")
def test_a_hostile_job_reaches_postfix_once_with_no_hidden_recipient(
    servers: MailServers,
) -> None:
    # The injected address is a local mailbox: a hidden envelope recipient would land there.
    injected = SENDER
    content = parse_job(hostile_job("support", RECIPIENT, "sendledger.test", injected))
    job = SendJob.request(
        content,
        from_addr=f"Support <{SENDER}>",
        message_id=message_id_for(KEY, "sendledger.test"),
        policy=PolicyRef("support", ""),
        at=datetime(2026, 11, 1, 9, tzinfo=UTC),
    )
    raw = render(job)
    provider = SmtpImapProvider(
        "mail",
        smtp_host="127.0.0.1",
        smtp_port=servers.smtp_port,
        smtp_security="none",
        imap_host="127.0.0.1",
        imap_port=servers.imap_port,
        imap_security="none",
        username=SENDER,
        password=PASSWORD,
        timeout=5.0,
    )
    assert provider.send_raw(raw).kind is SendKind.CONFIRMED
    mid = job.message_id
    assert servers.wait_copies(mid, 1, user="rcpt", folder="INBOX") == 1
    assert servers.wait_copies(mid, 1) == 1  # the sent copy
    servers.settle()
    assert servers.copies(mid, user="rcpt", folder="INBOX") == 1
    assert servers.copies(mid, user="sender", folder="INBOX") == 0  # no hidden recipient
    assert sum(servers.message_ids(user="rcpt", folder="INBOX").values()) == 1
    [delivered] = servers.folder_files("rcpt", "INBOX")
    assert_is_the_job(delivered.read_bytes(), content, mid)
    found = provider.search(mid)
    assert len(found.copies) == 1 and provider.read_message_id(found.copies[0]) == mid


# -- intake over HTTP: refused naming the field (422), or stored as typed -------------------


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    settings = write_config(tmp_path, f"sqlite:///{tmp_path / 'ledger.sqlite'}", max_body="64KB")
    with running_api(settings) as running:
        yield running


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"subject": "s" * (MAX_SUBJECT + 1)}, "subject"),
        ({"headers": {"X-Tag": "v" * (MAX_HEADER_VALUE + 1)}}, "headers.X-Tag"),
        (
            {"headers": {"List-Unsubscribe": "<https://x.example/?=?utf-8?q?a?=>"}},
            "headers.List-Unsubscribe",
        ),
        (
            {
                "attachments": [
                    {
                        "filename": "=?utf-8?q?=2E=2E=2F.bashrc?=",
                        "content_type": "text/plain",
                        "content_base64": "aGk=",
                    }
                ]
            },
            "attachments[0].filename",
        ),
    ],
)
def test_intake_refuses_naming_the_field_and_writes_nothing(
    api: Api, changes: dict[str, Any], field: str
) -> None:
    answer = api.client.post("/v1/jobs", json=api_job(**changes), headers=api.auth())
    assert answer.status_code == 422, answer.text
    assert answer.json()["errors"][0]["field"] == field
    assert list(api.ledger.jobs()) == []


def test_a_typed_encoded_word_is_accepted_and_kept_as_typed(api: Api) -> None:
    subject = "=?utf-8?q?Your_receipt=0D=0ABcc:_evil@attacker.example?="
    answer = api.client.post("/v1/jobs", json=api_job(subject=subject), headers=api.auth())
    assert answer.status_code == 201, answer.text
    job = api.ledger.get_job("order-1")
    assert job.content.subject == subject and job.content.bcc == ()
    assert b"Bcc:" not in render(job).split(b"\r\n\r\n", 1)[0]


def test_a_render_mismatch_at_intake_is_422_naming_the_field(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    def adds_a_bcc(fields: MessageFields) -> bytes:
        raw = render_message(fields)
        return raw.replace(b"\r\nSubject:", b"\r\nBcc: evil@attacker.example\r\nSubject:", 1)

    monkeypatch.setattr(wire_check, "render_message", adds_a_bcc)
    answer = api.client.post("/v1/jobs", json=api_job(), headers=api.auth())
    assert answer.status_code == 422, answer.text
    assert answer.json()["errors"][0]["field"] == "bcc"
    assert list(api.ledger.jobs()) == []
