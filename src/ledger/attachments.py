"""Attachments of a job: `[{"filename", "content_type", "content_base64"}]`, validated at
intake (docs/cli.md, "Message fields"). The message carries them as parts of a
multipart/mixed message with RFC 2231 file names (`ledger/mime.py`)."""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass
from typing import Any

from ledger.characters import unsafe_character
from ledger.exceptions import Refusal, SendledgerError

FIELDS = ("filename", "content_type", "content_base64")
MAX_FILENAME = 255
# RFC 2045 type/subtype tokens.
_TOKEN = r"[!#$%&'*+.^_`{|}~0-9A-Za-z-]+"
_CONTENT_TYPE = re.compile(rf"^({_TOKEN})/({_TOKEN})\Z")
# Whitespace a base64 encoder may wrap its output with.
_WRAPPING = re.compile(r"[ \t\r\n]+")


class AttachmentError(SendledgerError, ValueError):
    """`field` is the attachment's own field name ("filename", ...), or "" for the item."""

    kind = Refusal.BAD_INPUT

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(reason)
        self.field = field
        self.reason = reason


@dataclass(frozen=True)
class Attachment:
    filename: str
    content_type: str  # lower-case "type/subtype"
    content_base64: str  # canonical: standard alphabet, padded, unwrapped

    @property
    def data(self) -> bytes:
        return base64.b64decode(self.content_base64)

    @property
    def maintype(self) -> str:
        return self.content_type.split("/", 1)[0]

    @property
    def subtype(self) -> str:
        return self.content_type.split("/", 1)[1]

    def canonical(self) -> dict[str, str]:
        return {
            "filename": self.filename,
            "content_type": self.content_type,
            "content_base64": self.content_base64,
        }


def parse_attachment(item: object) -> Attachment:
    """One attachment object, or AttachmentError naming the bad field."""
    if not isinstance(item, dict):
        raise AttachmentError("", "must be an object with filename, content_type, content_base64")
    unknown = sorted(set(item) - set(FIELDS))
    if unknown:
        raise AttachmentError(unknown[0], "unknown field")
    for name in FIELDS:
        if name not in item:
            raise AttachmentError(name, "is required")
        if not isinstance(item[name], str):
            raise AttachmentError(name, "must be a string")
    return Attachment(
        filename=_filename(item["filename"]),
        content_type=_content_type(item["content_type"]),
        content_base64=_base64(item["content_base64"]),
    )


def filename_problem(value: str) -> str | None:
    """Why `value` may not be an attachment's file name, or None. The mail writer
    (`ledger/mime.py`) writes an accepted name so that a client shows exactly these
    characters (RFC 2231, never an encoded word), so the rules below hold for what the
    reader sees, and `ledger/wire_check.py` checks them again on the decoded name."""
    if not value.strip() or value != value.strip():
        return "must not be empty or start or end with a space"
    if len(value) > MAX_FILENAME:
        return f"longer than {MAX_FILENAME} characters"
    # A path would be a question to the recipient's mail program of where to write it.
    if "/" in value or "\\" in value or value.strip(".") == "":
        return "must be a file name, not a path"
    bad = unsafe_character(value)
    if bad:
        return f"must not contain {bad}"
    # Mail readers unquote a parameter wrapped so (Python's email.utils.unquote among them):
    # "<a>" and '"a"' would reach the recipient as "a", not as the name that was sent.
    if len(value) >= 2 and (value[0], value[-1]) in (("<", ">"), ('"', '"')):
        return "must not be wrapped in <> or double quotes"
    # Many clients decode an encoded word in a file name, against RFC 2231, whatever its
    # form: "=?utf-8?q?=2E=2E=2F.bashrc?=" would be saved as "../.bashrc".
    if "=?" in value:
        return "must not contain '=?' (an encoded word)"
    return None


def _filename(value: str) -> str:
    problem = filename_problem(value)
    if problem:
        raise AttachmentError("filename", problem)
    return value


def _content_type(value: str) -> str:
    match = _CONTENT_TYPE.match(value)
    if not match:
        raise AttachmentError(
            "content_type", f"not a type/subtype such as application/pdf: {value!r}"
        )
    if match.group(1).lower() in ("multipart", "message"):
        # Their bodies have a structure of their own that a plain base64 part cannot carry.
        raise AttachmentError("content_type", f"{match.group(1).lower()}/* cannot be attached")
    return value.lower()


def _base64(value: str) -> str:
    try:
        data = base64.b64decode(_WRAPPING.sub("", value), validate=True)
    except (binascii.Error, ValueError):
        raise AttachmentError("content_base64", "does not decode as base64") from None
    return base64.b64encode(data).decode("ascii")


def from_stored(items: list[Any]) -> tuple[Attachment, ...]:
    """Attachments as the Requested event stores them (already validated at intake)."""
    return tuple(
        Attachment(item["filename"], item["content_type"], item["content_base64"]) for item in items
    )
