"""What a caller submits: the job JSON, validated, normalized and hashed.

The content hash is what makes intake idempotent: the same key with the same content
is the same job; the same key with other content is a conflict, never an overwrite.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ledger.addresses import AddressError, parse_mailbox, unsafe_character

REQUIRED_FIELDS = ("channel", "key", "to", "subject", "body")
OPTIONAL_FIELDS = ("html", "cc", "reply_to")
MAX_KEY_LENGTH = 1000


class JobInputError(ValueError):
    """Bad job input. `field` names the offending field for a one-line error."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


@dataclass(frozen=True)
class JobContent:
    channel: str
    key: str
    to: tuple[str, ...]
    subject: str
    body: str
    html: str | None = None
    cc: tuple[str, ...] = ()
    reply_to: str | None = None

    def canonical(self) -> dict[str, Any]:
        return {
            "channel": self.channel,
            "key": self.key,
            "to": list(self.to),
            "cc": list(self.cc),
            "reply_to": self.reply_to,
            "subject": self.subject,
            "body": self.body,
            "html": self.html,
        }

    @classmethod
    def from_canonical(cls, fields: Mapping[str, Any]) -> JobContent:
        """The inverse of :meth:`canonical` (extra names in ``fields`` are ignored)."""
        return cls(
            channel=fields["channel"],
            key=fields["key"],
            to=tuple(fields["to"]),
            cc=tuple(fields["cc"]),
            reply_to=fields["reply_to"],
            subject=fields["subject"],
            body=fields["body"],
            html=fields["html"],
        )

    @property
    def content_hash(self) -> str:
        encoded = json.dumps(
            self.canonical(), sort_keys=True, ensure_ascii=False, separators=(",", ":")
        )
        return "sha256:" + hashlib.sha256(encoded.encode("utf-8")).hexdigest()


def reject_line_breaks(field: str, value: str) -> None:
    # A CR or LF in a header value would let a caller inject headers (Bcc, a second
    # Message-ID) into the message we promise to send exactly once.
    if "\r" in value or "\n" in value:
        raise JobInputError(field, "must not contain CR or LF")


def validate_address(field: str, value: str) -> str:
    """One mailbox ("Name <a@b.c>" or "a@b.c"), strictly (``ledger/addresses.py``);
    returns it re-rendered canonically."""
    try:
        return str(parse_mailbox(value))
    except AddressError as exc:
        raise JobInputError(field, str(exc)) from None


def _addresses(field: str, value: object, *, required: bool) -> tuple[str, ...]:
    if value is None and not required:
        return ()
    items: list[object]
    if isinstance(value, str):
        items = [value]
    elif isinstance(value, list):
        items = list(value)
    else:
        raise JobInputError(field, "must be an address or a list of addresses")
    if required and not items:
        raise JobInputError(field, "needs at least one address")
    result = []
    for index, item in enumerate(items):
        name = field if isinstance(value, str) else f"{field}[{index}]"
        if not isinstance(item, str):
            raise JobInputError(name, "must be a string")
        result.append(validate_address(name, item))
    return tuple(result)


def reject_unsafe_header_text(field: str, value: str) -> None:
    """A header value (subject) is refused for what :func:`unsafe_character` names: what
    cannot be built, or could show a reader something other than what it says."""
    reject_line_breaks(field, value)
    bad = unsafe_character(value)
    if bad:
        raise JobInputError(field, f"must not contain {bad}")


def _text(field: str, value: object, *, header: bool, required: bool = True) -> str:
    if not isinstance(value, str):
        raise JobInputError(field, "must be a string" if required else "must be a string or null")
    if header:
        reject_line_breaks(field, value)
    if "\x00" in value:
        raise JobInputError(field, "must not contain NUL characters")
    if any(0xD800 <= ord(char) <= 0xDFFF for char in value):
        # JSON can spell one ("\ud800"); it cannot be encoded, so the message cannot be built.
        raise JobInputError(field, "must not contain a lone surrogate (invalid Unicode)")
    return value


def _subject(value: object) -> str:
    subject = _text("subject", value, header=True)
    reject_unsafe_header_text("subject", subject)
    return subject


def parse_job(data: object) -> JobContent:
    """Validate a submitted job (already decoded from JSON)."""
    if not isinstance(data, Mapping):
        raise JobInputError("job", "must be a JSON object")
    unknown = sorted(set(data) - set(REQUIRED_FIELDS) - set(OPTIONAL_FIELDS))
    if unknown:
        raise JobInputError(unknown[0], "unknown field")
    for field in REQUIRED_FIELDS:
        if field not in data:
            raise JobInputError(field, "is required")
    channel = _text("channel", data["channel"], header=True)
    if not channel:
        raise JobInputError("channel", "must not be empty")
    key = _text("key", data["key"], header=True)
    if not key.strip():
        raise JobInputError("key", "must not be empty")
    if len(key) > MAX_KEY_LENGTH:
        raise JobInputError("key", f"longer than {MAX_KEY_LENGTH} characters")
    html_value = data.get("html")
    reply_to = data.get("reply_to")
    if reply_to is not None and not isinstance(reply_to, str):
        raise JobInputError("reply_to", "must be one address")
    return JobContent(
        channel=channel,
        key=key,
        to=_addresses("to", data["to"], required=True),
        subject=_subject(data["subject"]),
        body=_text("body", data["body"], header=False),
        html=None if html_value is None else _text("html", html_value, header=False),
        cc=_addresses("cc", data.get("cc"), required=False),
        reply_to=None if reply_to is None else validate_address("reply_to", reply_to),
    )
