"""Delivery status notifications read as the hostile input they are (docs/how-it-works.md
"Bounces: what a report proves").

A bounce arrives in the sender's mailbox as a message anyone could have written. This
module reads one with a strict parser of its own (no I/O, no stdlib `email` code) and
returns either a :class:`DeliveryReport` naming exactly one message of ours, or a
:class:`ReportRefused` saying why it names none. What it accepts:

* at most :data:`MAX_REPORT_BYTES`, checked before anything is parsed;
* a top-level ``multipart/report; report-type=delivery-status`` (RFC 6522, RFC 3464; the
  shape Postfix, Gmail and Microsoft 365 all send), whose parts are split at its own
  boundary only: nested multiparts (a human-readable ``multipart/related``) are left
  unread, so the work is one pass over the bytes whatever the nesting;
* exactly one ``message/delivery-status`` part, with at least one recipient whose
  ``Action`` is ``failed`` (permanent) or ``delayed`` (transient) and whose ``Status`` is
  a 5.x.x or 4.x.x code;
* exactly one original-message part (``text/rfc822-headers``, ``message/rfc822`` or their
  RFC 6533 ``global`` forms) whose header block has exactly one Message-ID, and that
  Message-ID is ours: the ``<job-<32 hex>@domain>`` shape of ``ledger/message_id.py``,
  with one of our ``message_id_domain`` values (or, exactly, the Message-ID of a job the
  caller knows: one sent before its channel's domain changed). Gmail's
  ``X-Original-Message-ID`` in the status part, when present, must name the same message.
  The original's Date, when quoted once, is kept (`DeliveryReport.original_date`): the
  job compares it with its own where its provider sends our Date unchanged.

Anything else is refused with a :class:`ReportRefusal` (a metric label and a log line, never an
event on a job). Which job the report belongs to, and whether that job's mailbox is the one
it arrived in, is for the caller to decide with the index (`daemon/engine/bounces.py`) and
the aggregate (`SendJob.record_bounce`).
"""

from __future__ import annotations

import base64
import binascii
import quopri
import re
from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum

from ledger.exceptions import SendledgerError

__all__ = [
    "MAX_REPORT_BYTES",
    "UNVERIFIED_SAID",
    "BouncedRecipient",
    "DeliveryReport",
    "ReportRefusal",
    "ReportRefused",
    "read_report",
    "said",
]

#: The largest report read: a DSN that quotes a big original message in full is refused
#: unread (docs/providers.md "Bounces").
MAX_REPORT_BYTES = 2 * 1024 * 1024
#: A header block longer than this is not a mail header (a top-level or a part's).
MAX_HEADER_BYTES = 64 * 1024
#: Top-level parts of a report: RFC 3464 has three; a few more for what MTAs add.
MAX_PARTS = 16
#: Recipient blocks read from one report, and the size of the part that holds them (a
#: block is a few hundred bytes: more is no report).
MAX_RECIPIENTS = 100
MAX_STATUS_BYTES = 64 * 1024
#: The longest text kept of a diagnostic, a reporter or a report id.
MAX_TEXT = 300

_HEADER_NAME = re.compile(r"[!-9;-~]+")
_OUR_MESSAGE_ID = re.compile(r"<job-[0-9a-f]{32}@([A-Za-z0-9.-]{1,253})>")
_STATUS = re.compile(r"([245])\.[0-9]{1,3}\.[0-9]{1,3}")
_ADDRESS = re.compile(r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~.-]{1,64}@[A-Za-z0-9.-]{1,253}")
_REPORT_ID = re.compile(r"<[!-;=?-~]{1,250}>")
_STATUS_TYPES = frozenset({"message/delivery-status", "message/global-delivery-status"})
_ORIGINAL_TYPES = frozenset(
    {
        "text/rfc822-headers",
        "message/rfc822-headers",  # seen in the wild, not registered
        "message/rfc822",
        "message/global",
        "message/global-headers",
    }
)
_ENCODINGS = frozenset({"", "7bit", "8bit", "binary", "base64", "quoted-printable"})


