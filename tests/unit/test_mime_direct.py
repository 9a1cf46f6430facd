"""The direct path of build_message writes exactly the bytes the email package writes.

`ledger.mime.build_message` writes the common plain-text message itself and hands
everything else to the email package (`direct=False` forces it). Whatever it is given,
the two must agree: the same bytes, or the same refusal. The strategies aim at the edges
of what the direct path takes (specials in display names, encoded-word look-alikes, long
lines, spacing, non-ASCII, surrogates), so both sides of each edge are compared.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ledger.message_id import message_id_for
from ledger.mime import _direct_plain, build_message


def build_with_email_package(**args: Any) -> bytes:
    return build_message(**args, direct=False)


NAME_CHARS = "AZaz09 '_-.,\"@=?é<>()\\"
LOCAL_CHARS = "az09._+-'=/"
words = st.text(alphabet="abcXYZ019'_-", min_size=1, max_size=12)
display = st.one_of(
    st.lists(words, min_size=1, max_size=4).map(" ".join),
    st.text(alphabet=NAME_CHARS, max_size=20),
)
local = st.one_of(
    st.lists(st.text("abc019_+-", min_size=1, max_size=10), min_size=1, max_size=3).map(".".join),
    st.text(alphabet=LOCAL_CHARS, min_size=1, max_size=70),
)
label = st.one_of(
    st.text("abcxyz019", min_size=1, max_size=10),
    st.sampled_from(["xn--bcher-kva", "XN--bcher-kva", "123", "a-b", "-a", "a" * 63, "a" * 64]),
)
domain = st.lists(label, min_size=1, max_size=4).map(".".join)
spec = st.builds(lambda loc, dom: f"{loc}@{dom}", local, domain)
mailbox = st.one_of(
    spec,
    st.builds(lambda name, addr: f"{name} <{addr}>", display, spec),
    st.sampled_from(["Support <support@example.com>", "bücher.de <a@bücher.de>", "a@[1.2.3.4]"]),
)
header_text = st.one_of(
    st.lists(st.text("abcXYZ019!#:;<>", min_size=1, max_size=15), min_size=1, max_size=8).map(
        " ".join
    ),
    st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=90),
    st.text(alphabet=" a=?\t\r\nq", max_size=12),
    st.sampled_from(["", " lead", "trail ", "two  spaces", "=?utf-8?q?x?=", "x" * 80]),
)
body = st.one_of(
    st.text(alphabet="ab \r\n.é€", max_size=200),
    st.text(max_size=300),
    st.builds(lambda n: "x" * n + "\n", st.integers(990, 1005)),
    st.just("Thanks for order 7.\n"),
)
message_id = st.one_of(
    st.text("abcdef0123456789", min_size=1, max_size=40).map(
        lambda key: message_id_for(key, "mail.example.com")
    ),
    st.builds(lambda a, b: f"<{a}@{b}>", st.text("abc.=?/", max_size=80), domain),
    st.sampled_from(["no-brackets@example.com", "<a@b>\r\nBcc: x@y.z"]),
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
# Fields the direct path takes: a message made of these must be written directly.
simple_mailbox = st.one_of(
    st.builds(
        lambda loc, dom: f"{loc}@{dom}.com", words.filter(str.isalnum), words.filter(str.isalnum)
    ),
    st.builds(
        lambda name, loc: f"{name} <{loc}@example.com>",
        st.lists(words, min_size=1, max_size=3).map(" ".join),
        st.text("abc019_+-", min_size=1, max_size=10),
    ),
)
simple_text = st.lists(
    st.text("abcXYZ019!#:;<>/", min_size=1, max_size=10), min_size=1, max_size=5
).map(" ".join)
simple = {
    "from_addr": simple_mailbox,
    "to": st.lists(simple_mailbox, min_size=1, max_size=2),
    "subject": simple_text,
    "body": st.one_of(st.text(alphabet="ab \r\n.é€", max_size=200), st.text(max_size=100)),
    "message_id": message_id,
    "date": date,
    "cc": st.lists(simple_mailbox, max_size=1),
    "reply_to": st.none() | simple_mailbox,
    "bcc": st.lists(simple_mailbox, max_size=1),
    "headers": st.lists(st.tuples(extra_name, simple_text), max_size=2).map(tuple),
    "in_reply_to": st.none() | message_id,
    "references": st.lists(message_id, max_size=4),
}
edgy = {
    "from_addr": mailbox,
    "to": st.lists(mailbox, min_size=1, max_size=3),
    "subject": header_text,
    "body": body,
    "message_id": message_id,
    "date": date,
    "cc": st.lists(mailbox, max_size=2),
    "reply_to": mailbox,
    "bcc": st.lists(mailbox, max_size=2),
    "headers": st.lists(st.tuples(extra_name, header_text), max_size=2).map(tuple),
    "in_reply_to": st.one_of(message_id, header_text),
    "references": st.lists(message_id, max_size=12),
}


@st.composite
def messages(draw: st.DrawFn) -> dict[str, Any]:
    """A simple message, with one or two fields (or none) drawn from the edges."""
    args = {name: draw(strategy) for name, strategy in simple.items()}
    for name in draw(st.lists(st.sampled_from(sorted(edgy)), max_size=2)):
        args[name] = draw(edgy[name])
    return args


def outcome(build: Any, args: dict[str, Any]) -> tuple[str, object]:
    try:
        return "bytes", build(**args)
    except Exception as exc:
        return "refused", (type(exc), str(exc))


TYPICAL: dict[str, Any] = {
    "from_addr": "Support <support@example.com>",
    "to": ["Alice <alice@example.com>"],
    "subject": "Your receipt 7",
    "body": "Thanks for order 7.\n",
    "message_id": message_id_for("order-7", "mail.example.com"),
    "date": datetime(2026, 1, 1, 12, tzinfo=UTC),
}


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages())
@example(TYPICAL)
@example({**TYPICAL, "subject": ""})
@example({**TYPICAL, "reply_to": ""})
@example({**TYPICAL, "body": ""})
@example({**TYPICAL, "date": datetime(2026, 1, 1, 12)})  # naive: "-0000"
@example({**TYPICAL, "body": "a\rb\r\nc\n\nd"})
@example({**TYPICAL, "body": "\ud800"})
@example({**TYPICAL, "body": "é" * 100})
@example({**TYPICAL, "to": ["J. Smith <j@example.com>"]})
@example({**TYPICAL, "references": ["<a@b.c>"] * 12, "in_reply_to": "<a@b.c>"})
def test_direct_path_writes_what_the_email_package_writes(args: dict[str, Any]) -> None:
    assert outcome(build_message, args) == outcome(build_with_email_package, args)


def test_a_typical_job_takes_the_direct_path() -> None:
    """The speed-up is the direct path: a plain job with ASCII headers must take it (and
    with a display name, cc, reply-to, bcc, threading and extra headers)."""
    plain = dict(TYPICAL, cc=[], reply_to=None, bcc=[], headers=(), in_reply_to=None)
    plain["references"] = []
    assert _direct_plain(**plain) is not None
    full = dict(
        plain,
        cc=["Bob <bob@example.com>"],
        reply_to="help@example.com",
        bcc=["audit@example.com"],
        headers=(("X-Campaign", "spring"),),
        in_reply_to="<a@example.com>",
        references=["<a@example.com>", "<b@example.com>"],
        body="Grüße\n",
    )
    assert _direct_plain(**full) == build_with_email_package(**full)
