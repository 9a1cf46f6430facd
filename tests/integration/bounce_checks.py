"""The bounce checks every provider's mailbox passes (docs/how-it-works.md "Bounces"), run by
the engine in-process on a real SQLite store against a real server or an emulator.

A job to an address that bounces gets exactly one Bounced, read after read and after the
engine is built again on the same store (a restart: its memory of what it read is gone);
four forged reports in the same mailbox (another domain's Message-ID, a job of another
mailbox, no original headers, 10 MB) put no bounce on any job; no job changes state.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from daemon.engine import Engine, PolicyHolder
from daemon.engine.observer import NullObserver
from daemon.providers.base import Provider
from ledger.application import Ledger
from ledger.content import parse_job
from ledger.delivery_reports import MAX_REPORT_BYTES
from ledger.mime import date_value
from policies.loader import PolicySet
from policies.model import ChannelPolicy
from testkit.dsn import report, rfc3464_report

#: Reads of the mailbox a few apart: what "read after read" means here.
READS = 3
INTERVAL = 0.05


@dataclass
class Mailboxes:
    """What the checks need of one provider's setup."""

    providers: Mapping[str, Provider]
    policies: list[ChannelPolicy]  # "mail" (the mailbox read) and "other" (another one)
    mailbox: str  # the address of the "mail" channel's mailbox
    gone: str  # an address the server bounces
    ok: str  # an address the server delivers to (the other jobs' recipient)
    deliver: Callable[[bytes], object]  # put a message into the mailbox's INBOX
    bounce_arrived: Callable[[], bool]  # the server's own report is in INBOX


