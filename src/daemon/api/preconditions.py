"""A decision's expected version as HTTP says it: a job's status is served with its
version as an `ETag`, and a decision (`POST /v1/review/{key}/resolve`, `POST
/v1/jobs/{key}/cancel`) sent back with it in `If-Match` holds for that version only, as
with the body's `expected_version` (docs/http-api.md "Conditional requests",
docs/review.md "Two people, one job"). The decision and its refusals are the service's;
HTTP's are the spelling and the one status RFC 9110 gives a condition that does not hold:
412, where the body's `expected_version` is answered 409 (or 422 for a version the job
never had)."""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Annotated

from fastapi import Header

from daemon.api.errors import ApiError
from daemon.api.models import exactly
from daemon.service_layer.problems import FieldProblem, NotAtVersion, ServiceError
from ledger.exceptions import Refusal

IF_MATCH = "If-Match"
#: One strong entity tag of a version, as `etag` writes it (at most 18 digits, as the
#: page's form takes): `If-Match` compares strongly, so a weak tag (`W/"7"`) never holds.
_TAG = re.compile(r'"([1-9][0-9]{0,17})"')
_RULES = (
    'the ETag a status of the job was served with ("7"), or *; one that says another '
    "version than the body's expected_version is refused"
)

#: The route's `If-Match` header, every line of it (the document says one): two lines
#: are one list to HTTP, and only the first would have been read.
IfMatch = Annotated[
    list[str] | None,
    Header(
        alias=IF_MATCH,
        description="the job's ETag the decision was made on: refused (412) if it changed since",
        json_schema_extra=exactly(
            {"type": "string", "pattern": r'^(\*|"[1-9][0-9]{0,17}")$', "x-rules": _RULES}
        ),
    ),
]


def etag(version: int) -> str:
    """The `ETag` of a job's status at `version`: the same version, the same status."""
    return f'"{version}"'


def expected_version(if_match: Sequence[str] | None, body: int | None) -> int | None:
    """The version a decision holds for: `If-Match`'s, else the body's `expected_version`
    (None: the version the service reads). `*` asks only that the job exists, as every
    decision does. Two that say different versions are refused, and so is the header
    given twice: either could be the one the caller looked at."""
    if not if_match:
        return body
    if len(if_match) > 1:
        raise _refused("given twice: send the one ETag of the status you looked at")
    if (text := if_match[0].strip(" \t")) == "*":
        return body
    found = _TAG.fullmatch(text)
    if found is None:
        raise _refused(
            'not one entity tag of a version: send the ETag the job\'s status was served with ("7")'
            + (", not a weak one (If-Match compares strongly)" if text.startswith("W/") else "")
        )
    version = int(found.group(1))
    if body is not None and body != version:
        raise _refused(
            f"says version {version} and the body's expected_version {body}: give the one "
            "version you looked at"
        )
    return version


@contextmanager
def held_to(if_match: Sequence[str] | None) -> Iterator[None]:
    """A decision made under `If-Match`: refused because the job is not at the tag's
    version (moved on since, or while it was decided; or a version it never had), it is
    412 Precondition Failed with the service's words, as RFC 9110 requires of a condition
    that does not hold, not the 409 or 422 of the body's `expected_version`."""
    try:
        yield
    except NotAtVersion as exc:
        if if_match and if_match[0].strip(" \t") != "*":
            raise ApiError(412, exc.message) from None
        raise


def _refused(reason: str) -> ServiceError:
    problem = FieldProblem(None, IF_MATCH, reason)
    return ServiceError(Refusal.BAD_INPUT, f"{IF_MATCH}: {reason}", [problem])


__all__ = ["IF_MATCH", "IfMatch", "etag", "expected_version", "held_to"]
