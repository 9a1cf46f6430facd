"""The event format: which stored shapes a release writes and reads, and the guard that
keeps two releases on one store from misreading each other (docs/operations.md
"Upgrading").

Every release reads what earlier ones wrote (upcasters, explicit topics:
docs/architecture.md "Stored events keep loading"), but not the other way round. An
event topic an older release lacks fails the load of its job, and the load of every job
in the same batch of due work with it (``could not load N due jobs`` at each tick, none
of them sent); a field it lacks is dropped without a word (a `Checked` event's `count`
and `complete`, read by a release before them, show the first 20 copies as all there
are). So the shapes of the events and of the job index are numbered:

- ``EVENT_FORMAT``: the newest format this release writes and reads. The shapes it
  stands for are pinned by ``FORMAT_DIGESTS`` (``shapes_digest``: every event's topic,
  class version and fields, the index's columns, the job states); a change to any of them
  fails ``tests/unit/test_event_format.py`` until the format is raised and its digest
  added.
- The store records the highest format written to it (``ledger.stores.format_rows``), and
  each server the format its release reads, at its start.

``check_event_format`` is asked at every open (``daemon.from_settings.open_ledger``),
and by a daemon once it holds its name (``daemon.runtime.start_up``: only the name's
holder declares, so a start the name refuses writes nothing):

- a store of a newer format than the release reads is refused (``StoreFormatNewer``,
  exit 2): "this store holds events of format N, this release reads up to M: upgrade
  sendledger on this host";
- a release that writes a newer format than the store holds raises the store's format
  first, and refuses to (``OlderReleaseLive``, exit 3) while a server of a release that
  reads only an older format is live on the store; a command that only reads goes on
  without raising it. Each server declares before it reads, and a raise is followed by a
  second read of the declarations: of an older server and a newer one starting at once,
  one is refused (the older one sees the raised format, or the newer one its declaration).

A store without a record (written by releases before the record) holds ``FIRST_FORMAT``;
so does a live server that declared none (those releases do not check the store
themselves: see docs/operations.md "Upgrading").
"""

from __future__ import annotations

import hashlib
import inspect
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ledger.exceptions import Refusal, SendledgerError
from ledger.stores.format_rows import (
    STORE_HOLDER,
    FormatRow,
    format_rows_for,
    server_holder,
)
from ledger.stores.url import StoreRefused

if TYPE_CHECKING:
    from ledger.application import Ledger

#: The format of every store written before the store recorded one (releases up to the
#: Eleventh wave), and of their servers, which declare none.
FIRST_FORMAT = 1
#: The newest format this release writes and reads.
EVENT_FORMAT = 2
#: Each format's shapes (`shapes_digest`): a changed shape needs a new format.
FORMAT_DIGESTS = {
    1: "6973a14e1bb3",
    # Attempted v4: `made_draft`, the draft a claim's call sends, made before the claim.
    2: "7cddbb54ccf6",
}
#: A server's declaration counts it as live this long after it was written even before
#: its loaded-policies row is (`daemon.service_layer.loaded.LIVE_SECONDS`): a server that
#: has checked the store and not yet announced itself is starting, not gone.
STARTING_SECONDS = 60.0


class StoreFormatNewer(StoreRefused):
    """The store holds events of a format this release cannot read: nothing was written."""

    def __init__(self, stored: int, reads: int) -> None:
        super().__init__(
            f"this store holds events of format {stored}, this release reads up to "
            f"{reads}: upgrade sendledger on this host"
        )
        self.stored = stored
        self.reads = reads


class OlderReleaseLive(SendledgerError):
    """This release would write a newer format than a live server of the store reads."""

    kind = Refusal.CONFLICT

    def __init__(self, writes: int, stored: int, older: Sequence[tuple[str, int]]) -> None:
        named = ", ".join(f"{holder} (reads up to format {reads})" for holder, reads in older)
        super().__init__(
            f"this release writes events of format {writes} and this store holds format "
            f"{stored}; live on it: {named}: upgrade or stop those first"
        )
        self.older = list(older)


@dataclass(frozen=True)
class Release:
    """What a release knows of formats: the newest it reads, the one it writes (the
    same in a release; tests inject others)."""

    reads: int
    writes: int


def judge_format(
    stored: int,
    release: Release,
    live: Mapping[str, int],
    *,
    writing: bool,
) -> bool:
    """Whether the store's format is to be raised to `release.writes` (True), or the
    store is used as it is (False); StoreFormatNewer or OlderReleaseLive when neither.

    `stored`: the store's format; `live`: the format each other live server reads, by
    holder; `writing`: whether the opener may write events (a read-only command never
    raises the format, and reads an older one as it is)."""
    if stored > release.reads:
        raise StoreFormatNewer(stored, release.reads)
    if not writing or stored >= release.writes:
        return False
    older = sorted((h, reads) for h, reads in live.items() if reads < release.writes)
    if older:
        raise OlderReleaseLive(release.writes, stored, older)
    return True


