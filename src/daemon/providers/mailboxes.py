"""The mailboxes a provider acts as with `user = "{from}"`: each made on first use and
dropped once idle (docs/performance.md "Many mailboxes, one daemon").

A provider that acts as each job's From mailbox keeps something per mailbox (Gmail: the
delegated credentials and the quota bucket; Graph: the request slots and the drafts it
made). A daemon may serve 10,000 mailboxes that each send now and then, so an entry is
dropped once it equals what a fresh one would be: dropping then loses nothing. A bucket
still refilling (a fresh one is full), a call in flight or a remembered draft keep it; what
a provider must keep past the entry (Gmail's live token) it takes in `on_drop`.

`forget_idle` (every engine tick, through `Provider.forget_idle`) looks only at the
entries whose time to be looked at has come: an entry is looked at `idle_after` seconds
after its last use, and again when it says it might be idle (`Entry.idle_at`). So a tick
costs the mailboxes it looks at, not the mailboxes kept, and nothing for the mailboxes
that had nothing to do (tests/unit/test_idle_mailboxes.py counts it).

A job's view of its mailbox asks for the entry at each use (`get`), never keeps it: a view
that outlived a drop (its job queued behind an open circuit) must spend the same bucket
as the jobs loaded after it, never a second one of the same mailbox.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from ledger.addresses import parse_mailbox

#: Seconds after its last use before a mailbox is looked at to be dropped: long enough
#: that a mailbox sending now and then keeps its entry, short enough that 10,000 mailboxes
#: that each sent once are gone within the minute.
IDLE_AFTER = 60.0
#: The soonest an entry that said "not yet" is looked at again, so one look per tick at most.
_AGAIN = 0.5


class Entry(Protocol):
    def idle_at(self, now: float) -> float | None:
        """None when the entry equals a fresh one now (it may be dropped); otherwise the
        moment (on the registry's clock) when it might."""
        ...


E = TypeVar("E", bound=Entry)


@dataclass(eq=False)
class _Slot(Generic[E]):
    entry: E
    used_at: float
    spellings: list[str] = field(default_factory=list)  # the From texts that name it


class Mailboxes(Generic[E]):
    """The entries by mailbox address (case-insensitive), each made by `make(address)`.
    Thread-safe; time is `clock` (the provider's monotonic clock, injected in tests)."""

    def __init__(
        self,
        make: Callable[[str], E],
        *,
        clock: Callable[[], float],
        idle_after: float = IDLE_AFTER,
        on_drop: Callable[[E], None] | None = None,
    ) -> None:
        self._make = make
        self._clock = clock
        self._idle_after = idle_after
        self._on_drop = on_drop
        self._lock = threading.Lock()
        self._slots: dict[str, _Slot[E]] = {}  # by lower-cased address
        self._by_from: dict[str, _Slot[E]] = {}  # by From as the jobs spell it
        # (when to look, tie-break, address): one per slot, the soonest first.
        self._looks: list[tuple[float, int, str]] = []
        self._order = itertools.count()
        self.looked = 0  # entries looked at by `forget_idle` (tests count them)

    def get(self, from_addr: str) -> E:
        """The entry of the mailbox `from_addr` names (a From header's text, or the bare
        address), made now if there is none; its use is noted."""
        now = self._clock()
        with self._lock:
            slot = self._by_from.get(from_addr)
            if slot is not None:
                slot.used_at = now
                return slot.entry
        # Every job of a mailbox spells its From the same way: each spelling parsed once.
        address = parse_mailbox(from_addr).address.addr_spec
        key = address.lower()
        with self._lock:
            slot = self._slots.get(key)
            if slot is None:
                slot = self._slots[key] = _Slot(self._make(address), now)
                heapq.heappush(self._looks, (now + self._idle_after, next(self._order), key))
            slot.used_at = now
            if from_addr not in self._by_from:
                self._by_from[from_addr] = slot
                slot.spellings.append(from_addr)
            return slot.entry

    def forget_idle(self) -> int:
        """Drop the entries that equal a fresh one and were not used for `idle_after`;
        how many were dropped. Looks only at the entries due to be looked at."""
        now = self._clock()
        dropped: list[E] = []
        with self._lock:
            while self._looks and self._looks[0][0] <= now:
                _, _, key = heapq.heappop(self._looks)
                slot = self._slots[key]
                self.looked += 1
                look = slot.used_at + self._idle_after
                if look <= now:
                    again = slot.entry.idle_at(now)
                    if again is None:
                        del self._slots[key]
                        for spelling in slot.spellings:
                            del self._by_from[spelling]
                        dropped.append(slot.entry)
                        continue
                    look = max(again, now + _AGAIN)
                heapq.heappush(self._looks, (look, next(self._order), key))
        if self._on_drop is not None:
            for entry in dropped:
                self._on_drop(entry)
        return len(dropped)

    def entries(self) -> list[E]:
        with self._lock:
            return [slot.entry for slot in self._slots.values()]

    def __len__(self) -> int:
        with self._lock:
            return len(self._slots)
