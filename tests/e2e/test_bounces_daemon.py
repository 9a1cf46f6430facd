"""Bounces on the job with the daemon as a process (docs/how-it-works.md "Bounces"): the Gmail
emulator bounces chosen recipients (Gmail's own report and the plain RFC 3464 one), forged
reports wait in the same INBOX, a webhook hears `bounced`, and the daemon is killed -9
once the first bounce is recorded. In the end each bounced job has exactly one Bounced
event and one `bounced` delivery (one event id; at least once, so possibly sent twice),
and no forgery put a bounce on any job."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import unquote_plus

from tests.e2e.daemon_kit import MAILBOX, RETRY_POLICY, Rig, job
from tests.e2e.test_webhooks_daemon import Receiver

from daemon.webhooks.signing import new_secret
from ledger.delivery_reports import MAX_REPORT_BYTES
from ledger.job import job_id_for
from ledger.message_id import message_id_for
from testkit.dsn import report, rfc3464_report
from testkit.gmail_emulator import GmailEmulator

DOMAIN = RETRY_POLICY["message_id_domain"]
OTHER_MAILBOX = "other@shop.example"
GMAIL_STYLE = [f"gone-{n}@gmail-bounce.example" for n in range(3)]
RFC_STYLE = [f"gone-{n}@rfc-bounce.example" for n in range(3)]
WATCHED = {**RETRY_POLICY, "watch_bounces": "1h"}


def original(key: str, to: str, domain: str = DOMAIN) -> bytes:
    """The header block a report quotes: what the job's message carried."""
    return (
        f"From: Shop <{MAILBOX}>\r\nTo: {to}\r\nSubject: Order {key}\r\n"
        f"Message-ID: {message_id_for(key, domain)}\r\n\r\nThank you.\r\n"
    ).encode()