def check_event_format(
    ledger: Ledger,
    *,
    release: Release | None = None,
    server: tuple[str, str] | None = None,
    writing: bool = True,
    clock: Callable[[], float] | None = None,
) -> int:
    """Judge the store of `ledger` for `release` (default: this one) and act on it: the
    format the store holds afterwards. `server`: (kind, name) of a server starting (its
    declaration is written first, and its own earlier rows are not "another release");
    `clock`: epoch seconds in place of the store's clock (PostgreSQL's, which servers on
    several hosts share, as for the loaded-policies rows) or, on the others, the wall
    clock's."""
    release = release or Release(EVENT_FORMAT, EVENT_FORMAT)
    rows = format_rows_for(ledger.recorder)
    found = rows.rows()
    # A store too new is refused before anything is written; a reader stops here.
    judge_format(_stored(found), release, {}, writing=False)
    if not writing or (server is None and _stored(found) >= release.writes):
        return _stored(found)  # one read: what almost every command's open costs
    now = clock() if clock is not None else ledger.loaded_policies().now()
    now = time.time() if now is None else now
    own = server_holder(*server) if server is not None else None
    # The row of this server's name before its own declaration replaces it: a live server
    # of that name is another process (a server declares once it holds its name, a
    # daemon its own and an API server its own, but on PostgreSQL the name's earlier
    # process may still run after a database restart ended its lock), and reads what it
    # declared.
    replaced = found.get(own or "")
    if own is not None:
        # Before reading the others: a server that starts beside this one sees it.
        declared = FormatRow(own, release.reads, now)
        _tried_twice(lambda: rows.declare(declared))
        ledger.format_declaration, ledger.format_replaced = declared, replaced
        found = rows.rows()
    stored = _stored(found)
    if stored >= release.writes:
        judge_format(stored, release, {}, writing=True)  # a newer one written meanwhile
        return stored
    try:
        if judge_format(
            stored, release, _live_readers(ledger, found, now, own, replaced), writing=True
        ):
            _tried_twice(lambda: rows.raise_to(release.writes, now))
            # An older server reads only the store's format: one that declared after the
            # read above may have read before the raise and gone on. Its declaration is in
            # by then: read again, this one refuses (the older one is refused at its next
            # start).
            again = _live_readers(ledger, rows.rows(), now, own, replaced)
            judge_format(stored, release, again, writing=True)
            return max(stored, release.writes)
    except OlderReleaseLive:
        if replaced is not None:
            # Refused: the live server of this name keeps the declaration it made.
            give_back_declaration(ledger)
        raise
    return stored


def give_back_declaration(ledger: Ledger) -> None:
    """A server's start refused after it declared (an older release live; a daemon's
    recovery failing once it holds its name; an API server's port): the declaration is
    taken back, the row of its name it replaced put back (the name's earlier process's,
    whose own stop removes only that one), so the store is as the start found it. Both
    only while the row is still the one this start wrote: one of the name declared since
    is kept. A daemon declares only once it holds its name (`daemon.runtime.start_up`),
    so a start its name refuses has nothing to give back."""
    declared, replaced = ledger.format_declaration, ledger.format_replaced
    if declared is None:
        return
    rows = format_rows_for(ledger.recorder)
    if replaced is not None:
        # Only over this start's own row: a declaration written since (a new process of
        # the name, another refused start) is newer than the one put back, and stays.
        rows.put_back(declared, replaced)
    else:
        rows.withdraw(declared)
    # Forgotten once written: a write the store failed is tried again with them (the
    # write changes only this start's own row, so a second one after a first that did
    # commit changes nothing).
    ledger.format_declaration = ledger.format_replaced = None


def _stored(found: Mapping[str, FormatRow]) -> int:
    return found[STORE_HOLDER].format if STORE_HOLDER in found else FIRST_FORMAT


def _live_readers(
    ledger: Ledger,
    found: Mapping[str, FormatRow],
    now: float,
    own: str | None,
    replaced: FormatRow | None,
) -> dict[str, int]:
    """The format each live server other than this one (`own`) reads: those with a live
    loaded-policies row (FIRST_FORMAT when it declared none), and those that declared
    within STARTING_SECONDS. A live row of `own`'s name is another process's (an API
    server's; a daemon's whose lock a PostgreSQL restart ended while it ran): it reads
    what it declared before this one's declaration replaced it (`replaced`)."""
    live: dict[str, int] = {}
    for server in ledger.loaded_policies().live(now):
        holder = server_holder(server.kind, server.name)
        declared = replaced if holder == own else found.get(holder)
        live[holder] = declared.format if declared is not None else FIRST_FORMAT
    for holder, row in found.items():
        if holder not in (STORE_HOLDER, own) and row.at > now - STARTING_SECONDS:
            live[holder] = row.format
    return live


def _tried_twice(write: Callable[[], None]) -> None:
    # Two processes creating the table at once: PostgreSQL refuses the second CREATE;
    # once the other's table is there, the write is tried again on it.
    try:
        write()
    except Exception:
        time.sleep(0.05)
        write()


def shapes_digest() -> str:
    """A digest of every shape an older release could misread: each event's topic, class
    version and fields, the job index's columns and the job states."""
    from ledger.job import SendJob
    from ledger.stores.index import COLUMNS
    from ledger.vocabulary import JobState

    lines = []
    for name, cls in sorted(vars(SendJob).items()):
        if not (inspect.isclass(cls) and hasattr(cls, "TOPIC")) or name == "Event":
            continue
        fields: set[str] = set()
        for base in cls.__mro__:
            fields.update(inspect.get_annotations(base))
        version = getattr(cls, "class_version", 1)
        lines.append(f"{cls.TOPIC} v{version} {','.join(sorted(fields))}")
    lines.append("index " + ",".join(COLUMNS))
    lines.append("states " + ",".join(state.value for state in JobState))
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:12]


__all__ = [
    "EVENT_FORMAT",
    "FIRST_FORMAT",
    "FORMAT_DIGESTS",
    "OlderReleaseLive",
    "Release",
    "StoreFormatNewer",
    "check_event_format",
    "give_back_declaration",
    "judge_format",
    "shapes_digest",
]
