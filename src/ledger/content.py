"""What a caller submits: the job JSON, validated, normalized and hashed.

The content hash is what makes intake idempotent: the same key with the same content
is the same job; the same key with other content is a conflict, never an overwrite.
"""

from __future__ import annotations

import difflib
import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ledger.addresses import AddressError, Mailbox, parse_mailbox
from ledger.attachments import Attachment, AttachmentError, from_stored, parse_attachment
from ledger.characters import unsafe_character
from ledger.exceptions import Refusal, SendledgerError
from ledger.extra_headers import (
    ASCII_ONLY,
    MAX_WORD,
    canonical_message_id,
    header_name_problem,
)
from ledger.header_encoding import MAX_LINE, fold, within_lines
from ledger.keys import identifier_problem

REQUIRED_FIELDS = ("channel", "key", "to", "subject", "body")
OPTIONAL_FIELDS = (
    "html",
    "cc",
    "reply_to",
    "bcc",
    "headers",
    "in_reply_to",
    "references",
    "send_at",
    "attachments",
    "from",
    "thread_id",
)
#: Fields added after the first release, with their empty values: the content hash holds
#: one only when it is set, so every job stored before keeps its hash (docs/cli.md, "Message
#: fields").
LATER_FIELDS: dict[str, Any] = {
    "bcc": [],
    "headers": {},
    "in_reply_to": None,
    "references": [],
    "send_at": None,
    "attachments": [],
    # The job's own From (JSON "from"; the policy's when None) and Gmail thread id.
    "sender": None,
    "thread_id": None,
}
MAX_KEY_LENGTH = 1000
#: A key's UTF-8 encoding at most: PostgreSQL indexes a value of at most 2704 bytes (a
#: third of a page) and the job index's key is its primary key. 1000 characters of a
#: script of 3 or 4 bytes each passed the length rule and failed there, a 500.
MAX_KEY_BYTES = 2500
MAX_THREAD_ID_LENGTH = 200
#: Longest subject, in characters (docs/cli.md "Message fields and validation", "Limits").
MAX_SUBJECT = 2000
#: Longest value of one extra header, in characters.
MAX_HEADER_VALUE = 2000
#: Most extra headers and most references in one job.
MAX_EXTRA_HEADERS = 50
MAX_REFERENCES = 100
#: Longest address as typed (display name included), in characters.
MAX_ADDRESS_TEXT = 500


class JobInputError(SendledgerError, ValueError):
    """Bad job input. `field` names the offending field for a one-line error."""

    kind = Refusal.BAD_INPUT

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


class JobInputErrors(JobInputError):
    """Several problems of one job, each a JobInputError; `field` and `reason` are the
    first's (a caller that says one problem says that one)."""

    def __init__(self, problems: Sequence[JobInputError]) -> None:
        super().__init__(problems[0].field, problems[0].reason)
        self.problems = list(problems)


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
    bcc: tuple[str, ...] = ()
    headers: tuple[tuple[str, str], ...] = ()  # (name, value), sorted by name
    in_reply_to: str | None = None
    references: tuple[str, ...] = ()
    send_at: str | None = None  # ISO 8601 in UTC: not dispatched before it
    attachments: tuple[Attachment, ...] = ()
    sender: str | None = None  # JSON "from": the mailbox the job is sent as
    thread_id: str | None = None  # Gmail's thread id (gmail providers only)

    @property
    def send_at_time(self) -> datetime | None:
        return None if self.send_at is None else datetime.fromisoformat(self.send_at)

    def stored(self) -> dict[str, Any]:
        """Every field, the unset ones with their empty values: what the Requested event
        stores (`ledger/job.py`)."""
        return {
            **self._first_fields(),
            "bcc": list(self.bcc),
            "headers": dict(self.headers),
            "in_reply_to": self.in_reply_to,
            "references": list(self.references),
            "send_at": self.send_at,
            "attachments": [attachment.canonical() for attachment in self.attachments],
            "sender": self.sender,
            "thread_id": self.thread_id,
        }

    def recipient_addresses(self) -> frozenset[str]:
        """The bare addresses (lower case) the message went to: To, Cc and Bcc. A delivery
        report about any other address is not about this job (docs/how-it-works.md
        "Bounces")."""
        found: set[str] = set()
        for value in (*self.to, *self.cc, *self.bcc):
            try:
                found.add(parse_mailbox(value).address.addr_spec.lower())
            except AddressError:
                continue  # stored before a rule tightened: it cannot match a report
        return frozenset(found)

    def redacted(self) -> JobContent:
        """What a purged job still holds of its content (ledger/redaction.py): what
        names the job and when it was due; every other field (the customer's) is left at
        its empty default."""
        return JobContent(
            channel=self.channel, key=self.key, to=(), subject="", body="", send_at=self.send_at
        )

    def canonical(self) -> dict[str, Any]:
        """What the content hash is taken of: the first release's fields, and each later
        field only when it is set."""
        return {
            name: value
            for name, value in self.stored().items()
            if name not in LATER_FIELDS or value != LATER_FIELDS[name]
        }

    def first_difference(self, other: JobContent) -> str | None:
        """The first field whose value differs from `other`'s, in the order of
        `stored` (what a conflicting resubmit names); None when they hold the same."""
        mine, theirs = self.canonical(), other.canonical()
        for name in self.stored():
            if mine.get(name) != theirs.get(name):
                return "from" if name == "sender" else name
        return None

    def _first_fields(self) -> dict[str, Any]:
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
        """The inverse of :meth:`canonical` and :meth:`stored` (extra names in ``fields``
        are ignored).

        Every load of a job makes one (`SendJob.Requested.apply`), so its fields are set
        as eventsourcing's mapper sets a stored event's (the object made, then its
        attributes filled in), not through the frozen dataclass's ``__init__``, which
        sets each of the 16 through ``object.__setattr__``: about half of this call's
        CPU (docs/performance.md "Performance and scaling"). The values are the ones
        ``__init__`` would be given, every field, as the intake validated them."""
        later = {name: fields.get(name, empty) for name, empty in LATER_FIELDS.items()}
        content = object.__new__(cls)
        vars(content).update(
            channel=fields["channel"],
            key=fields["key"],
            to=tuple(fields["to"]),
            subject=fields["subject"],
            body=fields["body"],
            html=fields["html"],
            cc=tuple(fields["cc"]),
            reply_to=fields["reply_to"],
            bcc=tuple(later["bcc"] or ()),
            headers=tuple(sorted((later["headers"] or {}).items())),
            in_reply_to=later["in_reply_to"],
            references=tuple(later["references"] or ()),
            send_at=later["send_at"],
            attachments=from_stored(later["attachments"] or []),
            sender=later["sender"],
            thread_id=later["thread_id"],
        )
        return content

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


