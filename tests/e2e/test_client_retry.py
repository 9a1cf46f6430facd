"""The Python client against the daemon as a process (docs/http-api.md "Python client"): a submit
whose answer the fault relay drops is sent again, the job key makes the repeat harmless,
and the daemon sends one job, one copy, counted in the emulator's acceptance log."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
from tests.e2e.daemon_kit import Rig, job
from tests.integration.api_kit import free_port

from sendledger.client import Client
from testkit.relay import FaultPlan, FaultRelay

TOKEN = "shop-token-0123456789abcdef"


def test_a_submit_whose_answer_is_lost_is_one_job_and_one_copy(tmp_path: Path) -> None:
    with Rig(tmp_path) as rig:
        listen = f"127.0.0.1:{free_port()}"
        tokens = tmp_path / "api-tokens"
        tokens.write_text(f"shop:{TOKEN}:submit,read\n", encoding="utf-8")
        os.chmod(tokens, 0o600)
        with rig.config.open("a", encoding="utf-8") as config:
            config.write(f'\n[api]\nlisten = "{listen}"\ntoken_file = "api-tokens"\n')
        rig.start_daemon()

        def listening() -> bool:
            try:
                return httpx.get(f"http://{listen}/healthz", timeout=1).status_code < 600
            except httpx.HTTPError:
                return False

        rig.wait_for(listening, "the API to listen")
        plan = FaultPlan(other=["drop-response", "drop-response"])
        with FaultRelay(f"http://{listen}", plan=plan) as relay:
            client = Client(relay.url, TOKEN, timeout=5, backoff=0.05)
            answer = client.submit(job("order-1"))
            assert answer["created"] is False  # the first try stored it
            assert relay.forwarded() == 3
            rig.wait_state("order-1", "confirmed")
            assert client.status("order-1")["state"] == "confirmed"
            assert [row["key"] for row in client.list()] == ["order-1"]
        assert rig.copies("order-1") == 1
        assert len(rig.sends(forwarded=True)) == 1
