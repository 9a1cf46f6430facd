"""One single-shot HTTP transport per thread, for the HTTP providers (httplib2 objects are
not thread-safe; "No silent re-send" in docs/architecture.md says why `SingleShotHttp`)."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable

from daemon.providers.transport import SingleShotHttp


class PerThreadHttp:
    """One `SingleShotHttp` per thread (httplib2 is not thread-safe), made on first use by
    `make`, and a `close` that closes the kept-alive connections of every thread."""

    def __init__(self, make: Callable[[], SingleShotHttp]) -> None:
        self._make = make
        self._local = threading.local()
        # Weak: a thread's HTTP object goes away with the thread.
        self._all: weakref.WeakSet[SingleShotHttp] = weakref.WeakSet()
        self._lock = threading.Lock()

    def get(self) -> SingleShotHttp:
        transport: SingleShotHttp | None = getattr(self._local, "transport", None)
        if transport is None:
            transport = self._local.transport = self._make()
            with self._lock:
                self._all.add(transport)
        return transport

    def close(self) -> None:
        with self._lock:
            transports = list(self._all)
            self._all.clear()
        # Kept-alive connections of every thread (and any request cut short in another).
        for transport in transports:
            for conn in list(transport.connections.values()):
                conn.close()