class ReportRefusal(StrEnum):
    """Why a message in the mailbox is not recorded as a bounce of any job."""

    TOO_LARGE = "too-large"
    NOT_A_REPORT = "not-a-report"  # not multipart/report; report-type=delivery-status
    MALFORMED = "malformed"
    NO_STATUS = "no-delivery-status"
    NO_ORIGINAL_HEADERS = "no-original-headers"
    AMBIGUOUS = "ambiguous"  # two status or original parts, two Message-IDs, a disagreement
    NO_FAILURE = "no-failure"  # every recipient delivered, relayed or expanded
    NOT_OURS = "not-ours"  # the original's Message-ID is not a job's of our domains
    # Decided by the daemon with the index and the job (daemon/engine/bounces.py).
    UNKNOWN_JOB = "unknown-job"
    OTHER_MAILBOX = "other-mailbox"
    NOT_A_RECIPIENT = "not-a-recipient"
    NOT_WATCHED = "not-watched"
    # Received before the job's first attempt (less the clock margin): written before the
    # message existed, from a Message-ID guessed from the job's key.
    BEFORE_SEND = "before-send"
    # Its original quotes no Date, or not the job's, on a provider that sends the job's
    # Date unchanged (`Provider.keeps_date`): a message the key's Message-ID was put on
    # by someone who guessed the key, not the job's.
    OTHER_DATE = "other-date"
    RECORDED_ALREADY = "recorded-already"  # the same report, read again (not a refusal)
    # Another report about recipients whose bounce of that kind (delayed, failed) the job
    # has recorded already: at most one Bounced per (recipient, permanence), so a flood of
    # reports, each with its own id, does not grow the job's history.
    REPEATED = "repeated"


#: What every recorded report is, as each place that shows a Bounced says it (the job page,
#: `history`, `history --json`, the `bounced` webhook, `sendledger_bounces_total`): no
#: report is proved. Nothing here checks who sent one (its sender, its `Received` lines,
#: its authentication results are what the sender wrote, or what the mailbox's server
#: wrote, and nothing tells the two apart here), so a report is a claim of whoever could
#: write it (docs/how-it-works.md "Bounces: what a report proves"). The event format
#: holds no field for it: no release has proved one.
UNVERIFIED_SAID = (
    "unverified: a report is mail; whoever knows the job's Message-ID and a recipient"
    " (on SMTP + IMAP its Date too) could have written it"
)


@dataclass(frozen=True)
class ReportRefused:
    reason: ReportRefusal
    detail: str = ""


@dataclass(frozen=True)
class BouncedRecipient:
    """One recipient a report says was not (or not yet) delivered."""

    address: str
    status: str  # the RFC 3463 code, "5.1.1"
    action: str  # "failed" or "delayed"
    diagnostic: str  # the remote server's words (printable ASCII, bounded), or ""

    @property
    def permanent(self) -> bool:
        return self.action == "failed"

    def as_dict(self) -> dict[str, str | bool]:
        return {
            "address": self.address,
            "status": self.status,
            "action": self.action,
            "permanent": self.permanent,
            "diagnostic": self.diagnostic,
        }


@dataclass(frozen=True)
class DeliveryReport:
    """A report that names exactly one message of ours and at least one failure."""

    report_id: str  # the report's own Message-ID, "" when it has no usable one
    original_message_id: str  # ours, as the job stores it
    reporter: str  # its Reporting-MTA, or ""
    recipients: tuple[BouncedRecipient, ...]
    # The Date the original's headers quote, whitespace collapsed ("" when they quote
    # none), and the moment it names (None: none, or not an RFC 5322 date-time). Compared
    # with the job's own where the provider sends our Date unchanged
    # (`SendJob.record_bounce`): an outsider who guessed a key knows its Message-ID, not
    # the second its job was created.
    original_date: str = ""
    original_moment: datetime | None = None

    @property
    def permanent(self) -> bool:
        return any(r.permanent for r in self.recipients)


def read_report(
    raw: bytes,
    *,
    domains: Collection[str],
    known: Callable[[str], bool] | None = None,
) -> DeliveryReport | ReportRefused:
    """`raw` read as a delivery status notification about one message of ours, whose
    Message-ID domain is one of `domains` (the policies' `message_id_domain`). `known`:
    whether a Message-ID of our shape on another domain is, exactly, a job's all the same
    (one sent before its channel's domain changed: the index says)."""
    if len(raw) > MAX_REPORT_BYTES:
        return ReportRefused(ReportRefusal.TOO_LARGE, f"{len(raw)} bytes")
    try:
        return _read(raw, {d.lower(): d for d in domains}, known)
    except _Refused as refused:
        return ReportRefused(refused.reason, refused.detail)


