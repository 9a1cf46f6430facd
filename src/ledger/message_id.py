"""The reconciliation handle: a Message-ID derived from the job key, never from a clock."""

from __future__ import annotations

import hashlib
import re

from ledger.exceptions import Refusal, SendledgerError

# RFC 5322 dot-atom for the domain part; strict enough to keep "<", ">", "@", spaces
# and control characters out of a header we build ourselves.
_DOMAIN = re.compile(
    r"^(?=.{1,253}\Z)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\Z"
)


class MessageIdError(SendledgerError, ValueError):
    kind = Refusal.BAD_INPUT


def validate_domain(domain: str) -> str:
    if not _DOMAIN.match(domain):
        raise MessageIdError(f"not a valid Message-ID domain: {domain!r}")
    return domain


def message_id_for(key: str, domain: str) -> str:
    """Same recipe as the widely shared n8n node, so existing handles carry over."""
    validate_domain(domain)
    digest = hashlib.sha256(key.encode("utf-8")).hexdigest()[:32]
    return f"<job-{digest}@{domain}>"


def normalize(message_id: str) -> tuple[str, str] | None:
    """(local part, lower-cased domain) of a Message-ID header value, or None if it
    does not look like one. One pair of angle brackets and surrounding space are
    optional; the domain compares case-insensitively (RFC 5321/5322), the local part
    does not."""
    value = message_id.strip()
    if value.startswith("<") and value.endswith(">"):
        value = value[1:-1].strip()
    local, at, domain = value.rpartition("@")
    if not at or not local or not domain:
        return None
    return local, domain.lower()


def same_message_id(a: str, b: str) -> bool:
    na, nb = normalize(a), normalize(b)
    return na is not None and na == nb
