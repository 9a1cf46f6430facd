"""Gmail's drafts as the send handle (`send_via = "drafts"`, docs/providers.md "Gmail setup").

drafts.create stores our raw MIME and returns a draft id and a message id before anything
is sent; drafts.send consumes the draft, so a second drafts.send of that id is a 404 and
`drafts.get` answers at once whether it was consumed. How each answer is read (the drafts
rows of "Outcome classification" in docs/architecture.md):

| call         | answer                                   | meaning                          |
|--------------|------------------------------------------|----------------------------------|
| drafts.create| 2xx with draft id and message id         | a draft, nothing sent            |
| drafts.create| 403 insufficientPermissions              | refused: needs gmail.compose     |
| drafts.create| other 4xx (not a rate limit)             | refused, permanent               |
| drafts.create| 429/403 rate, 5xx, no answer             | no information (a draft may exist)|
| drafts.send  | as messages.send (classify.py)           | CONFIRMED / UNKNOWN / REJECTED   |
| drafts.send  | 404                                      | UNKNOWN: the draft is gone       |
| drafts.get   | 200                                      | PENDING: not sent                |
| drafts.get   | 404, then messages.get 200 with SENT     | SENT                             |
| drafts.get   | 404, then messages.get 404 / not SENT    | GONE                             |

Requests go through the provider's own single-shot stack (gmail.py), so nothing below
these calls re-sends a request.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from daemon.providers.base import ProviderError, SendKind, SendOutcome, next_call
from daemon.providers.classify import (
    classify_send_exception,
    classify_send_response,
    error_reasons,
    is_rate_limited,
    provider_error_for_response,
)
from daemon.providers.draft_handle import Draft, DraftCheck, DraftRefused, DraftStatus
from daemon.providers.gmail_mailbox import (
    GmailCalls,
    Mailbox,
    message_id_header,
    search_term,
)
from daemon.providers.quota import GMAIL_GET_UNITS, GMAIL_LIST_UNITS
from ledger.message_id import same_message_id

COMPOSE_SCOPE = "https://www.googleapis.com/auth/gmail.compose"
# Gmail's cost of a drafts.create / drafts.delete (a drafts.get or list costs as a get).
GMAIL_DRAFT_WRITE_UNITS = 10.0
#: What the draft step before a claim costs at most without leftovers (drafts.list for a
#: draft an earlier run left, then drafts.create; a recorded draft's drafts.get is less):
#: reserved with the send, so a job whose mailbox has no quota left is not taken for it.
DRAFT_STEP_UNITS = GMAIL_LIST_UNITS + GMAIL_DRAFT_WRITE_UNITS
SENT_LABEL = "SENT"


def _draft_of(body: dict[str, Any]) -> Draft | None:
    message = body.get("message")
    draft_id = body.get("id")
    if not isinstance(message, dict) or not isinstance(draft_id, str) or not draft_id:
        return None
    message_id = message.get("id")
    if not isinstance(message_id, str) or not message_id:
        return None
    return Draft(draft_id, message_id)


class GmailDrafts:
    """The drafts calls of one GmailProvider, each acting as a given mailbox."""

    def __init__(self, provider: GmailCalls) -> None:
        self.provider = provider
        self._drafts = provider.service.users().drafts()
        self._messages = provider.service.users().messages()

    def create(self, mailbox: Mailbox, raw: bytes, thread_id: str | None) -> Draft:
        message: dict[str, str] = {"raw": base64.urlsafe_b64encode(raw).decode("ascii")}
        if thread_id is not None:
            message["threadId"] = thread_id
        request = self._drafts.create(userId=mailbox.user, body={"message": message})
        what = "drafts.create"
        status, headers, body = self.provider.answer(
            what, request, GMAIL_DRAFT_WRITE_UNITS, mailbox, draft=True
        )
        if 200 <= status < 300:
            draft = _draft_of(_json_or_empty(body))
            if draft is None:
                raise ProviderError(f"{what}: HTTP {status} without a draft id and message id")
            return draft
        error = provider_error_for_response(what, status, headers, body)
        if status >= 500 or is_rate_limited(status, body) or status == 401:
            raise error
        if status == 403 and "insufficientPermissions" in error_reasons(body):
            raise DraftRefused(
                f'{error.reason} (send_via = "drafts" needs the {COMPOSE_SCOPE} scope)'
            )
        if 400 <= status < 500:
            raise DraftRefused(error.reason)
        raise error

    def send(self, mailbox: Mailbox, draft: Draft) -> SendOutcome:
        request = self._drafts.send(userId=mailbox.user, body={"id": draft.draft_id})
        # A send: paid by the engine's reservation when it has one (quota.py).
        self.provider.prepare(request, None, mailbox)
        try:
            status, headers, body = self.provider.execute(request, mailbox)
        except Exception as exc:
            return classify_send_exception(exc)
        if status == 404:
            # Consumed by an earlier send whose answer was lost, or deleted by a person:
            # only check_draft can tell, so this is no refusal.
            return SendOutcome(
                SendKind.UNKNOWN, f"draft {draft.draft_id} is gone (HTTP 404)", status=status
            )
        return classify_send_response(status, headers, body)

    def check(self, mailbox: Mailbox, draft: Draft) -> DraftCheck:
        request = self._drafts.get(userId=mailbox.user, id=draft.draft_id, format="minimal")
        what = f"drafts.get {draft.draft_id}"
        status, headers, body = self.provider.answer(
            what, request, GMAIL_GET_UNITS, mailbox, draft=True
        )
        if 200 <= status < 300:
            return DraftCheck(DraftStatus.PENDING)
        if status != 404:
            raise provider_error_for_response(what, status, headers, body)
        # Gone as a draft: its message is read in a second call, asked as every further
        # call of a check is (`next_call`): a sweep's check stopped there is no answer.
        next_call(f"get {draft.provider_message_id}")
        request = self._messages.get(
            userId=mailbox.user,
            id=draft.provider_message_id,
            format="metadata",
            metadataHeaders=["Message-ID"],
        )
        what = f"get {draft.provider_message_id}"
        status, headers, body = self.provider.answer(
            what, request, GMAIL_GET_UNITS, mailbox, draft=True
        )
        if status == 404:
            return DraftCheck(DraftStatus.GONE)
        if not 200 <= status < 300:
            raise provider_error_for_response(what, status, headers, body)
        data = _json_or_empty(body)
        labels = [str(label) for label in data.get("labelIds") or ()]
        if SENT_LABEL not in labels:
            return DraftCheck(DraftStatus.GONE)
        return DraftCheck(
            DraftStatus.SENT,
            provider_message_id=draft.provider_message_id,
            message_id_header=message_id_header(data),
        )

    def raw(self, mailbox: Mailbox, draft: Draft) -> bytes | None:
        """The unsent draft's message as it is now (`drafts.get format=raw`, one get);
        None when it is no unsent draft any more (404)."""
        what = f"drafts.get {draft.draft_id}"
        message = self._unsent_message(mailbox, draft, "raw")
        if message is None:
            return None
        raw = message.get("raw")
        if not isinstance(raw, str):
            raise ProviderError(f"{what}: no raw message in the answer")
        try:
            return base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4))
        except ValueError:  # binascii.Error is one
            raise ProviderError(f"{what}: the raw message does not decode") from None

    def find(self, mailbox: Mailbox, message_id: str) -> list[Draft]:
        query = f"rfc822msgid:{search_term(message_id)}"
        found: list[Draft] = []
        params: dict[str, Any] = {
            "userId": mailbox.user,
            "q": query,
            "maxResults": self.provider.page_size,
        }
        what = f"drafts.list {query}"
        for page in self.provider.pages(what, self._drafts.list, params, mailbox, draft=True):
            for item in page.get("drafts") or []:
                draft = _draft_of(item) if isinstance(item, dict) else None
                if draft is None:
                    raise ProviderError(f"{what}: malformed entry {item!r}")
                # Each further call asks whether the mailbox's quota scope is still the
                # daemon's (`next_call`: a tidy's or a fence's, as Graph's deletion does;
                # docs/architecture.md "Scope leases").
                next_call(f"drafts.get {draft.draft_id}")
                header = self._draft_message_id(mailbox, draft)
                # rfc822msgid: matches loosely: the header must be exactly ours.
                if header is not None and same_message_id(header, message_id):
                    found.append(draft)
        return found

    def _draft_message_id(self, mailbox: Mailbox, draft: Draft) -> str | None:
        """The Message-ID header of an unsent draft; None when it has none or is gone."""
        # drafts.get takes no metadataHeaders: "metadata" gives every header.
        message = self._unsent_message(mailbox, draft, "metadata")
        return None if message is None else message_id_header(message)

    def _unsent_message(self, mailbox: Mailbox, draft: Draft, fmt: str) -> dict[str, Any] | None:
        """`drafts.get` of the draft in `fmt`: its message resource (empty when the
        answer has none); None when it is no unsent draft now (404: sent or deleted)."""
        request = self._drafts.get(userId=mailbox.user, id=draft.draft_id, format=fmt)
        what = f"drafts.get {draft.draft_id}"
        status, headers, body = self.provider.answer(
            what, request, GMAIL_GET_UNITS, mailbox, draft=True
        )
        if status == 404:
            return None
        if not 200 <= status < 300:
            raise provider_error_for_response(what, status, headers, body)
        message = _json_or_empty(body).get("message")
        return message if isinstance(message, dict) else {}

    def delete(self, mailbox: Mailbox, draft_id: str) -> bool:
        request = self._drafts.delete(userId=mailbox.user, id=draft_id)
        what = f"drafts.delete {draft_id}"
        status, headers, body = self.provider.answer(
            what, request, GMAIL_DRAFT_WRITE_UNITS, mailbox, draft=True
        )
        if status == 404:
            return False
        if not 200 <= status < 300:
            raise provider_error_for_response(what, status, headers, body)
        return True


def _json_or_empty(body: bytes) -> dict[str, Any]:
    try:
        data = json.loads(body or b"{}")
    except (ValueError, UnicodeDecodeError):
        return {}
    return data if isinstance(data, dict) else {}
