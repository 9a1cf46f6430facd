"""What a provider's calls answer (the provider port, `base.py`): a send's outcome, the copies
a search found, the delivery reports a mailbox read found, and the error of a call that gave
no answer. Values only: the port, the drafts handle (`draft_handle.py`) and every provider
share them, and none of them imports another for them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from ledger.characters import storable
from ledger.copies import COPIES_KEPT, TRASHED_ID
from ledger.exceptions import SendledgerError


class SendKind(StrEnum):
    CONFIRMED = "confirmed"  # 2xx with the provider's message id
    UNKNOWN = "unknown"  # the request may have been accepted; nobody can tell from here
    REJECTED = "rejected"  # the provider definitely did not accept it


@dataclass(frozen=True)
class SendOutcome:
    kind: SendKind
    reason: str
    provider_message_id: str | None = None
    transient: bool = False  # only for REJECTED: may be retried after a backoff
    retry_after: float | None = None  # seconds, from Retry-After when the provider gave one
    status: int | None = None  # HTTP status when there was one
    #: Only for REJECTED and transient: nothing was sent AND the provider (or the mailbox's
    #: quota) is unavailable (connection refused, DNS, connect timeout, TLS handshake, 429
    #: and quota errors, SMTP 421 before DATA). Waited out: it does not count against
    #: `max_attempts`, and a few in a row open the scope's circuit (docs/operations.md, "Outages and
    #: quotas").
    unavailable: bool = False
    #: The call ended because it outlived its timeout (after a send's request was written:
    #: UNKNOWN). For the job the outcome is what `kind` says; for the scope's circuit a
    #: sign of a hang, counted as "unavailable" is (docs/operations.md, "Outages and
    #: quotas").
    timed_out: bool = False
    #: The provider never answered at all: the connection ended (closed or reset) after
    #: the request was written with nothing of an answer, before its timeout. For the
    #: job the outcome is what `kind` says (UNKNOWN after SMTP's final `.` or an HTTP
    #: send): the ordinary ambiguous outcome, an answer for the circuit's
    #: count of unavailable calls. Only a run of them with no send answered in between
    #: pauses the scope's sends (the channel's `pause_after_unanswered`,
    #: docs/operations.md "Outages and quotas").
    unanswered: bool = False
    #: Only for REJECTED and transient: the send stopped before any call that could send
    #: this message, because its quota scope went to another daemon during a step before
    #: that call (Graph's tidy of an earlier attempt's drafts: `ScopeLost`). No attempt:
    #: like the dispatch's own "not ours", it does not count against `max_attempts`, and
    #: it is no failure for the scope's circuit (docs/architecture.md "Scope leases: one
    #: daemon per quota scope").
    not_attempted: bool = False

    def __post_init__(self) -> None:
        if self.not_attempted and not (self.kind is SendKind.REJECTED and self.transient):
            raise ValueError("a send that made no attempt is a transient rejection")
        # The provider's words are recorded as they came, and a store cannot keep every
        # string (a JSON error's "\ud800", a NUL): the outcome's save would fail, and the
        # claim be recovered as Unknown.
        object.__setattr__(self, "reason", storable(self.reason))


@dataclass(frozen=True)
class SearchHit:
    provider_message_id: str
    message_id_header: str
    labels: tuple[str, ...] = field(default_factory=tuple)
    # What a human checking the copy wants to see (as the provider stored them; "" when
    # the provider did not say): docs/review.md "Review".
    date: str = ""
    to: str = ""
    subject: str = ""
    #: Found in the mailbox's trash (IMAP's folder flagged `\\Trash`, Graph's Deleted
    #: Items), searched only when the sent folder holds no copy. Weaker evidence than a
    #: sent copy: a message *received* with the job's Message-ID and deleted is there too
    #: (anyone who knows a job key can compute it), so alone it settles nothing
    #: (`SearchResult.only_in_trash`, docs/how-it-works.md "Counting copies").
    in_trash: bool = False

    def __post_init__(self) -> None:
        # As a mailbox decoded them (undecodable bytes as lone surrogates): recorded with a
        # check (`Checked`), so storable as SendOutcome.reason is.
        for name in ("message_id_header", "date", "to", "subject"):
            object.__setattr__(self, name, storable(getattr(self, name)))


@dataclass(frozen=True)
class SearchResult:
    """The copies a search found, and the query exactly as the provider was sent it
    (that is what the ledger records for an audit).

    The one place a search's copies are bounded: `hits` keeps the first `COPIES_KEPT`
    (in the order found) and `more` counts the rest, so the answer, the recorded event,
    the page, the command line and the log never hold more, however many a mailbox
    lists (docs/how-it-works.md "Counting copies"). `count`, all of them, decides.
    `complete` is False when the provider stopped reading with more messages left
    (`first_copies`): `count` is then at least that many, and two or more, so the
    decision (a duplicate) is the one a whole read makes."""

    query: str
    hits: tuple[SearchHit, ...] = ()
    more: int = 0  # copies found beyond `hits`: counted, not kept
    complete: bool = True

    def __post_init__(self) -> None:
        if self.more < 0:
            raise ValueError("a negative count of copies")
        if not self.complete and len(self.hits) + self.more < 2:
            # A search that stopped reading before it could tell 0, 1 and 2+ apart has
            # not answered: the provider raises ProviderError instead (`first_copies`).
            raise ValueError("a search stops reading only once it has found two copies")
        if len(self.hits) > COPIES_KEPT:
            object.__setattr__(self, "more", self.more + len(self.hits) - COPIES_KEPT)
            object.__setattr__(self, "hits", self.hits[:COPIES_KEPT])

    @property
    def count(self) -> int:
        """How many copies the search found: exact when `complete`, else at least."""
        return len(self.hits) + self.more

    @property
    def only_in_trash(self) -> bool:
        """Whether every copy found is in the trash (none in the sent folder): a copy sent
        and deleted by its sender, or one received and deleted; a human tells them apart
        (`decisions.after_search`). A provider reads the trash only when the sent folder
        held none, so the copies counted beyond `hits` are in the trash too."""
        return bool(self.hits) and all(hit.in_trash for hit in self.hits)

    @property
    def copies(self) -> list[str]:
        """The provider's ids of the kept copies, in the order found."""
        return [hit.provider_message_id for hit in self.hits]

    @property
    def recorded_copies(self) -> list[str]:
        """`copies` as a check records them (`Checked.provider_message_ids`): a copy in
        the trash marked `TRASHED_ID` (IMAP's ids carry it already), so that what the
        job's page later says of the last check ("the customer has it") is not said of
        a copy that may have been received (`guidance.py`), and a copy moved between
        the trash and the sent folder is new evidence."""
        return [
            TRASHED_ID + hit.provider_message_id
            if hit.in_trash and not hit.provider_message_id.startswith(TRASHED_ID)
            else hit.provider_message_id
            for hit in self.hits
        ]


