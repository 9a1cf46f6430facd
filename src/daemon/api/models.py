"""The request and response models of the HTTP API: they make the OpenAPI document.

`JobIn` documents the job JSON of `submit`; intake itself is validated by
`ledger.content.parse_job` (through `daemon/service_layer/intake.py`), the one validation
both doors use.
`JobIn` is built from parse_job's own field lists, so a field added there appears here;
`tests/integration/test_api_schema.py` checks with hypothesis that the two agree.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, create_model

from ledger.content import OPTIONAL_FIELDS, REQUIRED_FIELDS
from ledger.vocabulary import Resolution

Addresses = str | list[str]

# The shape of each field parse_job knows; a field it gains later is documented as "any
# JSON" until it is described here (the agreement test still covers it).
_FIELD_TYPES: dict[str, tuple[Any, str]] = {
    "channel": (str, "the channel: a policy file in policies_dir"),
    "key": (str, "idempotency key, from the source event (at most 1000 characters)"),
    "to": (Addresses, "one address or a list"),
    "subject": (str, "no CR or LF"),
    "body": (str, "the text/plain part"),
    "html": (str | None, "an optional text/html part"),
    "cc": (Addresses | None, "one address or a list"),
    "reply_to": (str | None, "one address"),
    "bcc": (Addresses | None, "one address or a list; never in what recipients see"),
    "headers": (
        dict[str, str] | None,
        "extra headers by name: List-Unsubscribe, List-Unsubscribe-Post, X-*",
    ),
    "in_reply_to": (str | None, "one message id, <local@domain>"),
    "references": (list[str] | None, "message ids, oldest first"),
    "send_at": (str | None, "ISO 8601 time with a time zone: not sent before it"),
    "attachments": (
        list[dict[str, str]] | None,
        "[{filename, content_type, content_base64}]: parts of a multipart/mixed message",
    ),
    "from": (str | None, "one address the channel policy's allowed_from allows (else its from)"),
    "thread_id": (str | None, "Gmail's thread id (gmail providers only)"),
}


def _job_in() -> type[BaseModel]:
    fields: dict[str, Any] = {}
    for name in (*REQUIRED_FIELDS, *OPTIONAL_FIELDS):
        kind, about = _FIELD_TYPES.get(name, (Any, "see docs/cli.md"))
        default = ... if name in REQUIRED_FIELDS else None
        fields[name] = (kind, Field(default, description=about))
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


#: A decision made on the version of the job a person saw (`version` of its status).
EXPECTED_VERSION = Field(
    default=None,
    ge=1,
    description="the job's version the decision was made on: refused (409) if it changed since",
)


class ResolveIn(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    decision: Resolution = Field(alias="as")
    note: str = Field(default="", max_length=10_000)
    expected_version: int | None = EXPECTED_VERSION


class CancelIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    note: str = Field(default="", max_length=10_000)
    expected_version: int | None = EXPECTED_VERSION


#: No stored channel or reason holds a NUL (and PostgreSQL refuses one in a query).
NO_NUL = r"^[^\x00]*$"


class TriageIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    channel: str | None = Field(default=None, pattern=NO_NUL)
    reason: str | None = Field(default=None, pattern=NO_NUL)
    dry_run: bool = False


class CopyOut(BaseModel):
    provider_id: str
    date: str
    to: str
    subject: str


class CheckOut(BaseModel):
    """`review check --json`: what the search found now (and whether it was recorded)."""

    key: str
    state: str
    message_id: str
    count: int
    query: str
    copies: list[CopyOut]
    recorded: bool
    advice: str
    hits: list[dict[str, Any]] = Field(
        default_factory=list,
        description="the same copies as the first releases showed them: "
        "{provider_message_id, message_id, labels}",
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
