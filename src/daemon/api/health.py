"""`/healthz`: is this process able to do its work? (docs/http-api.md "HTTP API").

Checks the store (one index query, whether the last write of events failed, and in a
daemon sharing scopes whether its leases are renewed and its clock is the store's), the
scheduler (age of the last completed tick, in the daemon only), the channel policies
(loaded, and whether the last reload failed) and each provider handle's reliability. Any
failing check makes the answer 503 with its reason.

Every error text it serves comes from elsewhere (the store's driver, the operator's policy
files, a lease's or a clock's refusal) and is served bounded as a recorded reason is
(`ledger.characters.recorded`): a 10 MB error would otherwise be every probe's answer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from daemon.engine.circuit import OpenCircuit
from ledger.application import Ledger
from ledger.characters import recorded
from ledger.vocabulary import JobState
from policies.loader import PolicySet


@dataclass
class HealthSources:
    ledger: Ledger
    policies: Callable[[], PolicySet]
    policy_error: Callable[[], str | None]
    providers: list[str]
    unreliable: Callable[[], list[str]] | None = None
    tick_age: Callable[[], float] | None = None  # None: no scheduler in this process
    tick_limit: float = 60.0  # a tick older than this means the scheduler is stuck
    circuits: Callable[[], list[OpenCircuit]] | None = None  # None: no engine here
    #: Why the scope leases are not renewed (a store that takes no write of them); None
    #: when no engine here shares scopes (`Engine.scope_failure`).
    scope_failure: Callable[[], str | None] | None = None
    #: How far off the store's this daemon's clock is and why it stands aside for it;
    #: None while it does not, or when no engine here shares scopes
    #: (`Engine.clock_failure`).
    clock_failure: Callable[[], tuple[float, str] | None] | None = None


def check_health(sources: HealthSources) -> tuple[bool, list[str], dict[str, Any]]:
    reasons: list[str] = []
    checks: dict[str, Any] = {}
    try:
        review = sources.ledger.counts([JobState.REVIEW])[JobState.REVIEW]
        checks["store"] = {"ok": True, "review": review}
        # The query above only reads: a read-only or full store passes it while every
        # claim and outcome fails. The last write's refusal stands until a write succeeds.
        failure = sources.ledger.write_failure
        if failure is not None:
            checks["store"].update(
                ok=False,
                write_error=recorded(failure.error),
                write_failed_at=failure.at.isoformat(),
            )
            reasons.append(recorded(f"store cannot be written: {failure.error}"))
        # The scope leases are written apart from the events: a daemon that cannot renew
        # them stops its calls by itself and writes no event that could fail.
        leases = sources.scope_failure() if sources.scope_failure else None
        if leases is not None:
            checks["store"].update(ok=False, scope_leases_error=recorded(leases))
            reasons.append(recorded(f"store: {leases}"))
        # Standing aside it writes nothing, so nothing above fails while it sends nothing.
        aside = sources.clock_failure() if sources.clock_failure else None
        if aside is not None:
            off, why = aside
            checks["store"].update(ok=False, clock_off=round(off, 3), clock_error=recorded(why))
            reasons.append(recorded(f"store: {why}"))
    except Exception as exc:
        reason = recorded(f"store unreachable: {type(exc).__name__}: {exc}".splitlines()[0])
        checks["store"] = {"ok": False, "error": reason}
        reasons.append(reason)
    if sources.tick_age is None:
        checks["scheduler"] = {"ok": True, "running": False}
    else:
        age = sources.tick_age()
        ticking = age < sources.tick_limit
        checks["scheduler"] = {"ok": ticking, "running": True, "last_tick_age": round(age, 3)}
        if not ticking:
            reasons.append(f"scheduler: no tick for {age:.0f}s (limit {sources.tick_limit:.0f}s)")
    error = sources.policy_error()
    error = None if error is None else recorded(error)
    channels = sorted(sources.policies())
    checks["policies"] = {"ok": error is None, "channels": channels, "last_reload_error": error}
    if error is not None:
        reasons.append(recorded(f"policies: the last reload failed: {error}"))
    unreliable = set(sources.unreliable() if sources.unreliable else [])
    checks["providers"] = {
        name: {"ok": name not in unreliable, "handle_reliable": name not in unreliable}
        for name in sources.providers
    }
    for name in sorted(unreliable):
        reasons.append(f"provider {name}: handle unreliable (its Message-IDs were replaced)")
    if sources.circuits is not None:
        # An open circuit is an outage being waited out, not a fault of this process:
        # shown, but the answer stays 200 (docs/operations.md, "Outages and quotas").
        checks["circuits"] = {
            c.scope: {
                "open": True,
                "since": c.since.isoformat(),
                "failures": c.failures,
                "next_probe": c.next_probe.isoformat(),
                "probing": c.probing,
                "unanswered": c.unanswered,
                "sends_only": c.sends_only,
            }
            for c in sources.circuits()
        }
    return not reasons, reasons, checks
