"""`admin purge --key` scrubs the store's files whatever happens to a later key
(docs/configuration.md "Retention"): a purge that fails half-way still leaves no purged text in the
SQLite file or its WAL."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tests.e2e.test_cli_retention import customer, settled_jobs

from daemon import cli
from ledger.application import ConcurrentUpdate, Ledger


def _raw(store: Path) -> bytes:
    wal = store.with_name(store.name + "-wal")
    return store.read_bytes() + (wal.read_bytes() if wal.exists() else b"")


def _config(tmp_path: Path) -> Path:
    (tmp_path / "policies").mkdir()
    config = tmp_path / "sendledger.toml"
    config.write_text(
        '[store]\nurl = "sqlite:///ledger.sqlite"\n[daemon]\npolicies_dir = "policies"\n'
    )
    return config


def test_a_later_key_that_fails_leaves_the_earlier_ones_scrubbed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "ledger.sqlite"
    settled_jobs(store, 3, open_too=False)
    config = _config(tmp_path)
    real_purge = Ledger.purge

    def purge(self: Ledger, key: str, **kwargs: Any) -> Any:
        if key == "r-0002":  # another writer got there first
            raise ConcurrentUpdate(f"job {key!r} was changed by another writer")
        return real_purge(self, key, **kwargs)

    monkeypatch.setattr(Ledger, "purge", purge)
    with Ledger(f"sqlite:///{store}") as reader:  # keeps the WAL from going on close
        assert reader.row("r-0000") is not None
        argv = ["--config", str(config), "admin", "purge", "--json"]
        code = cli.main([*argv, "--key", "r-0000", "--key", "r-0001", "--key", "r-0002"])
        assert code == 3
        out, err = capsys.readouterr()
        assert "r-0002" in err and '"purged": 2' in out and '"scrubbed": true' in out
        raw = _raw(store)
        assert [i for i in (0, 1) if customer(i).encode() in raw] == []
        assert customer(2).encode() in raw
        assert reader.get_job("r-0001").purged and not reader.get_job("r-0002").purged


def test_a_periodic_purge_that_fails_half_way_still_scrubs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = tmp_path / "ledger.sqlite"
    settled_jobs(store, 3, open_too=False)
    real_purge = Ledger.purge

    def purge(self: Ledger, key: str, **kwargs: Any) -> Any:
        if key == "r-0002":
            raise OSError("disk went away")
        return real_purge(self, key, **kwargs)

    monkeypatch.setattr(Ledger, "purge", purge)
    with Ledger(f"sqlite:///{store}") as reader, Ledger(f"sqlite:///{store}") as ledger:
        assert reader.row("r-0000") is not None
        with pytest.raises(OSError, match="disk"):
            ledger.purge_settled(ledger.clock(), by="t", rule="t")
        raw = _raw(store)
        assert [i for i in (0, 1) if customer(i).encode() in raw] == []


def test_a_webhook_error_quoting_a_purged_job_leaves_the_file(tmp_path: Path) -> None:
    # A receiver's refusal that echoed the payload is kept as the webhook's last error
    # (`webhooks status`) until a delivery succeeds: beside the events, in the same file.
    store = tmp_path / "ledger.sqlite"
    settled_jobs(store, 1, open_too=False)
    with Ledger(f"sqlite:///{store}") as ledger:
        positions = ledger.positions()
        positions.ensure()
        assert positions.claim("ops", "a", 0.0, 60.0) is not None
        error = f"HTTP 422: cannot take detail for {customer(0)}"
        assert positions.fail("ops", "a", 0, error, 10.0, 1.0, 60.0)
        result = ledger.purge_settled(ledger.clock(), by="t", rule="t")
        assert (result.purged, result.scrubbed) == (1, True)
        [row] = positions.read_all()
        assert row.last_error == "HTTP 422: cannot take detail for [purged]"
    assert customer(0).encode() not in _raw(store)
