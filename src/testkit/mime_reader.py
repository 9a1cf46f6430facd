"""Reading raw RFC 5322 messages the way Gmail presents them through its API."""

from __future__ import annotations

import base64
import binascii
import html
import re
from email.header import decode_header, make_header
from email.message import Message
from email.parser import BytesParser
from email.policy import compat32
from typing import Any

_FOLD = re.compile(r"\r?\n(?=[ \t])")
_WS = re.compile(r"\s+")


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode("ascii")


def decode_b64url(text: str) -> bytes:
    """Gmail accepts base64url with or without padding (and plain base64 too)."""
    cleaned = "".join(text.split())
    padded = cleaned + "=" * (-len(cleaned) % 4)
    try:
        if "+" in cleaned or "/" in cleaned:
            return base64.b64decode(padded, validate=True)
        return base64.urlsafe_b64decode(padded.encode("ascii"))
    except (binascii.Error, ValueError, UnicodeEncodeError) as exc:
        raise ValueError("raw is not valid base64url") from exc


def parse(raw: bytes) -> Message:
    # compat32 keeps headers as the client wrote them; the modern policy would "repair"
    # odd Message-ID values, and an emulator must not be kinder than the real thing.
    return BytesParser(policy=compat32).parsebytes(raw)


def unfold(value: Any) -> str:
    return _FOLD.sub("", str(value)).strip()


def decoded(value: Any) -> str:
    text = unfold(value)
    try:
        return str(make_header(decode_header(text)))
    except (ValueError, LookupError, UnicodeDecodeError):
        return text


def header(message: Message, name: str) -> str | None:
    value = message.get(name)
    return None if value is None else unfold(value)


def normalize_message_id(value: str) -> str:
    """The form rfc822msgid: compares: no quotes, no angle brackets, case folded."""
    text = value.strip().strip('"').strip()
    if text.startswith("<") and text.endswith(">"):
        text = text[1:-1]
    return text.strip().lower()


def replace_message_id(raw: bytes, new_value: str) -> bytes:
    """raw with every Message-ID header removed and `new_value` put first.

    Works on bytes so the rest of the message stays exactly as the client sent it.
    """
    newline = b"\r\n" if b"\r\n" in raw[:4096] else b"\n"
    split = re.search(rb"\r?\n\r?\n", raw)
    head, rest = (raw[: split.start()], raw[split.start() :]) if split else (raw, b"")
    kept: list[bytes] = []
    skipping = False
    for line in re.split(rb"\r?\n", head):
        if line[:1] in (b" ", b"\t") and skipping:
            continue
        skipping = line.lower().startswith(b"message-id:")
        if not skipping:
            kept.append(line)
    first = b"Message-ID: " + new_value.encode("ascii")
    return newline.join([first, *[line for line in kept if line]]) + rest


def split_related(body: bytes, content_type: str) -> list[tuple[dict[str, str], bytes]]:
    """The parts of a multipart/related upload, each as (lower-cased headers, bytes).

    Split by hand: the email parser would re-serialise the message/rfc822 part, and the
    stored copy must be byte-for-byte what the client uploaded.
    """
    match = re.search(r'boundary="?([^";]+)"?', content_type, re.IGNORECASE)
    if match is None:
        raise ValueError("multipart upload without a boundary")
    delimiter = b"--" + match.group(1).encode("ascii")
    chunks = body.split(delimiter)
    parts: list[tuple[dict[str, str], bytes]] = []
    for chunk in chunks[1:]:
        if chunk.startswith(b"--"):
            break
        chunk = chunk.removeprefix(b"\r\n").removeprefix(b"\n")
        sep = re.search(rb"\r?\n\r?\n", chunk)
        if sep is None:
            head, content = chunk, b""
        else:
            head, content = chunk[: sep.start()], chunk[sep.end() :]
        if content.endswith(b"\r\n"):
            content = content[:-2]
        elif content.endswith(b"\n"):
            content = content[:-1]
        headers: dict[str, str] = {}
        for line in re.split(rb"\r?\n", head):
            if b":" in line:
                name, value = line.split(b":", 1)
                headers[name.decode("latin-1").strip().lower()] = value.decode("latin-1").strip()
        parts.append((headers, content))
    if not parts:
        raise ValueError("multipart upload without parts")
    return parts


def headers_json(part: Message, only: set[str] | None = None) -> list[dict[str, str]]:
    return [
        {"name": name, "value": decoded(value)}
        for name, value in part.items()
        if only is None or name.lower() in only
    ]


def payload_json(part: Message, part_id: str = "") -> dict[str, Any]:
    body: dict[str, Any]
    result: dict[str, Any] = {
        "partId": part_id,
        "mimeType": part.get_content_type(),
        "filename": part.get_filename() or "",
        "headers": headers_json(part),
    }
    if part.is_multipart():
        children = part.get_payload()
        assert isinstance(children, list)
        body = {"size": 0}
        result["body"] = body
        result["parts"] = [
            payload_json(child, f"{part_id}.{index}" if part_id else str(index))
            for index, child in enumerate(children)
        ]
    else:
        data = part.get_payload(decode=True)
        content = data if isinstance(data, bytes) else b""
        body = {"size": len(content)}
        if content:
            body["data"] = b64url(content)
        result["body"] = body
    return result


def snippet(message: Message, limit: int = 200) -> str:
    for part in message.walk():
        if part.get_content_type() == "text/plain" and not part.is_multipart():
            data = part.get_payload(decode=True)
            if not isinstance(data, bytes):
                continue
            charset = part.get_content_charset() or "utf-8"
            try:
                text = data.decode(charset, errors="replace")
            except LookupError:
                text = data.decode("utf-8", errors="replace")
            # Gmail's snippets are HTML-escaped, which surprises people who print them.
            # Only the head is looked at: a report quoting megabytes costs no more.
            head = text.lstrip()[: limit * 20]
            return html.escape(_WS.sub(" ", head).strip()[:limit])
    return ""
