"""How long a stop may wait for the store, and the checks of it against the stop timeouts
(docs/operations.md "Stopping").

Once a stopping daemon's provider calls have ended, it may wait for rows another session
holds (a long transaction, an open psql). Such a session holds its rows for the whole
stop: every statement that meets one waits its whole lock wait and fails, and what would
follow it in the same step is not run. The waits that may then follow one another are,
from the code, the engine's (`Daemon.shutdown`, daemon/runtime.py):

1. the withdrawal of a lease renewal waiting for its job's row: it ends at its lock
   wait's end (`Leases.stop_renewing`, daemon/engine/leases.py);
2. and 3. the outcome's save: tried only within one lock wait of when it was asked, the
   last try waiting a lock wait of its own (daemon/engine/commit.py);
4. a renewal of a call that raised, not withdrawn by its worker, waited for by
   `Leases.close` until its lock wait ends (at most `close_wait`, 5 s);
5. a renewal of the scope leases and the heartbeat in flight, which `ScopeOwners.close`
   waits for (daemon/engine/owners.py): its first held row fails it;
6. the release of the scope leases, then the removal of the heartbeat
   (`ScopeOwners.close`): one of the two at most, since a release that fails skips the
   removal and one that succeeds met no held row.

A tick's round in flight (its scope leases' writes) is waited for before the engine
closes, beside 1 to 3: its first held row ends it; so are the API's requests in flight,
at most one lock wait (`ApiServer.stop`, daemon/api/server.py). Beside the engine's
close, on a thread of their own (`Daemon._stop_beside`), the rows that are not the
engine's, `BESIDE_LOCK_WAITS` in a row: the webhooks' three (`WebhookThreads.stop`,
daemon/webhooks/delivery_threads.py: a write in flight; a write begun before its thread
saw the stop, then the release of its lease) and the loaded policies' three
(`PolicyAnnouncer.stop`, daemon/service_layer/loaded.py: the heartbeat's write in flight,
then the row's removal, then the removal of the server's event format declaration).
tests/integration/test_stop_lock_waits.py holds every one of these rows from another
session and measures the stop against `stop_store_wait`.

A lock wait is PostgreSQL's `[store] lock_timeout`. On SQLite the wait is the busy
handler's, for a write of another process, never a session left open: not checked.
"""

from __future__ import annotations

from daemon.config.config_file import ConfigError
from ledger.stores.url import is_postgres_url

#: The engine's lock waits in a row once the calls have ended (1 to 6 above).
ENGINE_LOCK_WAITS = 6
#: The webhooks' and the loaded policies' lock waits in a row, beside the engine's.
BESIDE_LOCK_WAITS = 6
#: The lock waits in a row a stop may spend once its calls have ended.
STOP_LOCK_WAITS = max(ENGINE_LOCK_WAITS, BESIDE_LOCK_WAITS)


def stop_store_wait(url: str, lock_timeout: int) -> float | None:
    """The longest a stop may wait for rows another session holds, in seconds, once its
    calls have ended, on the store at `url`; None where no lock wait is configured (not
    PostgreSQL)."""
    if not is_postgres_url(url):
        return None
    return float(STOP_LOCK_WAITS * lock_timeout)


def check_stop_fits(url: str, lock: int, stop: float, source: str) -> None:
    """Refuse (ConfigError, exit 2) a `daemon.stop_timeout` (`stop`) shorter than the
    stop's lock waits of `store.lock_timeout` (`lock`): the daemon would give up its own
    stop, leaving outcomes to recovery, whenever rows stay held. `source`: where the
    settings came from, for the one line."""
    waits = stop_store_wait(url, lock)
    if waits is None or waits <= stop:
        return
    remedy = f"raise daemon.stop_timeout to {waits:g}s"
    if stop >= STOP_LOCK_WAITS:
        remedy += f" or lower store.lock_timeout to {int(stop // STOP_LOCK_WAITS)}s"
    raise ConfigError(
        f"{source}: daemon.stop_timeout: {stop:g}s is shorter than a stop's "
        f"{STOP_LOCK_WAITS} lock waits of store.lock_timeout ({lock}s each: {waits:g}s); "
        f"{remedy}"
    )


__all__ = [
    "BESIDE_LOCK_WAITS",
    "ENGINE_LOCK_WAITS",
    "STOP_LOCK_WAITS",
    "check_stop_fits",
    "stop_store_wait",
]
