"""The example of docs/http-api.md "Python client", run as printed against the real server
(uvicorn on loopback, a SQLite store, the fake provider's mailbox lent to the API): only its
URL is this server's and `token` one of its tokens. Each call has the effect the page's
comments give it."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.integration.api_kit import TOKEN
from tests.integration.test_api_review import Rig, rig  # noqa: F401  (the fixture, by name)

PAGE = Path(__file__).resolve().parents[2] / "docs" / "http-api.md"


def test_the_client_example_runs_as_printed(
    rig: Rig,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    text = PAGE.read_text(encoding="utf-8").split("\n## Python client\n", 1)[1]
    example = text.split("```python\n", 1)[1].split("```", 1)[0]
    assert example.count('"http://127.0.0.1:8025"') == 1
    rig.in_review("order-1041", copies=1)  # the job the example checks and resolves
    rig.submit("order-1043")  # the one it cancels
    code = example.replace('"http://127.0.0.1:8025"', repr(rig.api.url))
    exec(compile(code, str(PAGE), "exec"), {"token": TOKEN})
    assert capsys.readouterr().out == "order-1041 unknown-outcome\n"
    states = {key: rig.api.ledger.get_job(key).state for key in ("order-1041", "order-1042")}
    assert states == {"order-1041": "confirmed", "order-1042": "requested"}
    assert rig.api.ledger.get_job("order-1043").state == "cancelled"
    checked = [e["type"] for e in rig.events("order-1041")]
    assert "Checked" in checked and checked[-1] == "Confirmed"
