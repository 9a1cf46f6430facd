"""Decoding job JSON for `submit` and `POST /v1/jobs`: a name given twice in one object is
refused, never "last one wins" (docs/cli.md "Message fields and validation").

JSON allows an object to name a key twice and `json.loads` keeps the last value, but a
proxy, a log or a policy check in front of sendledger may read the first: it would see one
recipient and sendledger send to another. :func:`loads` marks each such object, and
:func:`duplicate_field` (called by `daemon.service_layer.intake.parse_jobs` for every job) names the
first one by its path (`to`, `headers.X-Tag`, `attachments[0].filename`), so the refusal
is the same one-line `job[1].to: ...` as every other field's.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["DUPLICATE_REASON", "duplicate_field", "loads"]

DUPLICATE_REASON = "given twice in one JSON object (each name once: a reader could take either)"


class _Duplicated(dict[str, Any]):
    """An object that named `duplicate` more than once (the last value kept, as json
    does; it is refused before anything reads it)."""

    duplicate: str


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for name, value in pairs:
        if name in result and not isinstance(result, _Duplicated):
            marked = _Duplicated(result)
            marked.duplicate = name
            result = marked
        result[name] = value
    return result


def loads(text: str | bytes) -> Any:
    """`json.loads`, with every object that names a key twice marked for
    :func:`duplicate_field`. Raises json.JSONDecodeError for whatever is not a JSON
    document it can decode (nesting deeper than the parser goes and integers longer than
    Python converts included, so a caller handles one exception), UnicodeDecodeError for
    bytes that are not UTF-8."""
    if isinstance(text, bytes):
        # UTF-8 only (RFC 8259), as a proxy or a check in front reads it: from bytes,
        # json.loads guesses UTF-16 and UTF-32 and passes over a byte order mark, so such
        # a body was taken where a reader of UTF-8 saw no job in it, or another.
        text = text.decode("utf-8")
    try:
        return json.loads(text, object_pairs_hook=_pairs)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise
    except RecursionError:
        raise json.JSONDecodeError("nested too deeply", "", 0) from None
    except ValueError as exc:
        raise json.JSONDecodeError(str(exc), "", 0) from None


def duplicate_field(value: object) -> str | None:
    """The path, within `value`, of the first name given twice in one object (depth
    first, in document order), or None. Iterative: a deep document is no recursion."""
    stack: list[tuple[str, object]] = [("", value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, _Duplicated):
            return _join(path, item.duplicate)
        if isinstance(item, dict):
            stack.extend((_join(path, str(name)), child) for name, child in reversed(item.items()))
        elif isinstance(item, list):
            stack.extend(
                (f"{path}[{index}]", child) for index, child in reversed(list(enumerate(item)))
            )
    return None


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name
