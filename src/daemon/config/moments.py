"""A moment a user writes: an ISO 8601 time or date (UTC when it names no zone), or a
duration ago (`24h`, `7d`). `audit --since/--until` and `GET /v1/jobs?since=` read it
the same way (docs/cli.md "Command line", docs/http-api.md "HTTP API")."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from policies.durations import DurationError, parse_duration, unitless_number


def parse_moment(value: str, now: datetime) -> datetime:
    """The moment `value` names. ValueError with a one-line reason otherwise.

    A number without a unit is no duration here: "20261101" is a date (ISO 8601's basic
    form), which as seconds was 234 days ago; "24" is neither, and is refused naming
    the unit to write."""
    bare = unitless_number(value)
    try:
        if bare is None:
            return now - timedelta(seconds=parse_duration(value))
    except DurationError:
        pass
    except OverflowError:
        # "100000000d" ago is before the first representable time.
        raise ValueError(f"too far in the past: {value!r}") from None
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        if bare is not None:
            raise ValueError(
                f"{value!r} has no unit: write {bare}h for {bare} hours ago (or {bare}d, "
                f"{bare}m, {bare}s), or a date (2026-11-01)"
            ) from None
        raise ValueError(
            f"not a time: {value!r} (e.g. 2026-11-01, 2026-11-01T12:00Z or 24h)"
        ) from None
    moment = moment if moment.tzinfo else moment.replace(tzinfo=UTC)
    try:
        # The index compares epoch seconds; a time that has none is out of range.
        moment.timestamp()
        moment.astimezone(UTC)
    except (OverflowError, ValueError, OSError):
        raise ValueError(f"out of range: {value!r}") from None
    return moment


__all__ = ["parse_moment"]
