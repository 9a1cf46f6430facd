"""A token bucket that keeps a provider under its per-second quota.

Gmail meters each user in "quota units" (send 100, list 5, get 5; 250 units per user per
second). Going over earns 429s, which cost a backoff; waiting a little before each call is
cheaper. Time is injected so tests never sleep for real.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

# Gmail API quota units per method (developers.google.com/gmail/api/reference/quota).
GMAIL_SEND_UNITS = 100.0
GMAIL_LIST_UNITS = 5.0
GMAIL_GET_UNITS = 5.0
GMAIL_PROFILE_UNITS = 1.0  # users.getProfile: the ping


# Float slack: after sleeping exactly the computed wait, rounding can leave the balance a
# hair short, and a clock that cannot advance by so little would then spin forever.
_EPSILON = 1e-9


class TokenBucket:
    """`rate` units per second, at most `capacity` (default: one second's worth) saved up.

    The bucket starts full. `acquire` blocks (through the injected `sleep`) until the units
    are available; `try_acquire` never blocks. Thread-safe: the lock is held only while the
    balance is computed, never while sleeping, so one slow caller does not serialise others
    beyond what the quota itself demands.
    """

    def __init__(
        self,
        rate: float,
        capacity: float | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if rate <= 0:
            raise ValueError(f"rate must be positive, got {rate!r}")
        cap = rate if capacity is None else capacity
        if cap <= 0:
            raise ValueError(f"capacity must be positive, got {cap!r}")
        self.rate = float(rate)
        self.capacity = float(cap)
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._tokens = self.capacity
        self._stamp = clock()

    def _refill(self) -> None:
        # Caller holds the lock.
        now = self._clock()
        elapsed = now - self._stamp
        if elapsed > 0:
            self._tokens = min(self.capacity, self._tokens + elapsed * self.rate)
        # A clock that goes backwards (it should not: monotonic) earns nothing.
        self._stamp = max(self._stamp, now)

    def _check(self, units: float) -> None:
        if units < 0:
            raise ValueError(f"units must not be negative, got {units!r}")
        if units > self.capacity:
            # It could never be satisfied: fail loudly instead of blocking forever.
            raise ValueError(f"{units} units exceed the bucket's capacity {self.capacity}")

    @property
    def available(self) -> float:
        with self._lock:
            self._refill()
            return self._tokens

    def until_full(self) -> float:
        """Seconds until the bucket is full again (0.0: it is, as a fresh one would be)."""
        with self._lock:
            self._refill()
            return max(0.0, (self.capacity - self._tokens - _EPSILON) / self.rate)

    def try_acquire(self, units: float, *, keep: float = 0.0) -> bool:
        """Take `units` now if they are there with `keep` left over (what a call that
        must never delay a send leaves for one); False (and nothing taken) otherwise."""
        self._check(units)
        with self._lock:
            self._refill()
            if self._tokens + _EPSILON >= units + keep:
                self._tokens = max(0.0, self._tokens - units)
                return True
            return False

    def wait_for(self, units: float) -> float:
        """Seconds until `units` could be taken (0.0: now); nothing is taken."""
        self._check(units)
        with self._lock:
            self._refill()
            return max(0.0, (units - self._tokens - _EPSILON) / self.rate)

    def acquire(self, units: float) -> None:
        """Take `units`, sleeping until enough have accrued."""
        self._check(units)
        while True:
            with self._lock:
                self._refill()
                if self._tokens + _EPSILON >= units:
                    self._tokens = max(0.0, self._tokens - units)
                    return
                wait = (units - self._tokens) / self.rate
            # Another thread may take the refill meanwhile; then we loop and wait again.
            self._sleep(wait)
