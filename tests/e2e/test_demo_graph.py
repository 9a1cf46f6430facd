"""`sendledger demo --provider graph` as a user runs it: the daemon on the Graph provider
against the bundled Graph emulator over TLS (a throw-away CA the demo's process trusts
through REQUESTS_CA_BUNDLE), the TLS fault relay in front, copies counted in the
emulator's acceptance log. demo_kit checks what every demo promises.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.e2e.demo_kit import run_demo


def test_demo_on_graph_one_copy_per_confirmed_job(tmp_path: Path) -> None:
    summary, result = run_demo(
        "--provider", "graph", "--lag", "1s", "--dir", str(tmp_path), timeout=180
    )
    assert "Graph emulator" in summary["against"]
    jobs = summary["jobs"]
    assert summary["accepted_total"] == sum(job["copies"] for job in jobs)
    assert "MICROSOFT GRAPH EMULATOR" in result.stderr  # the commentary went to stderr
    # What the acceptance log holds agrees with the summary, line for line.
    lines = (tmp_path / "acceptance.jsonl").read_text(encoding="utf-8").splitlines()
    logged = [json.loads(line)["message_id"] for line in lines]
    for job in jobs:
        assert logged.count(job["message_id"]) == job["copies"], job
    config = (tmp_path / "sendledger.toml").read_text(encoding="utf-8")
    assert 'kind = "graph"' in config and "/v1.0" in config
    assert (tmp_path / "graph-client-secret").stat().st_mode & 0o077 == 0
    assert (tmp_path / "tls").is_dir()
