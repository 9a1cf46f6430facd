"""What every door shows of a job: its status, its events, the review queue.

The CLI (`status`, `history`, `review list/show`), the HTTP API and the review page read
these, so a job reads the same whichever door a human uses (docs/review.md "Review",
docs/architecture.md "One service layer"). Lists read the job index; the content a row
shows (To, Subject, `send_at`) is loaded for a page of rows in one query
(`Ledger.get_jobs`), never job by job.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime
from enum import Enum
from typing import TYPE_CHECKING, Any

from ledger.delivery_reports import UNVERIFIED_SAID, said
from ledger.display import iso
from ledger.job import SendJob
from ledger.stores.index import IndexRow
from ledger.vocabulary import JobState

if TYPE_CHECKING:
    from ledger.application import Ledger

_EVENT_BASE_FIELDS = {"originator_id", "originator_version", "timestamp", "originator_topic"}
#: Event fields too large or too internal for a timeline (kept in `history --json`).
BULKY_FIELDS = frozenset({"body", "html", "content_hash", "fingerprint"})


def job_status(job: SendJob) -> dict[str, Any]:
    """`status --json`, `GET /v1/jobs/{key}`."""
    status: dict[str, Any] = {
        "key": job.key,
        "channel": job.channel,
        "state": job.state.value,
        "message_id": job.message_id,
        "attempts": job.attempts,
    }
    if job.reason:
        status["reason"] = job.reason
    status.update(
        {
            "due_at": iso(job.due_at),
            "created": iso(job.created_on),
            "updated": iso(job.modified_on),
            "version": job.version,
            "searches": job.searches,
            "misses": job.misses,
            "duplicate": job.duplicate,
            "verifying": job.verifying,
            "provider_message_ids": list(job.provider_message_ids),
            "submitted_by": job.submitted_by,
        }
    )
    if job.purged_at is None:
        status.update(to=list(job.content.to), subject=job.content.subject)
    else:
        # Its content is gone (docs/configuration.md "Retention"): say so rather than show it empty.
        status["purged"] = {"at": iso(job.purged_at), "by": job.purged_by}
    if job.content.send_at is not None:
        status["send_at"] = job.content.send_at
    return status


def plain(value: Any) -> Any:
    """A value as JSON has it: times as ISO strings, enums as their strings, tuples as
    lists (what the page shows is this, never a Python repr)."""
    if isinstance(value, datetime):
        return iso(value)
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [plain(v) for v in value]
    return value


def event_record(event: Any) -> dict[str, Any]:
    """One event as `history --json` and `GET /v1/jobs/{key}/events` give it."""
    record: dict[str, Any] = {
        "type": type(event).__name__,
        "version": event.originator_version,
        "at": iso(event.timestamp),
    }
    for field in dataclasses.fields(event):
        if field.name not in _EVENT_BASE_FIELDS:
            record[field.name] = plain(getattr(event, field.name))
    if record["type"] == "Bounced":
        # Said on every report, an earlier release's too: none is proved
        # (`UNVERIFIED_SAID`); the event keeps no field for it.
        record["verified"] = False
    return record


def timeline_details(record: dict[str, Any]) -> list[tuple[str, str]]:
    """An event's fields for a human: each value as JSON, the bulky and the empty ones
    (null, "", [], {}) left out, attachments named by file name, type and size, never
    their content."""
    details = []
    for name, value in record.items():
        if name in ("type", "version", "at") or name in BULKY_FIELDS:
            continue
        if record["type"] == "Bounced" and name == "verified":
            details.append((name, f"{json.dumps(value)} ({UNVERIFIED_SAID})"))
            continue
        if value is None or value == "" or value == [] or value == {}:
            continue
        if name == "attachments" and isinstance(value, list):
            value = [attachment_summary(item) for item in value if isinstance(item, dict)]
        if record["type"] == "Bounced" and name == "recipients" and isinstance(value, list):
            value = said([item for item in value if isinstance(item, dict)])  # one line
        # Non-ASCII as typed, as a string field is: each door makes the line printable
        # (ASCII-only JSON came out as \\u674e there, its backslash doubled).
        shown = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        details.append((name, shown))
    return details


def attachment_summary(item: dict[str, Any]) -> dict[str, Any]:
    """{filename, content_type, size}: the size decoded from the base64 length."""
    data = str(item.get("content_base64", ""))
    size = len(data) * 3 // 4 - data[-2:].count("=") if data else 0
    return {
        "filename": item.get("filename", ""),
        "content_type": item.get("content_type", ""),
        "size": size,
    }


def attachments_of(job: SendJob) -> list[dict[str, Any]]:
    return [attachment_summary(a.canonical()) for a in job.content.attachments]


def review_row(row: IndexRow, job: SendJob | None) -> dict[str, Any]:
    """One job of the review queue: from its index row, with To, Subject and `send_at`
    from its content when loaded (`review list --json`, `GET /v1/review`). `version` is
    the row's: a decision taken from the list holds for what the list showed, and the
    content, loaded after, never makes it later (docs/review.md "Two people, one job")."""
    item: dict[str, Any] = {
        "key": row.key,
        "channel": row.channel,
        "state": row.state,
        "reason": row.reason,
        "since": iso(row.in_review_since),  # when it went to review (a check keeps it)
        "message_id": row.message_id,
        "version": row.version,
    }
    if job is not None:
        if job.purged_at is None:
            item["to"] = list(job.content.to)
            item["subject"] = job.content.subject
        if job.content.send_at is not None:
            item["send_at"] = job.content.send_at
        item["duplicate"] = job.duplicate
    return item


def listed_job(row: IndexRow) -> dict[str, Any]:
    """One job of `GET /v1/jobs`: its index row only (no content is loaded for a list);
    `GET /v1/jobs/{key}` gives the rest."""
    return {
        "key": row.key,
        "channel": row.channel,
        "state": row.state,
        "reason": row.reason,
        "message_id": row.message_id,
        "attempts": row.attempts,
        "due_at": None if row.due_at is None else iso(row.due_at),
        "created": iso(row.created_at),
        "updated": iso(row.updated_at),
        "version": row.version,
        "purged": row.purged_at is not None,
    }


def with_content(ledger: Ledger, rows: Sequence[IndexRow]) -> list[dict[str, Any]]:
    """The rows as `review_row`s, their jobs loaded in one query."""
    jobs = ledger.get_jobs([row.key for row in rows])
    return [review_row(row, jobs.get(row.key)) for row in rows]


def review_rows(
    ledger: Ledger, *, channel: str | None = None, reason: str | None = None
) -> list[dict[str, Any]]:
    """Every job in review (of `channel`, for `reason`), in key order: index rows, their
    content loaded `CONTENT_PAGE` jobs a query."""
    return [
        item
        for page in _pages(review_index(ledger, channel=channel, reason=reason))
        for item in with_content(ledger, page)
    ]


def channel_unknown(ledger: Ledger, channel: str | None, answered: bool) -> bool:
    """Whether an answer filtered by `channel` is empty (`answered` False) because no job
    of the store, in any state, is of that channel: likely a typo, which the empty answer
    would hide. One index read, made only when the answer is empty."""
    return bool(channel) and not answered and next(ledger.jobs(channel=channel), None) is None


def review_index(
    ledger: Ledger, *, channel: str | None = None, reason: str | None = None
) -> Iterator[IndexRow]:
    for row in ledger.jobs(state=JobState.REVIEW, channel=channel):
        if reason is None or row.reason == reason:
            yield row


#: Jobs loaded per query for their content: a job's events carry its attachments, so a
#: page stays small enough to hold in memory with large files attached.
CONTENT_PAGE = 50


def _pages(rows: Iterable[IndexRow], size: int = CONTENT_PAGE) -> Iterator[list[IndexRow]]:
    page: list[IndexRow] = []
    for row in rows:
        page.append(row)
        if len(page) >= size:
            yield page
            page = []
    if page:
        yield page


__all__ = [
    "BULKY_FIELDS",
    "CONTENT_PAGE",
    "attachment_summary",
    "attachments_of",
    "event_record",
    "job_status",
    "listed_job",
    "plain",
    "review_index",
    "review_row",
    "review_rows",
    "timeline_details",
    "with_content",
]
