"""A second daemon of the same `daemon.name` that reaches the SQLite store through a
symlink or a hard link is refused (exit 3, one line) like one on the same path, and
the first daemon's claims are left alone (docs/configuration.md "Stored mail: file modes,
encryption, daemon names"); the daemon refuses a key file that does not fit its store."""

from __future__ import annotations

import os
from pathlib import Path

from tests.e2e.daemon_kit import Rig, job

from ledger.stores.cipher import new_key


def test_a_second_daemon_through_a_symlink_or_a_hard_link_is_refused(tmp_path: Path) -> None:
    name = {"SENDLEDGER_DAEMON__NAME": "host-a"}
    with Rig(tmp_path) as rig:
        first = rig.start_daemon(name)
        rig.wait_for(lambda: "sendledger running" in first.stderr_text(), "the daemon to run")
        store = tmp_path / "ledger.sqlite"
        (tmp_path / "elsewhere").mkdir()
        symlink = tmp_path / "elsewhere" / "via-symlink.sqlite"
        symlink.symlink_to(store)
        hardlink = tmp_path / "elsewhere" / "via-hardlink.sqlite"
        os.link(store, hardlink)
        # The folder a link (its lock file one by both paths: taken once, still refused).
        (tmp_path / "linked").symlink_to(tmp_path)
        for path in (symlink, hardlink, tmp_path / "linked" / "ledger.sqlite"):
            env = {**name, "SENDLEDGER_STORE__URL": f"sqlite:///{path}"}
            refused = rig.cli("run", env=env, check=False, timeout=30)
            assert refused.returncode == 3, refused.stderr
            assert "daemon.name 'host-a' is held by another running daemon" in refused.stderr
            assert len(refused.stderr.strip().splitlines()) == 1
        assert first.terminate() == 0, first.tail()


def test_the_daemon_refuses_a_key_the_store_was_not_written_with(tmp_path: Path) -> None:
    """`run` opens the store as every command does: a key file added to a plain store is
    refused (exit 2, one line naming the setting) before the daemon claims anything."""
    with Rig(tmp_path) as rig:
        rig.submit([job("plain-1")])
        key_file = tmp_path / "store.key"
        key_file.write_text(new_key() + "\n")
        key_file.chmod(0o600)
        env = {"SENDLEDGER_STORE__ENCRYPTION_KEY_FILE": str(key_file)}
        refused = rig.cli("run", env=env, check=False, timeout=30)
        assert refused.returncode == 2, refused.stderr
        assert "store.encryption_key_file" in refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1
        assert rig.types("plain-1") == ["Requested"]
