"""The policies the running daemons have loaded, as the doors of intake see them.

`PolicyAnnouncer` is what a server (`run`, `sendledger api`) writes: its loaded set, at
start, at each reload and as a heartbeat, in the store's loaded-policy rows
(`ledger.stores.loaded_policies`). `judge_by_loaded` is what `submit` reads of them: a job
whose channel no running daemon has loaded is refused (the daemon would put it in review
at once, "no policy for the channel"); one whose file differs from what a daemon loaded is
accepted with a warning (it is sent under the loaded policy). With no daemon running,
nothing changes (docs/cli.md "Submit and the running daemons' policies";
docs/operations.md "Running under systemd").
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from daemon.service_layer.problems import FieldProblem
from ledger.display import iso, quoted
from ledger.event_format import StoreFormatNewer, check_event_format, give_back_declaration
from ledger.stores.format_rows import format_rows_for, server_holder
from ledger.stores.loaded_policies import DAEMON, LoadedPolicies, LoadedPolicyStore

if TYPE_CHECKING:
    from daemon.engine.policy_holder import PolicyHolder
    from ledger.application import Ledger
    from ledger.stores.identity import NameSession
    from policies.loader import PolicySet

log = logging.getLogger("sendledger")

#: How long a refused start tries to put back the declaration it replaced, and the pause
#: between two tries (`give_back_refused_start`).
GIVE_BACK_SECONDS = 5.0
GIVE_BACK_PAUSE = 0.5

#: A row counts as a running server's this long after its last write. Written every third
#: of it from a thread of its own, never from a tick: a slow tick (a provider call at its
#: timeout) must not make a running daemon look gone. A stop removes the row at once; one
#: left by a kill -9 stops counting when the daemon's name is free (its lock goes with the
#: process: `ledger.stores.loaded_policies`), and this long at most where that cannot be
#: asked.
LIVE_SECONDS = 60.0
#: How long a reload waits for its row to be written before it goes on regardless.
REWRITE_WAIT = 2.0
RELOAD_HINT = "reload them (systemctl reload sendledger)"


class PolicyAnnouncer:
    """Keeps this server's row: its name, what it loaded and when, and a heartbeat."""

    def __init__(
        self,
        rows: LoadedPolicyStore,
        name: str,
        kind: str,
        current: Callable[[], PolicySet],
        *,
        clock: Callable[[], float] = time.time,
        live_seconds: float = LIVE_SECONDS,
        on_beat: Callable[[], None] = lambda: None,
        on_stop: Callable[[], None] = lambda: None,
        held_by: Callable[[], NameSession | None] = lambda: None,
    ) -> None:
        """`held_by`: asked right before each write of the row, the session holding the
        server's name (`IdentityLock.session`): the row is written only while it still
        does, asked by the write itself (`LoadedPolicyStore.write`)."""
        self._rows = rows
        self._held_by = held_by
        self._on_beat = on_beat
        self._on_stop = on_stop
        self._name = name
        self._kind = kind
        self._current = current
        self._clock = clock
        self._live = live_seconds
        self._loaded_at = clock()
        #: The `loaded_at` of the row this server last wrote: a reload changes
        #: `_loaded_at` before its row is written (by the beat's thread, which a stop or a
        #: store that hangs may overtake), and the stop must remove the row that is there.
        self._row_loaded_at: float | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing = False
        self._written = threading.Condition()
        self._asked = 0  # reloads told
        self._done = 0  # reloads written (or tried)

    def write(self) -> None:
        """The row as of now (the store's clock where it has one). A store that cannot be
        written is said once and tried again at the next beat: the daemon keeps sending."""
        loaded_at = self._loaded_at
        try:
            session = self._held_by()
            now = self._rows.now()
            now = self._clock() if now is None else now
            self._rows.write(
                LoadedPolicies(
                    self._name,
                    self._kind,
                    loaded_at,
                    now + self._live,
                    self._current().fingerprints(),
                ),
                unless=self._stop.is_set,
                held_by=session,
            )
        except Exception as exc:
            if not self._failing:
                log.warning("cannot record the loaded policies in the store: %s", exc)
            self._failing = True
            return
        self._row_loaded_at = loaded_at
        self._failing = False

    def reloaded(self, _policies: PolicySet | None = None) -> None:
        """A reload took a new set: written at once by the beat's thread, waited for at
        most `REWRITE_WAIT`, so that a `submit` right after "policies reloaded" is judged
        by the new set, while a store that hangs never holds the caller (the daemon's main
        thread, which must stay free to read a stop) for longer."""
        with self._written:
            self._loaded_at = self._clock()
            self._asked += 1
            asked = self._asked
            self._wake.set()
            self._written.wait_for(lambda: self._done >= asked, timeout=REWRITE_WAIT)

    def start(self) -> None:
        self.write()
        self._thread = threading.Thread(target=self._beat, name="loaded-policies", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self._live / 3)
            self._wake.clear()
            if self._stop.is_set():
                return
            with self._written:
                asked = self._asked
            self.write()
            with self._written:
                self._done = asked
                self._written.notify_all()
            self._on_beat()

    def stop(self, lock_wait: float = 5.0) -> None:
        """Remove the row: a stopped server has loaded nothing. Within three lock waits
        (`lock_wait`: `[store] lock_timeout`, daemon/config/stop_bound.py): a heartbeat's
        write in flight, waited for, then the removal: of the row last written, and of
        the one a reload was to write (its write may have failed after it committed; a
        row not there is no wait), then `on_stop` (its event format declaration's). A
        write held up past the wait (a store that hangs) asks in its transaction whether
        the server stopped, and rolls back: it does not write the row again after the
        removal. One past that question holds the row, and the removal waits for it one
        lock wait; a commit held up longer asks again once it lands, and takes back the
        row it wrote (`LoadedPolicyStore.write`)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=lock_wait)
        written = [] if self._row_loaded_at is None else [self._row_loaded_at]
        for loaded_at in dict.fromkeys([*written, self._loaded_at]):
            try:
                self._rows.leave(self._name, self._kind, loaded_at)
            except Exception as exc:
                log.warning("cannot remove the loaded policies from the store: %s", exc)
                break
        try:
            self._on_stop()
        except Exception as exc:
            log.warning("cannot remove this server's event format from the store: %s", exc)


def live_daemons(rows: LoadedPolicyStore, now: datetime) -> list[LoadedPolicies]:
    """The rows of the sending daemons running at `now` (the caller's clock; the store's
    where it has one), not `sendledger api`'s: it sends nothing."""
    at = rows.now()
    at = now.timestamp() if at is None else at
    return [row for row in rows.live(at) if row.kind == DAEMON]


