"""The delivery-report parser as hostile input meets it (ledger/delivery_reports.py,
docs/how-it-works.md "Bounces"): what it accepts from three mail systems, what it refuses
and why, and for any bytes at all that it answers (never raises) and never attributes a
report to a message the original headers do not name, or to one not of our domains."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, timezone

from hypothesis import example, given
from hypothesis import strategies as st

from ledger.delivery_reports import (
    MAX_REPORT_BYTES,
    DeliveryReport,
    ReportRefusal,
    ReportRefused,
    read_report,
)
from ledger.message_id import message_id_for
from ledger.mime import date_value
from testkit.dsn import exchange_report, gmail_report, original_headers, report, rfc3464_report

DOMAIN = "mail.example.com"
MID = message_id_for("order-1", DOMAIN)
OTHER = message_id_for("order-2", DOMAIN)
TO = "customer@example.net"
MAILBOX = "support@example.com"


def message(message_id: str = MID, to: str = TO) -> bytes:
    return (
        f"From: Support <{MAILBOX}>\r\nTo: {to}\r\nSubject: Your receipt\r\n"
        f"Message-ID: {message_id}\r\nMIME-Version: 1.0\r\n\r\nThank you.\r\n"
    ).encode()


def read(raw: bytes) -> DeliveryReport | ReportRefused:
    return read_report(raw, domains=[DOMAIN])


def refusal(raw: bytes) -> ReportRefusal:
    found = read(raw)
    assert isinstance(found, ReportRefused), found
    return found.reason


# -- what three mail systems write ------------------------------------------------------


def test_the_three_shapes_name_the_message_and_the_recipient() -> None:
    shapes = [
        rfc3464_report(message(), mailbox=MAILBOX, recipient=TO),
        gmail_report(message(), mailbox=MAILBOX, recipient=TO, message_id=MID),
        exchange_report(message(), mailbox=MAILBOX, recipient=TO, subject="Your receipt"),
    ]
    for raw in shapes:
        found = read(raw)
        assert isinstance(found, DeliveryReport), found
        assert found.original_message_id == MID
        [recipient] = found.recipients
        assert (recipient.address, recipient.permanent) == (TO, True)
        assert recipient.status.startswith("5.")
        assert found.report_id.startswith("<") and found.report_id != MID


def test_a_delay_is_transient_and_a_delivery_no_bounce() -> None:
    delayed = read(
        rfc3464_report(message(), mailbox=MAILBOX, recipient=TO, status="4.4.1", action="delayed")
    )
    assert isinstance(delayed, DeliveryReport) and not delayed.permanent
    delivered = rfc3464_report(
        message(), mailbox=MAILBOX, recipient=TO, status="2.0.0", action="delivered"
    )
    assert refusal(delivered) is ReportRefusal.NO_FAILURE


def test_the_domain_compares_case_blind_and_comes_back_as_the_policy_spells_it() -> None:
    shouted = message(MID.replace(DOMAIN, DOMAIN.upper()))
    found = read(rfc3464_report(shouted, mailbox=MAILBOX, recipient=TO))
    assert isinstance(found, DeliveryReport) and found.original_message_id == MID


# -- what is refused, and as what ---------------------------------------------------------


def test_forgeries_are_refused_for_what_they_are() -> None:
    base = rfc3464_report(message(), mailbox=MAILBOX, recipient=TO)
    cases = {
        "another domain": (
            rfc3464_report(
                message(MID.replace(DOMAIN, "evil.example")), mailbox=MAILBOX, recipient=TO
            ),
            ReportRefusal.NOT_OURS,
        ),
        "not our shape": (
            rfc3464_report(message("<order-1@mail.example.com>"), mailbox=MAILBOX, recipient=TO),
            ReportRefusal.NOT_OURS,
        ),
        "too large": (base + b" " * MAX_REPORT_BYTES, ReportRefusal.TOO_LARGE),
        "plain text": (message(), ReportRefusal.NOT_A_REPORT),
        "no original headers": (
            report(
                sender="MAILER-DAEMON@x",
                to=MAILBOX,
                subject="failed",
                parts=[
                    (["Content-Type: text/plain"], f"{MID} to {TO} failed\r\n".encode()),
                    (
                        ["Content-Type: message/delivery-status"],
                        f"Reporting-MTA: dns; x\r\n\r\nFinal-Recipient: rfc822; {TO}\r\n"
                        "Action: failed\r\nStatus: 5.1.1\r\n".encode(),
                    ),
                ],
            ),
            ReportRefusal.NO_ORIGINAL_HEADERS,
        ),
        "two Message-IDs in the original": (
            rfc3464_report(
                message().replace(b"MIME-Version", f"Message-ID: {OTHER}\r\nMIME-Version".encode()),
                mailbox=MAILBOX,
                recipient=TO,
            ),
            ReportRefusal.AMBIGUOUS,
        ),
        "Gmail's id names another message": (
            gmail_report(message(), mailbox=MAILBOX, recipient=TO, message_id=OTHER),
            ReportRefusal.AMBIGUOUS,
        ),
        "no closing boundary": (base[: base.rindex(b"--=_report")], ReportRefusal.MALFORMED),
        "an unknown transfer encoding": (
            base.replace(
                b"Content-Type: text/rfc822-headers",
                b"Content-Type: text/rfc822-headers\r\nContent-Transfer-Encoding: x-uue",
            ),
            ReportRefusal.MALFORMED,
        ),
    }
    for name, (raw, expected) in cases.items():
        assert refusal(raw) is expected, name


def test_the_status_part_nested_in_a_multipart_is_not_read() -> None:
    """Only the report's own parts count: a delivery-status and original headers hidden
    one level down (inside a forged human part) are never looked at."""
    inner = "=_inner"
    nested = (
        (
            f"--{inner}\r\nContent-Type: message/delivery-status\r\n\r\n"
            f"Reporting-MTA: dns; x\r\n\r\nFinal-Recipient: rfc822; {TO}\r\nAction: failed\r\n"
            f"Status: 5.1.1\r\n\r\n--{inner}\r\nContent-Type: text/rfc822-headers\r\n\r\n"
        ).encode()
        + original_headers(message())
        + f"\r\n--{inner}--\r\n".encode()
    )
    raw = report(
        sender="MAILER-DAEMON@x",
        to=MAILBOX,
        subject="failed",
        parts=[([f'Content-Type: multipart/mixed; boundary="{inner}"'], nested)],
    )
    assert refusal(raw) is ReportRefusal.NO_STATUS


def test_the_envelope_and_the_text_never_attribute_only_the_original_headers_do() -> None:
    """A report whose text, subject, envelope fields and headers name our message, but
    whose original headers name another job of ours: it is the other job's report."""
    raw = rfc3464_report(message(OTHER), mailbox=MAILBOX, recipient=TO)
    raw = raw.replace(b"Subject: Undelivered", f"In-Reply-To: {MID}\r\nSubject: {MID}".encode())
    raw = raw.replace(b"Reporting-MTA", f"Original-Envelope-Id: {MID}\r\nReporting-MTA".encode())
    found = read(raw)
    assert isinstance(found, DeliveryReport) and found.original_message_id == OTHER


