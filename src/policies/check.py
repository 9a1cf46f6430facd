"""``sendledger policy check [DIR]``: validate a policy folder without starting anything.

The CLI prints each problem on its own line to stderr and exits 2, or prints
:func:`summary_rows` as a table (:func:`render_table`) or JSON and exits 0.
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

from policies.durations import format_duration
from policies.loader import PolicyLoadError, PolicyProblem, PolicySet, load_policy_dir

__all__ = ["SUMMARY_COLUMNS", "check_policies", "render_table", "summary_rows"]

#: Column order of :func:`summary_rows` (and of the table).
SUMMARY_COLUMNS: tuple[str, ...] = (
    "channel",
    "provider",
    "on_unknown",
    "irreversible",
    "search_after",
    "search_interval",
    "confirm_misses",
    "max_attempts",
    "retry_backoff",
    "retry_backoff_max",
    "verify_after",
    "fingerprint",
    "file",
)


def check_policies(
    directory: Path,
    known_providers: Collection[str] | None,
    client_copy_providers: Collection[str] = (),
) -> tuple[PolicySet | None, list[PolicyProblem]]:
    """``(policies, [])`` when the folder loads, ``(None, problems)`` when it does not."""
    try:
        policies = load_policy_dir(
            directory,
            known_providers=known_providers,
            client_copy_providers=client_copy_providers,
        )
        return policies, []
    except PolicyLoadError as exc:
        return None, exc.problems


def summary_rows(policies: PolicySet) -> list[dict[str, object]]:
    """One row per channel, sorted by channel, keys as :data:`SUMMARY_COLUMNS`.

    Windows are written as durations ("5m", "250ms"), which ``parse_duration`` reads back.
    """
    rows: list[dict[str, object]] = []
    for name in sorted(policies):
        policy = policies[name]
        source = policies.sources.get(name)
        rows.append(
            {
                "channel": policy.channel,
                "provider": policy.provider,
                "on_unknown": policy.on_unknown,
                "irreversible": policy.irreversible,
                "search_after": format_duration(policy.search_after),
                "search_interval": format_duration(policy.effective_search_interval),
                "confirm_misses": policy.confirm_misses,
                "max_attempts": policy.max_attempts,
                "retry_backoff": format_duration(policy.retry_backoff),
                "retry_backoff_max": format_duration(policy.retry_backoff_max),
                "verify_after": format_duration(policy.verify_after),
                "fingerprint": policy.fingerprint,
                "file": str(source) if source is not None else "",
            }
        )
    return rows


def _cell(value: object) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def render_table(rows: list[dict[str, object]], columns: tuple[str, ...] | None = None) -> str:
    """A plain aligned text table with a header line; no trailing newline."""
    cols = columns if columns is not None else SUMMARY_COLUMNS
    cells = [[_cell(row.get(col, "")) for col in cols] for row in rows]
    widths = [max([len(col), *(len(line[i]) for line in cells)]) for i, col in enumerate(cols)]
    lines = ["  ".join(col.ljust(w) for col, w in zip(cols, widths, strict=True)).rstrip()]
    for line in cells:
        lines.append("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip())
    return "\n".join(lines)
