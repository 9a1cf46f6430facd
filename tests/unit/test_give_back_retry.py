"""A refused start's put-back of the declaration it replaced is tried again after a store
error (docs/operations.md "Upgrading"; `daemon.service_layer.loaded.give_back_refused_start`):
left, the row of the live server's name says the refused start's release, which a newer
release judging whether to raise the store's format takes for what the live one reads."""

# ruff: noqa: F811 - the tests take the imported fixture by name

from __future__ import annotations

import pytest
from tests.unit.daemon_thread import daemon_on
from tests.unit.test_event_format import T0, ledger  # noqa: F401

from daemon.runtime import start_up
from daemon.service_layer import loaded
from ledger.application import Ledger
from ledger.event_format import check_event_format
from ledger.stores.format_rows import FormatRow, format_rows_for


def failing_once(monkeypatch: pytest.MonkeyPatch, ledger: Ledger) -> list[str]:
    """The store's put-back fails its first write (a disk I/O error, a dropped
    connection); the list holds each try."""
    rows_class = type(format_rows_for(ledger.recorder))
    put_back = rows_class.put_back
    tries: list[str] = []

    def flaky(rows: object, declared: FormatRow, replaced: FormatRow) -> None:
        tries.append(declared.holder)
        if len(tries) == 1:
            raise OSError("disk I/O error")
        put_back(rows, declared, replaced)  # type: ignore[arg-type]

    monkeypatch.setattr(rows_class, "put_back", flaky)
    return tries


def test_a_put_back_the_store_fails_once_is_tried_again(
    ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A start that holds its name and declared, then is refused (here its recovery of
    the name's claims fails), puts back the row its declaration replaced (the name's
    earlier process's); a store error at that write: tried once, the row stayed the
    refused start's. Now tried again, and the earlier row is back, put back before the
    name is let go (no other process of the name declares meanwhile)."""
    monkeypatch.setattr(loaded, "GIVE_BACK_PAUSE", 0.01, raising=False)
    check_event_format(ledger, server=("daemon", "a"), clock=lambda: T0)
    kept = format_rows_for(ledger.recorder).rows()["daemon a"]
    tries = failing_once(monkeypatch, ledger)
    with Ledger(ledger.store) as second:
        service = daemon_on(second, name="a").service

        def recovery_fails(**_: object) -> None:
            assert format_rows_for(ledger.recorder).rows()["daemon a"] != kept
            raise OSError("disk I/O error")

        monkeypatch.setattr(service.engine, "recover_own_claims", recovery_fails)
        with pytest.raises(OSError):
            start_up(service)
        service.close()
    assert tries == ["daemon a", "daemon a"]
    assert format_rows_for(ledger.recorder).rows()["daemon a"] == kept