#: A provider's search stops reading messages once it has found this many copies: one
#: more than it keeps (`COPIES_KEPT`), so it knows there were more, and far more than the
#: two that decide a duplicate. A mailbox holding 100,000 copies costs a search this many
#: reads (Gmail's metadata gets, IMAP's header fetches, Graph's pages), not 100,000.
SEARCH_STOPS_AT = COPIES_KEPT + 1
#: The most messages a search reads that are not copies (a provider's looser match than
#: the exact Message-ID: Gmail's `rfc822msgid:`, IMAP's substring `HEADER` search) before
#: it gives up: a search that cannot tell 0, 1 and 2+ apart within it fails
#: (ProviderError: no information, never a miss), rather than read without end.
SEARCH_READS_MAX = 500


def first_copies(read: Iterable[SearchHit | None], what: str) -> tuple[list[SearchHit], bool]:
    """The copies among the messages a search reads, in order (`read` yields each one
    read: its hit, or None for a message that is no copy), and whether every one was
    read. Stops pulling once it has `SEARCH_STOPS_AT` copies (so the provider reads no
    further page or message), or after `SEARCH_READS_MAX` messages that are no copies:
    with two copies or more the search has answered (a duplicate, at least that many);
    with fewer it cannot tell, and raises ProviderError (no information, never a miss)."""
    hits: list[SearchHit] = []
    others = 0
    for hit in read:
        if hit is not None:
            hits.append(hit)
            if len(hits) >= SEARCH_STOPS_AT:
                return hits, False
            continue
        others += 1
        if others >= SEARCH_READS_MAX:
            if len(hits) >= 2:
                return hits, False
            raise ProviderError(
                f"{what}: {others} messages read that are not copies, {len(hits)} that"
                " are: too many to read before one, none or two copies can be told apart"
            )
    return hits, True