class _Refused(SendledgerError):
    def __init__(self, reason: ReportRefusal, detail: str = "") -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


def _read(
    raw: bytes, domains: dict[str, str], known: Callable[[str], bool] | None
) -> DeliveryReport:
    text = raw.decode("latin-1").replace("\r\n", "\n")  # bytes 1:1 to characters
    headers, body = _split_head(text)
    content_type, params = _content_type(headers)
    report_type = params.get("report-type", "").lower()
    if content_type != "multipart/report" or report_type not in (
        "delivery-status",
        "global-delivery-status",
    ):
        raise _Refused(ReportRefusal.NOT_A_REPORT, content_type or "no Content-Type")
    parts = _parts(body, params.get("boundary", ""))
    statuses = [p for p in parts if p[0] in _STATUS_TYPES]
    originals = [p for p in parts if p[0] in _ORIGINAL_TYPES]
    if not statuses:
        raise _Refused(ReportRefusal.NO_STATUS)
    if not originals:
        raise _Refused(ReportRefusal.NO_ORIGINAL_HEADERS)
    if len(statuses) > 1 or len(originals) > 1:
        raise _Refused(ReportRefusal.AMBIGUOUS, "more than one status or original part")
    message_fields, recipients = _status_fields(statuses[0][1])
    original_headers, _rest = _split_head(originals[0][1].lstrip("\n"))
    original = _original_message_id(original_headers, domains, known)
    gmail_says = _one(message_fields, "x-original-message-id")
    if gmail_says is not None and gmail_says.strip() != original:
        raise _Refused(ReportRefusal.AMBIGUOUS, "X-Original-Message-ID names another message")
    date = " ".join((_one(original_headers, "date") or "").split())
    failed = tuple(r for r in (_recipient(block) for block in recipients) if r is not None)
    if not failed:
        raise _Refused(ReportRefusal.NO_FAILURE)
    return DeliveryReport(
        report_id=_report_id(headers),
        original_message_id=original,
        reporter=_printable(_one(message_fields, "reporting-mta") or ""),
        recipients=failed,
        original_date=date,
        original_moment=_moment(date),
    )


Fields = list[tuple[str, str]]


def _split_head(text: str) -> tuple[Fields, str]:
    """The header block (fields, names lower-cased, folded lines joined) and the body."""
    end = text.find("\n\n", 0, MAX_HEADER_BYTES + 2)
    if end < 0:
        if len(text) > MAX_HEADER_BYTES:
            raise _Refused(ReportRefusal.MALFORMED, "header block too long")
        head, body = text, ""
    else:
        head, body = text[:end], text[end + 2 :]
    return _fields(head), body


def _fields(head: str) -> Fields:
    names: list[str] = []
    values: list[list[str]] = []  # a field's lines, joined once (folded lines stay linear)
    for line in head.split("\n"):
        if not line:
            continue
        if line[0] in " \t":
            if not values:
                raise _Refused(ReportRefusal.MALFORMED, "continuation before any field")
            values[-1].append(line.strip())
            continue
        name, colon, value = line.partition(":")
        if not colon or not _HEADER_NAME.fullmatch(name.rstrip()):
            raise _Refused(ReportRefusal.MALFORMED, "a header line without a field name")
        names.append(name.rstrip().lower())
        values.append([value.strip()])
    return [
        (name, " ".join(v for v in lines if v)) for name, lines in zip(names, values, strict=True)
    ]


def _all(fields: Fields, name: str) -> list[str]:
    return [value for field, value in fields if field == name]


def _one(fields: Fields, name: str) -> str | None:
    """The field's value when it occurs once; None when absent; refused when repeated."""
    values = _all(fields, name)
    if len(values) > 1:
        raise _Refused(ReportRefusal.AMBIGUOUS, f"{name} given {len(values)} times")
    return values[0] if values else None


def _content_type(fields: Fields) -> tuple[str, dict[str, str]]:
    value = _one(fields, "content-type")
    if value is None:
        return "", {}
    kind, _, rest = value.partition(";")
    params: dict[str, str] = {}
    for name, param in _parameters(rest):
        if name in params:
            raise _Refused(ReportRefusal.AMBIGUOUS, f"Content-Type parameter {name} given twice")
        params[name] = param
    return kind.strip().lower(), params