class Outcomes(NullObserver):
    """What became of each report read (`EngineObserver.bounce_report`)."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def bounce_report(self, outcome: str) -> None:
        self.seen.append(outcome)


def engine(ledger: Ledger, setup: Mailboxes, outcomes: Outcomes) -> Engine:
    policies = PolicySet({p.channel: p for p in setup.policies})
    return Engine(
        ledger,
        PolicyHolder(lambda: policies, policies),
        setup.providers,
        provider_timeouts={name: 5.0 for name in setup.providers},
        bounce_interval=INTERVAL,
        daemon_name="it",
        observer=outcomes,
    )


def message_id(ledger: Ledger, key: str) -> str:
    row = ledger.row(key)
    assert row is not None
    return row.message_id


def original(
    ledger: Ledger, key: str, to: str, named: str | None = None, late: float = 0.0
) -> bytes:
    """The header block of the job's message (its Message-ID, or `named`), with its Date
    (the one an SMTP server keeps, `Provider.keeps_date`), or one `late` seconds after."""
    mid = named or message_id(ledger, key)
    created = ledger.get_job(key).created_on.astimezone(UTC)
    date = date_value(created + timedelta(seconds=late))
    return (
        f"From: {to}\r\nTo: {to}\r\nSubject: s\r\nDate: {date}\r\nMessage-ID: {mid}\r\n\r\nbody\r\n"
    ).encode()


def forgeries(ledger: Ledger, mailbox: str, fine: str) -> list[bytes]:
    other_domain = message_id(ledger, "fine").replace("@", "@evil.")
    no_headers = report(
        sender="MAILER-DAEMON@mx.example",
        to=mailbox,
        subject="Undelivered Mail Returned to Sender",
        parts=[
            (["Content-Type: text/plain"], f"{message_id(ledger, 'fine')} failed\r\n".encode()),
            (
                ["Content-Type: message/delivery-status"],
                f"Reporting-MTA: dns; mx.example\r\n\r\nFinal-Recipient: rfc822; {fine}\r\n"
                "Action: failed\r\nStatus: 5.1.1\r\n".encode(),
            ),
        ],
    )
    huge = rfc3464_report(original(ledger, "fine", fine), mailbox=mailbox, recipient=fine)
    huge = huge.replace(b"user unknown", b"user unknown" + b" x" * (5 * MAX_REPORT_BYTES // 2), 1)
    return [
        rfc3464_report(
            original(ledger, "fine", fine, other_domain), mailbox=mailbox, recipient=fine
        ),
        rfc3464_report(original(ledger, "other", fine), mailbox=mailbox, recipient=fine),
        no_headers,
        huge,
    ]


def bounces(ledger: Ledger, key: str) -> list[object]:
    return [e for e in ledger.history(key) if type(e).__name__ == "Bounced"]


def run_bounce_checks(folder: Path, setup: Mailboxes, *, timeout: float = 20.0) -> None:
    ledger = Ledger(f"sqlite:///{folder / 'ledger.sqlite'}")
    mail, other = setup.policies
    outcomes = Outcomes()
    first = engine(ledger, setup, outcomes)
    try:
        jobs = {
            "bounced": (mail, setup.gone),
            "fine": (mail, setup.ok),
            "other": (other, setup.ok),
        }
        for key, (policy, to) in jobs.items():
            fields = {"channel": policy.channel, "key": key, "to": to, "subject": key, "body": "."}
            ledger.submit(parse_job(fields), policy.sender)
        deadline = time.monotonic() + timeout
        while {ledger.row(k).state for k in jobs} != {"confirmed"}:  # type: ignore[union-attr]
            assert time.monotonic() < deadline, [ledger.row(k) for k in jobs]
            first.tick()
        for forged in forgeries(ledger, setup.mailbox, setup.ok):
            setup.deliver(forged)
        keeps_date = setup.providers[mail.provider].keeps_date
        if keeps_date:  # the Message-ID guessed from the key, the creation second missed
            guessed = original(ledger, "fine", setup.ok, late=1.0)
            setup.deliver(rfc3464_report(guessed, mailbox=setup.mailbox, recipient=setup.ok))
        while not setup.bounce_arrived():
            assert time.monotonic() < deadline, "the server's bounce never arrived"
            time.sleep(0.05)
        for _ in range(READS):
            time.sleep(INTERVAL)
            first.tick()
        assert len(bounces(ledger, "bounced")) == 1
        first.close()
        again = engine(ledger, setup, outcomes)  # a restart: what was read is forgotten
        for _ in range(READS):
            time.sleep(INTERVAL)
            again.tick()
        again.close()
        [event] = bounces(ledger, "bounced")
        assert [r["address"] for r in event.recipients] == [setup.gone]  # type: ignore[attr-defined]
        assert event.permanent is True  # type: ignore[attr-defined]
        assert bounces(ledger, "fine") == [] and bounces(ledger, "other") == []
        assert {ledger.row(k).state for k in jobs} == {"confirmed"}  # type: ignore[union-attr]
        # Each forgery refused for what it is, each time it was read (twice: a restart).
        for refusal in ("not-ours", "other-mailbox", "no-original-headers", "too-large"):
            assert outcomes.seen.count(refusal) == 2, (refusal, outcomes.seen)
        assert outcomes.seen.count("other-date") == (2 if keeps_date else 0), outcomes.seen
        assert outcomes.seen.count("recorded") == 1
        assert outcomes.seen.count("recorded-already") == 1
    finally:
        ledger.close()


def run_report_before_send_check(
    folder: Path, setup: Mailboxes, deliver_at: Callable[[bytes, float], object]
) -> None:
    """A job's Message-ID derives from its key: whoever guesses a key and knows the
    recipient can mail the sender a report of the job before it is sent. A report the
    mailbox received (the provider's own time: Gmail's internalDate, Graph's
    receivedDateTime) well before the job's first attempt is refused (`before-send`);
    the same report received after it is recorded. `deliver_at(raw, epoch)`: put a
    message into the mailbox's INBOX, received then."""
    ledger = Ledger(f"sqlite:///{folder / 'ledger.sqlite'}")
    mail = setup.policies[0]
    outcomes = Outcomes()
    first = engine(ledger, setup, outcomes)
    try:
        fields = {"channel": mail.channel, "key": "early", "to": setup.ok, "subject": "s"}
        ledger.submit(parse_job({**fields, "body": "."}), mail.sender)
        deadline = time.monotonic() + 20.0
        while ledger.row("early").state != "confirmed":  # type: ignore[union-attr]
            assert time.monotonic() < deadline, ledger.row("early")
            first.tick()
        job = ledger.get_job("early")
        assert job.first_attempt_at is not None
        forged = rfc3464_report(
            original(ledger, "early", setup.ok), mailbox=setup.mailbox, recipient=setup.ok
        )
        # Ten minutes before the claim: far beyond the engine's margin (deadline_grace).
        deliver_at(forged, job.first_attempt_at.timestamp() - 600)
        for _ in range(READS):
            time.sleep(INTERVAL)
            first.tick()
        assert bounces(ledger, "early") == []
        assert "before-send" in outcomes.seen, outcomes.seen
        # The same report (its own Message-ID aside), received now: after the claim.
        setup.deliver(
            rfc3464_report(
                original(ledger, "early", setup.ok), mailbox=setup.mailbox, recipient=setup.ok
            )
        )
        for _ in range(READS):
            time.sleep(INTERVAL)
            first.tick()
        [event] = bounces(ledger, "early")
        assert [r["address"] for r in event.recipients] == [setup.ok]  # type: ignore[attr-defined]
        first.close()
    finally:
        ledger.close()


