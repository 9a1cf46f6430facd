"""build_message: what the provider receives must decode to exactly what was submitted."""

from __future__ import annotations

import base64
import email
import email.policy
from datetime import UTC, datetime, timedelta, timezone
from email.message import EmailMessage
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ledger.content import JobInputError
from ledger.message_id import message_id_for
from ledger.mime import build_message, date_value, wrapped_base64

DATE = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
MID = message_id_for("order-42", "mail.example.com")


def build(**overrides: Any) -> bytes:
    args: dict[str, Any] = {
        "from_addr": "Support <support@example.com>",
        "to": ["bob@example.com"],
        "subject": "Your receipt",
        "body": "Thanks for your order.\n",
        "message_id": MID,
        "date": DATE,
    }
    args.update(overrides)
    return build_message(**args)


def parse(raw: bytes) -> EmailMessage:
    message = email.message_from_bytes(raw, policy=email.policy.default)
    assert isinstance(message, EmailMessage)
    return message


def headers_of(raw: bytes) -> bytes:
    return raw.split(b"\r\n\r\n", 1)[0]


def text(part: Any) -> str:
    """Decoded text with the wire's CRLF line ends mapped back to LF."""
    content = part.get_content()
    assert isinstance(content, str)
    return content.replace("\r\n", "\n")


SUBJECTS = [
    "订单已发货",
    "🎉 Your order shipped 🎉",
    "Ваш заказ отправлен",
    "Mixed: 订单 🎉 заказ — café",
    "订单已发货 " * 30,  # long enough to fold into several encoded words
    "plain ASCII subject",
]


@pytest.mark.parametrize("subject", SUBJECTS)
def test_subject_round_trips_exactly(subject: str) -> None:
    raw = build(subject=subject)
    assert str(parse(raw)["Subject"]) == subject


@pytest.mark.parametrize("subject", SUBJECTS)
def test_headers_are_ascii_with_rfc2047_words(subject: str) -> None:
    raw = build(
        subject=subject,
        from_addr="Støre Ølé <support@example.com>",
        to=["张三 <zhang@example.com>", "Иван Петров <ivan@example.com>"],
    )
    head = headers_of(raw)
    head.decode("ascii")  # raises if any raw non-ASCII byte made it into a header
    if not subject.isascii():
        assert b"=?utf-8?" in head
    for line in head.split(b"\r\n"):
        assert len(line) <= 78


def test_display_names_round_trip() -> None:
    raw = build(
        from_addr="Støre Ølé <support@example.com>",
        to=["张三 <zhang@example.com>", "Иван Петров <ivan@example.com>"],
        cc=["🎉 Party <party@example.com>"],
        reply_to='"Doe, John" <john@example.com>',
    )
    message = parse(raw)
    assert [(a.display_name, a.addr_spec) for a in message["From"].addresses] == [
        ("Støre Ølé", "support@example.com")
    ]
    assert [(a.display_name, a.addr_spec) for a in message["To"].addresses] == [
        ("张三", "zhang@example.com"),
        ("Иван Петров", "ivan@example.com"),
    ]
    assert [(a.display_name, a.addr_spec) for a in message["Cc"].addresses] == [
        ("🎉 Party", "party@example.com")
    ]
    assert [(a.display_name, a.addr_spec) for a in message["Reply-To"].addresses] == [
        ("Doe, John", "john@example.com")
    ]


BODIES = [
    "Thanks for your order.\n",
    "Ваш заказ отправлен.\n订单已发货 🎉\nCafé crème.\n",
    "x" * 5000 + "\n",  # one ASCII line far over the 998-octet limit
    ("Очень длинная строка " * 200) + "\n",
    "first\n\n\nlast line\n",
    "trailing spaces   \nand a tab\t\n",
    ".\nFrom the start of a line\n",
]


@pytest.mark.parametrize("body", BODIES)
def test_body_round_trips_exactly(body: str) -> None:
    message = parse(build(body=body))
    assert text(message) == body


@pytest.mark.parametrize("body", BODIES)
def test_wire_lines_stay_within_998_octets(body: str) -> None:
    raw = build(body=body, html=body)
    assert max(len(line) for line in raw.split(b"\r\n")) <= 998


def test_body_without_final_newline_gets_one() -> None:
    # email's content manager ends text with a line break; nothing else changes.
    assert text(parse(build(body="no newline"))) == "no newline\n"


def test_crlf_line_endings_throughout() -> None:
    raw = build(body="a\nb\n", html="<p>a</p>\n")
    assert b"\n" not in raw.replace(b"\r\n", b"")
    assert b"\r" not in raw.replace(b"\r\n", b"")


def test_message_id_present_once_and_exact() -> None:
    raw = build()
    message = parse(raw)
    assert message.get_all("Message-ID") == [MID]
    assert raw.count(b"\r\nMessage-ID: ") == 1
    assert f"\r\nMessage-ID: {MID}\r\n".encode() in raw


