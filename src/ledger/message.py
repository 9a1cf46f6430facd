"""The bytes a provider is handed (`Provider.send_raw(raw)`, docs/architecture.md "The
message"): `render_checked` makes them from a job, in one place, for the intake and for the
dispatch alike, and `Envelope` is the SMTP envelope those bytes give, which the check holds
to the job and the SMTP provider submits.

In the ledger beside the writer (`mime.py`) and its proof (`wire_check.py`): the intake and
the dispatch share it without importing each other, and the SMTP provider takes the
envelope from here, so the engine names no provider (tests/unit/test_layers.py).
"""

from __future__ import annotations

import hashlib
import importlib.util
import re
import sys
import threading
from collections.abc import Sequence
from datetime import UTC, datetime
from email.parser import BytesHeaderParser
from email.utils import getaddresses
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from ledger import SOURCES_AT_IMPORT, sources_seen
from ledger.mime import MessageFields, mailboxes, render_message
from ledger.wire_check import Mismatch, RenderMismatch, checked_message

if TYPE_CHECKING:  # the writer's pure tests run without eventsourcing (make test-py313)
    from ledger.job import SendJob

_CRLF = b"\r\n"
_EOLS = re.compile(rb"\r\n|\r|\n")
_LEADING_DOT = re.compile(rb"(?m)^\.")
_HEADER_END = re.compile(rb"\r?\n\r?\n")
# A Bcc header with its folded continuation lines.
_BCC = re.compile(rb"(?im)^bcc:[^\r\n]*(?:\r?\n[ \t][^\r\n]*)*\r?\n")


_ENVELOPE_FIELDS = ("to", "cc", "bcc", "message-id")
# A field's value: the rest of its line, then its folded lines; any line end but a bare CR.
_VALUE = rb"[^\r\n]*\r?\n(?:[ \t][^\r\n]*\r?\n)*"
# A plain header block, ending at its blank line: header lines as the email package's feed
# parser takes them (its headerRE, less the "From " line and the empty name it also lets
# in), each with its value.
_PLAIN_BLOCK = re.compile(rb"(?:[\041-\071\073-\176]+:" + _VALUE + rb")*\r?\n")
_ENVELOPE_FIELD = re.compile(rb"(?im)^(to|cc|bcc|message-id):(" + _VALUE + rb")")


def _plain_fields(head: bytes) -> dict[str, list[str]] | None:
    """To, Cc, Bcc and Message-ID of a plain header block, each value exactly as the email
    package gives it (compat32: the first line's value without its leading blanks, the
    folded lines after it as they are, the last line end dropped); None for any block that
    is not plain (a byte above 127, a bare CR, a line that is neither a header nor its
    continuation, a first line that is a continuation, no blank line at its end), which
    the package then reads itself. The envelope's half of the check before a claim that
    proves its message, and every SMTP send's: the package's parser costs several times
    this (docs/performance.md "The SMTP path"), and tests/unit/test_envelope_fields.py
    holds the two to the same answer."""
    if not head.isascii() or _PLAIN_BLOCK.fullmatch(head) is None:
        return None
    found: dict[str, list[str]] = {name: [] for name in _ENVELOPE_FIELDS}
    for match in _ENVELOPE_FIELD.finditer(head):
        value = match.group(2).decode("ascii").lstrip(" \t").rstrip("\r\n")
        found[match.group(1).decode("ascii").lower()].append(value)
    return found


# The last envelope each thread parsed: a claim that proves its message parses the envelope
# to check it (`render_checked`) and hands the same bytes to `send_raw` in the same worker,
# which then need not parse them again (docs/performance.md "The SMTP path").
_last = threading.local()


class Envelope:
    """The SMTP envelope of a raw message: recipients from To, Cc and Bcc; the data
    without its Bcc header (Bcc recipients must not see each other)."""

    def __init__(self, raw: bytes) -> None:
        match = _HEADER_END.search(raw)
        self._raw = raw
        self._head_end = match.end() if match else len(raw)
        head = raw[: self._head_end]
        found = _plain_fields(head)
        if found is None:
            headers = BytesHeaderParser().parsebytes(head)
            found = {n: [str(v) for v in headers.get_all(n) or ()] for n in _ENVELOPE_FIELDS}
        fields = found["to"] + found["cc"] + found["bcc"]
        self.recipients = [addr for _, addr in getaddresses(fields) if addr]
        self.message_id = found["message-id"][0].strip() if found["message-id"] else ""
        _last.envelope = self

    @classmethod
    def of(cls, raw: bytes) -> Envelope:
        """The envelope of `raw`: the one this thread parsed last when it was of this very
        bytes object (bytes are immutable: the same object, the same envelope), else
        parsed now."""
        last: Envelope | None = getattr(_last, "envelope", None)
        if last is not None and last._raw is raw:
            return last
        return cls(raw)

    @cached_property
    def data(self) -> bytes:
        """The message without its Bcc header. Made on first use: the dispatch's check
        before a claim (`render_checked`) reads only the recipients and the Message-ID."""
        head_end = self._head_end
        return _BCC.sub(b"", self._raw[:head_end]) + self._raw[head_end:]

    @cached_property
    def eight_bit(self) -> bool:
        """Whether the data has a byte above 127 (then MAIL asks for BODY=8BITMIME)."""
        return not self.data.isascii()

    def wire_data(self) -> bytes:
        """DATA's payload: CRLF line ends, leading dots doubled, then CRLF . CRLF. The
        messages sendledger writes already end every line with CR LF and seldom start one
        with a dot: counted first (C loops over the bytes), rewritten only when needed."""
        data = self.data
        line_ends = data.count(_CRLF)
        if data.count(b"\r") != line_ends or data.count(b"\n") != line_ends:
            data = _EOLS.sub(_CRLF, data)
        if data.startswith(b".") or b"\n." in data:
            data = _LEADING_DOT.sub(b"..", data)
        if not data.endswith(_CRLF):
            data += _CRLF
        return data + b"." + _CRLF


