"""Whether each provider keeps our Message-ID, and the read-back that finds out.

Reconciliation rests on one assumption: a copy the provider stored carries the Message-ID
we set. A provider that replaces it makes every search miss and every retry a duplicate.
So after a send confirmed by response the stored copy's Message-ID is read back; a
mismatch marks the provider's handle unreliable in the store (for every daemon), and from
then on its unknown outcomes go to review instead of being searched.

Not after every send: a read-back is a second API call (and, on Gmail, 5 quota units) per
send, and a provider that replaces IDs does so for every message of an account, not for
one in a thousand. So each provider's first `readback_first` confirmed sends after the
daemon starts are read back, then a steady `readback_rate` share of the rest (every
1/rate-th, by a running credit, so the share is exact and tests need no randomness).
Both are capabilities of the provider port (`daemon/providers/base.py`; the Gmail
provider sets them from its settings, others keep `ProviderBase`'s defaults).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from contextlib import nullcontext
from dataclasses import dataclass

from daemon.engine.circuit import CHECK, Circuits
from daemon.engine.clock import Clock
from daemon.providers.base import Provider, ProviderError
from ledger.application import Ledger
from ledger.display import quoted
from ledger.job import SendJob
from ledger.message_id import same_message_id
from ledger.stores.unchanged import Unchanged
from ledger.wire_check import carries_message_id

log = logging.getLogger("sendledger.engine")


@dataclass
class _Sampler:
    first: int
    rate: float
    seen: int = 0
    credit: float = 0.0

    def take(self) -> bool:
        self.seen += 1
        if self.seen <= self.first:
            return True
        self.credit += self.rate
        if self.credit >= 1.0 - 1e-9:
            self.credit -= 1.0
            return True
        return False


def _sampler_for(provider: Provider) -> _Sampler:
    first, rate = provider.readback_first, provider.readback_rate
    return _Sampler(max(int(first), 1), min(max(float(rate), 0.0), 1.0))


class ProviderHealth:
    """The handles' reliability, read from the store once per tick (not once per job),
    and again only where a decision rests on it: after a search's miss, before a resend
    those misses decided (`still_reliable`)."""

    def __init__(self, ledger: Ledger, clock: Clock, circuits: Circuits | None = None) -> None:
        self._ledger = ledger
        self._clock = clock
        self._circuits = circuits  # a read-back's call counts toward its scope's circuit
        self._lock = threading.Lock()
        self._reliable: dict[str, bool] = {}
        #: Handles this process marked unreliable, and when: the count of `_marks` at the
        #: mark's last step (`read_back`), so a `refresh` tells a mark made while it read.
        self._marks = 0
        self._marked: dict[str, int] = {}
        self._samplers: dict[str, _Sampler] = {}
        self.readbacks = 0

    def refresh(self, providers: Iterable[str]) -> None:
        with self._lock:
            read_from = self._marks
        fresh = {name: self._ledger.handle_reliable(name) for name in providers}
        with self._lock:
            # A read-back's mark made while the store was read: the answer may be from
            # before it was written, and the mark stands (the next refresh reads it).
            for name, marked in self._marked.items():
                if marked > read_from:
                    fresh[name] = False
            self._reliable = fresh

    def reliable(self, provider: str) -> bool:
        with self._lock:
            return self._reliable.get(provider, True)

    def still_reliable(self, provider: str) -> bool:
        """`reliable`, and the store read again now rather than at the last tick: another
        daemon's read-back may have marked the handle since (docs/architecture.md "The
        message"). Found marked, this daemon takes it for unreliable from now on."""
        return self.unmarked_in_store(provider) is not None

    def unmarked_in_store(self, provider: str) -> Unchanged | None:
        """`still_reliable`, its answer, when unmarked, the handle as read: the save of a
        decision made on it holds to it (`Work.unchanged`), so that another daemon's
        mark written after this read withdraws that save (`Changed`) instead of being
        missed (docs/how-it-works.md "The read-back of the Message-ID")."""
        if not self.reliable(provider):
            return None
        read = self._ledger.handle_unmarked(provider)
        if read is None:
            self._mark_unreliable(provider)
        return read

    def unreliable(self) -> list[str]:
        with self._lock:
            return sorted(name for name, ok in self._reliable.items() if not ok)

    def should_read_back(self, name: str, provider: Provider) -> bool:
        """Whether this confirmed send of provider `name` is one to read back."""
        if not provider.response_ids_readable:
            return False
        with self._lock:
            sampler = self._samplers.get(name)
            if sampler is None:
                sampler = self._samplers[name] = _sampler_for(provider)
            return sampler.take()

    def read_back(
        self, job: SendJob, name: str, provider: Provider, provider_message_id: str, *, raw: bytes
    ) -> None:
        """Compare the stored copy's Message-ID with ours; a failed read proves nothing.
        `raw` is what was sent: another Message-ID marks the handle unreliable only when
        those bytes are proved to carry ours in their one header block (a message that
        lost it on the way out says nothing about the provider)."""
        with self._lock:
            self.readbacks += 1
        # A read, not a send: its answer clears only failures of calls begun before it
        # (a read-back answered before a hang and read after it closes nothing), and
        # one that hung is a hang, as a search's (its probe a ping, not a send into it).
        circuit = (
            nullcontext()
            if self._circuits is None
            else self._circuits.call(provider.scope(), self._clock, CHECK)
        )
        try:
            with circuit:
                stored = provider.read_message_id(provider_message_id)
        except ProviderError as exc:
            log.warning("job %s: Message-ID read-back failed: %s", job.key, quoted(exc.reason))
            return
        if stored is not None and same_message_id(stored, job.message_id):
            return
        if not carries_message_id(raw, job.message_id):
            log.error(
                "job %s: the stored copy carries Message-ID %s, but the bytes sent do not"
                " carry ours in their header block: the handle is not marked unreliable",
                job.key,
                stored,
            )
            return
        log.critical(
            "PROVIDER %s REPLACED OUR MESSAGE-ID: sent %s, stored %s. Searches cannot find "
            "this provider's copies; unknown outcomes now go to review.",
            name,
            job.message_id,
            stored,
        )
        self._mark_unreliable(name)
        self._ledger.mark_handle(
            name,
            lambda handle: handle.mark_unreliable(
                expected=job.message_id,
                observed=stored or "",
                provider_message_id=provider_message_id,
                job_key=job.key,
                at=self._clock(),
            ),
        )
        # Again once written: a refresh that read the store before the write and kept
        # its answer after the first mark has set it back.
        self._mark_unreliable(name)

    def _mark_unreliable(self, name: str) -> None:
        with self._lock:
            self._reliable[name] = False
            self._marks += 1
            self._marked[name] = self._marks
