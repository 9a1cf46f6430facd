"""The proof that a rendered message says exactly what its job says (docs/cli.md "Message
fields and validation", docs/architecture.md "The message").

`ledger/mime.py` writes the bytes; this module reads them back with a strict parser of
its own and compares them with the job, field by field: one header block ending at the
first CR LF CR LF; well-formed header lines (printable ASCII, continuations only by
folding); exactly one From, To, Subject, Date, Message-ID, and a Cc, Bcc, Reply-To,
In-Reply-To, References and each extra header exactly when the job has one, no other
header; the Message-ID the job's; the recipients (To, Cc, Bcc: what the Gmail API and the
SMTP envelope take) the job's; the subject, display names, extra header values and file
names as a client decodes them equal to the job's, and still within the display rules;
the MIME tree exactly the job's parts, with a boundary that occurs nowhere else.

Nothing here trusts the writer: a mismatch names the job's field (a :class:`Mismatch`),
and :func:`checked_message` raises it as :class:`RenderMismatch`, a JobInputError (at
intake a refusal, at dispatch review with reason ``render-mismatch``). Linear in the
message's size.
"""

from __future__ import annotations

import base64
import binascii
import functools
import re
from dataclasses import dataclass
from email.utils import format_datetime

from ledger.addresses import unquote
from ledger.attachments import Attachment, filename_problem
from ledger.characters import unsafe_character
from ledger.content import JobInputError
from ledger.exceptions import SendledgerError
from ledger.header_encoding import MAX_LINE, client_view, parameter_value
from ledger.mime import MessageFields, mailboxes, render_message, wire_text

_FIELD_NAME = re.compile(r"[!-9;-~]+")
_WORD = r"=\?utf-8\?b\?[A-Za-z0-9+/]*={0,2}\?="
_OUR_WORDS = re.compile(rf"{_WORD}(?: {_WORD})*")
_TOKEN = re.compile(r"[!#$%&'*+.^_`{|}~0-9A-Za-z-]+")
_ADDR_SPEC = re.compile(r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~.-]+@[A-Za-z0-9.-]+")
# Header name (lower case) -> the job field it carries.
_FIELDS = {
    "from": "from",
    "to": "to",
    "cc": "cc",
    "bcc": "bcc",
    "reply-to": "reply_to",
    "subject": "subject",
    "date": "date",
    "message-id": "message_id",
    "in-reply-to": "in_reply_to",
    "references": "references",
}


@dataclass(frozen=True)
class Mismatch:
    """Where the rendered bytes differ from the job: the job's `field`, and how."""

    field: str
    reason: str


class RenderMismatch(JobInputError):
    """The rendered message does not say what the job says (a :class:`Mismatch`)."""

    def __init__(self, mismatch: Mismatch) -> None:
        super().__init__(mismatch.field, f"the rendered message differs: {mismatch.reason}")
        self.mismatch = mismatch


class _Bad(SendledgerError):
    # Never shown: find_mismatch returns its mismatch (BaseException keeps the args).
    def __init__(self, field: str, reason: str) -> None:
        self.mismatch = Mismatch(field, reason)


def checked_message(fields: MessageFields) -> bytes:
    """The message rendered and proved; RenderMismatch when the proof fails (a bug in the
    writer, or a job the writer cannot carry faithfully), JobInputError when the job
    cannot be rendered at all."""
    raw = render_message(fields)
    found = find_mismatch(raw, fields)
    if found is not None:
        raise RenderMismatch(found)
    return raw


def find_mismatch(raw: bytes, fields: MessageFields) -> Mismatch | None:
    """The first difference between `raw` and the job's `fields`, or None."""
    try:
        headers, body = _entity(raw)
        _check_headers(headers, fields)
        _check_tree(headers, body, _expected_tree(fields), "body")
    except _Bad as bad:
        return bad.mismatch
    return None


def carries_message_id(raw: bytes, message_id: str) -> bool:
    """Whether `raw`'s one header block holds exactly one Message-ID, `message_id`."""
    try:
        headers, _ = _entity(raw)
    except _Bad:
        return False
    return [value for name, value in headers if name.lower() == "message-id"] == [message_id]