def _parameters(text: str) -> list[tuple[str, str]]:
    """`; name=value` pairs, values as tokens or quoted strings (one pass)."""
    found: list[tuple[str, str]] = []
    i, n = 0, len(text)
    while i < n:
        while i < n and text[i] in " \t;":
            i += 1
        start = i
        while i < n and text[i] not in "=;":
            i += 1
        name = text[start:i].strip().lower()
        if i >= n or text[i] != "=":
            if name:
                found.append((name, ""))
            continue
        i += 1
        while i < n and text[i] in " \t":
            i += 1
        if i < n and text[i] == '"':
            i += 1
            chars: list[str] = []
            while i < n and text[i] != '"':
                if text[i] == "\\" and i + 1 < n:
                    i += 1
                chars.append(text[i])
                i += 1
            i += 1
            value = "".join(chars)
        else:
            start = i
            while i < n and text[i] != ";":
                i += 1
            value = text[start:i].strip()
        if name:
            found.append((name, value))
    return found


def _parts(body: str, boundary: str) -> list[tuple[str, str]]:
    """(content type, decoded body) of each part between the report's own boundaries.
    Only whole boundary lines are found (one regular expression with the boundary as its
    literal prefix): one scan of the bytes, and a step per boundary."""
    if not 1 <= len(boundary) <= 70 or any(not " " <= c <= "~" for c in boundary):
        raise _Refused(ReportRefusal.MALFORMED, "no usable boundary")
    text = "\n" + body
    lines = re.compile(r"\n--" + re.escape(boundary) + r"(--)?[ \t]*(?=\n|\Z)")
    parts: list[tuple[str, str]] = []
    start: int | None = None  # where the current part's text begins
    for found in lines.finditer(text):
        if start is not None:
            parts.append(_part(text[start : found.start()]))
        if found.group(1):
            return parts
        if len(parts) >= MAX_PARTS:
            raise _Refused(ReportRefusal.MALFORMED, f"more than {MAX_PARTS} parts")
        start = found.end() + 1
    raise _Refused(ReportRefusal.MALFORMED, "the report's closing boundary is missing")


def _part(text: str) -> tuple[str, str]:
    headers, body = _split_head(text) if not text.startswith("\n") else ([], text[1:])
    content_type, _params = _content_type(headers)
    encoding = (_one(headers, "content-transfer-encoding") or "").strip().lower()
    if encoding not in _ENCODINGS:
        raise _Refused(ReportRefusal.MALFORMED, f"transfer encoding {encoding[:40]!r}")
    return content_type or "text/plain", _decoded(body, encoding)


def _decoded(body: str, encoding: str) -> str:
    if encoding == "base64":
        try:
            data = base64.b64decode("".join(body.split()), validate=True)
        except (binascii.Error, ValueError):
            raise _Refused(ReportRefusal.MALFORMED, "a base64 part does not decode") from None
        return data.decode("latin-1").replace("\r\n", "\n")
    if encoding == "quoted-printable":
        return quopri.decodestring(body.encode("latin-1")).decode("latin-1").replace("\r\n", "\n")
    return body


def _status_fields(body: str) -> tuple[Fields, list[Fields]]:
    """The per-message fields and each per-recipient block of a delivery-status part."""
    if len(body) > MAX_STATUS_BYTES:
        raise _Refused(ReportRefusal.MALFORMED, f"a delivery-status part of {len(body)} bytes")
    blocks = [b for b in re.split(r"\n[ \t]*\n", body.strip("\n")) if b.strip()]
    if not blocks:
        raise _Refused(ReportRefusal.NO_STATUS, "an empty delivery-status part")
    if len(blocks) - 1 > MAX_RECIPIENTS:
        raise _Refused(ReportRefusal.MALFORMED, f"more than {MAX_RECIPIENTS} recipients")
    return _fields(blocks[0]), [_fields(block) for block in blocks[1:]]


def _original_message_id(
    headers: Fields, domains: dict[str, str], known: Callable[[str], bool] | None
) -> str:
    found = _all(headers, "message-id")
    if not found:
        raise _Refused(ReportRefusal.NO_ORIGINAL_HEADERS, "the original headers have no Message-ID")
    if len(found) > 1:
        raise _Refused(
            ReportRefusal.AMBIGUOUS, f"the original headers have {len(found)} Message-IDs"
        )
    value = found[0].strip()
    match = _OUR_MESSAGE_ID.fullmatch(value)
    ours = None if match is None else domains.get(match.group(1).lower())
    if match is not None and ours is None and known is not None and known(value):
        return value  # exactly a job's, on a domain no policy names any more
    if match is None or ours is None:
        raise _Refused(ReportRefusal.NOT_OURS, _printable(value))
    # As the job stores it: the domain as the policy spells it (it compares case-blind).
    return value[: match.start(1)] + ours + ">"


