"""The defaults of the Message-ID read-back after confirmed sends, in one place.

The engine reads back every one of a provider's first `readback_first` confirmed sends after
the daemon starts, then a `readback_rate` share of the rest (daemon/engine/health.py); a
provider's settings may change both (docs/performance.md, "Performance and scaling").
"""

from __future__ import annotations

#: Enough to catch a provider that replaces every Message-ID before anything else depends on it.
DEFAULT_READBACK_FIRST = 10
#: One send in a hundred: a read-back costs an API call (5 Gmail quota units) per send.
DEFAULT_READBACK_RATE = 0.01
