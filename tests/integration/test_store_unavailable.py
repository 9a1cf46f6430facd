"""A store that cannot be written says so in one line naming it (docs/cli.md "Exit codes"):
a full disk, simulated by SQLite's page limit (a real full disk gives the same
SQLITE_FULL)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ledger.application import Ledger, Sender
from ledger.content import JobContent
from ledger.stores.causes import StoreUnavailable
from ledger.stores.private_api import CachingConnectionPool
from ledger.vocabulary import PolicyRef

SENDER = Sender(
    from_addr="Support <support@example.com>",
    message_id_domain="mail.example.com",
    policy=PolicyRef("receipts", "0123456789abcdef"),
)


def job(key: str, body: str = "Thanks") -> JobContent:
    return JobContent(
        channel="receipts", key=key, to=("alice@example.com",), subject="Receipt", body=body
    )


def test_a_full_disk_is_named_with_the_store_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "full.sqlite"
    with Ledger(f"sqlite:///{path}") as ledger:
        ledger.submit(job("k-1"), SENDER)
    made = CachingConnectionPool._create_connection

    def no_room(pool: CachingConnectionPool) -> Any:
        # As a disk with no free block: the file may not grow by one page.
        connection = made(pool)
        raw = connection._sqlite_conn
        pages = raw.execute("PRAGMA page_count").fetchone()[0]
        raw.execute(f"PRAGMA max_page_count = {pages}")
        return connection

    monkeypatch.setattr(CachingConnectionPool, "_create_connection", no_room)
    with Ledger(f"sqlite:///{path}") as ledger:
        with pytest.raises(StoreUnavailable) as refused:
            ledger.submit(job("k-2", body="x" * 200_000), SENDER)
        assert str(refused.value) == (
            f"store sqlite:{path}: disk full: nothing more can be written "
            "(database or disk is full)"
        )
        assert ledger.find_job("k-2") is None
        assert ledger.find_job("k-1") is not None
