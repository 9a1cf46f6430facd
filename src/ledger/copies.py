"""How many of a search's copies are kept, and how every door says what a search found.

A mailbox can hold any number of messages with a job's Message-ID: any inbound mail can
carry any Message-ID, and a provider may list many. The count decides (one copy confirms,
none is a miss, two or more are a duplicate) and is kept whole; the copies themselves (a
provider id each, with its Date, To and Subject on a check's answer) are kept only up to
:data:`COPIES_KEPT`, wherever they go: the recorded event, a check's answer, the review
page, the command line, a log line (docs/how-it-works.md "Counting copies"). No imports
of ours: the ledger's events and the daemon's search results both read it.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["COPIES_KEPT", "TRASHED_ID", "copies_found", "found_only_in_trash", "only_in_trash"]

#: The most copies a search keeps, in the order the provider listed them; the rest are
#: counted. Two decide a duplicate; a human deciding on one opens a few to see what the
#: customer got. 20 keeps every copy of any duplicate the daemon itself can make at the
#: default `max_attempts` (3) over several resends, and bounds a check's answer: each
#: copy's Date, To and Subject are at most 2,000 long as JSON (`MAX_RECORDED`), so 20
#: copies are at most 120,000 of them, where 10,000 copies were 2.3 MB. A provider's
#: search stops reading once it has found one more than this (it knows there are more:
#: the count is then "at least").
COPIES_KEPT = 20


def copies_found(count: int, complete: bool = True) -> str:
    """ "1 copy found", "3 copies found", "at least 21 copies found" (the search stopped
    reading once it had more than :data:`COPIES_KEPT`): how every door says what a
    search found."""
    least = "" if complete else "at least "
    return f"{least}{count} {'copy' if count == 1 else 'copies'} found"


def found_only_in_trash(count: int, complete: bool = True) -> str:
    """ "a copy only in the trash: sent and deleted by its sender, or received and
    deleted", "2 copies ...": how every door says a search found copies in the sender's
    trash and none in its sent folder, which settles nothing (docs/review.md "Review")."""
    one = count == 1 and complete
    counted = "a copy" if one else copies_found(count, complete).removesuffix(" found")
    whose = "its" if one else "their"
    return (
        f"{counted} only in the trash: sent and deleted by {whose} sender, or received and deleted"
    )


#: The mark of a copy found in the trash, at the head of its id where a check records it
#: (`SearchResult.recorded_copies`), and of IMAP's trash ids themselves.
TRASHED_ID = "trash:"


def only_in_trash(recorded: Sequence[str]) -> bool:
    """Whether a check recorded copies, every one found in the trash (`TRASHED_ID`)."""
    return bool(recorded) and all(copy.startswith(TRASHED_ID) for copy in recorded)