# -- header blocks ------------------------------------------------------------------------


def _entity(data: bytes, where: str = "body") -> tuple[list[tuple[str, str]], bytes]:
    # One header block, ending at the first CR LF CR LF; each value unfolded, without the
    # one space after the colon.
    end = data.find(b"\r\n\r\n")
    if end < 0:
        raise _Bad(where, "no end of the header block")
    head = data[:end]
    if not head.isascii():
        raise _Bad(where, "a header holds a byte that is not ASCII")
    fields: list[tuple[str, list[str]]] = []  # each value's lines, joined once at the end
    for line in head.decode("ascii").split("\r\n"):
        if not line.isprintable():
            raise _Bad(where, f"a header line holds a control character: {line[:60]!r}")
        if len(line) > MAX_LINE:
            raise _Bad(where, "a header line is longer than 998 octets")
        if line.startswith(" "):
            if not fields or not line.strip():
                raise _Bad(where, "a header line starts with a space")
            fields[-1][1].append(line)
            continue
        name, colon, value = line.partition(":")
        # "Name: value", or "Name:" alone for an empty value (an empty subject).
        if not colon or not _FIELD_NAME.fullmatch(name) or value[:1] not in ("", " "):
            raise _Bad(where, f"not a header line: {line[:60]!r}")
        fields.append((name, [value[1:]]))
    return [(name, "".join(lines)) for name, lines in fields], data[end + 4 :]


def _field_of(name: str) -> str:
    # Only top-level headers other than Content-* come here (the tree checks those).
    lower = name.lower()
    if lower in _FIELDS:
        return _FIELDS[lower]
    if lower == "mime-version":
        return "body"
    return f"headers.{name}"


def _check_headers(headers: list[tuple[str, str]], fields: MessageFields) -> None:
    wanted: dict[str, str] = {"from": "From", "to": "To", "subject": "Subject"}
    wanted.update({"date": "Date", "message-id": "Message-ID", "mime-version": "MIME-Version"})
    for present, name in (
        (fields.cc, "Cc"),
        (fields.bcc, "Bcc"),
        (fields.reply_to is not None, "Reply-To"),
        (fields.in_reply_to is not None, "In-Reply-To"),
        (fields.references, "References"),
    ):
        if present:
            wanted[name.lower()] = name
    extra = {name.lower(): value for name, value in fields.headers}
    wanted.update({name.lower(): name for name, _ in fields.headers})
    seen: dict[str, str] = {}
    for name, value in headers:
        lower = name.lower()
        if lower.startswith("content-"):
            continue  # the tree's, checked there
        if lower not in wanted:
            raise _Bad(_field_of(name), f"a {name} header the job does not have")
        if lower in seen:
            raise _Bad(_field_of(name), f"more than one {name} header")
        seen[lower] = value
    for lower, name in wanted.items():
        if lower not in seen:
            raise _Bad(_field_of(name), f"no {name} header")
    _sender_equal("from", seen["from"], fields.from_addr)
    _mailboxes_equal("to", seen["to"], fields.to)
    if fields.cc:
        _mailboxes_equal("cc", seen["cc"], fields.cc)
    if fields.bcc:
        _mailboxes_equal("bcc", seen["bcc"], fields.bcc)
    if fields.reply_to is not None:
        _sender_equal("reply_to", seen["reply-to"], fields.reply_to)
    _text_equal("subject", seen["subject"], fields.subject)
    _equal("date", seen["date"], format_datetime(fields.date))
    _equal("message_id", seen["message-id"], fields.message_id)
    _equal("body", seen["mime-version"], "1.0")
    if fields.in_reply_to is not None:
        _equal("in_reply_to", seen["in-reply-to"], fields.in_reply_to)
        _one_form("in_reply_to", seen["in-reply-to"])  # a message id is never encoded
    if fields.references:
        _equal("references", seen["references"], " ".join(fields.references))
        _one_form("references", seen["references"])
    for name, _ in fields.headers:
        _text_equal(f"headers.{name}", seen[name.lower()], extra[name.lower()])


