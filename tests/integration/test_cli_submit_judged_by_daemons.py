"""`sendledger submit` (the CLI, without the daemon) judged by the policies a running daemon
loaded, on SQLite and PostgreSQL (daemon/service_layer/loaded.py): a policy file added and
not reloaded is refused (exit 2, one line naming the channel, nothing written), one edited
and not reloaded is accepted with a warning, and after the reload both are as the folder
says. Before, `submit` read the folder alone: the added channel's job was accepted and the
daemon put it in review at once ("no policy for the channel")."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from daemon.cli import main
from daemon.engine.policy_holder import PolicyHolder
from daemon.from_settings import load_policies, settings_for
from daemon.service_layer.loaded import announce_policies
from ledger.application import Ledger
from ledger.stores.loaded_policies import DAEMON

POLICY = (
    'provider = "support"\nfrom = "Support <support@example.com>"\n'
    'message_id_domain = "mail.example.com"\non_unknown = "{on_unknown}"\n'
)


def submit(config: Path, tmp_path: Path, key: str, channel: str) -> int:
    job = {"channel": channel, "key": key, "to": "a@example.com", "subject": "s", "body": "b"}
    path = tmp_path / f"{key}.json"
    path.write_text(json.dumps(job))
    return main(["--config", str(config), "submit", str(path)])


def test_submit_judges_by_what_the_running_daemon_loaded(
    tmp_path: Path, store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "receipts.toml").write_text(POLICY.format(on_unknown="review"))
    (tmp_path / "sa.json").write_text("{}")
    config = tmp_path / "sendledger.toml"
    config.write_text(
        f'[store]\nurl = "{store_url}"\n[daemon]\npolicies_dir = "policies"\n'
        '[providers.support]\ncredentials_file = "sa.json"\n'
    )
    settings = settings_for(str(config))
    with Ledger(store_url) as ledger:
        holder = PolicyHolder(lambda: load_policies(settings))
        announcer = announce_policies(ledger, "d1", holder, DAEMON)
        try:
            # Added to the folder, not reloaded: refused, naming the channel.
            (policies / "invoices.toml").write_text(POLICY.format(on_unknown="review"))
            capsys.readouterr()
            assert submit(config, tmp_path, "k1", "invoices") == 2
            err = capsys.readouterr().err
            assert len(err.splitlines()) == 1, err
            assert "'invoices'" in err and "systemctl reload sendledger" in err
            assert ledger.find_job("k1") is None
            # Edited, not reloaded: accepted, with a warning on stderr.
            (policies / "receipts.toml").write_text(POLICY.format(on_unknown="retry"))
            assert submit(config, tmp_path, "k2", "receipts") == 0
            captured = capsys.readouterr()
            assert "created k2" in captured.out
            assert "warning" in captured.err and "'receipts'" in captured.err
            # Reloaded: the folder and the daemon agree again.
            assert holder.reload()  # the row is written before it returns
            assert "invoices" in _live_channels(ledger)
            assert submit(config, tmp_path, "k3", "invoices") == 0
            assert submit(config, tmp_path, "k4", "receipts") == 0
            assert capsys.readouterr().err == ""
        finally:
            announcer.stop()
    # No daemon running: the folder is all there is, as before.
    (policies / "letters.toml").write_text(POLICY.format(on_unknown="review"))
    assert submit(config, tmp_path, "k5", "letters") == 0


def _live_channels(ledger: Ledger) -> set[str]:
    rows = ledger.loaded_policies()
    now = rows.now()
    return {c for row in rows.live(time.time() if now is None else now) for c in row.fingerprints}