def _recipient(block: Fields) -> BouncedRecipient | None:
    """The recipient a block reports not delivered, or None (delivered, relayed,
    expanded, or a block that does not say who or what)."""
    action = (_one(block, "action") or "").strip().lower()
    status = (_one(block, "status") or "").strip().split(" ")[0]
    match = _STATUS.fullmatch(status)
    if action not in ("failed", "delayed") or match is None or match.group(1) == "2":
        return None
    recipient = _one(block, "original-recipient") or _one(block, "final-recipient") or ""
    kind, _, address = recipient.partition(";")
    address = address.strip().strip("<>")
    kind = kind.strip().lower()
    if kind == "utf-8":
        address = _utf8_address(address) or ""
    if kind not in ("rfc822", "utf-8") or not _ADDRESS.fullmatch(address):
        return None
    return BouncedRecipient(
        address=address,
        status=status,
        action=action,
        diagnostic=_printable(_one(block, "diagnostic-code") or ""),
    )


#: RFC 6533's escape of a character in a 7-bit `utf-8` address: `\x{00FC}`.
_XTEXT = re.compile(r"\\x\{([0-9A-Fa-f]{2,6})\}")


def _utf8_address(address: str) -> str | None:
    """An RFC 6533 `utf-8` address (raw UTF-8, as the report's bytes read 1:1, or with
    `\\x{HHHH}` escapes) as the job keeps its recipient: the domain in A-labels
    (`ledger.addresses`), so "zoe@bücher.example" is "zoe@xn--bcher-kva.example". None
    when it is not one (a non-ASCII local part is never a job's recipient here)."""
    try:
        text = address.encode("latin-1").decode("utf-8")
    except UnicodeError:
        return None
    text = _XTEXT.sub(lambda m: chr(min(int(m.group(1), 16), 0x10FFFF)), text)
    local, at, domain = text.rpartition("@")
    if not at or not local.isascii() or not domain or len(domain) > 253:
        return None
    if domain.isascii():
        return f"{local}@{domain}"
    import idna

    try:
        return f"{local}@{idna.encode(domain, uts46=True).decode('ascii')}"
    except (idna.IDNAError, UnicodeError):
        return None


def _moment(value: str) -> datetime | None:
    """The moment an RFC 5322 Date names, in UTC; None when it is none (no date, a day or
    time that does not exist, past the calendar's ends). Read by the standard library's
    RFC 5322 reader, the obsolete forms with the rest (section 4.3: a zone by its name, a
    year of two digits, comments), as a receiver must read them: an MTA that writes the
    original's Date again may write any of them, and its report is still the job's. A
    zone it cannot name (or -0000) is UTC, as the RFC says."""
    if not value:
        return None
    # Imported here: `ledger.job` imports this module, and the command line's `status`
    # and `submit` load no `email` package (tests/e2e/test_cli_lazy_imports.py).
    from email.utils import parsedate_to_datetime

    try:
        moment = parsedate_to_datetime(value)
        if moment.tzinfo is None:
            return moment.replace(tzinfo=UTC)
        return moment.astimezone(UTC)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None


def _report_id(headers: Fields) -> str:
    values = _all(headers, "message-id")
    if len(values) != 1:
        return ""
    value = values[0].strip()
    return value if _REPORT_ID.fullmatch(value) else ""


def _printable(text: str) -> str:
    """Printable ASCII only, whitespace collapsed, at most MAX_TEXT characters."""
    kept = "".join(c if " " <= c <= "~" else " " for c in text[: MAX_TEXT * 4])
    return " ".join(kept.split())[:MAX_TEXT]


def said(recipients: list[dict[str, object]]) -> str:
    """What a Bounced event's report says, one line: "5.1.1 a@example.com: 550 ..." per
    recipient, joined with "; " (the webhook's `detail`, the job page's line)."""
    lines = []
    for recipient in recipients:
        line = f"{recipient.get('status', '')} {recipient.get('address', '')}"
        diagnostic = recipient.get("diagnostic") or ""
        lines.append(f"{line}: {diagnostic}" if diagnostic else line)
    return "; ".join(lines)
