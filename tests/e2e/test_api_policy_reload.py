"""`sendledger api` alone (no sending, beside the daemons on a shared store) takes jobs by
the policies; `SIGHUP` reloads them as it does in the daemon (docs/policies.md "Broken
policy files and reloads"). Its intake once kept the policies of its start for good, and
the signal's default action ended it: a channel added or changed (an `allowed_from`
narrowed) was judged by stale rules at one door while the daemons followed the new ones."""

from __future__ import annotations

import os
import signal
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from tests.e2e.api_process import sendledger_api
from tests.integration.api_kit import TOKEN, job

from ledger.application import Ledger

AUTH = {"Authorization": f"Bearer {TOKEN}"}


def test_sighup_reloads_the_policies_of_sendledger_api(tmp_path: Path) -> None:
    with sendledger_api(tmp_path) as (url, folder, _emulator):
        pid = int((folder / "api.pid").read_text())
        refused = httpx.post(url + "/v1/jobs", json=job("k1", channel="alerts"), headers=AUTH)
        assert refused.status_code == 422, refused.text
        (folder / "policies" / "alerts.toml").write_text(
            (folder / "policies" / "receipts.toml").read_text()
        )
        os.kill(pid, signal.SIGHUP)
        deadline = time.monotonic() + 15
        while True:
            answer = httpx.post(url + "/v1/jobs", json=job("k1", channel="alerts"), headers=AUTH)
            if answer.status_code == 201 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert answer.status_code == 201, answer.text
        assert "policies reloaded: alerts, receipts" in (folder / "api.log").read_text()


def test_a_sighup_during_start_up_reloads_once_sendledger_api_serves(tmp_path: Path) -> None:
    """SIGHUP while `sendledger api` still starts (its policies read, its store being
    opened: held by another process's exclusive lock) neither ends it (the signal's
    default action) nor is lost: once it serves, it reloads."""
    store = tmp_path / "ledger.sqlite"
    Ledger(f"sqlite:///{store}").close()  # there: opening it reads it

    @contextmanager
    def held(pids: list[int]) -> Iterator[None]:
        holder = sqlite3.connect(store, isolation_level=None)
        try:
            holder.execute("PRAGMA locking_mode = EXCLUSIVE")
            holder.execute("BEGIN EXCLUSIVE")  # no reader either, until the rollback
            yield
            fds = Path(f"/proc/{pids[0]}/fd")
            deadline = time.monotonic() + 30
            while not any(os.readlink(fds / fd) == str(store) for fd in os.listdir(fds)):
                assert time.monotonic() < deadline, "sendledger api never opened the store"
                time.sleep(0.05)
            # The policies were read before the store is opened: this one comes after.
            (tmp_path / "policies" / "alerts.toml").write_text(
                (tmp_path / "policies" / "receipts.toml").read_text()
            )
            os.kill(pids[0], signal.SIGHUP)
            time.sleep(0.2)  # delivered while the open still waits
        finally:
            holder.execute("ROLLBACK")
            holder.close()

    with sendledger_api(tmp_path, starting=held) as (url, folder, _emulator):
        deadline = time.monotonic() + 15
        while "policies reloaded" not in (folder / "api.log").read_text():
            assert time.monotonic() < deadline, (folder / "api.log").read_text()
            time.sleep(0.1)
        assert "policies reloaded: alerts, receipts" in (folder / "api.log").read_text()
        answer = httpx.post(url + "/v1/jobs", json=job("k1", channel="alerts"), headers=AUTH)
        assert answer.status_code == 201, answer.text