# -- any bytes at all ---------------------------------------------------------------------

LINES = [
    "",
    "--=_report_x",
    "--=_report_x--",
    "Content-Type: message/delivery-status",
    "Content-Type: text/rfc822-headers",
    'Content-Type: multipart/report; report-type=delivery-status; boundary="=_report_x"',
    f"Message-ID: {MID}",
    f"Message-ID: {OTHER}",
    f"Message-ID: {MID.replace(DOMAIN, 'evil.example')}",
    "X-Original-Message-ID: " + MID,
    "Final-Recipient: rfc822; " + TO,
    "Action: failed",
    "Action: delayed",
    "Status: 5.1.1",
    "Status: 4.4.7",
    " folded",
    "\tContent-Transfer-Encoding: base64",
    "Content-Transfer-Encoding: quoted-printable",
    "=\r",
    "\x00\xff",
]


@st.composite
def hostile(draw: st.DrawFn) -> bytes:
    """A valid report cut, spliced and salted with report-shaped lines."""
    base = draw(
        st.sampled_from(
            [
                rfc3464_report(message(), mailbox=MAILBOX, recipient=TO),
                gmail_report(message(), mailbox=MAILBOX, recipient=TO, message_id=MID),
            ]
        )
    )
    lines = base.decode("latin-1").split("\r\n")
    for _ in range(draw(st.integers(0, 6))):
        at = draw(st.integers(0, len(lines)))
        action = draw(st.sampled_from(["insert", "delete", "duplicate"]))
        if action == "insert":
            lines.insert(at, draw(st.sampled_from(LINES) | st.text(max_size=30)))
        elif lines and action == "delete":
            del lines[min(at, len(lines) - 1)]
        elif lines:
            lines.insert(at, lines[min(at, len(lines) - 1)])
    newline = draw(st.sampled_from(["\r\n", "\n", "\r"]))
    return newline.join(lines).encode("utf-8", "surrogateescape")


