"""A `sendledger api` killed with `kill -9` leaves its loaded-policy row and its event
format declaration (docs/operations.md "How fast an API server is replaced"): its row
counted as a running server's for the rest of its heartbeat, 60 s, though its name's lock
went with it, holding back an upgrade (exit 3) and `admin copy-store` that long. It counts
now only while its name is held, as a daemon's; an API server of an earlier release,
which holds no name, is still judged by its heartbeat alone."""

from __future__ import annotations

import time

from tests.unit.test_scope_owners import POLICIES

from daemon.service_layer.copy_store import running_on
from daemon.service_layer.loaded import PolicyAnnouncer
from ledger.application import Ledger
from ledger.event_format import check_event_format
from ledger.stores.format_rows import FormatRow, format_rows_for
from ledger.stores.identity import api_lock_name
from ledger.stores.loaded_policies import API


def _api_servers(ledger: Ledger) -> list[str]:
    rows = ledger.loaded_policies()
    now = rows.now()
    return sorted(row.name for row in rows.live(time.time() if now is None else now))


def test_a_killed_api_server_stops_counting_once_its_name_is_free(store_url: str) -> None:
    with Ledger(store_url) as ledger:
        lock = ledger.hold_identity(api_lock_name("web"))
        check_event_format(ledger, server=(API, "web"))  # as `sendledger api` declares
        PolicyAnnouncer(ledger.loaded_policies(), "web", API, lambda: POLICIES).write()
        # An earlier release's API server: no name held, its declaration an older one's.
        format_rows_for(ledger.recorder).declare(FormatRow("api old", 1, time.time()))
        PolicyAnnouncer(ledger.loaded_policies(), "old", API, lambda: POLICIES).write()
        assert _api_servers(ledger) == ["old", "web"]
        lock.release()  # its process killed: the row and its declaration stay
        assert _api_servers(ledger) == ["old"]  # "web" counted 60 s more
        assert [line.split(" (")[0] for line in running_on(ledger)] == ["api 'old'"]
