"""How long a tick may take before the daemon counts its scheduler as stuck: what stops
systemd's watchdog pings (`Daemon._wait_for_stop`, daemon/runtime.py) and fails
`/healthz`'s scheduler check (daemon/api/health.py) (docs/operations.md "Running under
systemd").

A tick reads and writes the store on its own thread (`Daemon.tick`, then
`Engine.hand_out`, daemon/engine/tick.py). A store that is slow but healthy (a row held by
another session for a while, a pool whose connections are all taken) makes each of those
calls wait out its bound before it answers, and the waits that may follow one another in
one tick are, from the code:

1. to 5. the scope round's writes on PostgreSQL (`ScopeOwners.balance` and its
   `renew_due`, daemon/engine/owners.py): the heartbeat, the renewal of the scopes held,
   the release of the idle ones, the release of those above the share, and the take of
   free ones, each waiting for its rows at most one `store.lock_timeout`;
6. and 7. the check of the daemon's name (`AdvisoryIdentityLock.check`,
   ledger/stores/postgres.py) after its session ended (a database restart): a new
   connection, and the end of its own earlier session, each at most one
   `store.connect_timeout`.

Beside those, the tick waits for the claims' renewals one renewer interval at most
(`Leases.renew_due`: 5 s). A fixed limit of ten ticks or a minute was below these waits
once `store.lock_timeout` was raised to 10 s (five of them, two connections of 10 s and
the renewals: 75 s): a tick still waiting for a row held a while failed `/healthz`, and
from 20 s (125 s) it outlasted the minute and the shipped unit's `WatchdogSec=60` after
it, and systemd killed the daemon in the middle of its provider calls (their outcomes then
recovered as unknown). On SQLite and the memory store there is no such wait to add.
"""

from __future__ import annotations

from daemon.config.settings import StoreSettings
from ledger.stores.url import is_postgres_url

#: Ten ticks, or a minute when that is longer: a scheduler that misses that many is stuck.
TICKS = 10
MINIMUM = 60.0
#: The scope round's lock waits in a row in one tick (1 to 5 above).
TICK_LOCK_WAITS = 5
#: The name check's connection waits in a row in one tick (6 and 7 above).
TICK_CONNECT_WAITS = 2
#: The claims' renewals a tick waits for, at most one renewer interval (`renew_interval`).
RENEWALS_WAIT = 5.0


def tick_store_wait(store: StoreSettings) -> float | None:
    """The longest one tick may wait for a slow but healthy `store`, in seconds; None
    where none of its waits is configured (not PostgreSQL)."""
    if not is_postgres_url(store.url):
        return None
    locks = TICK_LOCK_WAITS * store.lock_timeout
    return float(locks + TICK_CONNECT_WAITS * store.connect_timeout + RENEWALS_WAIT)


def tick_limit(tick: float, store: StoreSettings) -> float:
    """Seconds since the last tick ended past which the scheduler is stuck: ten ticks
    (`daemon.tick`: `tick`), a minute, or the waits of one tick for `store`
    (`tick_store_wait`) after the interval before that tick began, whichever is longest.
    The age is counted from the last tick's end, and the scheduler starts the next one up
    to `tick` later: the waits alone took a tick that met them all for a hang."""
    waits = tick_store_wait(store)
    return max(tick * TICKS, MINIMUM, 0.0 if waits is None else tick + waits)


__all__ = [
    "MINIMUM",
    "RENEWALS_WAIT",
    "TICKS",
    "TICK_CONNECT_WAITS",
    "TICK_LOCK_WAITS",
    "tick_limit",
    "tick_store_wait",
]