def mailbox_of(field: str, value: str) -> Mailbox:
    """One mailbox ("Name <a@b.c>" or "a@b.c"), strictly (``ledger/addresses.py``), at
    most :data:`MAX_ADDRESS_TEXT` characters as typed."""
    if isinstance(value, str) and len(value) > MAX_ADDRESS_TEXT:
        raise JobInputError(field, f"longer than {MAX_ADDRESS_TEXT} characters")
    try:
        return parse_mailbox(value)
    except AddressError as exc:
        raise JobInputError(field, str(exc)) from None


def validate_address(field: str, value: str) -> str:
    """One mailbox (see :func:`mailbox_of`), re-rendered canonically."""
    return str(mailbox_of(field, value))


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
    if len(subject) > MAX_SUBJECT:
        raise JobInputError("subject", f"longer than {MAX_SUBJECT} characters")
    reject_unsafe_header_text("subject", subject)
    return subject


def _headers(value: object) -> tuple[tuple[str, str], ...]:
    if value is None:
        return ()
    if not isinstance(value, Mapping):
        raise JobInputError("headers", "must be an object of header names and values")
    if len(value) > MAX_EXTRA_HEADERS:
        raise JobInputError("headers", f"more than {MAX_EXTRA_HEADERS} headers")
    seen: dict[str, str] = {}
    for name, text in value.items():
        field = f"headers.{name}"
        problem = header_name_problem(name)
        if problem:
            raise JobInputError(field, problem)
        if name.lower() in seen:
            raise JobInputError(field, f"given twice (also as {seen[name.lower()]})")
        seen[name.lower()] = name
        header_value = _text(field, text, header=True)
        if len(header_value) > MAX_HEADER_VALUE:
            raise JobInputError(field, f"longer than {MAX_HEADER_VALUE} characters")
        reject_unsafe_header_text(field, header_value)
        if not header_value.strip():
            raise JobInputError(field, "must not be empty")
        if header_value != header_value.strip(" "):
            # A parser drops them: the recipient would read another value than the job's.
            raise JobInputError(field, "must not start or end with a space")
        if name.lower() in ASCII_ONLY and not header_value.isascii():
            raise JobInputError(field, "must be ASCII (percent-encode a URL)")
        if name.lower() in ASCII_ONLY and "=?" in header_value:
            # Written as typed (a URL or token cannot be encoded): a client would decode it.
            raise JobInputError(field, "must not contain '=?' (percent-encode a URL)")
        # Written as typed (only an encoded value folds anywhere): a line can only be
        # folded at a space, and a folded line must stay within SMTP's 998 octets.
        if name.lower() in ASCII_ONLY and any(
            len(word) > MAX_WORD for word in header_value.split(" ")
        ):
            raise JobInputError(
                field, f"has a run of more than {MAX_WORD} characters without a space"
            )
        if name.lower() in ASCII_ONLY and not within_lines(fold(name, header_value.split(" "))):
            # Nor at the second of two spaces: a long run of them stays on one line.
            raise JobInputError(
                field, f"has too many spaces in a row to fold within {MAX_LINE}-octet lines"
            )
    return tuple(sorted(value.items()))


def _message_id(field: str, value: object) -> str:
    if not isinstance(value, str):
        raise JobInputError(field, "must be a message id string")
    canonical = canonical_message_id(value)
    if canonical is None:
        raise JobInputError(field, f"not a message id like <local@domain>: {value!r}")
    if "=?" in canonical:
        # Written as typed (a message id cannot be encoded): a reader could decode it.
        raise JobInputError(field, "must not contain '=?' (an encoded word)")
    return canonical


