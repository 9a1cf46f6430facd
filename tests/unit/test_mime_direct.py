"""For a plain message, sendledger's own writer writes exactly the bytes the standard
library's email package wrote before it (so messages stored and compared before keep
their bytes); the reference below is that email package code path, kept only here.

Outside the plain case the writer differs on purpose (docs/cli.md "Message fields and
validation"): what is not plain ASCII is written as our own encoded words, never by the
email package.
"""

from __future__ import annotations

import email.policy
from datetime import UTC, datetime, timedelta, timezone
from email.message import EmailMessage
from email.utils import format_datetime
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ledger.header_encoding import fold
from ledger.message_id import message_id_for
from ledger.mime import build_message

_POLICY = email.policy.SMTP.clone(max_line_length=78, refold_source="none")


def _set_folded(message: EmailMessage, name: str, value: str) -> None:
    # Folded by our code then, too: the email package stored it as given.
    message.set_raw(name, fold(name, value.split(" "))[len(name) + 2 :])


def build_with_email_package(**args: Any) -> bytes:
    """The message as the email package wrote it (the code path before issue 16)."""
    message = EmailMessage(policy=_POLICY)
    message["From"] = args["from_addr"]
    message["To"] = ", ".join(args["to"])
    if args.get("cc"):
        message["Cc"] = ", ".join(args["cc"])
    if args.get("reply_to"):
        message["Reply-To"] = args["reply_to"]
    message["Subject"] = args["subject"]
    message["Date"] = format_datetime(args["date"])
    message["Message-ID"] = args["message_id"]
    if args.get("in_reply_to") is not None:
        _set_folded(message, "In-Reply-To", args["in_reply_to"])
    if args.get("references"):
        _set_folded(message, "References", " ".join(args["references"]))
    if args.get("bcc"):
        message["Bcc"] = ", ".join(args["bcc"])
    for name, value in args.get("headers", ()):
        _set_folded(message, name, value)
    message["MIME-Version"] = "1.0"
    body = args["body"]
    lines = body.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    cte = "7bit" if body.isascii() and all(len(line) <= 998 for line in lines) else "base64"
    message.set_content(body, subtype="plain", charset="utf-8", cte=cte)
    return message.as_bytes(policy=_POLICY)


words = st.text(alphabet="abcXYZ019'_-", min_size=1, max_size=12)
message_id = st.text("abcdef0123456789", min_size=1, max_size=40).map(
    lambda key: message_id_for(key, "mail.example.com")
)
date = st.builds(
    lambda seconds, minutes: (
        datetime(2026, 1, 1, tzinfo=UTC).astimezone(timezone(timedelta(minutes=minutes)))
        + timedelta(seconds=seconds)
    ),
    st.integers(0, 10**9),
    st.integers(-12 * 60, 14 * 60),
)
extra_name = st.sampled_from(["X-Campaign", "List-Unsubscribe", "X-a", "X-Tag_1"])
# A plain message: ASCII words in the headers, any text in the body.
simple_mailbox = st.one_of(
    st.builds(
        lambda loc, dom: f"{loc}@{dom}.com", words.filter(str.isalnum), words.filter(str.isalnum)
    ),
    st.builds(
        lambda name, loc: f"{name} <{loc}@example.com>",
        st.lists(words, min_size=1, max_size=3).map(" ".join),
        # Not starting with "-": intake refuses that as Postfix does (docs/cli.md).
        st.text("abc019_+-", min_size=1, max_size=10).filter(lambda loc: loc[0] != "-"),
    ),
)
simple_text = st.lists(
    st.text("abcXYZ019!#:;<>/", min_size=1, max_size=10), min_size=1, max_size=5
).map(" ".join)
any_text = st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=100)
simple = {
    "from_addr": simple_mailbox,
    "to": st.lists(simple_mailbox, min_size=1, max_size=2),
    "subject": simple_text,
    "body": st.one_of(st.text(alphabet="ab \r\n.é€", max_size=200), any_text),
    "message_id": message_id,
    "date": date,
    "cc": st.lists(simple_mailbox, max_size=1),
    "reply_to": st.none() | simple_mailbox,
    "bcc": st.lists(simple_mailbox, max_size=1),
    "headers": st.lists(
        st.tuples(extra_name, simple_text), max_size=2, unique_by=lambda h: h[0]
    ).map(tuple),
    "in_reply_to": st.none() | message_id,
    "references": st.lists(message_id, max_size=4),
}


def unfolded(raw: bytes) -> bool:
    head = raw.split(b"\r\n\r\n", 1)[0]
    return b"\r\n " not in head


TYPICAL: dict[str, Any] = {
    "from_addr": "Support <support@example.com>",
    "to": ["Alice <alice@example.com>"],
    "subject": "Your receipt 7",
    "body": "Thanks for order 7.\n",
    "message_id": message_id_for("order-7", "mail.example.com"),
    "date": datetime(2026, 1, 1, 12, tzinfo=UTC),
}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.fixed_dictionaries(simple))
@example(TYPICAL)
@example({**TYPICAL, "body": ""})
@example({**TYPICAL, "date": datetime(2026, 1, 1, 12)})  # naive: "-0000"
@example({**TYPICAL, "body": "a\rb\r\nc\n\nd"})
@example({**TYPICAL, "body": "é" * 100})
@example({**TYPICAL, "references": ["<a@b.c>"] * 12, "in_reply_to": "<a@b.c>"})
def test_a_plain_message_is_written_as_the_email_package_wrote_it(args: dict[str, Any]) -> None:
    reference = build_with_email_package(**args)
    if unfolded(reference):  # the email package folded longer lines its own way
        assert build_message(**args) == reference


def test_a_typical_job_keeps_its_bytes() -> None:
    full = dict(
        TYPICAL,
        cc=["Bob <bob@example.com>"],
        reply_to="help@example.com",
        bcc=["audit@example.com"],
        headers=(("X-Campaign", "spring"),),
        in_reply_to="<a@example.com>",
        references=["<a@example.com>", "<b@example.com>"],
        body="Grüße\n",
    )
    assert build_message(**full) == build_with_email_package(**full)
    assert build_message(**TYPICAL) == build_with_email_package(**TYPICAL)
