"""Form fields and query parameters as the bytes a client sent: UTF-8 text, or refused
naming the field (docs/http-api.md "Errors and statuses", docs/review.md "Review page").

Starlette decodes a query string and an `application/x-www-form-urlencoded` body with
`urllib.parse.unquote`, whose errors are "replace": `note=caf%E9` (a Latin-1 client's
`café`) arrived as `caf\ufffd`, stored in the trail as text nobody typed, and
`?channel=caf%E9` listed no job of channel `café` rather than saying why. A
`multipart/form-data` field that is not UTF-8 was read as Latin-1. Here the same
`name=value` pairs (and multipart fields) are read as bytes, percent escapes decoded, and
each must decode as UTF-8 strictly; the door answers its own refusal for the first that
does not.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import unquote_to_bytes

import python_multipart
from python_multipart.multipart import parse_options_header

from ledger.exceptions import SendledgerError

#: What the refusal says after the byte: how the field's text must come.
HOW = "a field's text is its UTF-8 bytes, percent-encoded"

#: The fields (and, of a multipart form, the files) the form parser takes at most:
#: Starlette's `request.form()` default, which FastAPI keeps. It refuses a form of more
#: (400) once it reads one more, and so the check of a form's fields stops there too: it
#: read all of a 40 MB body's fields, on the event loop and before the sign-in.
MAX_FIELDS = 1000

_PAIR = re.compile(rb"[^&]+")


class _Enough(SendledgerError):
    """The multipart check has read what it needs: a field that is not text, or one
    field or file past what the form parser takes."""


@dataclass(frozen=True)
class NotText:
    """The first field whose bytes are not UTF-8: its name (as far as it is text) and the
    first byte that is not."""

    field: str
    byte: int

    @property
    def reason(self) -> str:
        return f"not UTF-8 text (byte 0x{self.byte:02x}): {HOW}"


def _strict(raw: bytes) -> int | None:
    """The first byte of `raw` that is not UTF-8 text, else None."""
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return raw[exc.start]
    return None


def _name(raw: bytes) -> str:
    # A name that is not text itself is shown as its escapes: the line names it still.
    return raw.decode("utf-8", "backslashreplace")


def _checked(name: bytes, value: bytes) -> NotText | None:
    byte = _strict(name)
    if byte is None:
        byte = _strict(value)
    return None if byte is None else NotText(_name(name), byte)


def in_pairs(encoded: bytes, most: int | None = None) -> NotText | None:
    """The first `name=value` of a query string or urlencoded body (`+` a space, percent
    escapes decoded) that is not UTF-8 text, else None; None too once past `most` pairs
    (a form's: the form parser refuses the form then, and counts pairs as this does)."""
    for count, pair in enumerate(_PAIR.finditer(encoded), start=1):
        if most is not None and count > most:
            return None
        name, _, value = pair[0].replace(b"+", b" ").partition(b"=")
        found = _checked(unquote_to_bytes(name), unquote_to_bytes(value))
        if found is not None:
            return found
    return None


_RAW = re.compile(rb"[\x80-\xff]")


def percent_escaped(encoded: bytes) -> bytes:
    """An urlencoded body with each byte past ASCII percent-escaped.
    `curl -d 'note=café'` sends `é` as its two raw UTF-8 bytes; Starlette reads raw bytes
    as Latin-1 (`cafÃ©`), escaped ones as UTF-8 (`café`)."""
    return _RAW.sub(lambda byte: b"%%%02X" % byte[0][0], encoded)


def in_multipart(boundary: bytes, body: bytes) -> NotText | None:
    """The first field of a multipart body (a file's content aside) that is not UTF-8;
    None too once past :data:`MAX_FIELDS` fields or files, which the parser refuses."""
    found: list[NotText] = []
    counts = {True: 0, False: 0}  # files, fields
    header: list[bytes] = [b"", b""]
    part: dict[str, bytes] = {}
    data = bytearray()

    def on_part_begin() -> None:
        part.clear()
        data.clear()

    def on_header_field(chunk: bytes, start: int, end: int) -> None:
        header[0] += chunk[start:end]

    def on_header_value(chunk: bytes, start: int, end: int) -> None:
        header[1] += chunk[start:end]

    def on_header_end() -> None:
        part[header[0].decode("latin-1").lower()] = header[1]
        header[0] = header[1] = b""

    def on_part_data(chunk: bytes, start: int, end: int) -> None:
        data.extend(chunk[start:end])

    def on_part_end() -> None:
        _, options = parse_options_header(part.get("content-disposition", b""))
        a_file = b"filename" in options
        counts[a_file] += 1
        if counts[a_file] > MAX_FIELDS:
            raise _Enough
        if a_file:
            return
        result = _checked(options.get(b"name", b""), bytes(data))
        if result is not None:
            found.append(result)
            raise _Enough

    parser = python_multipart.MultipartParser(
        boundary,
        {
            "on_part_begin": on_part_begin,
            "on_header_field": on_header_field,
            "on_header_value": on_header_value,
            "on_header_end": on_header_end,
            "on_part_data": on_part_data,
            "on_part_end": on_part_end,
        },
    )
    try:
        parser.write(body)
        parser.finalize()
    except _Enough:
        pass
    except python_multipart.exceptions.FormParserError:
        pass  # a malformed body is the form parser's to refuse, after this
    return found[0] if found else None


def urlencoded(content_type: str) -> bool:
    return parse_options_header(content_type)[0] == b"application/x-www-form-urlencoded"


def in_form(content_type: str, body: bytes) -> NotText | None:
    """The first field of a form body, by its `Content-Type`, that is not UTF-8 text."""
    kind, options = parse_options_header(content_type)
    if urlencoded(content_type):
        return in_pairs(body, MAX_FIELDS)
    if kind == b"multipart/form-data" and options.get(b"boundary"):
        return in_multipart(options[b"boundary"], body)
    return None


__all__ = [
    "HOW",
    "MAX_FIELDS",
    "NotText",
    "in_form",
    "in_multipart",
    "in_pairs",
    "percent_escaped",
    "urlencoded",
]
