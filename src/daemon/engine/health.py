"""Whether each provider keeps our Message-ID, and the read-back that finds out.

Reconciliation rests on one assumption: a copy the provider stored carries the Message-ID
we set. A provider that replaces it makes every search miss and every retry a duplicate.
So after a send confirmed by response the stored copy's Message-ID is read back; a
mismatch marks the provider's handle unreliable in the store (for every daemon), and from
then on its unknown outcomes go to review instead of being searched.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable

from daemon.engine.clock import Clock
from daemon.providers.base import Provider, ProviderError
from ledger.application import Ledger
from ledger.job import SendJob
from ledger.message_id import same_message_id

log = logging.getLogger("sendledger.engine")


class ProviderHealth:
    """The handles' reliability, read from the store once per tick (not once per job)."""

    def __init__(self, ledger: Ledger, clock: Clock) -> None:
        self._ledger = ledger
        self._clock = clock
        self._lock = threading.Lock()
        self._reliable: dict[str, bool] = {}

    def refresh(self, providers: Iterable[str]) -> None:
        fresh = {name: self._ledger.handle_reliable(name) for name in providers}
        with self._lock:
            self._reliable = fresh

    def reliable(self, provider: str) -> bool:
        with self._lock:
            return self._reliable.get(provider, True)

    def unreliable(self) -> list[str]:
        with self._lock:
            return sorted(name for name, ok in self._reliable.items() if not ok)

    def read_back(
        self, job: SendJob, name: str, provider: Provider, provider_message_id: str
    ) -> None:
        """Compare the stored copy's Message-ID with ours; a failed read proves nothing."""
        try:
            stored = provider.read_message_id(provider_message_id)
        except ProviderError as exc:
            log.warning("job %s: Message-ID read-back failed: %s", job.key, exc.reason)
            return
        if stored is not None and same_message_id(stored, job.message_id):
            return
        log.critical(
            "PROVIDER %s REPLACED OUR MESSAGE-ID: sent %s, stored %s. Searches cannot find "
            "this provider's copies; unknown outcomes now go to review.",
            name,
            job.message_id,
            stored,
        )
        with self._lock:
            self._reliable[name] = False
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
