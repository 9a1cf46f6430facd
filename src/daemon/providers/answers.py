"""Reading a provider's 2xx answer body, the same way for every HTTP provider."""

from __future__ import annotations

import json
from typing import Any

from daemon.providers.base import ProviderError


def json_object(what: str, status: int, body: bytes) -> dict[str, Any]:
    """A 2xx answer's JSON object. A body that is not one is no information: ProviderError,
    never an empty result."""
    try:
        data = json.loads(body)
    except ValueError as exc:
        raise ProviderError(f"{what}: HTTP {status} with an unreadable body") from exc
    if not isinstance(data, dict):
        raise ProviderError(f"{what}: HTTP {status} with an unexpected body")
    return data
