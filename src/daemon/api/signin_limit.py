"""Sign-in attempts limited per client address (docs/review.md "Review page", "Sign-in").

After `failures` failed sign-ins from one address within `window` seconds, that address is
answered 429 (with Retry-After) until the oldest of those failures leaves the window. Only
time clears a failure: a valid token, with the page's role or without it, resets nothing,
or a token without the role (a submit-only one, which many scripts hold) would buy four
more guesses each time it is used. A sign-in being judged counts as a failure until it is
judged (`begin`, `end`): guesses sent at once are limited as if sent one after the other.
Kept in memory, like the sessions. The clock is injected so tests need not wait.
"""

from __future__ import annotations

import ipaddress
import threading
import time
from collections import deque
from collections.abc import Callable

FAILURES = 5
WINDOW = 300.0
#: Addresses tracked at most; past it the oldest are forgotten (memory stays bounded).
MAX_ADDRESSES = 10_000


def client_of(host: str) -> str:
    """What the limit counts as one client: an IPv4 address, or an IPv6 address's /64
    (one host has a /64 to itself and picks any address in it: per address, every guess
    could come from a fresh one). Anything else (a name, "-") as it is."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:  # ::ffff:192.0.2.7 is that IPv4 client
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


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
        self._judging: dict[str, int] = {}  # sign-ins under way, per address

    def _recent(self, address: str, now: float) -> deque[float]:
        times = self._seen.get(address, deque())
        while times and times[0] <= now - self.window:
            times.popleft()
        return times

    def _wait(self, address: str, now: float) -> float:
        """Seconds until `address` may try again; 0 when it may now."""
        times = self._recent(address, now)
        if len(times) + self._judging.get(address, 0) < self.failures:
            return 0.0
        if not times:
            # Every attempt left is under way: the next may come once one is judged.
            return 1.0
        return max(times[0] + self.window - now, 0.001)

    def begin(self, address: str) -> float:
        """`wait`, and when it is 0 one sign-in of `address` is under way, counted as a
        failure until `end`: asked and counted at once, so no other passes between."""
        with self._lock:
            wait = self._wait(address, self.clock())
            if not wait:
                self._judging[address] = self._judging.get(address, 0) + 1
            return wait

    def end(self, address: str, *, failed: bool) -> None:
        """A sign-in `begin` let through was judged."""
        with self._lock:
            left = self._judging.get(address, 0) - 1
            if left > 0:
                self._judging[address] = left
            else:
                self._judging.pop(address, None)
            if failed:
                self._failed(address)

    def _failed(self, address: str) -> None:
        now = self.clock()
        times = self._recent(address, now)
        times.append(now)
        self._seen.pop(address, None)
        self._seen[address] = times  # newest last: the oldest are forgotten first
        while len(self._seen) > MAX_ADDRESSES:
            del self._seen[next(iter(self._seen))]


__all__ = ["FAILURES", "WINDOW", "SignInLimit", "client_of"]