def test_long_message_id_is_never_encoded_or_broken() -> None:
    domain = "outbound-notifications.mail.some-very-long-company-name.example.com"
    mid = message_id_for("order-42", domain)
    raw = build(message_id=mid)
    assert f"\r\nMessage-ID: {mid}\r\n".encode() in raw
    assert parse(raw).get_all("Message-ID") == [mid]


def test_plain_text_only_without_html() -> None:
    message = parse(build())
    assert message.get_content_type() == "text/plain"
    assert message.get_content_charset() == "utf-8"
    assert not message.is_multipart()


def test_multipart_alternative_with_html() -> None:
    html = "<p>Ваш заказ <b>отправлен</b> 🎉</p>\n"
    message = parse(build(body="Ваш заказ отправлен 🎉\n", html=html))
    assert message.get_content_type() == "multipart/alternative"
    parts = list(message.iter_parts())
    assert [p.get_content_type() for p in parts] == ["text/plain", "text/html"]
    assert text(parts[0]) == "Ваш заказ отправлен 🎉\n"
    assert text(parts[1]) == html
    assert all(p.get_content_charset() == "utf-8" for p in parts)


def test_other_headers() -> None:
    message = parse(build(cc=["carol@example.com"], reply_to="help@example.com"))
    assert message["MIME-Version"] == "1.0"
    assert message["Date"].datetime == DATE
    assert str(message["Cc"]) == "carol@example.com"
    assert str(message["Reply-To"]) == "help@example.com"
    assert "Bcc" not in message


def test_no_cc_or_reply_to_headers_when_absent() -> None:
    message = parse(build())
    assert "Cc" not in message
    assert "Reply-To" not in message


def test_date_comes_from_the_given_datetime() -> None:
    tz = timezone(timedelta(hours=9))
    raw = build(date=datetime(2026, 3, 4, 5, 6, 7, tzinfo=tz))
    assert b"\r\nDate: Wed, 04 Mar 2026 05:06:07 +0900\r\n" in raw


@given(st.datetimes(timezones=st.sampled_from([UTC, timezone(timedelta(0)), timezone.min, None])))
def test_the_date_is_written_as_the_email_package_writes_it(date: datetime) -> None:
    # UTC takes the writer's own path, any other zone (or none) the package's.
    assert date_value(date) == email.utils.format_datetime(date)


def test_same_inputs_same_bytes() -> None:
    args: dict[str, Any] = {
        "subject": "订单已发货 🎉",
        "body": "Ваш заказ\n",
        "to": ["张三 <zhang@example.com>"],
        "cc": ["carol@example.com"],
        "reply_to": "help@example.com",
    }
    assert build(**args) == build(**args)
    assert build(**args) != build(**args, date=DATE + timedelta(seconds=1))


def test_same_inputs_same_bytes_with_html() -> None:
    args: dict[str, Any] = {"body": "Thanks\n", "html": "<p>Thanks</p>"}
    assert build(**args) == build(**args)


@pytest.mark.parametrize("separator", ["\x0c", "\x0b", "\x1c"])
def test_no_7bit_line_over_998_octets_with_odd_separators(separator: str) -> None:
    raw = build(body="x" * 600 + separator + "y" * 600 + "\n")
    assert max(len(line) for line in raw.split(b"\r\n")) <= 998


@pytest.mark.parametrize("brk", ["\r", "\n", "\r\nBcc: eve@example.com"])
def test_line_break_in_subject_is_refused(brk: str) -> None:
    with pytest.raises(JobInputError) as info:
        build(subject=f"hello{brk}")
    assert info.value.field == "subject"
    assert str(info.value).startswith("subject: ")


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"from_addr": "not an address"}, "from"),
        ({"to": ["ok@example.com", "a@b"]}, "to[1]"),
        ({"cc": ["bob@example.com\r\nBcc: eve@example.com"]}, "cc[0]"),
        ({"reply_to": "@b.c"}, "reply_to"),
        ({"message_id": MID + "\r\nBcc: eve@example.com"}, "message_id"),
    ],
)
def test_bad_headers_are_refused_naming_the_field(overrides: dict[str, Any], field: str) -> None:
    with pytest.raises(JobInputError) as info:
        build(**overrides)
    assert info.value.field == field


@given(st.binary(max_size=3000))
def test_an_attachment_is_its_stored_base64_in_the_lines_its_data_would_be_encoded_in(
    data: bytes,
) -> None:
    """The part body comes from the canonical text stored at intake, not from decoding and
    encoding the data again at every attempt: the same bytes either way."""
    canonical = base64.b64encode(data).decode("ascii")
    assert wrapped_base64(canonical) == base64.encodebytes(data).replace(b"\n", b"\r\n")
