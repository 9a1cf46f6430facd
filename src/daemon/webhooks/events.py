"""Which job events a webhook hears, and what it is sent for each (docs/http-api.md "Webhooks").

`WEBHOOK_EVENTS` is the one table from job events to webhook types: a new kind of
outcome is one line here (and its name in `WebhookType`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, get_args
from uuid import UUID

from ledger.delivery_reports import said
from ledger.vocabulary import Resolution

if TYPE_CHECKING:
    from ledger.job import SendJob

WebhookType = Literal[
    "confirmed", "review", "duplicate", "abandoned", "cancelled", "rejected", "bounced"
]
WEBHOOK_TYPES: tuple[str, ...] = get_args(WebhookType)

# A `rejected` delivery's `reason`: a code a receiver can branch on. The provider's own
# words (free text, any language, sometimes a stack of JSON) go in `detail`.
RejectedCode = Literal["unavailable", "transient", "permanent"]
REJECTED_CODES: tuple[str, ...] = get_args(RejectedCode)


def _always(event: Any) -> bool:
    return True


@dataclass(frozen=True)
class WebhookEvent:
    type: str  # what `events` names and the payload's "type" says
    event: str  # the SendJob event (class name) it comes from
    when: Callable[[Any], bool] = _always  # which of those events

    @property
    def topic(self) -> str:
        # Spelled from the name, so a type whose event does not exist yet (a newer
        # release's) matches nothing instead of failing. Imported here: the settings
        # import this module and must not load the aggregate (and eventsourcing).
        from ledger.job import SendJob

        return f"{SendJob.TOPIC}.{self.event}"


WEBHOOK_EVENTS: tuple[WebhookEvent, ...] = (
    WebhookEvent("confirmed", "Confirmed"),
    WebhookEvent("review", "Escalated"),
    WebhookEvent("duplicate", "Duplicate"),
    WebhookEvent(
        "abandoned", "Resolved", lambda e: getattr(e, "decision", None) == Resolution.ABANDON
    ),
    WebhookEvent("cancelled", "Cancelled"),
    # Not a claim its daemon released unsent, no call made (its store's answer lost, a
    # stop, its scope gone to another daemon, its circuit's hold): the provider refused
    # nothing, and the job's send, due again, is heard when it is made.
    WebhookEvent("rejected", "Rejected", lambda e: not e.released),
    WebhookEvent("bounced", "Bounced"),
)


def topics_for(types: Iterable[str]) -> list[str]:
    """The stored-event topics a webhook of these types reads."""
    wanted = set(types)
    return sorted({entry.topic for entry in WEBHOOK_EVENTS if entry.type in wanted})


def type_of(event: Any, types: Iterable[str]) -> str | None:
    """The webhook type of a job event among `types`, or None: not one a webhook hears."""
    wanted = set(types)
    name = type(event).__name__
    for entry in WEBHOOK_EVENTS:
        if entry.type in wanted and entry.event == name and entry.when(event):
            return entry.type
    return None


def event_id_for(job_id: UUID, version: int) -> str:
    """The delivery's `webhook-id` and the payload's `event_id`: the same for an event in
    every attempt, every daemon and every webhook (a receiver deduplicates on it)."""
    return f"evt_{job_id.hex}_{version}"


def iso(moment: datetime) -> str:
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def rejected_code(event: Any) -> RejectedCode:
    """What kind of refusal a Rejected event was: the provider could not take the send now
    (nothing sent, not counted against `max_attempts`), refused it for now (a retry is
    due), or refused it for good."""
    if getattr(event, "unavailable", False):
        return "unavailable"
    return "transient" if event.transient else "permanent"


def payload(kind: str, job: SendJob, event: Any, event_id: str) -> dict[str, Any]:
    """The JSON a delivery POSTs: the job as it was right after the event. `reason` is
    a code (the job's reason; for `rejected` one of `REJECTED_CODES`; for `bounced`
    `permanent` or `transient`); `detail` is the provider's text for `rejected`, the
    report's recipients and statuses for `bounced`, else null; `verified` is false for
    `bounced`, as every report is (a claim, not a proof:
    `ledger.delivery_reports.UNVERIFIED_SAID`), else null."""
    verified: bool | None = None
    if kind == "bounced":
        reason: str | None = "permanent" if event.permanent else "transient"
        detail: str | None = said(event.recipients)
        verified = False
    elif kind == "rejected":
        reason, detail = rejected_code(event), event.reason
    else:
        reason, detail = job.reason, None
    return {
        "type": kind,
        "key": job.key,
        "channel": job.channel,
        "state": str(job.state),
        "message_id": job.message_id,
        "at": iso(event.timestamp),
        "event_id": event_id,
        "reason": reason,
        "detail": detail,
        "verified": verified,
    }


__all__ = [
    "REJECTED_CODES",
    "WEBHOOK_EVENTS",
    "WEBHOOK_TYPES",
    "RejectedCode",
    "WebhookEvent",
    "WebhookType",
    "event_id_for",
    "payload",
    "rejected_code",
    "topics_for",
    "type_of",
]
