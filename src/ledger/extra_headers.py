"""The message fields a caller may add beyond the basics: extra headers by name from an
allow-list, and the threading headers (In-Reply-To, References). See docs/cli.md, "Message
fields".

The headers that sendledger writes itself are never the caller's: a second Message-ID
would break reconciliation (docs/architecture.md), a second From or To would send other
mail than the job records.
"""

from __future__ import annotations

import re

#: Headers sendledger builds itself; a caller naming one is refused (compared lower-case).
OWNED_HEADERS = frozenset(
    name.lower()
    for name in (
        "Message-ID",
        "From",
        "To",
        "Cc",
        "Bcc",
        "Date",
        "MIME-Version",
        "Subject",
        "Reply-To",
        "In-Reply-To",
        "References",
    )
)
#: Extra headers a caller may set, by exact name (compared lower-case), besides any X-*.
ALLOWED_HEADERS = {
    "list-unsubscribe": "List-Unsubscribe",
    "list-unsubscribe-post": "List-Unsubscribe-Post",
}
#: Headers whose values are URLs or tokens: ASCII only (an IRI must be percent-encoded).
ASCII_ONLY = frozenset(ALLOWED_HEADERS)

# RFC 5322 field name: printable ASCII except ":".
_FIELD_NAME = re.compile(r"^[!-9;-~]+\Z")
_ATEXT = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+"
_DOT_ATOM = rf"{_ATEXT}(?:\.{_ATEXT})*"
# RFC 5322 msg-id with dot-atom on both sides (no obsolete forms, no domain literals).
_MSG_ID = re.compile(rf"^<{_DOT_ATOM}@{_DOT_ATOM}>\Z")
#: Longest message id accepted: it must fit one header line (998 octets) with its name.
MAX_MESSAGE_ID = 250
#: Longest run without a space in a header value: a line can only be folded at a space,
#: and a folded line must stay within SMTP's 998 octets.
MAX_WORD = 900
#: Longest extra header name: the name and its first word must fit one line.
MAX_HEADER_NAME = 76


def header_name_problem(name: str) -> str | None:
    """Why `name` may not be an extra header, or None when it may."""
    if not _FIELD_NAME.match(name):
        return "not a header name (printable ASCII without ':' or spaces)"
    if len(name) > MAX_HEADER_NAME:
        return f"a header name longer than {MAX_HEADER_NAME} characters"
    lower = name.lower()
    if lower in OWNED_HEADERS or lower.startswith("content-"):
        return f"{name} is written by sendledger and cannot be set"
    if lower in ALLOWED_HEADERS or (lower.startswith("x-") and len(lower) > 2):
        return None
    return f"{name} is not allowed (allowed: List-Unsubscribe, List-Unsubscribe-Post, X-*)"


def canonical_message_id(value: str) -> str | None:
    """`value` as one ``<left@right>`` message id (angle brackets added when missing), or
    None when it is not one."""
    text = value if value.startswith("<") else f"<{value}>"
    if len(text) > MAX_MESSAGE_ID or not _MSG_ID.match(text):
        return None
    return text