def _when(row: LoadedPolicies) -> str:
    return f"daemon {row.name!r} (loaded {iso(row.loaded_at)})"


def judge_by_loaded(
    daemons: Sequence[LoadedPolicies],
    jobs: Sequence[tuple[str, str]],
    *,
    batch: bool,
) -> tuple[list[FieldProblem], list[str]]:
    """Each job (channel, fingerprint of the file it was checked against) against what the
    running `daemons` loaded: a problem per job whose channel none of them loaded, a
    warning per channel whose file differs from (or is missing in) what one loaded."""
    problems: list[FieldProblem] = []
    warnings: dict[str, str] = {}
    if not daemons:
        return problems, []  # no daemon running: the folder is all there is
    for index, (channel, fingerprint) in enumerate(jobs):
        holders = [row for row in daemons if channel in row.fingerprints]
        if not holders:
            problems.append(
                FieldProblem(
                    index if batch else None,
                    "channel",
                    f"the policy of channel {channel!r} was added since the daemon loaded "
                    f"its policies ({', '.join(_when(row) for row in daemons)}): "
                    f"{RELOAD_HINT}",
                )
            )
            continue
        stale = [row for row in daemons if row.fingerprints.get(channel) != fingerprint]
        if stale and channel not in warnings:
            warnings[channel] = (
                f"warning: channel {channel!r}: the policy file differs from the one "
                f"{', '.join(_when(row) for row in stale)} sends with (fingerprint "
                f"{stale[0].fingerprints.get(channel, 'none')}, file {fingerprint}): the job "
                f"is sent under the loaded policy until you {RELOAD_HINT}"
            )
    return problems, list(warnings.values())


