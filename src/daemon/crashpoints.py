"""Named crash points for the reliability tests.

`SENDLEDGER_CRASH_POINT=after-claim` makes the process kill itself with SIGKILL the first
time it reaches that point: exactly what a power cut or `kill -9` would do there. Unset
(the default), a crash point costs one dictionary lookup.
"""

from __future__ import annotations

import os
import signal

ENV = "SENDLEDGER_CRASH_POINT"

# after-claim: the Attempted event is durable, the provider has not been called.
# after-send: the provider answered, its outcome is not yet recorded.
# after-search: the mailbox answered, the search result is not yet recorded.
POINTS = frozenset({"after-claim", "after-send", "after-search"})


def crash_point(name: str) -> None:
    if os.environ.get(ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)