def _original_ids(raw: bytes) -> set[str]:
    """Every Message-ID the bytes carry anywhere (a loose reading: what a report could
    possibly have named)."""
    return set(re.findall(r"<job-[0-9a-f]{32}@[A-Za-z0-9.-]+>", raw.decode("latin-1")))


@given(st.binary(max_size=4000) | hostile())
@example(b"")
@example(b"Content-Type: multipart/report; report-type=delivery-status; boundary=" + b"-" * 71)
def test_any_bytes_get_an_answer_and_never_a_message_they_do_not_name(raw: bytes) -> None:
    found = read(raw)
    assert isinstance(found, DeliveryReport | ReportRefused)
    if isinstance(found, DeliveryReport):
        # Ours (shape and domain), named in the bytes, with a failure for an address.
        named = {m.lower() for m in _original_ids(raw)}
        assert found.original_message_id.lower() in named
        assert found.original_message_id in (MID, OTHER)
        assert found.recipients and all(r.action in ("failed", "delayed") for r in found.recipients)
        assert all(
            len(r.diagnostic) <= 300 and r.diagnostic.isprintable() for r in found.recipients
        )


PLACES = ["subject", "text", "envelope", "status-recipient", "report-id"]


@given(
    named=st.sampled_from([MID, OTHER]),
    places=st.sets(st.sampled_from(PLACES)),
    shape=st.sampled_from(["rfc3464", "gmail", "exchange"]),
)
def test_only_the_original_headers_attribute_a_report(
    named: str, places: set[str], shape: str
) -> None:
    """The other job's Message-ID put anywhere else in the report (subject, text, status
    fields, the report's own id) never moves the report to that job."""
    decoy = OTHER if named == MID else MID
    if shape == "rfc3464":
        raw = rfc3464_report(message(named), mailbox=MAILBOX, recipient=TO)
    elif shape == "gmail":
        raw = gmail_report(message(named), mailbox=MAILBOX, recipient=TO, message_id=named)
    else:
        raw = exchange_report(message(named), mailbox=MAILBOX, recipient=TO, subject="s")
    edits = {
        "subject": (b"\r\nSubject: ", f"\r\nSubject: {decoy} ".encode()),
        "text": (b"This is a MIME-encapsulated message.", decoy.encode()),
        "envelope": (b"Reporting-MTA", f"Original-Envelope-Id: {decoy}\r\nReporting-MTA".encode()),
        "status-recipient": (
            b"Action: failed",
            f"X-Message-ID: {decoy}\r\nAction: failed".encode(),
        ),
        "report-id": (b"@reports.example.invalid>", b"@reports.example.invalid>"),
    }
    for place in places:
        old, new = edits[place]
        raw = raw.replace(old, new, 1)
    if "report-id" in places:
        raw = re.sub(
            rb"\r\nMessage-ID: <[^>]*@reports.example.invalid>",
            f"\r\nMessage-ID: {decoy}".encode(),
            raw,
            count=1,
        )
    found = read(raw)
    assert isinstance(found, DeliveryReport), found
    assert found.original_message_id == named


@given(
    # From the year 100: a year written 0001 to 0099 is read as two digits are (no job
    # is dated then).
    moment=st.none() | st.datetimes(min_value=datetime(100, 1, 1), timezones=st.just(UTC)),
    decoy=st.datetimes(timezones=st.just(UTC)),
    shape=st.sampled_from(["rfc3464", "gmail", "exchange"]),
    folded=st.booleans(),
)
def test_the_original_date_is_the_originals_alone(
    moment: datetime | None, decoy: datetime, shape: str, folded: bool
) -> None:
    """The Date a job compares with its own (`original_date`) comes from the original's
    headers only, whitespace collapsed: the report's own Date, its Arrival-Date and its
    text never stand in for it, and a quoted original without one has none."""
    date = "" if moment is None else date_value(moment)
    head = message().replace(
        b"\r\nMessage-ID", b"\r\nDate:\r\n " + date.encode() + b"\r\nMessage-ID"
    )
    original = head if folded else head.replace(b"Date:\r\n ", b"Date: ")
    if moment is None:
        original = message()
    if shape == "rfc3464":
        raw = rfc3464_report(original, mailbox=MAILBOX, recipient=TO)
    elif shape == "gmail":
        raw = gmail_report(original, mailbox=MAILBOX, recipient=TO, message_id=MID)
    else:
        raw = exchange_report(original, mailbox=MAILBOX, recipient=TO, subject="s")
    raw = raw.replace(
        b"This is a MIME-encapsulated message.", f"Date: {date_value(decoy)}".encode()
    )
    found = read(raw)
    assert isinstance(found, DeliveryReport), found
    assert found.original_date == date
    assert found.original_moment == (None if moment is None else moment.replace(microsecond=0))


