"""The channel policies in force, swapped whole on reload (SIGHUP)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from policies.loader import PolicySet


log = logging.getLogger("sendledger.engine")


class PolicyHolder:
    """The policies in force. A reload that fails keeps the last good set running."""

    def __init__(self, loader: Callable[[], PolicySet], initial: PolicySet | None = None) -> None:
        self._loader = loader
        self._lock = threading.Lock()
        self._policies = initial if initial is not None else loader()
        self.last_error: str | None = None
        #: Told each set a reload takes (the loaded-policy row: `service_layer/loaded.py`).
        self.listeners: list[Callable[[PolicySet], None]] = []

    @property
    def current(self) -> PolicySet:
        with self._lock:
            return self._policies

    def reload(self) -> bool:
        try:
            policies = self._loader()
        except Exception as exc:
            self.last_error = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            log.error("policy reload failed, keeping the last good policies: %s", exc)
            return False
        with self._lock:
            self._policies = policies
        self.last_error = None
        # Before the line that says so: whoever waits for it (an operator, a script) may
        # submit at once, judged by what the store says this daemon loaded.
        for listener in self.listeners:
            try:
                listener(policies)
            except Exception as exc:  # the reload stands; a listener's failure is said
                log.warning("after the policy reload: %s", exc)
        log.info("policies reloaded: %s", ", ".join(sorted(policies)) or "none")
        return True
