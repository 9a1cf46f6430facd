"""A second daemon of the same `daemon.name` that reaches the SQLite store through a
symlink or a hard link is refused (exit 3, one line) like one on the same path, and
the first daemon's claims are left alone (README "Stored mail: file modes, encryption,
daemon names")."""

from __future__ import annotations

import os
from pathlib import Path

from tests.e2e.daemon_kit import Rig


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
        for path in (symlink, hardlink):
            env = {**name, "SENDLEDGER_STORE__URL": f"sqlite:///{path}"}
            refused = rig.cli("run", env=env, check=False, timeout=30)
            assert refused.returncode == 3, refused.stderr
            assert "daemon.name 'host-a' is held by another running daemon" in refused.stderr
            assert len(refused.stderr.strip().splitlines()) == 1
        assert first.terminate() == 0, first.tail()
