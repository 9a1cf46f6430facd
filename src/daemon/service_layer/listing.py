"""Listing jobs from the job index a page at a time (`GET /v1/jobs`, docs/http-api.md "HTTP API").

A page is in (written_at, key) order, the order the rows were stored, and its cursor is
the last row's position, so paging on is stable under inserts: a job created or changed
while a caller pages sorts after every row already read (it shows up once, later), and
none already read is skipped. Not by `updated_at`: a job's times are taken before it is
written (a batch's when its messages were proved, seconds before), so a walk by them
would pass a batch before it committed (`ledger.stores.index.IndexRow.written_at`). The
cursor is opaque to callers (base64url JSON), checked when it comes back.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from daemon.config.moments import parse_moment
from daemon.service_layer.problems import FieldProblem
from ledger.vocabulary import JobState

LIMIT_DEFAULT = 100
LIMIT_MAX = 1000
#: A cursor is a position (a time and a key): anything much longer was not ours.
CURSOR_MAX = 4096
STATES = tuple(state.value for state in JobState)


@dataclass(frozen=True)
class ParamProblem(FieldProblem):
    """One refused query parameter, named as it is written (`limit: ...`)."""

    def __str__(self) -> str:
        return f"{self.field}: {self.reason}"


def _problem(name: str, reason: str) -> ParamProblem:
    return ParamProblem(None, name, reason)


@dataclass(frozen=True)
class JobQuery:
    state: str | None
    channel: str | None
    since: datetime | None
    limit: int
    after: tuple[float, str] | None


def parse_query(
    *,
    state: str | None,
    channel: str | None,
    since: str | None,
    limit: str | int | None,
    cursor: str | None,
    now: datetime,
) -> tuple[JobQuery | None, list[ParamProblem]]:
    """The query, or every problem of its parameters (each named)."""
    problems: list[ParamProblem] = []
    if state is not None and state not in STATES:
        problems.append(_problem("state", f"one of {', '.join(STATES)}"))
    if channel is not None and not channel.strip():
        problems.append(_problem("channel", "empty"))
    moment = None
    if since is not None:
        try:
            moment = parse_moment(since, now)
        except ValueError as exc:
            problems.append(_problem("since", str(exc)))
    size = LIMIT_DEFAULT
    if limit is not None:
        text = str(limit).strip()
        if not (text.isascii() and text.isdigit() and len(text) <= 6) or not (
            1 <= int(text) <= LIMIT_MAX
        ):
            problems.append(_problem("limit", f"a whole number from 1 to {LIMIT_MAX}"))
        else:
            size = int(text)
    after = None
    if cursor is not None:
        after = decode_cursor(cursor)
        if after is None:
            problems.append(_problem("cursor", "not a cursor this API gave (next_cursor)"))
    if problems:
        return None, problems
    return JobQuery(state, channel, moment, size, after), []


def encode_cursor(updated_at: float, key: str) -> str:
    raw = json.dumps([updated_at, key], ensure_ascii=True, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[float, str] | None:
    """The position a cursor holds, or None for anything that is not one."""
    if not cursor or len(cursor) > CURSOR_MAX or not cursor.isascii():
        return None
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        value: Any = json.loads(raw)
    except (binascii.Error, ValueError, RecursionError):
        return None
    match value:
        # Checked as the store reads it: the key is bound as UTF-8 text, which a lone
        # surrogate has no encoding for (a crash, not a refusal) and PostgreSQL refuses a
        # NUL in. No job key holds either (`ledger.keys`), so no cursor we gave does.
        case [int() | float() as at, str() as key] if not isinstance(at, bool) and _storable(key):
            try:
                position = float(at)
            except OverflowError:
                return None
            return (position, key) if math.isfinite(position) else None
    return None


def _storable(text: str) -> bool:
    if "\x00" in text:
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


__all__ = [
    "LIMIT_DEFAULT",
    "LIMIT_MAX",
    "JobQuery",
    "ParamProblem",
    "decode_cursor",
    "encode_cursor",
    "parse_query",
]
