"""Sign-in attempts limited per client address (docs/review.md "Review page", "Sign-in").

After `failures` failed sign-ins from one address within `window` seconds, that address is
answered 429 (with Retry-After) until the oldest of those failures leaves the window. Only
time clears a failure: a valid token, with the page's role or without it, resets nothing,
or a token without the role (a submit-only one, which many scripts hold) would buy four
more guesses each time it is used. Kept in memory, like the sessions. The clock is
injected so tests need not wait.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

FAILURES = 5
WINDOW = 300.0
#: Addresses tracked at most; past it the oldest are forgotten (memory stays bounded).
MAX_ADDRESSES = 10_000


class SignInLimit:
    def __init__(
        self,
        failures: int = FAILURES,
        window: float = WINDOW,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.failures = failures
        self.window = window
        self.clock = clock
        self._lock = threading.Lock()
        self._seen: dict[str, deque[float]] = {}

    def _recent(self, address: str, now: float) -> deque[float]:
        times = self._seen.get(address, deque())
        while times and times[0] <= now - self.window:
            times.popleft()
        return times

    def wait(self, address: str) -> float:
        """Seconds until `address` may try again; 0 when it may now."""
        with self._lock:
            now = self.clock()
            times = self._recent(address, now)
            if len(times) < self.failures:
                return 0.0
            return max(times[0] + self.window - now, 0.001)

    def failed(self, address: str) -> None:
        with self._lock:
            now = self.clock()
            times = self._recent(address, now)
            times.append(now)
            self._seen.pop(address, None)
            self._seen[address] = times  # newest last: the oldest are forgotten first
            while len(self._seen) > MAX_ADDRESSES:
                del self._seen[next(iter(self._seen))]


__all__ = ["FAILURES", "WINDOW", "SignInLimit"]
