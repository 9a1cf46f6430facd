"""`sendledger api` alone (no sending, beside the daemons on a shared store) takes jobs as
`submit` does: by the policy folder as it is now and by what the running daemons loaded
(docs/policies.md "Broken policy files and reloads"); `SIGHUP` reloads the set it reports
as loaded, and does not end it. Its intake once kept the policies of its start for good,
and the signal's default action ended it; then it judged by the set its SIGHUP loaded: a
channel the daemons had reloaded was refused ("reload them") and an edited file judged by
its old version, at one door while the daemons followed the new ones."""

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

from daemon.engine.policy_holder import PolicyHolder
from daemon.from_settings import load_policies, settings_for
from daemon.service_layer.loaded import announce_policies
from ledger.application import Ledger
from ledger.stores.loaded_policies import DAEMON

AUTH = {"Authorization": f"Bearer {TOKEN}"}


def test_sendledger_api_reads_the_folder_and_sighup_reloads_what_it_reports(
    tmp_path: Path,
) -> None:
    with sendledger_api(tmp_path) as (url, folder, _emulator):
        pid = int((folder / "api.pid").read_text())
        refused = httpx.post(url + "/v1/jobs", json=job("k1", channel="alerts"), headers=AUTH)
        assert refused.status_code == 422, refused.text
        (folder / "policies" / "alerts.toml").write_text(
            (folder / "policies" / "receipts.toml").read_text()
        )
        # No daemon running: the folder is all there is, as for `submit`.
        answer = httpx.post(url + "/v1/jobs", json=job("k1", channel="alerts"), headers=AUTH)
        assert answer.status_code == 201, answer.text
        os.kill(pid, signal.SIGHUP)
        deadline = time.monotonic() + 15
        while "policies reloaded" not in (folder / "api.log").read_text():
            assert time.monotonic() < deadline, (folder / "api.log").read_text()
            time.sleep(0.1)
        assert "policies reloaded: alerts, receipts" in (folder / "api.log").read_text()
        assert httpx.get(url + "/healthz").status_code == 200  # it still serves


def test_sendledger_api_judges_by_what_the_running_daemon_loaded(tmp_path: Path) -> None:
    """A daemon on the same store (its name held, its row written, as `run` does): a file
    added is refused until the daemon reloads, then taken without touching `sendledger
    api`; a file edited and reloaded by the daemon is taken with no warning. Before, the
    API judged by its own set: the added channel stayed refused ("reload them") after the
    daemon's reload, and the edited one was warned about as differing from the file."""
    with sendledger_api(tmp_path) as (url, folder, _emulator):
        settings = settings_for(str(folder / "sendledger.toml"))
        with Ledger(f"sqlite:///{folder / 'ledger.sqlite'}") as ledger:
            name = ledger.hold_identity("d1")
            holder = PolicyHolder(lambda: load_policies(settings))
            announcer = announce_policies(ledger, "d1", holder, DAEMON)
            try:
                receipts = folder / "policies" / "receipts.toml"
                (folder / "policies" / "alerts.toml").write_text(receipts.read_text())
                refused = httpx.post(
                    url + "/v1/jobs", json=job("k1", channel="alerts"), headers=AUTH
                )
                assert refused.status_code == 422, refused.text
                assert "added since the daemon loaded its policies" in refused.text
                assert holder.reload()  # systemctl reload sendledger: the daemon only
                taken = httpx.post(url + "/v1/jobs", json=job("k1", channel="alerts"), headers=AUTH)
                assert taken.status_code == 201, taken.text
                receipts.write_text(receipts.read_text().replace('"review"', '"retry"'))
                assert holder.reload()
                edited = httpx.post(url + "/v1/jobs", json=job("k2"), headers=AUTH)
                assert edited.status_code == 201, edited.text
            finally:
                announcer.stop()
                name.release()
        assert "warning" not in (folder / "api.log").read_text()


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