def _equal(field: str, found: str, expected: str) -> None:
    if found != expected:
        raise _Bad(field, f"carries {found[:80]!r}, the job {expected[:80]!r}")


def _one_form(field: str, raw: str) -> None:
    # Either no "=?" at all or nothing but our encoded words: then every client, however
    # it finds and decodes encoded words, shows the same text.
    if "=?" in raw and not _OUR_WORDS.fullmatch(raw):
        raise _Bad(field, f"encoded words mixed with other text: {raw[:80]!r}")


def _text_equal(field: str, found: str, expected: str) -> None:
    _one_form(field, found)
    shown = client_view(found)
    if shown != expected:
        raise _Bad(field, f"a client shows {shown[:80]!r}, the job says {expected[:80]!r}")
    bad = unsafe_character(shown)
    if bad:
        raise _Bad(field, f"a client would show {bad}")


# -- address lists ------------------------------------------------------------------------


def _mailboxes_equal(field: str, value: str, expected: tuple[str, ...] | list[str]) -> None:
    want = [(box.display_name, box.addr_spec) for box in mailboxes(field, expected)]
    found = _address_list(field, value)
    if [spec for _, spec in found] != [spec for _, spec in want]:
        raise _Bad(field, f"the recipients are {[s for _, s in found]}, the job's {want}")
    for (name, _), (wanted, _) in zip(found, want, strict=True):
        if name != wanted:
            raise _Bad(field, f"a client shows the name {name[:80]!r}, the job {wanted[:80]!r}")
        bad = unsafe_character(name)
        if bad:
            raise _Bad(field, f"a client would show {bad}")


def _sender_equal(field: str, value: str, expected: str) -> None:
    found = _sender_mismatch(field, value, expected)
    if found is not None:
        raise _Bad(found.field, found.reason)


# A sender's From (and Reply-To) header reads the same in every message of its channel.
# Its check reads nothing but the header's value as `_entity` unfolded it from these very
# bytes and the job's text (every check of the lines themselves, their characters, length
# and folding, runs on each message's own bytes in `_entity`), so its verdict is a pure
# function of those two strings and is kept for them: a value that differs by one
# character is another key, checked afresh. A job text that cannot be parsed raises, and
# is not kept (lru_cache keeps no exceptions).
@functools.lru_cache(maxsize=4096)
def _sender_mismatch(field: str, value: str, expected: str) -> Mismatch | None:
    try:
        _mailboxes_equal(field, value, [expected])
    except _Bad as bad:
        return bad.mismatch
    return None


def _address_list(field: str, value: str) -> list[tuple[str, str]]:
    """(display name as a client shows it, addr-spec) of each mailbox: only the forms the
    writer uses (atoms, one quoted string or encoded words, then <addr-spec>; or a bare
    addr-spec), so a comment, a group, a route or a second address is a mismatch."""
    result: list[tuple[str, str]] = []
    for text in _split_top_level(field, value):
        text = text.strip(" ")
        if not text.endswith(">"):
            if not _ADDR_SPEC.fullmatch(text):
                raise _Bad(field, f"not one address: {text[:80]!r}")
            result.append(("", text))
            continue
        start = text.rfind("<")
        spec = text[start + 1 : -1]
        if start < 0 or not _ADDR_SPEC.fullmatch(spec):
            raise _Bad(field, f"not one address: {text[:80]!r}")
        result.append((_display(field, text[:start].rstrip(" ")), spec))
    return result


def _split_top_level(field: str, value: str) -> list[str]:
    if _QUOTING_OR_REFUSED.search(value) is None:
        return value.split(",")  # what the walk gives when it meets none of them
    return _walk_top_level(field, value)


def _walk_top_level(field: str, value: str) -> list[str]:
    parts: list[str] = []
    start, quoted, escaped = 0, False, False
    for index, char in enumerate(value):
        if escaped:
            escaped = False
        elif quoted:
            if char == "\\":
                escaped = True
            elif char == '"':
                quoted = False
        elif char == '"':
            quoted = True
        elif char == ",":
            parts.append(value[start:index])
            start = index + 1
        elif char in "()[]:;\\":
            raise _Bad(field, f"{char!r} outside a quoted string")
    if quoted:
        raise _Bad(field, "an unterminated quoted string")
    parts.append(value[start:])
    return parts


