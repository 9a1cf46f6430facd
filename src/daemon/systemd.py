"""sd_notify without libsystemd: one datagram per state change to $NOTIFY_SOCKET."""

from __future__ import annotations

import math
import os
import socket

#: The longest one state line may wait for room at $NOTIFY_SOCKET: a reader that stopped
#: reading (a full queue) costs the daemon that long, then the line is dropped, so the
#: thread that writes it (the main thread, which also handles SIGTERM) never hangs.
SEND_TIMEOUT = 1.0


class Notifier:
    def __init__(self, address: str | None = None, *, send_timeout: float = SEND_TIMEOUT) -> None:
        self.address = address if address is not None else os.environ.get("NOTIFY_SOCKET", "")
        self._socket: socket.socket | None = None
        if self.address:
            self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self._socket.settimeout(send_timeout)

    @property
    def enabled(self) -> bool:
        return self._socket is not None

    def notify(self, *lines: str) -> bool:
        if self._socket is None:
            return False
        address = self.address
        if address.startswith("@"):  # abstract namespace socket
            address = "\0" + address[1:]
        try:
            self._socket.sendto("\n".join(lines).encode("utf-8"), address)
        except OSError:  # TimeoutError too: a reader that stopped reading
            # systemd going away must never take the daemon down with it.
            return False
        return True

    def ready(self, status: str) -> bool:
        return self.notify("READY=1", f"STATUS={status}", f"MAINPID={os.getpid()}")

    def status(self, status: str) -> bool:
        return self.notify(f"STATUS={status}")

    def watchdog(self) -> bool:
        return self.notify("WATCHDOG=1")

    def stopping(self, status: str = "stopping", *, takes: float | None = None) -> bool:
        """STOPPING=1; with `takes` (seconds), EXTEND_TIMEOUT_USEC too: systemd (236 and
        later) then waits that long for the process to end, even past the unit's
        TimeoutStopSec, which lives outside sendledger and may be shorter."""
        lines = ["STOPPING=1", f"STATUS={status}"]
        if takes is not None:
            lines.append(extend_timeout(takes))
        return self.notify(*lines)

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close()
            self._socket = None


#: Seconds a start waiting for its store asks systemd for above the longest until its
#: next word (`StartNotices`): a loaded machine's late wake-up, the datagram's way.
START_MARGIN = 5


class StartNotices:
    """What systemd is told while a service's start waits for its PostgreSQL server
    (`ledger.stores.url.StartWatch`). Nothing else tells it: past TimeoutStartSec (90 s
    by default), a start still waiting, with a `store.connect_timeout` above about 75 s,
    was killed. Each try again extends the start's timeout (EXTEND_TIMEOUT_USEC, systemd
    236 and later) past the next word, and STATUS= says what it waits for (the store
    without its password) until connected, when it is cleared."""

    def __init__(self, notifier: Notifier) -> None:
        self._notifier = notifier

    def waiting(self, store: str, cause: str, within: float) -> None:
        self._notifier.notify(
            f"STATUS=waiting for PostgreSQL at {store} ({cause})",
            extend_timeout(within + START_MARGIN),
        )

    def connected(self, store: str, within: float) -> None:
        # The rest of the start may already be past TimeoutStartSec: it gets as long
        # again before READY=1 or its next wait's word.
        self._notifier.notify("STATUS=", extend_timeout(within + START_MARGIN))


def extend_timeout(seconds: float) -> str:
    """The notice that gives the unit's current start or stop `seconds` more (systemd 236
    and later), whatever its TimeoutStartSec or TimeoutStopSec."""
    return f"EXTEND_TIMEOUT_USEC={math.ceil(seconds * 1_000_000)}"


#: What a unit's TimeoutStopSec leaves above `daemon.stop_timeout`: the store's close and
#: the process's exit after the wait (docs/operations.md "Stopping").
STOP_MARGIN = 15


def timeout_stop_sec(stop_timeout: float) -> int:
    """The TimeoutStopSec for a daemon whose stop waits at most `stop_timeout` seconds: the
    daemon ends itself first, so systemd's SIGKILL never cuts a stop short."""
    return math.ceil(stop_timeout) + STOP_MARGIN


def watchdog_interval() -> float | None:
    """Half of WATCHDOG_USEC (as sd_watchdog_enabled advises), in seconds, or None."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        return max(int(usec) / 2_000_000, 0.05)
    except ValueError:
        return None


def under_systemd() -> bool:
    return bool(os.environ.get("INVOCATION_ID") or os.environ.get("JOURNAL_STREAM"))
