"""``sendledger probe`` on a Gmail provider: the drafts path beside the messages path
(docs/providers.md "Gmail setup", "Providers").

One more real, clearly labelled message is sent, through a draft, with the reply to
drafts.send dropped by the probe's relay. Then, without any search: was the consumed draft
answered as gone, is the sent message found under the draft's message id, and did Gmail
keep our Message-ID on this path? Last the search's index lag for this copy. From both
paths the probe recommends `send_via` and the windows.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from daemon.providers.base import ProviderError
from daemon.providers.draft_handle import DraftsProvider, DraftStatus
from policies.durations import format_duration

#: The recommended `search_after`: a few times the index lag seen, at least a minute.
MIN_SEARCH_AFTER = 60.0
LAG_FACTOR = 3.0


def recommend_search_after(lag: float) -> float:
    """A few times the observed lag, rounded up to a whole minute, at least a minute."""
    return max(MIN_SEARCH_AFTER, math.ceil(lag * LAG_FACTOR / 60.0) * 60.0)


def run_drafts_probe(
    drafts: DraftsProvider,
    raw: bytes,
    message_id: str,
    *,
    search_until: Callable[[str, float], dict[str, Any]],
    clock: Callable[[], float] = time.monotonic,
) -> dict[str, Any]:
    """Create the draft, check it is pending, send it (reply dropped), check it again.
    `search_until(message_id, started)` measures the index lag (the messages path's loop)."""
    result: dict[str, Any] = {
        "message_id": message_id,
        "draft_created": False,
        "pending_before_send": None,
        "send_outcome": None,
        "send_reason": None,
        "gone_after_send": None,
        "found_by_message_id": None,
        "kept_message_id": None,
        "index_lag_seconds": None,
    }
    try:
        draft = drafts.create_draft(raw)
    except ProviderError as exc:
        result["error"] = f"drafts.create: {exc.reason}"
        return result
    result["draft_created"] = True
    try:
        result["pending_before_send"] = drafts.check_draft(draft).status is DraftStatus.PENDING
    except ProviderError as exc:
        result["error"] = f"drafts.get before the send: {exc.reason}"
        drafts.delete_draft(draft.draft_id)
        return result
    started = clock()
    outcome = drafts.send_draft(draft)
    result["send_outcome"] = outcome.kind.value
    result["send_reason"] = outcome.reason
    try:
        check = drafts.check_draft(draft)
    except ProviderError as exc:
        result["error"] = f"drafts.get after the send: {exc.reason}"
        return result
    result["gone_after_send"] = check.status is not DraftStatus.PENDING
    result["found_by_message_id"] = check.status is DraftStatus.SENT
    if check.status is DraftStatus.SENT:
        result["kept_message_id"] = check.message_id_header == message_id
        result["sent_message_id_header"] = check.message_id_header
    if result["kept_message_id"]:
        searched = search_until(message_id, started)
        result["index_lag_seconds"] = searched.get("index_lag_seconds")
        result["search_query"] = searched.get("query")
    return result


def drafts_handle_works(drafts: dict[str, Any]) -> bool:
    """The draft answers the ambiguity by itself: gone after the send, and the sent message
    found under the draft's message id."""
    return bool(drafts.get("gone_after_send") and drafts.get("found_by_message_id"))


def recommend(messages: dict[str, Any], drafts: dict[str, Any]) -> dict[str, Any]:
    """`send_via` and the windows from what both paths showed."""
    lags = [
        lag
        for lag in (messages.get("index_lag_seconds"), drafts.get("index_lag_seconds"))
        if isinstance(lag, int | float)
    ]
    search_after = messages.get("recommended_search_after")
    if lags and search_after is None:
        search_after = format_duration(recommend_search_after(max(lags)))
    if drafts_handle_works(drafts):
        why = "the draft answered the dropped reply at once, without a search"
        if not messages.get("kept_message_id"):
            why += "; messages.send did not show our Message-ID, so a search there proves nothing"
        return {
            "send_via": "drafts",
            "why": why,
            "search_after": search_after,
            "search_note": (
                "used only when a draft is gone and its message is not found"
                if search_after
                else 'no search found our Message-ID: on_unknown must not be "retry"'
            ),
        }
    if messages.get("kept_message_id"):
        return {
            "send_via": "messages",
            "why": "the draft did not settle the dropped reply; messages.send kept our Message-ID",
            "search_after": search_after,
            "search_note": "every ambiguous send waits this long before its first search",
        }
    return {
        "send_via": None,
        "why": 'neither path proved a handle: keep on_unknown = "review" for this mailbox',
        "search_after": None,
        "search_note": "",
    }
