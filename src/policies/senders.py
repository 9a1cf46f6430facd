"""Which mailboxes a channel may send as: the policy's `allowed_from` patterns and a job's
own `from` (docs/policies.md "Channel policies", docs/cli.md "Message fields").

A pattern is matched with `fnmatch` rules (`*` any run of characters, `?` one character)
against the bare address (`local@domain`, no display name), case-insensitively: mailbox
names at Gmail and most providers do not depend on case. Character classes (`[...]`) are
refused so that a pattern reads the same to every operator.
"""

from __future__ import annotations

import fnmatch
import functools
import re
from collections.abc import Sequence

from ledger.addresses import AddressError, parse_mailbox
from ledger.exceptions import Refusal, SendledgerError
from ledger.vocabulary import Sender

MAX_PATTERNS = 1000
# Matched whole (`fullmatch`): `$` after `.match` lets a final line feed through.
_PATTERN = re.compile(r"[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]+@[A-Za-z0-9.*?-]+")


class SenderRefused(SendledgerError, ValueError):
    """A job's `from` that its channel's policy does not allow. `field` names it."""

    kind = Refusal.BAD_INPUT

    def __init__(self, reason: str) -> None:
        super().__init__(f"from: {reason}")
        self.field = "from"
        self.reason = reason


def pattern_problem(pattern: str) -> str | None:
    """Why `pattern` cannot be an `allowed_from` entry, or None."""
    if not pattern:
        return "must not be empty"
    if "[" in pattern or "]" in pattern:
        return f"character classes are not supported (only * and ?): {pattern!r}"
    if not _PATTERN.fullmatch(pattern):
        return f"not an address pattern like '*@example.com': {pattern!r}"
    return None


@functools.lru_cache(maxsize=4096)
def bare_address(value: str) -> str:
    """The lower-cased addr-spec of one mailbox ("Name <A@B.c>" -> "a@b.c"). Cached: every
    claim asks it of its job's From (`sends_as`), 0.1-0.2 ms a parse, and a channel's
    jobs share a few."""
    return parse_mailbox(value).address.addr_spec.lower()


def allowed(address: str, patterns: Sequence[str]) -> bool:
    """Whether the mailbox `address` (display name allowed) matches one of `patterns`."""
    try:
        bare = bare_address(address)
    except AddressError:
        return False
    return any(fnmatch.fnmatchcase(bare, pattern.lower()) for pattern in patterns)


def sends_as(policy_from: str, patterns: Sequence[str], from_addr: str) -> bool:
    """Whether a channel whose `from` is `policy_from` and whose `allowed_from` is
    `patterns` lets a job send as `from_addr` (its own `from`, or the policy's at intake)."""
    try:
        if bare_address(from_addr) == bare_address(policy_from):
            return True
    except AddressError:
        return False
    return allowed(from_addr, patterns)


def job_sender(default: Sender, patterns: Sequence[str], job_from: str | None) -> Sender:
    """The Sender of one job: the policy's, or the job's own `from` when the policy allows
    it (its Message-ID domain and policy stay the policy's). Raises SenderRefused."""
    if job_from is None:
        return default
    if not patterns:
        raise SenderRefused("this channel's policy has no allowed_from: jobs cannot set from")
    if not allowed(job_from, patterns):
        raise SenderRefused(f"{job_from!r} matches none of the policy's allowed_from")
    return Sender(job_from, default.message_id_domain, default.policy)


__all__ = [
    "MAX_PATTERNS",
    "SenderRefused",
    "allowed",
    "bare_address",
    "job_sender",
    "pattern_problem",
    "sends_as",
]
