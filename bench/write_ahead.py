"""The least a write-ahead sender must do: one fsync'd SQLite commit per send.

`WriteAhead` is the record of a durable serial loop (bench/pipeline.py and
bench/smtp_senders.py run it next to the bare loops and the daemon): before each send, one
transaction writes that message as claimed and the previous one's outcome, and commits
with SQLite's fsync (WAL, `synchronous = FULL`: a claim must survive a power cut), as the
daemon's store does. Nothing else: no events, no job index, no proof, no decisions. So it
is what the safety alone costs a loop, and the daemon, which groups its commits, should
beat it (issue 30).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path


class WriteAhead:
    def __init__(self, path: Path) -> None:
        self._conn = sqlite3.connect(path, isolation_level=None)
        self._conn.execute("PRAGMA journal_mode = WAL")
        self._conn.execute("PRAGMA synchronous = FULL")
        self._conn.execute(
            "CREATE TABLE IF NOT EXISTS sends (message_id TEXT PRIMARY KEY, state TEXT NOT NULL)"
        )
        self._last: tuple[str, str] | None = None  # (message_id, outcome) not yet written
        self.commits = 0

    def claim(self, message_id: str) -> None:
        """`message_id` claimed, durable before its send; the previous outcome with it."""
        conn = self._conn
        conn.execute("BEGIN")
        if self._last is not None:
            conn.execute("UPDATE sends SET state = ? WHERE message_id = ?", self._last[::-1])
            self._last = None
        conn.execute("INSERT INTO sends VALUES (?, 'claimed')", (message_id,))
        conn.execute("COMMIT")
        self.commits += 1

    def sent(self, message_id: str, outcome: str = "sent") -> None:
        """The send's outcome, written with the next claim (or `close`)."""
        self._last = (message_id, outcome)

    def close(self) -> None:
        if self._last is not None:
            self._conn.execute("UPDATE sends SET state = ? WHERE message_id = ?", self._last[::-1])
            self._last = None
        self._conn.close()