def _references(value: object) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise JobInputError("references", "must be a list of message ids")
    if len(value) > MAX_REFERENCES:
        raise JobInputError("references", f"more than {MAX_REFERENCES} message ids")
    return tuple(_message_id(f"references[{i}]", item) for i, item in enumerate(value))


def _send_at(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise JobInputError("send_at", "must be an ISO 8601 time string")
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise JobInputError("send_at", f"not an ISO 8601 time: {value!r}") from None
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise JobInputError("send_at", f"needs a time zone (Z or +01:00): {value!r}")
    try:
        # One spelling per instant: "10:00+01:00" and "09:00Z" are the same job.
        return moment.astimezone(UTC).isoformat()
    except OverflowError:
        raise JobInputError("send_at", f"out of range: {value!r}") from None


def _attachments(value: object) -> tuple[Attachment, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise JobInputError("attachments", "must be a list of attachment objects")
    result = []
    for index, item in enumerate(value):
        try:
            result.append(parse_attachment(item))
        except AttachmentError as exc:
            where = f"attachments[{index}]" + (f".{exc.field}" if exc.field else "")
            raise JobInputError(where, exc.reason) from None
    return tuple(result)


def _thread_id(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise JobInputError("thread_id", "must be a string (Gmail's thread id)")
    # Gmail's thread ids are hex; anything URL- and JSON-safe is accepted, nothing else.
    if not value or len(value) > MAX_THREAD_ID_LENGTH:
        raise JobInputError("thread_id", f"must be 1..{MAX_THREAD_ID_LENGTH} characters")
    if not all(ch.isascii() and (ch.isalnum() or ch in "-_") for ch in value):
        reason = f"may contain only letters, digits, '-' and '_': {value!r}"
        raise JobInputError("thread_id", reason)
    return value


def _sender(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise JobInputError("from", "must be one address")
    return validate_address("from", value)


def _did_you_mean(name: object) -> str:
    """ "; did you mean FIELD?" for an unknown field close to a known one: `subjet` is a
    typo of `subject`, and the operator is told which field to write, not only which not."""
    close = difflib.get_close_matches(str(name), REQUIRED_FIELDS + OPTIONAL_FIELDS, n=1)
    return f"; did you mean {close[0]}?" if close else ""


def parse_job(data: object) -> JobContent:
    """Validate a submitted job (already decoded from JSON). Every field is checked: a job
    with several problems raises `JobInputErrors` listing each (one per field, in the
    order of the fields), so a caller fixes them in one go (docs/http-api.md "HTTP API")."""
    if not isinstance(data, Mapping):
        raise JobInputError("job", "must be a JSON object")
    problems = [
        JobInputError(name, f"unknown field{_did_you_mean(name)}")
        for name in sorted(set(data) - set(REQUIRED_FIELDS) - set(OPTIONAL_FIELDS))
    ]
    problems += [JobInputError(name, "is required") for name in REQUIRED_FIELDS if name not in data]
    checks: dict[str, Callable[[Any], Any]] = {
        "channel": _channel,
        "key": _key,
        "to": lambda v: _addresses("to", v, required=True),
        "subject": _subject,
        "body": lambda v: _text("body", v, header=False),
        "html": lambda v: None if v is None else _text("html", v, header=False),
        "cc": lambda v: _addresses("cc", v, required=False),
        "reply_to": _reply_to,
        "bcc": lambda v: _addresses("bcc", v, required=False),
        "headers": _headers,
        "in_reply_to": lambda v: None if v is None else _message_id("in_reply_to", v),
        "references": _references,
        "send_at": _send_at,
        "attachments": _attachments,
        "from": _sender,
        "thread_id": _thread_id,
    }
    values: dict[str, Any] = {}
    for name, check in checks.items():
        if name not in data and name in REQUIRED_FIELDS:
            continue  # said above
        try:
            values[name] = check(data.get(name))
        except JobInputError as exc:
            problems.append(exc)
    if len(problems) == 1:
        raise problems[0]
    if problems:
        raise JobInputErrors(problems)
    return JobContent(**{("sender" if name == "from" else name): v for name, v in values.items()})


def _channel(value: object) -> str:
    channel = _text("channel", value, header=True)
    if not channel:
        raise JobInputError("channel", "must not be empty")
    return channel


def _key(value: object) -> str:
    key = _text("key", value, header=True)
    if not key.strip():
        raise JobInputError("key", "must not be empty")
    if len(key) > MAX_KEY_LENGTH:
        raise JobInputError("key", f"longer than {MAX_KEY_LENGTH} characters")
    if len(key.encode("utf-8")) > MAX_KEY_BYTES:
        raise JobInputError("key", f"longer than {MAX_KEY_BYTES} bytes in UTF-8")
    if problem := identifier_problem(key):
        raise JobInputError("key", problem)
    return key


def _reply_to(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise JobInputError("reply_to", "must be one address")
    return validate_address("reply_to", value)
