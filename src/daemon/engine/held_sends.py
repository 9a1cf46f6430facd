"""The scopes whose sends are held, in words for systemd's `STATUS=` line: an operator
without the HTTP API (the default) sees there what `/healthz` `checks.circuits` shows
(docs/operations.md "Running under systemd", "Outages and quotas"), and the review page's
overview the same words (docs/review.md "Review page").

One line, bounded: the first `NAMED` scopes (sorted, as `Circuits.open` gives them), then
how many more. A scope's name carries a mailbox address (`Provider.scope`): the caller
makes the whole line printable before it leaves the process (`ledger.display.printable`).
"""

from __future__ import annotations

import math
from datetime import datetime

from daemon.engine.circuit import OpenCircuit

#: At most this many scopes named on the line; the rest counted ("and 2 more").
NAMED = 3
#: A scope's name cut to this many characters: a mailbox address may be 254 long.
NAME_MAX = 80


def held_sends(circuits: list[OpenCircuit], now: datetime) -> str | None:
    """`sends held: gmail/ops@example.com paused (10 unanswered, next probe in 40s), ...`;
    None when no scope's sends are held."""
    if not circuits:
        return None
    shown = [f"{_name(c.scope)} {held_scope(c, now)}" for c in circuits[:NAMED]]
    if len(circuits) > NAMED:
        shown.append(f"and {len(circuits) - NAMED} more")
    return "sends held: " + ", ".join(shown)


def held_scope(circuit: OpenCircuit, now: datetime) -> str:
    """How one scope's sends are held: `paused (10 unanswered, next probe in 40s)`, `open
    (3 failures, probe out)` (the review page's overview shows it beside the name)."""
    if circuit.sends_only:
        why = f"paused ({circuit.unanswered} unanswered"
    else:
        why = f"open ({circuit.failures} failures"
        if circuit.unanswered:
            why += f", {circuit.unanswered} unanswered"
    return f"{why}, {_probe(circuit, now)})"


def _probe(circuit: OpenCircuit, now: datetime) -> str:
    if circuit.probing:
        return "probe out"
    wait = (circuit.next_probe - now).total_seconds()
    return f"next probe in {math.ceil(wait)}s" if wait > 0 else "probe due"


def _name(scope: str) -> str:
    return scope if len(scope) <= NAME_MAX else scope[: NAME_MAX - 3] + "..."


__all__ = ["NAMED", "held_scope", "held_sends"]