@given(
    moment=st.datetimes(
        min_value=datetime(1900, 1, 2), max_value=datetime(9999, 12, 30), timezones=st.just(UTC)
    ),
    minutes=st.integers(min_value=-(23 * 60 + 59), max_value=23 * 60 + 59),
    padded=st.booleans(),
    named=st.booleans(),
)
def test_a_date_written_again_in_another_zone_names_the_same_moment(
    moment: datetime, minutes: int, padded: bool, named: bool
) -> None:
    """An MTA that writes the original's Date again (another zone, the day unpadded, no
    day name, a comment) names the moment ours does; a day that does not exist, none."""
    zone = timezone(timedelta(minutes=minutes))
    local = moment.astimezone(zone)
    sign = "+" if minutes >= 0 else "-"
    offset = f"{sign}{abs(minutes) // 60:02d}{abs(minutes) % 60:02d}"
    day = f"{local.day:02d}" if padded else str(local.day)
    text = (
        f"{local.strftime('%a') + ', ' if named else ''}{day} {local.strftime('%b')} "
        f"{local.year:04d} {local:%H:%M:%S} {offset}{' (UTC)' if named else ''}"
    )
    original = message().replace(b"\r\nMessage-ID", f"\r\nDate: {text}\r\nMessage-ID".encode())
    found = read(rfc3464_report(original, mailbox=MAILBOX, recipient=TO))
    assert isinstance(found, DeliveryReport), found
    assert found.original_moment == moment.replace(microsecond=0), text
    for wrong in (
        text.replace(f"{local.year:04d}", "2026 31 Feb"),
        "yesterday",
        "31 Feb 2026 00:00 +0000",
    ):
        original = message().replace(b"\r\nMessage-ID", f"\r\nDate: {wrong}\r\nMessage-ID".encode())
        found = read(rfc3464_report(original, mailbox=MAILBOX, recipient=TO))
        assert isinstance(found, DeliveryReport) and found.original_moment is None, wrong


def test_an_original_quoting_two_dates_is_ambiguous() -> None:
    original = message().replace(
        b"\r\nMessage-ID", b"\r\nDate: Mon, 02 Nov 2026 09:00:00 +0000\r\nDate: x\r\nMessage-ID"
    )
    assert refusal(rfc3464_report(original, mailbox=MAILBOX, recipient=TO)) is (
        ReportRefusal.AMBIGUOUS
    )


#: RFC 5322's obsolete zone names (section 4.3), which a receiver must still read.
_NAMED_ZONES = {"UT": 0, "GMT": 0, "EST": -5, "EDT": -4, "CST": -6, "CDT": -5}
_NAMED_ZONES |= {"MST": -7, "MDT": -6, "PST": -8, "PDT": -7}


@given(
    moment=st.datetimes(
        min_value=datetime(2000, 1, 2), max_value=datetime(2049, 12, 30), timezones=st.just(UTC)
    ),
    zone=st.sampled_from(sorted(_NAMED_ZONES)),
    two_digit_year=st.booleans(),
    comment=st.sampled_from(["", " (Coordinated Universal Time, as this relay writes it)"]),
)
def test_a_date_written_again_in_the_obsolete_forms_names_the_same_moment(
    moment: datetime, zone: str, two_digit_year: bool, comment: str
) -> None:
    """RFC 5322 section 4 has a receiver read the obsolete forms too: a zone by its name
    (EST, PDT, UT), a year of two digits, a comment of any length. An MTA that writes the
    original's Date again so quotes the moment ours names; it is the job's genuine report
    and must not be refused `other-date` where the Date is compared."""
    local = moment.astimezone(timezone(timedelta(hours=_NAMED_ZONES[zone])))
    year = f"{local.year % 100:02d}" if two_digit_year else f"{local.year:04d}"
    text = f"{local:%a}, {local.day} {local:%b} {year} {local:%H:%M:%S} {zone}{comment}"
    original = message().replace(b"\r\nMessage-ID", f"\r\nDate: {text}\r\nMessage-ID".encode())
    found = read(rfc3464_report(original, mailbox=MAILBOX, recipient=TO))
    assert isinstance(found, DeliveryReport), found
    assert found.original_moment == moment.replace(microsecond=0), text
