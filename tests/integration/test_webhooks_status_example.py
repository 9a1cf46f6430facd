"""`sendledger webhooks status` on a real SQLite store prints the columns that docs/http-api.md
"Webhook status" shows in its example, and `--json` the fields the page lists."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from daemon.cli import main
from daemon.webhooks.signing import new_secret
from ledger.application import Ledger

PAGE = Path(__file__).resolve().parents[2] / "docs" / "http-api.md"


def test_the_status_table_has_the_page_s_columns(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    example = PAGE.read_text(encoding="utf-8").split("webhooks status [--json]", 1)[1]
    header, row = example.split("```\n", 1)[1].split("```", 1)[0].splitlines()
    (tmp_path / "webhook-secret").write_text(new_secret() + "\n", encoding="utf-8")
    (tmp_path / "webhook-secret").chmod(0o600)
    url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    config = tmp_path / "sendledger.toml"
    config.write_text(
        f'[store]\nurl = "{url}"\n\n[webhooks.ops]\n'
        'url = "https://ops.example.com/hooks/sendledger"\nsecret_file = "webhook-secret"\n',
        encoding="utf-8",
    )
    with Ledger(url):
        pass  # the store exists (`status` never creates one)
    assert main(["--config", str(config), "webhooks", "status"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].split() == header.split()
    assert printed[1].split()[:2] == ["ops", "0"] and row.split()[0] == "ops"
    assert main(["--config", str(config), "webhooks", "status", "--json"]) == 0
    [record] = json.loads(capsys.readouterr().out)
    assert (record["name"], record["position"], record["configured"]) == ("ops", 0, True)