@dataclass(frozen=True)
class Fenced:
    """What a fence of a job's drafts did (`DraftFirst.delete_made`): the ids deleted, and
    what it read by id that the search right after it takes instead of reading again
    (`DraftFirst.search_made`). Opaque to the engine, which hands it on as it came."""

    deleted: list[str]
    #: Per draft id, its last read: the message (no draft any more: a copy, or another
    #: message's) or None (deleted for good by this fence: no copy can come of it). A draft
    #: the fence found gone, or lost to a late send under its deletion, is not here: a copy
    #: in transit may be filed by the time the search reads it (docs/architecture.md
    #: "Microsoft Graph").
    read: Mapping[str, Mapping[str, Any] | None] = field(default_factory=dict)


@dataclass(frozen=True)
class FoundReport:
    """A message of the mailbox that may be a delivery report, as the provider read it:
    its bytes, or None when it was not read: larger than the caller's limit, or of a
    top-level `content_type` the provider saw first that no report has."""

    provider_id: str
    raw: bytes | None
    size: int
    content_type: str = ""  # "multipart/report", ...; "" when the provider did not say
    #: When the mailbox received it, by the provider's clock (Gmail's internalDate,
    #: Graph's receivedDateTime); None when the provider did not say. A report received
    #: before the job was sent is a forgery (`SendJob.record_bounce`).
    received_at: datetime | None = None


@dataclass(frozen=True)
class ReportRead:
    """One read of a mailbox for delivery reports (docs/how-it-works.md "Bounces"): what
    was asked, every candidate the mailbox lists since then (`listed`, ids), and those not
    `known` before, read now (`found`). `complete` is False when the read stopped early
    (quota kept for sends, or the caller's limit): the rest are read next time."""

    query: str
    listed: tuple[str, ...] = ()
    found: tuple[FoundReport, ...] = ()
    complete: bool = True


class ProviderError(SendledgerError):
    """A search or read could not be completed (network, 5xx, quota).

    The caller must treat it as "no information", never as "no hits".
    """

    def __init__(
        self,
        reason: str,
        *,
        retry_after: float | None = None,
        unavailable: bool = False,
        timed_out: bool = False,
    ) -> None:
        reason = storable(reason)  # recorded as a failure's detail: as SendOutcome.reason
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after
        #: The provider did not answer at all or said "over quota" (as SendOutcome's); a
        #: call that timed out is unavailable too.
        self.unavailable = unavailable or timed_out
        #: The call outlived its timeout: a hang, for the circuit (SendOutcome.timed_out).
        self.timed_out = timed_out
        #: A report read refused for now after it listed or downloaded reports not
        #: listed or downloaded before: the provider keeps them for its next read, so the
        #: read got on though it failed (`BounceWatch` counts it as progress).
        self.progressed = False


class DeleteRefused(ProviderError):
    """Drafts the provider still holds, read by their ids, whose deletion it refused and
    would refuse again (a 4xx such as 403: a hold or a retention label on them, the
    application's access): a late call may still send them, and trying again does not
    help, so a fence that meets one cannot be made (`Sweep` sends the job to review,
    docs/providers.md "Deleting a draft: Deleted Items, and the late send"). `deleted`:
    the job's drafts it did delete."""

    def __init__(self, reason: str, *, deleted: Iterable[str] = ()) -> None:
        super().__init__(reason)
        self.deleted = list(deleted)


#: What a person does about a draft the provider refuses to delete for good, said after
#: the refusal wherever a job stops on one (the sweep's review, a person's resend).
DRAFT_OUT_OF_REACH = (
    "a late call may still send it, and a search would miss that copy: delete it in the"
    " mailbox (a hold or a retention label may keep it), then resend the job, or abandon it"
)


__all__ = [
    "DRAFT_OUT_OF_REACH",
    "SEARCH_READS_MAX",
    "SEARCH_STOPS_AT",
    "DeleteRefused",
    "Fenced",
    "FoundReport",
    "ProviderError",
    "ReportRead",
    "SearchHit",
    "SearchResult",
    "SendKind",
    "SendOutcome",
    "first_copies",
]
