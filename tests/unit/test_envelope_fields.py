"""The envelope's own header reader (`ledger/message.py: _plain_fields`) gives
what the email package's parser gives, on any header block: the envelope the SMTP
provider submits must not depend on which of the two read it."""

from __future__ import annotations

from email.parser import BytesHeaderParser
from email.utils import getaddresses

from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.message import Envelope, _plain_fields

NAMES = ["To", "to", "CC", "Bcc", "Message-ID", "message-id", "Subject", "X-To", "From"]
ENDS = [b"\r\n", b"\n", b"\r"]
WORDS = [
    "alice@example.com",
    "Bob <bob@example.com>",
    '"Carol, C." <carol@example.com>',
    "<mid.1@example.com>",
    ",",
    ":",
    " ",
    "\t",
    "(comment)",
    "=?utf-8?q?x?=",
    "",
]


@st.composite
def header_blocks(draw: st.DrawFn) -> bytes:
    """Mostly plain blocks (one line end throughout, header lines and their folds), now
    and then a line or a line end that sends the block to the package."""
    end = draw(st.sampled_from([b"\r\n", b"\n"]))
    value = st.lists(st.sampled_from(WORDS), max_size=4).map(" ".join)
    header = st.tuples(st.sampled_from(NAMES), st.sampled_from([": ", ":", ":\t"]), value)
    fold = st.tuples(st.sampled_from([" ", "\t", "  "]), value)
    odd = st.one_of(
        st.sampled_from(
            [b"no colon", b": empty name", b"From someone", b"To : x", b"To: \xc3\xa9"]
        ),
        st.text(st.characters(min_codepoint=1, max_codepoint=127), max_size=12).map(str.encode),
    )
    lines = []
    for kind in draw(st.lists(st.integers(0, 19), max_size=8)):
        if kind < 12:
            line = "".join(draw(header)).encode()
        elif kind < 18:
            line = "".join(draw(fold)).encode()
        else:
            line = draw(odd)
        lines.append(line + (draw(st.sampled_from(ENDS)) if kind == 19 else end))
    return b"".join(lines) + end


def package_fields(head: bytes) -> dict[str, list[str]]:
    headers = BytesHeaderParser().parsebytes(head)
    names = ("to", "cc", "bcc", "message-id")
    return {name: [str(v) for v in headers.get_all(name) or ()] for name in names}


@settings(max_examples=600)
@given(header_blocks())
def test_a_plain_block_reads_as_the_package_reads_it(head: bytes) -> None:
    found = _plain_fields(head)
    if found is not None:
        assert found == package_fields(head)


@settings(max_examples=300)
@given(header_blocks(), st.sampled_from([b"body\r\n", b"", b".\r\nmore\r\n"]))
def test_the_envelope_is_the_package_s_whichever_reader_took_the_block(
    head: bytes, body: bytes
) -> None:
    raw = head + body
    envelope = Envelope(raw)
    reference = package_fields(envelope._raw[: envelope._head_end])
    recipients = reference["to"] + reference["cc"] + reference["bcc"]
    assert envelope.recipients == [addr for _, addr in getaddresses(recipients) if addr]
    ids = reference["message-id"]
    assert envelope.message_id == (ids[0].strip() if ids else "")


def test_blocks_that_are_not_plain_go_to_the_package() -> None:
    assert _plain_fields(b"To: caf\xc3\xa9@example.com\r\n\r\n") is None
    assert _plain_fields(b"To: a@example.com\rCc: b@example.com\r\n\r\n") is None
    assert _plain_fields(b" folded first\r\nTo: a@example.com\r\n\r\n") is None
    assert _plain_fields(b"From someone\r\nTo: a@example.com\r\n\r\n") is None
    folded = b"To: Alice <alice@example.com>,\r\n\tBob <bob@example.com>\r\nX-A: 1\r\n\r\n"
    assert _plain_fields(folded) == package_fields(folded)
    assert Envelope(folded).recipients == ["alice@example.com", "bob@example.com"]