# What the walk in `_walk_top_level` treats other than as text: a quote, an escape, or
# a character it refuses outside a quoted string.
_QUOTING_OR_REFUSED = re.compile(r'["()\[\]:;\\]')


def _display(field: str, text: str) -> str:
    if text.startswith('"'):
        return client_view(_unquoted(field, text))
    if any(char in text for char in '"<>@'):
        raise _Bad(field, f"a display name with a special character: {text[:80]!r}")
    _one_form(field, text)
    return client_view(text)


def _unquoted(field: str, text: str) -> str:
    inner = unquote(text)
    if inner is None:
        raise _Bad(field, f"a display name that is not one quoted string: {text[:80]!r}")
    if "=?" in inner:
        raise _Bad(field, f"an encoded word inside a quoted display name: {text[:80]!r}")
    return inner


# -- the MIME tree ------------------------------------------------------------------------


@dataclass(frozen=True)
class _Text:
    subtype: str
    text: str
    field: str


@dataclass(frozen=True)
class _File:
    attachment: Attachment
    field: str


@dataclass(frozen=True)
class _Multi:
    subtype: str
    parts: tuple[_Text | _File | _Multi, ...]


_Node = _Text | _File | _Multi


def _expected_tree(fields: MessageFields) -> _Node:
    text: _Node = _Text("plain", fields.body, "body")
    if fields.html is not None:
        text = _Multi("alternative", (text, _Text("html", fields.html, "html")))
    if not fields.attachments:
        return text
    files = tuple(
        _File(attachment, f"attachments[{i}]") for i, attachment in enumerate(fields.attachments)
    )
    return _Multi("mixed", (text, *files))


def _params(field: str, value: str) -> tuple[str, dict[str, str]]:
    # `type/subtype; name=token; name="quoted"`: only what the writer writes.
    pieces = value.split(";")
    head = pieces[0].strip(" ")
    params: dict[str, str] = {}
    for piece in pieces[1:]:
        name, equals, raw = piece.strip(" ").partition("=")
        name = name.lower()
        if not equals or not _TOKEN.fullmatch(name) or name in params:
            raise _Bad(field, f"a bad or repeated parameter in {value[:80]!r}")
        if raw.startswith('"'):
            if len(raw) < 2 or not raw.endswith('"') or '"' in raw[1:-1] or "\\" in raw:
                raise _Bad(field, f"a bad quoted parameter in {value[:80]!r}")
            raw = raw[1:-1]
        elif not _TOKEN.fullmatch(raw):
            raise _Bad(field, f"a bad parameter value in {value[:80]!r}")
        params[name] = raw
    return head.lower(), params


def _one(headers: list[tuple[str, str]], name: str, field: str) -> str | None:
    values = [value for key, value in headers if key.lower() == name]
    if len(values) > 1:
        raise _Bad(field, f"more than one {name} header")
    return values[0] if values else None