def run_report_at_the_watch_s_end_check(
    folder: Path, setup: Mailboxes, deliver_at: Callable[[bytes, float], object]
) -> None:
    """A report the mailbox received 10 s before the job's watch ended, first read after
    that end (the engine's clock moved an hour on: the read of its last interval came
    later, or reads were held): it is recorded, and the watch ends after that read, not
    at its time with the report then refused `not-watched`."""
    ledger = Ledger(f"sqlite:///{folder / 'ledger.sqlite'}")
    mail = setup.policies[0]
    outcomes = Outcomes()
    offset = timedelta(0)

    def clock() -> datetime:
        return datetime.now(UTC) + offset

    policies = PolicySet({p.channel: p for p in setup.policies})
    first = Engine(
        ledger,
        PolicyHolder(lambda: policies, policies),
        setup.providers,
        provider_timeouts={name: 5.0 for name in setup.providers},
        bounce_interval=INTERVAL,
        daemon_name="it",
        observer=outcomes,
        clock=clock,
    )
    try:
        fields = {"channel": mail.channel, "key": "late", "to": setup.ok, "subject": "s"}
        ledger.submit(parse_job({**fields, "body": "."}), mail.sender)
        deadline = time.monotonic() + 20.0
        while ledger.row("late").state != "confirmed":  # type: ignore[union-attr]
            assert time.monotonic() < deadline, ledger.row("late")
            first.tick()
        # What else of the job is due before its watch's end (its verification, its
        # drafts' tidy) done first: the end is then all that is due.
        while (job := ledger.get_job("late")).due_at != job.watch_until:
            assert time.monotonic() < deadline and job.due_at is not None, ledger.row("late")
            offset = max(offset, job.due_at - datetime.now(UTC) + timedelta(seconds=1))
            first.tick()
        until = job.watch_until
        assert until is not None
        deliver_at(
            rfc3464_report(
                original(ledger, "late", setup.ok), mailbox=setup.mailbox, recipient=setup.ok
            ),
            until.timestamp() - 10,
        )
        offset = until - datetime.now(UTC) + timedelta(minutes=2)  # the watch is over
        for _ in range(READS):
            time.sleep(INTERVAL)
            first.tick()
        [event] = bounces(ledger, "late")
        assert [r["address"] for r in event.recipients] == [setup.ok]  # type: ignore[attr-defined]
        assert "not-watched" not in outcomes.seen, outcomes.seen
        assert type(ledger.history("late")[-1]).__name__ == "BounceWatchEnded"
        first.close()
    finally:
        ledger.close()
