"""The SMTP outcome table (daemon/providers/smtp_classify.py), the envelope of a raw
message, the smtp-imap settings and the policy refusal of `retry` with a client copy."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from daemon.config.settings import ConfigError, settings_from_dict
from daemon.providers.base import SendKind
from daemon.providers.smtp_classify import Stage, classify_smtp, queue_id_from_reply
from ledger.message import Envelope
from policies.loader import PolicyLoadError, load_policy_dir

MID = "<job-1@mail.example.com>"
BEFORE_DOT = [s for s in Stage if s is not Stage.END_OF_DATA]


@given(st.sampled_from(BEFORE_DOT), st.one_of(st.none(), st.integers(-1, 999)), st.text())
def test_nothing_before_the_final_dot_is_ever_sent(
    stage: Stage, code: int | None, text: str
) -> None:
    """Only a 5xx refuses for good; a garbled reply (smtplib's -1) is tried again. While
    the content was written, anything but a refusal (a success, a garbled line) proves
    nothing either way: searched."""
    outcome = classify_smtp(stage, code, text, message_id=MID)
    if stage is Stage.CONTENT and code is not None and not 400 <= code < 600:
        assert outcome.kind is SendKind.UNKNOWN
        return
    assert outcome.kind is SendKind.REJECTED
    assert outcome.transient is (code is None or not 500 <= code < 600)


@given(st.text())
def test_no_reply_after_the_final_dot_is_unknown(text: str) -> None:
    assert classify_smtp(Stage.END_OF_DATA, None, text, message_id=MID).kind is SendKind.UNKNOWN


@given(st.integers(100, 699), st.text())
def test_reply_after_the_final_dot(code: int, text: str) -> None:
    outcome = classify_smtp(Stage.END_OF_DATA, code, text, message_id=MID)
    if 200 <= code < 300:
        assert outcome.kind is SendKind.CONFIRMED and outcome.provider_message_id
    elif 400 <= code < 500:
        assert outcome.kind is SendKind.REJECTED and outcome.transient
    elif 500 <= code < 600:
        assert outcome.kind is SendKind.REJECTED and not outcome.transient
    else:
        assert outcome.kind is SendKind.UNKNOWN


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2.0.0 Ok: queued as 4XyZ12abC", "4XyZ12abC"),
        ("OK id=1qZ9ab-000abc-XY", "1qZ9ab-000abc-XY"),
        ("2.0.0 3AT9ABCD012345 Message accepted for delivery", "3AT9ABCD012345"),
        ("2.0.0 OK", None),
    ],
)
def test_queue_id_from_reply(text: str, expected: str | None) -> None:
    assert queue_id_from_reply(text) == expected
    outcome = classify_smtp(Stage.END_OF_DATA, 250, text, message_id=MID)
    assert outcome.provider_message_id == (expected or MID)


addresses = st.from_regex(r"[a-z]{1,8}@[a-z]{1,8}\.test", fullmatch=True)


@given(st.lists(addresses, min_size=1, max_size=4), st.lists(addresses, max_size=3), st.text())
def test_envelope_takes_every_recipient_and_hides_bcc(
    to: list[str], bcc: list[str], body: str
) -> None:
    head = f"From: a@b.test\r\nTo: {', '.join(to)}\r\nMessage-ID: {MID}\r\n"
    if bcc:
        head += "Bcc: " + ",\r\n ".join(bcc) + "\r\n"
    raw = (head + "Subject: x\r\n\r\n").encode() + body.encode("utf-8", "replace")
    envelope = Envelope(raw)
    assert envelope.recipients == to + bcc
    assert envelope.message_id == MID
    assert b"Bcc" not in envelope.data.split(b"\r\n\r\n", 1)[0]
    wire = envelope.wire_data()
    assert wire.endswith(b"\r\n.\r\n")
    # Dot-stuffing: no line of the payload is a lone "." before the end.
    assert b"\r\n.\r\n" not in wire[:-3]


SMTP = {
    "kind": "smtp-imap",
    "smtp_host": "smtp.example.com",
    "imap_host": "imap.example.com",
    "username": "support@example.com",
    "password_file": "mail-password",
}


def test_smtp_settings_defaults_and_refusals() -> None:
    config = settings_from_dict({"providers": {"mail": SMTP}}).providers["mail"]
    assert config.kind == "smtp-imap"
    cases: list[tuple[dict[str, object], str]] = [
        ({"smtp_security": "none"}, "providers.mail.smtp_security: "),
        ({"imap_port": 0}, "providers.mail.imap_port: "),
        ({"sent_copy": "both"}, "providers.mail.sent_copy: "),
        ({"credentials_file": "x"}, "providers.mail.credentials_file: unknown key"),
        (
            {"kind": "exchange"},
            'providers.mail.kind: expected "gmail", "smtp-imap" or "graph", got \'exchange\'',
        ),
    ]
    for change, message in cases:
        with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
            settings_from_dict({"providers": {"mail": {**SMTP, **change}}})
    loopback = {**SMTP, "smtp_host": "127.0.0.1", "smtp_security": "none"}
    assert settings_from_dict({"providers": {"mail": loopback}}).providers["mail"]


def test_retry_is_refused_for_a_client_copy_provider(tmp_path: Path) -> None:
    (tmp_path / "receipts.toml").write_text(
        'provider = "mail"\nfrom = "a@example.com"\nmessage_id_domain = "example.com"\n'
        'on_unknown = "retry"\n'
    )
    assert load_policy_dir(tmp_path, client_copy_providers=())
    with pytest.raises(PolicyLoadError) as info:
        load_policy_dir(tmp_path, client_copy_providers={"mail"})
    problem = str(info.value.problems[0])
    assert "receipts.toml" in problem and "on_unknown" in problem and "sent_copy" in problem


@pytest.mark.parametrize(
    ("stage", "code", "unavailable"),
    [
        (Stage.CONNECT, None, True),  # refused, DNS, connect timeout, TLS
        (Stage.HELLO, None, True),  # STARTTLS handshake failed
        (Stage.CONNECT, 421, True),  # greeting: "service not available"
        (Stage.MAIL, 421, True),  # 421 before DATA
        (Stage.RCPT, 421, True),
        (Stage.AUTH, None, False),  # a session that broke later: not sent, still counted
        (Stage.RCPT, 450, False),  # a definite refusal for now behaves as before
        (Stage.RCPT, 550, False),
        (Stage.END_OF_DATA, 421, False),  # after the data: transient, counted
        (Stage.CONNECT, -1, True),  # a garbled greeting: no SMTP server there
        (Stage.HELLO, -1, True),
        (Stage.AUTH, -1, False),
    ],
)
def test_unavailable_only_before_data_and_without_a_session(
    stage: Stage, code: int | None, unavailable: bool
) -> None:
    outcome = classify_smtp(stage, code, "text", message_id="<m@x>")
    assert outcome.kind is SendKind.REJECTED and outcome.unavailable is unavailable
    assert outcome.transient or code == 550


@given(st.lists(st.sampled_from([b"a", b".", b"\r", b"\n", b"\r\n", b"x.", b"\n."]), max_size=40))
def test_wire_data_is_crlf_lines_and_stuffed_dots_whatever_the_line_ends(
    chunks: list[bytes],
) -> None:
    """The payload counts before it rewrites: the same bytes as rewriting every time."""
    raw = b"To: a@b.test\r\nMessage-ID: <m@x.test>\r\n\r\n" + b"".join(chunks)
    expected = re.sub(rb"(?m)^\.", b"..", re.sub(rb"\r\n|\r|\n", b"\r\n", raw))
    if not expected.endswith(b"\r\n"):
        expected += b"\r\n"
    assert Envelope(raw).wire_data() == expected + b".\r\n"