def forgeries() -> list[bytes]:
    """Four reports that must put no bounce on any job: another domain's Message-ID, a
    job of another mailbox, no original headers (the Message-ID only in the text), and
    10 MB."""
    no_headers = report(
        sender="MAILER-DAEMON@mx.example",
        to=MAILBOX,
        subject="Undelivered Mail Returned to Sender",
        parts=[
            (
                ["Content-Type: text/plain"],
                f"{message_id_for('fine-1', DOMAIN)} to customer@example.com failed\r\n".encode(),
            ),
            (
                ["Content-Type: message/delivery-status"],
                b"Reporting-MTA: dns; mx.example\r\n\r\nFinal-Recipient: rfc822; "
                b"customer@example.com\r\nAction: failed\r\nStatus: 5.1.1\r\n",
            ),
        ],
    )
    huge = rfc3464_report(
        original("fine-2", "customer@example.com"),
        mailbox=MAILBOX,
        recipient="customer@example.com",
    )
    # 10 MB: the diagnostic of its text part padded.
    huge = huge.replace(b"user unknown", b"user unknown" + b" x" * (5 * MAX_REPORT_BYTES // 2), 1)
    return [
        rfc3464_report(
            original("fine-1", "customer@example.com", "evil.example"),
            mailbox=MAILBOX,
            recipient="customer@example.com",
        ),
        rfc3464_report(
            original("other-1", "customer@example.com"),
            mailbox=MAILBOX,
            recipient="customer@example.com",
        ),
        no_headers,
        huge,
    ]


def bounced(rig: Rig, key: str) -> list[dict[str, object]]:
    return [r for r in rig.history(key) if r["type"] == "Bounced"]


def test_each_bounce_is_recorded_once_across_a_kill9_and_forgeries_on_none(
    tmp_path: Path,
) -> None:
    secret = new_secret()
    receiver = Receiver(secret)
    bounce = {a: "gmail" for a in GMAIL_STYLE} | {a: "rfc3464" for a in RFC_STYLE}
    emulator = GmailEmulator(lag=0.3, acceptance_log=tmp_path / "acceptance.jsonl", bounce=bounce)
    other = {**WATCHED, "provider": "other", "from": f"Other <{OTHER_MAILBOX}>"}
    with Rig(
        tmp_path,
        emulator=emulator,
        policies={"receipts": WATCHED, "other": other},
        daemon_extra='bounce_interval = "200ms"',
    ) as rig:
        (tmp_path / "webhook-secret").write_text(secret + "\n")
        (tmp_path / "webhook-secret").chmod(0o600)
        with rig.config.open("a") as config:
            config.write(
                "\n[providers.other]\n"
                'kind = "gmail"\n'
                'credentials_file = "service-account.json"\n'
                f'user = "{OTHER_MAILBOX}"\n'
                f'api_endpoint = "{rig.relay.url}"\n'
                f'token_uri = "{emulator.token_uri}"\n'
                'timeout = "5s"\n'
                "\n[webhooks.ops]\n"
                f'url = "{receiver.url}"\n'
                'secret_file = "webhook-secret"\n'
                'events = ["bounced"]\n'
                'retry_backoff = "100ms"\n'
            )
        for forged in forgeries():
            emulator.inject(forged, labels=("INBOX",), user=MAILBOX)
        bouncing = {f"bounce-{n}": to for n, to in enumerate(GMAIL_STYLE + RFC_STYLE)}
        fine = ["fine-1", "fine-2"]
        rig.submit(
            [job(key, to=to) for key, to in bouncing.items()]
            + [job(key) for key in fine]
            + [job("other-1", channel="other")]
        )
        first = rig.start_daemon()
        rig.wait_for(lambda: any(bounced(rig, key) for key in bouncing), "a first bounce")
        assert first.kill9() < 0
        second = rig.start_daemon()
        rig.wait_for(lambda: all(bounced(rig, key) for key in bouncing), "every bounce")
        rig.wait_for(
            lambda: {p["key"] for p in receiver.accepted} == set(bouncing), "every webhook"
        )
        # More reads of both mailboxes (200 ms apart): nothing is recorded twice.
        reads_before = len(reads(rig))
        rig.wait_for(lambda: len(reads(rig)) >= reads_before + 6, "six more reads")
        assert second.terminate() == 0, second.tail()

        for key, to in bouncing.items():
            [event] = bounced(rig, key)
            assert event["recipients"][0]["address"] == to  # type: ignore[index]
            assert event["permanent"] is True
            assert event["verified"] is False  # history --json: a report is a claim
            assert rig.state(key) == "confirmed"  # a bounce changes nothing of the send
            assert rig.copies(key) == 1
        for key in [*fine, "other-1"]:
            assert bounced(rig, key) == [], key
            assert rig.state(key) == "confirmed"
        # The audit filter: every Bounced event, and nothing else.
        audit = rig.cli("audit", "--event", "Bounced", "--format", "json").stdout.splitlines()
        assert sorted(json.loads(line)["key"] for line in audit) == sorted(bouncing)
        gmail_style = [k for k, to in bouncing.items() if to in GMAIL_STYLE]
        assert {bounced(rig, k)[0]["reporter"] for k in gmail_style} == {"dns; googlemail.com"}
        event_ids = {
            k: f"evt_{job_id_for(k).hex}_{bounced(rig, k)[0]['version']}" for k in bouncing
        }

    assert receiver.bad == []
    for key in bouncing:
        deliveries = [p for p in receiver.accepted if p["key"] == key]
        assert {p["event_id"] for p in deliveries} == {event_ids[key]}
        assert {(p["type"], p["reason"], p["state"], p["verified"]) for p in deliveries} == {
            ("bounced", "permanent", "confirmed", False)
        }
        assert bouncing[key] in deliveries[0]["detail"]


def reads(rig: Rig) -> list[dict[str, object]]:
    """The report reads (INBOX lists) that reached the relay."""
    return [e for e in list(rig.relay.log) if "from:mailer-daemon" in unquote_plus(str(e["path"]))]
