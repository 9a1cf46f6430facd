"""The request and response models of the HTTP API: they make the OpenAPI document.

`JobIn` documents the job JSON of `submit`; intake itself is validated by
`ledger.content.parse_job` (through `daemon/service_layer/intake.py`), the one validation
both doors use.
`JobIn` is built from parse_job's own field lists, so a field added there appears here;
`tests/integration/test_api_schema.py` checks with hypothesis that the two agree.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, create_model, field_validator

from ledger.attachments import MAX_FILENAME
from ledger.content import (
    MAX_ADDRESS_TEXT,
    MAX_EXTRA_HEADERS,
    MAX_HEADER_VALUE,
    MAX_KEY_BYTES,
    MAX_KEY_LENGTH,
    MAX_REFERENCES,
    MAX_SUBJECT,
    MAX_THREAD_ID_LENGTH,
    OPTIONAL_FIELDS,
    REQUIRED_FIELDS,
)
from ledger.keys import MAX_NOTE_LENGTH
from ledger.vocabulary import EscalationReason, Resolution

#: No stored channel or reason holds a NUL (and PostgreSQL refuses one in a query).
NO_NUL = r"^[^\x00]*$"

# Every constraint intake enforces that JSON Schema can say is in the document; what it
# cannot say (the address grammar, the characters a subject may hold, ...) is named in the
# field's `x-rules`, so a client (or a generator such as schemathesis) knows every reason a
# document-valid job can still be refused (tests/unit/test_api_openapi.py).
Address = Annotated[str, Field(max_length=MAX_ADDRESS_TEXT)]
Addresses = Address | list[Address]
Recipients = Address | Annotated[list[Address], Field(min_length=1)]
HeaderValue = Annotated[str, Field(max_length=MAX_HEADER_VALUE)]
# One attachment's shape (documented only: the job model keeps no nested model, whose
# definition the request body, written out in full, could not refer to).
_ATTACHMENT = {
    "type": "object",
    "required": ["filename", "content_type", "content_base64"],
    "properties": {
        "filename": {"type": "string", "minLength": 1, "maxLength": MAX_FILENAME},
        "content_type": {"type": "string"},
        "content_base64": {"type": "string"},
    },
    "additionalProperties": False,
}

_WHERE = 'docs/cli.md "Message fields and validation"'
#: What intake holds a field to beyond its schema, in words (`x-rules`).
_RULES = {
    "channel": "a channel of this server (a policy file in its policies_dir) that loads",
    "key": "not only spaces; no control, format, surrogate, private-use or unassigned "
    'character (docs/cli.md "Keys")',
    "address": f"each one mailbox, `local@domain` or `Name <local@domain>`, as {_WHERE} "
    "says: no CR, LF, control or bidi character, no '=?', no comment, group or second "
    "address, no invisible character at an edge, an ASCII dot-atom local part not "
    "starting with '-', a host name of two labels or more",
    "header text": f"no CR, LF, control, bidi or line-separator character ({_WHERE})",
    "text": "no NUL and no lone surrogate",
    "headers": "names List-Unsubscribe, List-Unsubscribe-Post or X-* of at most 76 "
    "characters, each once in any case; values as the subject's text, not empty, not "
    f"starting or ending with a space; List-Unsubscribe* ASCII without '=?' ({_WHERE})",
    "message id": "each `<dot-atom@dot-atom>` (brackets added when missing), at most 250 "
    "characters, without '=?'",
    "send_at": "an ISO 8601 time with a time zone",
    "attachments": "content_base64 that decodes; content_type `type/subtype`, not "
    "multipart/* or message/*; a file name that is no path, not wrapped in <> or quotes, "
    f"without '=?' and as the subject's text; the whole message within the provider's "
    f"max_message_bytes ({_WHERE})",
    "from": "one address as `to`'s, which the channel policy's allowed_from allows",
    "thread_id": "only for a channel whose provider is gmail",
}

# The shape of each field parse_job knows, what it says, and the rules beyond the shape
# (docs/cli.md "Message fields and validation"); a field parse_job gains later is
# documented as "any JSON" until it is described here (the agreement test still covers it).
_ThreadId = Annotated[str, Field(pattern=rf"^[A-Za-z0-9_-]{{1,{MAX_THREAD_ID_LENGTH}}}$")]
_Headers = Annotated[dict[str, HeaderValue], Field(max_length=MAX_EXTRA_HEADERS)]
_MessageIds = Annotated[list[str], Field(max_length=MAX_REFERENCES)]
# name -> (its type, what it says, the key of its rules in _RULES)
_FIELD_TYPES: dict[str, tuple[Any, str, str]] = {
    "channel": (Annotated[str, Field(min_length=1)], "the channel: a policy file", "channel"),
    "key": (
        Annotated[str, Field(min_length=1, max_length=MAX_KEY_LENGTH)],
        f"idempotency key, from the source event (at most {MAX_KEY_LENGTH} characters "
        f"and {MAX_KEY_BYTES} bytes in UTF-8)",
        "key",
    ),
    "to": (Recipients, "one address or a list", "address"),
    "subject": (Annotated[str, Field(max_length=MAX_SUBJECT)], "no CR or LF", "header text"),
    "body": (str, "the text/plain part", "text"),
    "html": (str | None, "an optional text/html part", "text"),
    "cc": (Addresses | None, "one address or a list", "address"),
    "reply_to": (Address | None, "one address", "address"),
    "bcc": (Addresses | None, "one address or a list; never in what recipients see", "address"),
    "headers": (_Headers | None, "List-Unsubscribe, List-Unsubscribe-Post, X-*", "headers"),
    "in_reply_to": (str | None, "one message id, <local@domain>", "message id"),
    "references": (_MessageIds | None, "message ids, oldest first", "message id"),
    "send_at": (str | None, "ISO 8601 time with a time zone: not sent before it", "send_at"),
    "attachments": (
        list[dict[str, str]] | None,
        "[{filename, content_type, content_base64}]: parts of a multipart/mixed message",
        "attachments",
    ),
    "from": (Address | None, "one address the policy's allowed_from allows", "from"),
    "thread_id": (_ThreadId | None, "Gmail's thread id (gmail providers only)", "thread_id"),
}
#: Schema the field's type cannot carry (documented, not validated: intake is parse_job).
_MORE_SCHEMA: dict[str, dict[str, Any]] = {"attachments": {"items": _ATTACHMENT}}


#: A review filter's reason: one of these (the service refuses another, 422 naming it).
REASONS = [reason.value for reason in EscalationReason]


def exactly(schema: dict[str, Any]) -> Callable[[dict[str, Any]], None]:
    """A `json_schema_extra` that makes a query parameter's schema `schema`: the routes
    take every parameter as text and the service names each bad one
    (`daemon/service_layer/listing.py`), but the document says what it accepts."""

    def replace(found: dict[str, Any]) -> None:
        found.clear()
        found.update(schema)

    return replace


def _job_in() -> type[BaseModel]:
    fields: dict[str, Any] = {}
    for name in (*REQUIRED_FIELDS, *OPTIONAL_FIELDS):
        kind, about, rules = _FIELD_TYPES.get(name, (Any, "see docs/cli.md", ""))
        extra: dict[str, Any] = {"x-rules": _RULES[rules]} if rules else {}
        extra.update(_MORE_SCHEMA.get(name, {}))
        default: Any = ... if name in REQUIRED_FIELDS else None
        fields[name] = (kind, Field(default, description=about, json_schema_extra=extra))
    model: type[BaseModel] = create_model(
        "JobIn", __config__=ConfigDict(extra="forbid", strict=True), **fields
    )
    return model


JobIn = _job_in()


class JobOut(BaseModel):
    key: str
    message_id: str
    state: str
    created: bool


class Purged(BaseModel):
    at: str
    by: str


class JobStatus(BaseModel):
    """`sendledger status KEY --json`."""

    model_config = ConfigDict(extra="allow")
    key: str
    channel: str
    state: str
    message_id: str
    attempts: int
    reason: str | None = None
    send_at: str | None = Field(default=None, description="not sent before this time")
    purged: Purged | None = Field(
        default=None,
        description="its content was purged (docs/configuration.md 'Retention'): when, by whom",
    )


class EventOut(BaseModel):
    """One event of `sendledger history KEY --json`; the other fields depend on `type`."""

    model_config = ConfigDict(extra="allow")
    type: str
    version: int
    at: str


class ReviewItem(BaseModel):
    key: str
    channel: str
    state: str
    reason: str | None
    since: str | None
    message_id: str
    version: int = Field(
        description="the job's version listed: a decision's `expected_version`, to hold for it"
    )
    send_at: str | None = None
    to: list[str] | None = Field(default=None, description="absent once purged")
    subject: str | None = None
    duplicate: bool = False


class ListedJob(BaseModel):
    key: str
    channel: str
    state: str
    reason: str | None
    message_id: str
    attempts: int
    due_at: str | None
    created: str
    updated: str
    version: int
    purged: bool


class JobList(BaseModel):
    jobs: list[ListedJob]
    next_cursor: str | None = Field(
        description="pass as ?cursor= for the next page; null: no more jobs now"
    )


def _note() -> Any:
    return Field(default="", max_length=MAX_NOTE_LENGTH, pattern=NO_NUL)


def _json_integer(value: object) -> object:
    # What JSON Schema's "integer" is (`60.0` included), never a boolean or a string:
    # pydantic's lax mode read `true` and `"1"` as version 1.
    if isinstance(value, bool | str):
        raise ValueError("a JSON integer expected (the `version` of the job's status)")
    return value


def _expected_version() -> Any:
    # A decision made on the version of the job a person saw (`version` of its status).
    return Field(
        default=None,
        ge=1,
        description="the job's version the decision was made on: refused (409) if it changed since",
    )


class ResolveIn(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    decision: Resolution = Field(alias="as")
    note: str = _note()
    expected_version: int | None = _expected_version()
    _version = field_validator("expected_version", mode="before")(_json_integer)


class CancelIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    note: str = _note()
    expected_version: int | None = _expected_version()
    _version = field_validator("expected_version", mode="before")(_json_integer)


class TriageIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    channel: str | None = Field(default=None, pattern=NO_NUL)
    reason: str | None = Field(default=None, json_schema_extra={"enum": [*REASONS, None]})
    # A JSON boolean only: `"no"` or `0` once ran a live triage (pydantic's lax mode).
    dry_run: StrictBool = False


class CopyOut(BaseModel):
    provider_id: str
    date: str
    to: str
    subject: str
    in_trash: bool = Field(
        default=False, description="found in the sender's trash, not in its sent folder"
    )


class CheckOut(BaseModel):
    """`review check --json`: what the search found now (and whether it was recorded)."""

    key: str
    state: str
    message_id: str
    count: int = Field(description="copies found: all of them, `copies` lists the first 20")
    complete: bool = Field(
        default=True,
        description="false when the search stopped reading with more copies left: "
        "`count` is then at least that many",
    )
    query: str
    copies: list[CopyOut]
    only_in_trash: bool = Field(
        default=False,
        description="every copy found is in the sender's trash: sent and deleted by its "
        "sender, or received and deleted, which no search takes for proof",
    )
    recorded: bool
    version: int | None = Field(
        default=None,
        description="the job's version the answer is about (the recorded check's own): "
        "the `expected_version` of a resolve decided on it",
    )
    advice: str
    hits: list[dict[str, Any]] = Field(
        default_factory=list,
        description="the same copies as the first releases showed them: "
        "{provider_message_id, message_id, labels, in_trash}",
    )


class TriageItemOut(BaseModel):
    key: str
    channel: str
    reason: str | None
    count: int | None = Field(description="copies found; null when the search failed")
    copies: list[str]
    action: str = Field(
        description="resolved-sent, would-resolve-sent (dry run), left or search-failed"
    )
    detail: str


class Problem(BaseModel):
    error: str


class FieldError(BaseModel):
    index: int | None = Field(description="the job's place in a submitted list")
    field: str
    reason: str


class Invalid(BaseModel):
    error: str
    errors: list[FieldError] = Field(description="at most 100, in order")
    count: int = Field(description="how many errors there were in all")


class Health(BaseModel):
    """`/healthz` with a valid token: every check's details, and why any failed."""

    ok: bool
    reasons: list[str]
    checks: dict[str, Any]


class HealthBrief(BaseModel):
    """`/healthz` without a token: each check's pass or fail, no detail."""

    ok: bool
    checks: dict[str, bool]