def _check_tree(headers: list[tuple[str, str]], body: bytes, node: _Node, field: str) -> None:
    where = node.field if isinstance(node, _Text | _File) else field
    allowed = {"content-type", "content-transfer-encoding"}
    if isinstance(node, _File):
        allowed.add("content-disposition")
    for name, _ in headers:
        if name.lower().startswith("content-") and name.lower() not in allowed:
            raise _Bad(where, f"an unexpected {name} header")
    content_type = _one(headers, "content-type", where)
    encoding = _one(headers, "content-transfer-encoding", where)
    if content_type is None:
        raise _Bad(where, "no Content-Type header")
    kind, params = _params(where, content_type)
    if isinstance(node, _Multi):
        if kind != f"multipart/{node.subtype}" or set(params) != {"boundary"} or encoding:
            raise _Bad(where, f"a {kind} part where the job has multipart/{node.subtype}")
        parts = _split_multipart(where, body, params["boundary"], len(node.parts))
        for part, child in zip(parts, node.parts, strict=True):
            child_headers, child_body = _entity(part, where)
            if any(not name.lower().startswith("content-") for name, _ in child_headers):
                raise _Bad(where, "a part with a header that is not Content-*")
            _check_tree(child_headers, child_body, child, where)
        return
    if isinstance(node, _Text):
        if kind != f"text/{node.subtype}" or params != {"charset": "utf-8"}:
            raise _Bad(where, f"a {kind} part where the job has text/{node.subtype}")
        wanted, expected = wire_text(node.text, node.field)
        if encoding != wanted:
            raise _Bad(where, f"encoded as {encoding}, not {wanted}")
        if _decoded(where, body, encoding) != expected:
            raise _Bad(where, "the text differs from the job's")
        return
    attachment = node.attachment
    if kind != attachment.content_type or params or encoding != "base64":
        raise _Bad(where, f"a {kind} part where the job has {attachment.content_type}")
    disposition = _one(headers, "content-disposition", where)
    if disposition is None:
        raise _Bad(f"{where}.filename", "no Content-Disposition header")
    how, file_params = _params(f"{where}.filename", disposition)
    if any("=?" in value for value in file_params.values()):
        raise _Bad(f"{where}.filename", "an encoded word in the file name's parameters")
    shown = parameter_value(file_params, "filename")
    if how != "attachment" or shown is None or shown != attachment.filename:
        raise _Bad(f"{where}.filename", f"a client shows {shown!r}, the job has the name")
    problem = filename_problem(shown)
    if problem:
        raise _Bad(f"{where}.filename", f"a client would show a name that {problem}")
    # The job's attachment is its canonical base64 text (validated at intake, decoded
    # the same way by every reader): the same text on the wire is the same content, and
    # neither needs decoding here.
    if _base64_text(where, body) != attachment.content_base64.encode("ascii"):
        raise _Bad(where, "the content differs from the job's")


def _split_multipart(field: str, body: bytes, mark: str, count: int) -> list[bytes]:
    delimiter = b"--" + mark.encode("ascii")
    close = b"\r\n" + delimiter + b"--\r\n"
    if not body.startswith(delimiter + b"\r\n") or not body.endswith(close):
        raise _Bad(field, "the multipart body does not start and end with its boundary")
    # Every occurrence is a delimiter: a line in a part that starts with the boundary
    # would be a part of its own to some client.
    if body.count(delimiter) != count + 1:
        raise _Bad(field, f"the boundary occurs {body.count(delimiter)} times, not {count + 1}")
    inner = body[len(delimiter) + 2 : len(body) - len(close)]
    return inner.split(b"\r\n" + delimiter + b"\r\n")


def _longest_line(field: str, body: bytes) -> int:
    # Counted, not scanned line by line in Python: a part may be 25 MB.
    line_ends = body.count(b"\r\n")
    if body.count(b"\r") != line_ends or body.count(b"\n") != line_ends:
        raise _Bad(field, "a part with a bare CR or LF")
    return max(map(len, body.split(b"\r\n")))


def _base64_text(field: str, body: bytes) -> bytes:
    """A base64 body's text without its line ends, its lines checked."""
    if _longest_line(field, body) > 76:
        raise _Bad(field, "a base64 line longer than 76 characters")
    return body.replace(b"\r\n", b"")


def _decoded(field: str, body: bytes, encoding: str | None) -> bytes:
    longest = _longest_line(field, body)
    if encoding == "7bit":
        if not body.isascii():
            raise _Bad(field, "a 7bit part with a byte that is not ASCII")
        if longest > MAX_LINE:
            raise _Bad(field, "a line longer than 998 octets")
        return body
    if encoding != "base64":
        raise _Bad(field, f"an unexpected transfer encoding {encoding!r}")
    if longest > 76:
        raise _Bad(field, "a base64 line longer than 76 characters")
    try:
        return base64.b64decode(body.replace(b"\r\n", b""), validate=True)
    except (binascii.Error, ValueError):
        raise _Bad(field, "a base64 part that does not decode") from None


__all__ = ["Mismatch", "RenderMismatch", "carries_message_id", "checked_message", "find_mismatch"]
