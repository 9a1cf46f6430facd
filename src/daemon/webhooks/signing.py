"""The Standard Webhooks signature (https://www.standardwebhooks.com, docs/http-api.md "Webhooks").

Signed with the `standardwebhooks` package, the specification's own reference library,
so that a receiver verifying with it (or with any library that follows it) agrees with
us byte for byte. The secret is written `whsec_<base64>`, as the specification writes it.
"""

from __future__ import annotations

import base64
import binascii
import math
import os
from datetime import UTC, datetime

from standardwebhooks.webhooks import Webhook

SECRET_PREFIX = "whsec_"
#: The specification's bounds on the secret's length, in bytes.
SECRET_BYTES = (24, 64)


def parse_secret(text: str) -> str:
    """The secret of a `secret_file`'s text (one line, `whsec_<base64>`); ValueError
    with the reason, never with the secret in it."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if len(lines) != 1:
        raise ValueError(f"one line expected ({SECRET_PREFIX}<base64>), found {len(lines)}")
    secret = lines[0]
    if not secret.startswith(SECRET_PREFIX):
        raise ValueError(f"the secret must start with {SECRET_PREFIX!r}")
    try:
        raw = base64.b64decode(secret[len(SECRET_PREFIX) :], validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"not base64 after {SECRET_PREFIX!r}") from None
    low, high = SECRET_BYTES
    if not low <= len(raw) <= high:
        raise ValueError(f"the secret must be {low} to {high} bytes, not {len(raw)}")
    return secret


def new_secret() -> str:
    """A fresh secret: 32 random bytes (`sendledger webhooks new-secret`)."""
    return SECRET_PREFIX + base64.b64encode(os.urandom(32)).decode("ascii")


def signed_headers(secret: str, msg_id: str, at: datetime, body: str) -> dict[str, str]:
    """`webhook-id`, `webhook-timestamp` (whole seconds) and `webhook-signature`
    (`v1,<base64 HMAC-SHA256 of "id.timestamp.body">`) for one attempt."""
    # The library reads a datetime's wall clock as UTC: give it UTC.
    moment = at.astimezone(UTC)
    signature = Webhook(secret).sign(msg_id, moment, body)
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(math.floor(moment.timestamp())),
        "webhook-signature": signature,
    }


__all__ = ["SECRET_PREFIX", "new_secret", "parse_secret", "signed_headers"]