def render(job: SendJob) -> bytes:
    """The job's raw message, rendered and proved (`render_checked`); identical bytes for
    every attempt of the job."""
    return render_checked(job)


def writer_fingerprint() -> str:
    """Which writer and proof this process runs: a digest of the domain's source files
    (the writer `mime.py`, the proof `wire_check.py` and every module they read the job
    with), of the libraries they call (`WRITER_LIBRARIES`) and of the Python that runs
    them. The same installed release gives the same fingerprint in every process; any
    change of that code, of those libraries or of Python, another.

    Taken once, as this module is imported, just after the writer and the proof were
    (`_WRITER`): a daemon's first claim can come hours later, after an upgrade has put
    other sources on disk, and a digest of those would vouch for code it does not run.
    "" (every claim proves, the intake records no writer) when the sources were already
    no longer those the process first imported the package from (`ledger/__init__.py`):
    `sendledger api` loads the job's validation at its start and this module at its
    first submission, and after an upgrade in place it would run a mix of two releases."""
    return _WRITER


#: Libraries whose code decides the bytes: idna maps an internationalized domain to the
#: ASCII form the writer puts in the headers and the envelope (`addresses.py`), and a new
#: release of it may map the same stored domain otherwise.
WRITER_LIBRARIES = ("idna",)


def sources_fingerprint(folder: Path, libraries: Sequence[str] = ()) -> str:
    """The digest of `folder`'s Python sources, of each library's (found without being
    imported) and of this Python; "" when they cannot all be found and read or this
    module's own is not among them (an install without its sources), and then every
    claim proves its message again."""
    sources = [(path.name, path) for path in sorted(folder.glob("*.py"))]
    if Path(__file__).name not in {name for name, _ in sources}:
        return ""
    for library in libraries:
        spec = importlib.util.find_spec(library)
        if spec is None or spec.origin is None:
            return ""
        package = Path(spec.origin).parent
        sources += [(f"{library}/{path.name}", path) for path in sorted(package.glob("*.py"))]
    digest = hashlib.sha256(sys.version.encode())
    try:
        for name, path in sources:
            digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    except OSError:
        return ""
    return digest.hexdigest()[:32]


def _writer() -> str:
    folder = Path(__file__).parent
    digest = sources_fingerprint(folder, WRITER_LIBRARIES)
    # Looked at after the digest: a file replaced before or while it was read differs.
    if sources_seen(str(folder)) != SOURCES_AT_IMPORT:
        return ""
    return digest


_WRITER = _writer()


def message_date(job: SendJob) -> datetime:
    """The Date the job's message carries: its creation, in UTC (`mime.date_value` writes
    it), the same at every attempt."""
    return job.created_on.astimezone(UTC)


def render_checked(job: SendJob) -> bytes:
    """The one place a job becomes bytes, at intake and before the claim: rendered by
    `ledger/mime.py`, proved by `ledger/wire_check.py` to say exactly what the job says,
    and the SMTP envelope those bytes give (`Envelope`, the other parser of them) held to
    the job's to, cc and bcc. RenderMismatch naming the field when the proof fails
    (intake: a refusal; dispatch: review, `render-mismatch`).

    A job whose very message this writer proved at intake (its proved_by, recorded by
    the intake with the time it rendered the message at, which is the job's creation) is
    only rendered: the same code on the same fields writes the same bytes, so proving
    them again would prove what was proved. Any other job (written by another release,
    or not through the intake) is proved here (docs/architecture.md "The message")."""
    fields = MessageFields.of(
        job.content,
        from_addr=job.from_addr,
        message_id=job.message_id,
        date=message_date(job),
    )
    fingerprint = writer_fingerprint()
    if fingerprint and job.proved_by == fingerprint:
        return render_message(fields)
    raw = checked_message(fields)
    recipients = [
        box.addr_spec
        for field, addresses in (("to", fields.to), ("cc", fields.cc), ("bcc", fields.bcc))
        for box in mailboxes(field, addresses)
    ]
    envelope = Envelope(raw)
    if envelope.recipients != recipients or envelope.message_id != fields.message_id:
        reason = f"the SMTP envelope would be {envelope.recipients}, the job's {recipients}"
        raise RenderMismatch(Mismatch("to", reason))
    return raw


__all__ = [
    "Envelope",
    "message_date",
    "render",
    "render_checked",
    "sources_fingerprint",
    "writer_fingerprint",
]