def format_watch(ledger: Ledger, newer: Callable[[StoreFormatNewer], None]) -> Callable[[], None]:
    """A server's heartbeat's read of the store's event format (`on_beat`), one row. A newer
    release raises it once no older server is live, and an older server whose heartbeat
    lapsed (a long pause, a stopped VM) counted as gone: `newer` is called, once, on the
    first format newer than this release reads, for the server to stop as its start would
    have refused (StoreFormatNewer, exit 2; docs/operations.md "Upgrading")."""
    found: list[StoreFormatNewer] = []

    def beat() -> None:
        try:
            check_event_format(ledger, writing=False)
        except StoreFormatNewer as exc:
            if not found:
                found.append(exc)
                newer(exc)
        except Exception as exc:
            # A store that cannot be read now: the heartbeat's write says so; next beat.
            log.debug("event format not read at the heartbeat: %s", exc)

    return beat


def announce_policies(
    ledger: Ledger,
    name: str,
    holder: PolicyHolder,
    kind: str,
    on_beat: Callable[[], None] = lambda: None,
    held_by: Callable[[], NameSession | None] = lambda: None,
) -> PolicyAnnouncer:
    """This server's loaded-policy row, written now, at each reload and as a heartbeat,
    for `submit` to judge by (`daemon/service_layer/loaded.py`); `on_beat` is called on
    the heartbeat's thread after each write but the first; each write is made only
    while `held_by()`, asked right before it, holds the server's name (PostgreSQL: two
    processes of one name after a database restart never both write its row; None:
    unconditioned). Its stop removes the row and
    the event format this server declared at its start (`ledger.event_format`), unless
    another server of its name declared since: a fresh declaration counts as a server
    starting (`admin copy-store` is refused beside one), and a stopped one starts
    nothing."""
    declared = ledger.format_declaration

    def withdraw() -> None:
        # Only the row this server's open wrote: one of its name written since is another
        # server's (the process that took its name after a database restart ended
        # this one's lock).
        if declared is not None and declared.holder == server_holder(kind, name):
            format_rows_for(ledger.recorder).withdraw(declared)

    announcer = PolicyAnnouncer(
        ledger.loaded_policies(),
        name or socket.gethostname(),
        kind,
        lambda: holder.current,
        on_beat=on_beat,
        on_stop=withdraw,
        held_by=held_by,
    )
    holder.listeners.append(announcer.reloaded)
    announcer.start()
    return announcer


def give_back_refused_start(ledger: Ledger) -> None:
    """A server's start refused after it declared its event format (an API server's
    port or heartbeat; a daemon, which declares once it holds its name, an older release
    live or its recovery failing): the declaration is taken back
    (`ledger.event_format.give_back_declaration`), so that the store is as the start
    found it. Left, it was a fresh declaration: `admin copy-store` took the store for one
    a server was starting on, for a minute, and a server of the name, whose row it
    replaced, did not remove it at its stop. A store that fails that write leaves the
    refusal the line.

    A store error is tried again, for :data:`GIVE_BACK_SECONDS` at most, a pause of
    :data:`GIVE_BACK_PAUSE` between two: the row left is no longer only a minute's
    false start. Put back, it is what the live server of the name reads; left, it is the
    refused start's release, and a newer release judging whether to raise the store's
    format took the live older server for one that reads it (the live one then stops
    at its next beat, on a format it cannot read). One try waits the store's own bound
    for a lock at most, within `daemon.stop_timeout` (docs/operations.md "Upgrading")."""
    deadline = time.monotonic() + GIVE_BACK_SECONDS
    while True:
        try:
            give_back_declaration(ledger)
            return
        except Exception as exc:
            if time.monotonic() + GIVE_BACK_PAUSE >= deadline:
                log.warning("cannot put the event format declaration back: %s", quoted(exc))
                return
            log.info("the event format declaration not put back, tried again: %s", quoted(exc))
        time.sleep(GIVE_BACK_PAUSE)


__all__ = [
    "LIVE_SECONDS",
    "PolicyAnnouncer",
    "announce_policies",
    "format_watch",
    "give_back_refused_start",
    "judge_by_loaded",
    "live_daemons",
]
