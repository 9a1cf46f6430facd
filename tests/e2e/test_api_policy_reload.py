"""`sendledger api` alone (no sending, beside the daemons on a shared store) takes jobs by
the policies; `SIGHUP` reloads them as it does in the daemon (docs/policies.md "Broken
policy files and reloads"). Its intake once kept the policies of its start for good, and
the signal's default action ended it: a channel added or changed (an `allowed_from`
narrowed) was judged by stale rules at one door while the daemons followed the new ones."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx
from tests.e2e.api_process import sendledger_api
from tests.integration.api_kit import TOKEN, job

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
